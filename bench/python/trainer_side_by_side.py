"""The Hugging Face Trainer on libzero against the Trainer on DeepSpeed 0.19 (ZeRO 1, 2, 3), in one run: tokens/s and
peak resident memory per rank, 2 ranks under torchrun on CPU (bench/README.md, "The Hugging Face Trainer").

    python bench/python/trainer_side_by_side.py [--layers 6] [--width 512] [--ranks 2] [--steps 16] [--repeats 3]

The same script runs both, the import changed (``from transformers import ...`` with DeepSpeed, ``from
libzero.transformers import ...``): a Llama built from a config (no download), generated token sequences, the
DeepSpeed config with "auto" values, bf16, gradient accumulation 2, AdamW with the Trainer's linear schedule. Each
run's tokens/s counts the steps after the first two (warm-up) by the wall clock of rank 0 between a callback's
step ends; peak memory is each rank's VmHWM above what it had after importing. Runs of the two frameworks alternate
stage by stage, and the medians of ``--repeats`` paired runs are printed with the ratios."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def worker(args: argparse.Namespace) -> None:
    import torch
    import transformers

    torch.set_num_threads(1)
    if args.framework == "deepspeed":
        import deepspeed  # noqa: F401 - imported before the baseline, as libzero is

        mod = transformers
    else:
        import libzero.transformers as mod
    base = status_kib("VmRSS")

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return args.steps * 2 * args.batch * args.ranks

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            start = torch.randint(0, args.vocab, (1,), generator=torch.Generator().manual_seed(i))
            ids = (start + torch.arange(args.seq) * 7) % args.vocab
            return {"input_ids": ids, "labels": ids.clone()}

    times: list[float] = []

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, *_: object, **__: object) -> None:
            times.append(time.perf_counter())

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.width, intermediate_size=args.width * 8 // 3,
                                   num_hidden_layers=args.layers, num_attention_heads=args.width // 64,
                                   num_key_value_heads=args.width // 64, max_position_embeddings=args.seq)
    model = transformers.LlamaForCausalLM(cfg)
    ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
          "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
          "zero_optimization": {"stage": args.stage, "reduce_bucket_size": "auto",
                                "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}}
    targs = mod.TrainingArguments(output_dir=os.path.join(args.out, "run"), deepspeed=ds,
                                  per_device_train_batch_size=args.batch, gradient_accumulation_steps=2,
                                  max_steps=args.steps, learning_rate=1e-3, bf16=True, use_cpu=True, report_to=[],
                                  save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0)
    trainer = mod.Trainer(model=model, args=targs, train_dataset=Tokens(), callbacks=[Clock()])
    trainer.train()
    rank = targs.process_index
    timed = times[2:]
    tokens = (len(timed) - 1) * 2 * args.batch * args.seq * args.ranks
    result = {"rank": rank, "peak_kib": status_kib("VmHWM") - base,
              "tokens_per_s": tokens / (timed[-1] - timed[0]) if len(timed) > 1 else 0.0}
    with open(os.path.join(args.out, f"{args.framework}-s{args.stage}-rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stages", default="1,2,3")
    ap.add_argument("--framework", help=argparse.SUPPRESS)
    ap.add_argument("--stage", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.framework:
        worker(args)
        return
    import torch
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.width, intermediate_size=args.width * 8 // 3,
                                   num_hidden_layers=args.layers, num_attention_heads=args.width // 64,
                                   num_key_value_heads=args.width // 64, max_position_embeddings=args.seq)
    with torch.device("meta"):
        psi = sum(p.numel() for p in transformers.LlamaForCausalLM(cfg).parameters())
    work = tempfile.mkdtemp(prefix="libzero-trainer-bench-")
    env = dict(os.environ, DS_ACCELERATOR="cpu", DS_BUILD_OPS="0", OMP_NUM_THREADS="1")
    common = [os.path.abspath(__file__), "--out", work, "--layers", str(args.layers), "--width", str(args.width),
              "--vocab", str(args.vocab), "--seq", str(args.seq), "--batch", str(args.batch), "--ranks",
              str(args.ranks), "--steps", str(args.steps)]
    print(f"Llama {args.layers} x {args.width}, {psi / 1e6:.1f} M params, bf16, {args.ranks} ranks under torchrun "
          f"(gloo), micro-batch {args.batch} x {args.seq} tokens, accumulation 2, {args.steps} steps (the first 2 "
          f"untimed), medians of {args.repeats} paired runs")
    print(f"{'stage':>5} {'':10} {'tokens/s':>9} {'peak RSS/rank':>14}   libzero / DeepSpeed: tokens/s, memory")
    for stage in [int(s) for s in args.stages.split(",")]:
        figures: dict[str, list[tuple[float, float]]] = {"libzero": [], "deepspeed": []}
        for _ in range(args.repeats):
            for framework in ("deepspeed", "libzero"):
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                       str(args.ranks)] + common + ["--framework", framework, "--stage", str(stage)]
                for attempt in (1, 2):  # a torchrun start now and then fails to rendezvous: once more
                    run = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                    if run.returncode == 0:
                        break
                    if attempt == 2:
                        sys.exit(f"{framework} at stage {stage} failed:\n{run.stderr[-3000:]}")
                ranks = [json.load(open(os.path.join(work, f"{framework}-s{stage}-rank{r}.json"), encoding="utf-8"))
                         for r in range(args.ranks)]
                figures[framework].append((ranks[0]["tokens_per_s"], max(r["peak_kib"] for r in ranks) / 1024))
        med = {f: (statistics.median(t for t, _ in v), statistics.median(m for _, m in v)) for f, v in figures.items()}
        for framework in ("deepspeed", "libzero"):
            tps, mem = med[framework]
            tail = (f"   {tps / med['deepspeed'][0]:.2f}x, {mem / med['deepspeed'][1]:.2f}x"
                    if framework == "libzero" else "")
            print(f"{stage:>5} {framework:10} {tps:9.0f} {mem:10.0f} MiB{tail}")


if __name__ == "__main__":
    main()
