"""One rank of one benchmark run: trains bench/python/model.py with one framework and writes its measurements to
<out>/rank<r>.json. Launched by side_by_side.py: mpirun for "libzero" (its MPI module), torchrun for the others —
"libzero_torchrun" is libzero under torchrun with its default transport there (shared memory on one machine),
"libzero_gloo" the same over torch.distributed's gloo group (ZERO_TORCH_TRANSPORT=process_group)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import batch, make_model  # noqa: E402


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", required=True, choices=["libzero", "libzero_torchrun", "libzero_gloo", "deepspeed", "zero_redundancy", "fsdp2",
                                                            "compute_only"])
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    with open(args.config) as f:
        cfg = json.load(f)
    cfg["zero_optimization"]["stage"] = args.stage
    micro = cfg["train_micro_batch_size_per_gpu"]
    lr = cfg["optimizer"]["params"]["lr"]
    wd = cfg["optimizer"]["params"]["weight_decay"]
    clip = cfg.get("gradient_clipping", 1.0)

    # `baseline`: what the process holds before the model exists (python, torch and the framework's imports).
    libzero_run = args.framework.startswith("libzero")
    if libzero_run:
        import libzero.torch

        if args.framework != "libzero":  # under torchrun
            torch.distributed.init_process_group("gloo")
            if args.framework == "libzero_gloo":
                os.environ["ZERO_TORCH_TRANSPORT"] = "process_group"
        baseline = resident_bytes()
        engine = libzero.torch.initialize(make_model(), cfg)
        rank, world = engine.engine.rank, engine.engine.world_size

    elif args.framework == "deepspeed":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        baseline = resident_bytes()
        model = make_model()
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()

    if libzero_run or args.framework == "deepspeed":  # the same three calls: libzero.torch follows DeepSpeed's loop

        def train_step(x, y):
            loss = engine(x, y)
            engine.backward(loss)
            t = time.perf_counter()
            engine.step()
            return loss, time.perf_counter() - t

    elif args.framework == "compute_only":
        # The floor under every framework's step: torch's forward and backward on this rank's micro-batch alone (no
        # communication, no optimizer; the gradients dropped), with the other ranks doing the same on their cores.
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        baseline = resident_bytes()
        model = make_model()

        def train_step(x, y):
            loss = model(x, y)
            loss.backward()
            t = time.perf_counter()
            model.zero_grad(set_to_none=True)
            return loss, time.perf_counter() - t

    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        if args.framework == "zero_redundancy":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            from torch.nn.parallel import DistributedDataParallel
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
        baseline = resident_bytes()
        model = make_model()
        if args.framework == "zero_redundancy":
            module = DistributedDataParallel(model)
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=lr, weight_decay=wd)
        else:
            mesh = init_device_mesh("cpu", (world,))
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            module = model
            opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)

        def train_step(x, y):
            loss = module(x, y)
            loss.backward()
            t = time.perf_counter()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss, time.perf_counter() - t

    step_times, opt_times, losses = [], [], []
    for s in range(args.warmup + args.steps):
        x, y = batch(s, rank, micro)
        t0 = time.perf_counter()
        loss, t_opt = train_step(x, y)
        dt = time.perf_counter() - t0
        losses.append(float(loss.detach()))
        if s >= args.warmup:
            step_times.append(dt)
            opt_times.append(t_opt)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(
            {
                "rank": rank,
                "world": world,
                "step_times": step_times,
                "opt_times": opt_times,
                "losses": losses,
                "tokens_per_step": micro * x.shape[1],
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "baseline_rss_bytes": baseline,
                "median_step_s": statistics.median(step_times),
            },
            f,
        )
    if args.framework != "libzero":
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
