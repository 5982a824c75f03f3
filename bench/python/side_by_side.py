"""libzero against DeepSpeed, PyTorch's ZeroRedundancyOptimizer + DDP and FSDP2 on the same torch model and the same
ds_config.json, 2 ranks on CPU, in one run (bench/README.md, "Python side by side").

    python bench/python/side_by_side.py [--repeats 2] [--steps 12] [--only libzero,deepspeed]
    python bench/python/side_by_side.py --only libzero,libzero_torchrun --ranks 4 --machines 2 \
        --mpi-testing-module build/release/tests/libzero_mpi_testing.so

Each run is its own job (libzero under mpirun over its MPI backend and under torchrun over its shared-memory
communicator, the others under torchrun over gloo; --only libzero_gloo adds libzero over gloo, libzero_noarena
libzero under torchrun with the shared arena off, ZERO_SHM_ARENA_BYTES=0, and compute_only with --stages 0,...
torch's forward and backward alone on every rank, the floor under any framework's step); runs
alternate framework order between repeats (paired), and every figure is the median over repeats of a per-run
median. Tokens/s counts every rank's tokens per step over the slowest rank's median step time; peak RSS is the
largest rank's; the optimizer step is the time of engine.step() (or clip + optimizer.step + zero_grad).

--machines M cuts this machine into M "machines" of ranks/M consecutive ranks each, for libzero across machines:
under mpirun the MPI module's hierarchical collectives (its test build, --mpi-testing-module, with
ZERO_TEST_MPI_NODES), under torchrun the shared-memory communicator across machines (one torchrun agent per
machine, --nnodes, each with its own ZERO_TORCH_MACHINE_ID):
shared memory within each, MPI or TCP over loopback between them."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = [
    ("libzero", 1), ("libzero", 2), ("libzero", 3),
    ("libzero_torchrun", 1), ("libzero_torchrun", 2), ("libzero_torchrun", 3),
    ("deepspeed", 1), ("deepspeed", 2), ("deepspeed", 3),
    ("zero_redundancy", 1), ("fsdp2", 3),
]
NAMES = {"libzero": "libzero", "libzero_torchrun": "libzero under torchrun",
         "libzero_gloo": "libzero under torchrun over gloo",
         "libzero_noarena": "libzero under torchrun, buckets outside the shared arena",
         "compute_only": "torch forward + backward alone (no optimizer, no communication)", "deepspeed": "DeepSpeed 0.19", "zero_redundancy": "torch ZeroRedundancyOptimizer + DDP",
         "fsdp2": "torch FSDP2 (fully_shard)"}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(framework: str, stage: int, args: argparse.Namespace, out: str) -> dict | None:
    worker = [sys.executable, os.path.join(HERE, "train.py"), "--framework", framework, "--stage", str(stage),
              "--config", args.config, "--steps", str(args.steps), "--warmup", str(args.warmup), "--out", out]
    env = dict(os.environ, DS_ACCELERATOR="cpu", DS_BUILD_OPS="0", OMP_NUM_THREADS="1")
    if framework == "libzero_noarena":  # the shared-memory communicator with its arena off: peers' pieces copied first
        env["ZERO_SHM_ARENA_BYTES"] = "0"
        worker[worker.index("--framework") + 1] = "libzero_torchrun"
    if args.machines > 1:
        per = args.ranks // args.machines
        env["ZERO_MPI_BACKEND"] = os.path.abspath(args.mpi_testing_module)
        env["ZERO_TEST_MPI_NODES"] = ",".join(str(r // per) for r in range(args.ranks))
        env["ZERO_TEST_MPI_REQUIRE_HIERARCHY"] = "1"
    if framework == "libzero":
        cmd = [args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(args.ranks)] + worker[:1] + worker[1:]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    elif args.machines > 1:
        # One torchrun agent per machine, as a multi-node job starts, each saying which machine it is.
        port = free_port()
        logs = [tempfile.TemporaryFile("w+") for _ in range(args.machines)]  # files: no pipe to fill up
        agents = [subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(args.machines), "--node-rank", str(k),
             "--nproc-per-node", str(per), "--master-addr", "127.0.0.1", "--master-port", str(port)] + worker[1:],
            env=dict(env, ZERO_TORCH_MACHINE_ID=f"machine-{k}"), stdout=log, stderr=subprocess.STDOUT, text=True)
            for k, log in enumerate(logs)]
        try:
            codes = [a.wait(timeout=1800) for a in agents]
        finally:
            for a in agents:
                if a.poll() is None:
                    a.kill()
        output = ""
        for log in logs:
            log.seek(0)
            output += log.read()
        proc = subprocess.CompletedProcess("torchrun", next((c for c in codes if c != 0), 0), output, "")
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks)] + worker[1:]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-6:]
        print(f"  {framework} stage {stage}: failed ({proc.returncode}): " + " | ".join(tail), flush=True)
        return None
    ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(args.ranks)]
    step = max(r["median_step_s"] for r in ranks)
    return {
        "tokens_per_s": sum(r["tokens_per_step"] for r in ranks) / step,
        "peak_rss_mib": max(r["peak_rss_bytes"] for r in ranks) / 2**20,
        "train_mib": max(r["peak_rss_bytes"] - r["baseline_rss_bytes"] for r in ranks) / 2**20,
        "opt_ms": 1e3 * max(statistics.median(r["opt_times"]) for r in ranks),
        "step_ms": 1e3 * step,
        "loss": statistics.mean(r["losses"][-1] for r in ranks),
        "first_loss": statistics.mean(r["losses"][0] for r in ranks),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=os.path.join(HERE, "ds_config.json"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    ap.add_argument("--only", default="")
    ap.add_argument("--stages", default="1,2,3")
    ap.add_argument("--machines", type=int, default=1)
    ap.add_argument("--mpi-testing-module", default="")
    args = ap.parse_args()
    if args.machines > 1 and (args.ranks % args.machines or not args.mpi_testing_module):
        ap.error("--machines needs --ranks divisible by it and --mpi-testing-module")
    extra = [(f, s) for f in ("libzero_gloo", "libzero_noarena") for s in (1, 2, 3)]  # with --only
    extra += [("compute_only", 0)]  # with --only and a 0 in --stages: the floor of any framework's step
    with open(args.config) as f:
        config = json.load(f)
    if isinstance(config.get("train_batch_size"), int):  # the same micro-batch per rank at any rank count
        wanted = config["train_micro_batch_size_per_gpu"] * config.get("gradient_accumulation_steps", 1) * args.ranks
        if wanted != config["train_batch_size"]:
            config["train_batch_size"] = wanted
            scaled = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
            json.dump(config, scaled)
            scaled.close()
            args.config = scaled.name
    stages = {int(s) for s in args.stages.split(",")}
    runs = [r for r in RUNS + extra
            if ((r in RUNS and not args.only) or r[0] in args.only.split(",")) and r[1] in stages]
    results: dict[tuple[str, int], list[dict]] = {r: [] for r in runs}
    for rep in range(args.repeats):
        order = runs if rep % 2 == 0 else list(reversed(runs))
        for framework, stage in order:
            with tempfile.TemporaryDirectory() as out:
                r = launch(framework, stage, args, out)
            if r is not None:
                results[(framework, stage)].append(r)
                print(f"  repeat {rep}: {framework} stage {stage}: {r['tokens_per_s']:.0f} tokens/s, "
                      f"{r['peak_rss_mib']:.0f} MiB ({r['train_mib']:.0f} above imports), step {r['opt_ms']:.1f} ms, loss {r['loss']:.4f}", flush=True)

    def med(key: str, rs: list[dict]) -> float:
        return statistics.median(r[key] for r in rs)

    print()
    print("| framework | ZeRO stage | tokens/s | peak RSS per rank (MiB) | of which above imports (MiB) | "
          f"optimizer step (ms) | loss after {args.warmup + args.steps} steps |")
    print("|---|---|---|---|---|---|---|")
    for (framework, stage), rs in results.items():
        if not rs:
            print(f"| {NAMES[framework]} | {stage} | failed | | | | |")
            continue
        print(f"| {NAMES[framework]} | {stage} | {med('tokens_per_s', rs):.0f} | {med('peak_rss_mib', rs):.0f} | "
              f"{med('train_mib', rs):.0f} | "
              f"{med('opt_ms', rs):.1f} | {med('loss', rs):.4f} |")
    base = {s: results.get(("libzero", s)) for s in (1, 2, 3)}
    print()
    for (framework, stage), rs in results.items():
        if framework == "libzero" or not rs or not base.get(stage):
            continue
        b = base[stage]
        if framework.startswith("libzero"):
            print(f"{NAMES[framework]} stage {stage} vs libzero under mpirun: tokens/s "
                  f"x{med('tokens_per_s', rs) / med('tokens_per_s', b):.2f}, peak RSS "
                  f"x{med('peak_rss_mib', rs) / med('peak_rss_mib', b):.2f}, "
                  f"loss difference {abs(med('loss', b) - med('loss', rs)):.2e}")
            continue
        print(f"libzero stage {stage} vs {NAMES[framework]}: tokens/s x{med('tokens_per_s', b) / med('tokens_per_s', rs):.2f}, "
              f"peak RSS x{med('peak_rss_mib', b) / med('peak_rss_mib', rs):.2f} "
              f"(above imports x{med('train_mib', b) / med('train_mib', rs):.2f}), "
              f"optimizer step x{med('opt_ms', rs) / med('opt_ms', b):.2f} faster, "
              f"loss difference {abs(med('loss', b) - med('loss', rs)):.2e}")


if __name__ == "__main__":
    main()
