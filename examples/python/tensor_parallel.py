"""ZeRO beside Megatron-style tensor parallelism: a GPT whose attention and MLP are split across tensor-parallel ranks
(column-parallel linears, row-parallel linears, a vocab-parallel embedding and head, LayerNorms whole on every
tensor-parallel rank), trained through libzero on the data-parallel dimension. It learns to copy a sequence of
random tokens shifted by one.

    torchrun --standalone --nproc-per-node 4 examples/python/tensor_parallel.py --tp 2 [--stage 3] [--steps 200]

The ranks form a grid: tensor-parallel rank = rank % tp, data-parallel rank = rank // tp (Megatron-LM's order). The
engine is given DeepSpeed's ``mpu`` (``libzero.deepspeed.initialize(mpu=...)``): ZeRO shards over the data-parallel
group, and the gradient norm, the clip and the non-finite skip span the whole job. The tensor-parallel collectives
of the forward and backward are torch.distributed's, over gloo.
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import libzero.deepspeed


class ModelParallelUnit:
    """Megatron's ``mpu`` for a grid of ``tp`` tensor-parallel by world / tp data-parallel ranks (no pipeline)."""

    def __init__(self, tp: int) -> None:
        world, rank = dist.get_world_size(), dist.get_rank()
        if world % tp != 0:
            raise ValueError(f"--tp {tp} does not divide the {world} ranks")
        self.tp, self.dp = tp, world // tp
        # new_group is collective: every rank creates every group, in one order.
        for d in range(self.dp):
            group = dist.new_group(list(range(d * tp, (d + 1) * tp)), backend="gloo")
            if rank // tp == d:
                self.model_group = group
        for t in range(tp):
            group = dist.new_group(list(range(t, world, tp)), backend="gloo")
            if rank % tp == t:
                self.data_group = group

    def get_model_parallel_group(self):
        return self.model_group

    def get_data_parallel_group(self):
        return self.data_group

    def get_tensor_model_parallel_group(self):
        return self.model_group

    def get_tensor_model_parallel_rank(self) -> int:
        return dist.get_rank(self.model_group)

    def get_model_parallel_world_size(self) -> int:
        return self.tp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


