"""The GPT of examples/gpt, rebuilt in plain torch and trained through libzero.torch: two-digit additions written
with the sum's digits reversed ("07+48=550" is 7 + 48 = 55), byte-level, loss on the answers only, one problem per
sequence (the context of 10 bytes; a longer one packs several lines, and learned absolute positions must then learn
the sum at every line's place separately). Each rank trains on its own problems; held-out problems are answered
greedily at the end.

    mpirun --allow-run-as-root --oversubscribe -np 2 python examples/python/train_gpt.py [--stage 3] [--steps 1500]

Runs in one process without mpirun too, and under torchrun (after which it uses torch.distributed's gloo group).
--device cuda trains on the GPU (libzero's device engine; under torchrun its data host-staged over shared memory, or
over NCCL with ZERO_TORCH_TRANSPORT=nccl).
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

import libzero
import libzero.torch

LINE = 10  # "07+48=550\n"
ANSWER_AT = 6


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(c, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers: int, width: int, heads: int, context: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(256, width)
        self.pos = nn.Parameter(torch.randn(context, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2 and name != "pos":
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "down.weight")) else 0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1), ignore_index=-1)


def problems(generator: torch.Generator, count: int) -> list[str]:
    ab = torch.randint(0, 100, (count, 2), generator=generator).tolist()
    return [f"{a:02d}+{b:02d}={str(a + b).zfill(3)[::-1]}\n" for a, b in ab]


def batch(generator: torch.Generator, size: int, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    lines = context // LINE + 1
    text = ["".join(problems(generator, lines)) for _ in range(size)]
    data = torch.tensor([list(t.encode()) for t in text])[:, : context + 1]
    x, y = data[:, :-1], data[:, 1:].clone()
    column = (torch.arange(context) + 1) % LINE  # y's column within its line
    y[:, (column < ANSWER_AT) | (column > ANSWER_AT + 3)] = -1  # only the answer digits and the newline count
    return x, y


@torch.no_grad()
def answer(model: torch.nn.Module, lines: list[str], device: torch.device) -> list[str]:
    idx = torch.tensor([list(line[:ANSWER_AT].encode()) for line in lines], device=device)
    for _ in range(3):
        logits = model(idx)
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return [bytes(row[ANSWER_AT:].tolist()).decode(errors="replace") for row in idx]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=LINE)
    ap.add_argument("--micro-batch", type=int, default=96)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: the model on this process's GPU")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        torch.distributed.init_process_group("gloo")

    torch.manual_seed(0)  # every rank builds the same model; rank 0's values are the ones registered
    model = GPT(args.layers, args.width, args.heads, args.context).to(device)
    params = sum(p.numel() for p in model.parameters())  # counted now: at stage 3 they become placeholders
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    config = {
        "train_batch_size": args.micro_batch * world,
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": args.stage},
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupCosineLR",
                      "params": {"total_num_steps": args.steps, "warmup_num_steps": max(1, args.steps // 20)}},
    }
    engine = libzero.torch.initialize(model, config)
    rank = engine.engine.rank
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"{params / 1e6:.2f} M params, ZeRO stage {args.stage}, {engine.engine.world_size} ranks, "
        f"{engine.engine.device or 'cpu'} engine")
    data = torch.Generator().manual_seed(1 + rank)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        loss = engine(*(t.to(device) for t in batch(data, args.micro_batch, args.context)))
        engine.backward(loss)
        result = engine.step()
        if step % 100 == 0 or step == 1:
            say(f"step {step:4d}  loss {loss.item():.3f}  lr {result.lr:.2e}  grad norm {result.grad_norm:.2f}  "
                f"{time.perf_counter() - start:.0f} s")
    heldout = problems(torch.Generator().manual_seed(4242), 384)
    got = answer(engine, heldout, device)
    right = sum(g == line[ANSWER_AT : ANSWER_AT + 3] for g, line in zip(got, heldout))
    for line, g in list(zip(heldout, got))[:5]:
        a, b = int(line[:2]), int(line[3:5])
        say(f"  {a} + {b} = {int(g[::-1]) if g.isdigit() else g!r}" + ("" if g == line[6:9] else "   (wrong)"))
    say(f"held-out whole answers right: {right} of {len(heldout)} ({100 * right / len(heldout):.1f} %)")
    engine.close()
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
