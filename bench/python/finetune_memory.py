"""Per-rank memory of LoRA fine-tuning at ZeRO stage 3: libzero against DeepSpeed 0.19 in one run, 2 ranks on CPU
(bench/README.md, "Fine-tuning memory").

    python bench/python/finetune_memory.py [--layers 12] [--width 1024] [--ranks 2] [--steps 3]

A Llama built from a config (bf16, no download) is saved once as a Hugging Face directory; then each framework loads
it, wraps it in PEFT LoRA (q, k, v, o projections) and trains a few steps at stage 3:
  libzero        every rank builds the model with its params on the meta device (accelerate.init_empty_weights),
                 libzero.torch.initialize(state_dict=...) allocates the shards and rank 0 writes one unit at a
                 time from the directory (its low-memory path);
  libzero-whole  every rank builds the whole model from the directory first (the simple path);
  deepspeed      transformers' DeepSpeed integration (HfDeepSpeedConfig, so from_pretrained builds under zero.Init),
                 then deepspeed.initialize.
Each rank reports the resident memory above what it had after importing (VmRSS), the peak of loading and of training
(VmHWM, reset between phases through /proc/self/clear_refs), and libzero's memory_stats; the table shows the largest
rank's figures next to the formula 2 Psi / N for the frozen base's shard."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")


def llama_config(args: argparse.Namespace):  # noqa: ANN201 - transformers' type
    import transformers

    return transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.width, intermediate_size=args.width * 8 // 3,
                                    num_hidden_layers=args.layers, num_attention_heads=args.width // 64,
                                    num_key_value_heads=args.width // 64, max_position_embeddings=64,
                                    torch_dtype="bfloat16")


def lora_config():  # noqa: ANN201
    import peft

    return peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])


def ds_config(ranks: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "train_batch_size": ranks,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 5e6,
                              "stage3_prefetch_bucket_size": 0, "stage3_max_live_parameters": 0,
                              "stage3_max_reuse_distance": 0, "overlap_comm": False},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
    }


def worker(args: argparse.Namespace) -> None:
    import torch
    import transformers

    torch.set_num_threads(1)
    import accelerate  # noqa: F401 - every import before the baseline, so that the figures are the model's
    import peft

    if args.framework == "deepspeed":
        import deepspeed
        from transformers.integrations import HfDeepSpeedConfig
    else:
        import libzero.torch as lzt
    base_rss = status_kib("VmRSS")
    reset_peak()

    ds_cfg = ds_config(args.ranks)
    if args.framework == "deepspeed":
        deepspeed.init_distributed(dist_backend="gloo")
        rank = torch.distributed.get_rank()
        keep = HfDeepSpeedConfig(ds_cfg)  # noqa: F841 - from_pretrained builds under zero.Init while it lives
        model = transformers.LlamaForCausalLM.from_pretrained(args.dir, torch_dtype=torch.bfloat16)
        model = peft.get_peft_model(model, lora_config())
        engine, *_ = deepspeed.initialize(model=model, config=ds_cfg,
                                          model_parameters=[p for p in model.parameters() if p.requires_grad])
        stats: dict = {}
    else:
        rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
        if args.framework == "libzero":
            # Params on the meta device, buffers (the rotary embedding's) real, as from_pretrained builds them.
            with accelerate.init_empty_weights():
                model = transformers.LlamaForCausalLM(llama_config(args)).to(torch.bfloat16)
            model = peft.get_peft_model(model, lora_config())
            # PEFT's adapters on the meta device too: their initial values come from rank 0 (below)
            source = args.dir
        else:
            model = transformers.LlamaForCausalLM.from_pretrained(args.dir, torch_dtype=torch.bfloat16)
            model = peft.get_peft_model(model, lora_config())
            source = None
        if source is not None:
            # The base from the directory (PEFT's names: base_model.model.<name>); the adapters are small and made
            # here, the same on every rank (seeded).
            from libzero.torch.loading import _SafetensorsFiles

            files = _SafetensorsFiles(source)
            torch.manual_seed(0)
            adapters = {n: (torch.randn(p.shape) * 0.01).to(torch.bfloat16) if "lora_A" in n
                        else torch.zeros(p.shape, dtype=torch.bfloat16)
                        for n, p in model.named_parameters() if p.requires_grad}

            class Source(dict):
                def __contains__(self, name: object) -> bool:
                    return name in adapters or str(name).removeprefix("base_model.model.") in files

                def __getitem__(self, name: str):  # noqa: ANN204
                    return adapters[name] if name in adapters else files[name.removeprefix("base_model.model.")]

                def shape(self, name: str) -> tuple[int, ...]:
                    return tuple(adapters[name].shape) if name in adapters else files.shape(
                        name.removeprefix("base_model.model."))

            source = Source()
        engine = lzt.initialize(model, ds_cfg, state_dict=source)
        stats = engine.engine.memory_stats()
    load_peak = status_kib("VmHWM") - base_rss
    after_load = status_kib("VmRSS") - base_rss
    reset_peak()
    for step in range(args.steps):
        ids = (torch.arange(args.seq) * (step + 3 + rank)) % args.vocab
        out = engine(input_ids=ids[None], labels=ids[None])
        engine.backward(out.loss)
        engine.step()
    train_peak = status_kib("VmHWM") - base_rss
    result = {"rank": rank, "load_peak_kib": load_peak, "after_load_kib": after_load, "train_peak_kib": train_peak,
              "frozen_param_bytes": stats.get("frozen_param_bytes", 0), "gathered_bytes": stats.get("gathered_bytes", 0),
              "total_bytes": stats.get("total_bytes", 0), "loss": float(out.loss)}
    with open(os.path.join(args.out, f"{args.framework}-rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)
    if args.framework == "deepspeed":
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    else:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--framework", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.framework:
        worker(args)
        return
    import torch
    import transformers

    work = tempfile.mkdtemp(prefix="libzero-finetune-memory-")
    model_dir = os.path.join(work, "model")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config(args)).to(torch.bfloat16)
    psi = sum(p.numel() for p in model.parameters())
    model.save_pretrained(model_dir)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    del model
    base = [sys.executable, os.path.abspath(__file__), "--dir", model_dir, "--out", work, "--ranks", str(args.ranks),
            "--steps", str(args.steps), "--layers", str(args.layers), "--width", str(args.width), "--vocab",
            str(args.vocab), "--seq", str(args.seq)]
    env = dict(os.environ, DS_ACCELERATOR="cpu", DS_BUILD_OPS="0", OMP_NUM_THREADS="1")
    runs = {
        "libzero": [args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(args.ranks)] + base
        + ["--framework", "libzero"],
        "libzero-whole": [args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(args.ranks)] + base
        + ["--framework", "libzero-whole"],
        "deepspeed": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                      str(args.ranks)] + base[1:] + ["--framework", "deepspeed"],
    }
    mib = 1024.0
    formula = 2 * psi / args.ranks / 2**20
    print(f"Llama {args.layers} x {args.width}, {psi / 1e6:.1f} M params in bf16 ({2 * psi / 2**20:.0f} MiB), "
          f"LoRA r=8 on q/k/v/o, stage 3, {args.ranks} ranks; one layer {2 * layer / 2**20:.1f} MiB; "
          f"formula 2 Psi / N = {formula:.1f} MiB")
    print(f"{'':15} {'load peak (rank 0 / others)':>28} {'after load':>11} {'train peak':>11} {'frozen shard':>13} "
          f"{'vs formula':>11}")
    for name, cmd in runs.items():
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            print(f"{name}: failed: " + " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-5:]))
            continue
        ranks = [json.load(open(os.path.join(work, f"{name}-rank{r}.json"), encoding="utf-8"))
                 for r in range(args.ranks)]
        worst = {k: max(r[k] for r in ranks) for k in ("load_peak_kib", "after_load_kib", "train_peak_kib",
                                                        "frozen_param_bytes")}
        shard = worst["frozen_param_bytes"] / 2**20
        rank0 = ranks[0]["load_peak_kib"] / mib
        others = max(r["load_peak_kib"] for r in ranks[1:]) / mib if len(ranks) > 1 else rank0
        print(f"{name:15} {rank0:16.1f}M / {others:7.1f}M {worst['after_load_kib'] / mib:10.1f}M "
              f"{worst['train_peak_kib'] / mib:10.1f}M {(f'{shard:.1f}M' if shard else '-'):>13} "
              f"{(f'{shard / formula:.3f}x' if shard else '-'):>11}")


if __name__ == "__main__":
    main()