class _CopyToTensorParallel(torch.autograd.Function):
    """Identity forward; the gradient summed over the tensor-parallel ranks (Megatron's copy_to_..._region)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """The partial results summed over the tensor-parallel ranks; identity backward (reduce_from_..._region)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTensorParallel(torch.autograd.Function):
    """The last dimension's parts concatenated in rank order; backward keeps this rank's part."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        size, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return grad.chunk(size, dim=-1)[rank].contiguous(), None


def _split(param: nn.Parameter, dim: int, stride: int = 1) -> nn.Parameter:
    """Marks a param split along ``dim`` across tensor-parallel ranks, as Megatron does; with ``stride`` the whole
    param stacks that many blocks along ``dim`` (qkv: q, k and v), each split alike."""
    param.tensor_model_parallel = True
    param.partition_dim = dim
    param.partition_stride = stride
    return param


def part_of(value: torch.Tensor, param: nn.Parameter, size: int, rank: int) -> torch.Tensor:
    """This rank's part of a whole param's ``value``: its slice of each stride block along ``partition_dim``."""
    if not getattr(param, "tensor_model_parallel", False):
        return value
    dim, stride = param.partition_dim, getattr(param, "partition_stride", 1)
    blocks = value.chunk(stride, dim=dim)
    return torch.cat([block.chunk(size, dim=dim)[rank] for block in blocks], dim=dim)


class ColumnParallelLinear(nn.Module):
    """y = x A^T + b with A's rows (the outputs) split: each rank computes its part of the outputs."""

    def __init__(self, inputs: int, outputs: int, group, size: int, stride: int = 1) -> None:
        super().__init__()
        self.group = group
        self.weight = _split(nn.Parameter(torch.empty(outputs // size, inputs)), 0, stride)
        self.bias = _split(nn.Parameter(torch.zeros(outputs // size)), 0, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.group is not None:
            x = _CopyToTensorParallel.apply(x, self.group)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = x A^T + b with A's columns (the inputs) split: partial products summed over the ranks, then the bias,
    which every rank holds whole."""

    def __init__(self, inputs: int, outputs: int, group, size: int) -> None:
        super().__init__()
        self.group = group
        self.weight = _split(nn.Parameter(torch.empty(outputs, inputs // size)), 1)
        self.bias = nn.Parameter(torch.zeros(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.group is not None:
            y = _ReduceFromTensorParallel.apply(y, self.group)
        return y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a contiguous slice of the vocabulary's rows; tokens outside it look up zeros, and the ranks'
    lookups are summed."""

    def __init__(self, vocab: int, width: int, group, size: int, rank: int) -> None:
        super().__init__()
        self.group = group
        self.first, self.rows = rank * (vocab // size), vocab // size
        self.weight = _split(nn.Parameter(torch.empty(self.rows, width)), 0)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        local = tokens - self.first
        outside = (local < 0) | (local >= self.rows)
        y = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.group is not None:
            y = _ReduceFromTensorParallel.apply(y, self.group)
        return y


class Block(nn.Module):
    def __init__(self, width: int, heads: int, group, size: int) -> None:
        super().__init__()
        self.heads = heads // size  # this rank's attention heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = ColumnParallelLinear(width, 3 * width, group, size, stride=3)  # q, k, v of this rank's heads
        self.proj = RowParallelLinear(width, width, group, size)
        self.up = ColumnParallelLinear(width, 4 * width, group, size)
        self.down = RowParallelLinear(4 * width, width, group, size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.proj(a)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TensorParallelGPT(nn.Module):
    """The model as one tensor-parallel rank holds it (``group`` None and ``size`` 1: the whole model)."""

    def __init__(self, vocab=32, width=32, heads=4, layers=2, context=16, group=None, size=1, rank=0) -> None:
        super().__init__()
        self.group = group
        self.embed = VocabParallelEmbedding(vocab, width, group, size, rank)
        self.position = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(Block(width, heads, group, size) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = ColumnParallelLinear(width, vocab, group, size)  # logits split by vocabulary

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if self.group is not None:
            logits = _GatherFromTensorParallel.apply(logits, self.group)
        return logits


def whole_init(model: TensorParallelGPT, seed: int = 0) -> dict[str, torch.Tensor]:
    """The whole model's initial values by name, the same on every rank."""
    size = _size(model)
    whole = TensorParallelGPT(
        vocab=model.head.weight.shape[0] * size,
        width=model.position.shape[1],
        heads=model.blocks[0].heads * size,
        layers=len(model.blocks),
        context=model.position.shape[0],
    )
    generator = torch.Generator().manual_seed(seed)
    values = {}
    for name, p in whole.named_parameters():
        if p.dim() > 1:  # matrices: small random values; LayerNorm weights 1; biases 0
            values[name] = torch.randn(p.shape, generator=generator) * 0.02
        else:
            values[name] = torch.full(p.shape, 1.0 if "ln" in name and name.endswith("weight") else 0.0)
    return values


def _size(model: TensorParallelGPT) -> int:
    return dist.get_world_size(model.group) if model.group is not None else 1


def load_part(model: TensorParallelGPT, whole: dict[str, torch.Tensor]) -> None:
    """Each param takes its tensor-parallel part of the whole model's value (``part_of``)."""
    size = _size(model)
    rank = dist.get_rank(model.group) if model.group is not None else 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(part_of(whole[name], p, size, rank))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--stage", type=int, default=1)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    mpu = ModelParallelUnit(args.tp)
    tp_rank = mpu.get_tensor_model_parallel_rank()
    model = TensorParallelGPT(group=mpu.model_group, size=args.tp, rank=tp_rank)
    load_part(model, whole_init(model))
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
        "zero_optimization": {"stage": args.stage},
    }
    engine, _, _, _ = libzero.deepspeed.initialize(model=model, config=config, mpu=mpu)
    # Every tensor-parallel rank of a replica must see the same batch; the replicas see different ones.
    data = torch.Generator().manual_seed(1000 + dist.get_rank(mpu.data_group))
    first = last = None
    for step in range(args.steps):
        tokens = torch.randint(0, 32, (8, 17), generator=data)
        logits = engine(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 32), torch.roll(tokens[:, :-1], 1, dims=1).reshape(-1))
        engine.backward(loss)
        engine.step()
        first = loss.item() if first is None else first
        last = loss.item()
    if dist.get_rank() == 0:
        print(
            f"tensor-parallel GPT: {args.tp} tensor-parallel x {mpu.dp} data-parallel ranks, ZeRO stage {args.stage}: "
            f"loss {first:.3f} -> {last:.3f} in {args.steps} steps (uniform guess: {math.log(32):.3f})"
        )
    engine.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
