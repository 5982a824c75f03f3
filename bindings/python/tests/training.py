"""A small model registered the way an outside user would: odd sizes, units interleaved with registration order, an
unused param, and gradients chosen so that every sum is exact (results are then comparable bit for bit)."""

from __future__ import annotations

import numpy as np

import libzero

# (name, shape, unit); units are numbered in forward order, registration order is not that order.
LAYOUT = [
    ("head.w", (3, 5), 2),
    ("embed", (7,), 0),
    ("block.w", (11, 3), 1),
    ("block.b", (1,), 1),
    ("unused", (5,), 0),  # never gets a gradient
    ("head.b", (13,), 2),
]
UNITS = 3
UNUSED = "unused"


def config(stage: int, gas: int, world: int, dtype: str = "fp32", clip: float = 0.0) -> dict:
    cfg = {
        "train_batch_size": gas * world,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": clip,
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 16, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
        "libzero": {"timeout_s": 60},
    }
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def initial(name: str, shape: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(shape))
    seed = sum(ord(c) for c in name)
    return (((np.arange(n) * 5 + seed) % 13 - 6) / 8.0).astype(np.float32).reshape(shape)


def gradient(name: str, shape: tuple[int, ...], micro: int, rank: int) -> np.ndarray:
    """Multiples of 1/16 in [-1/2, 1/2]: exact in bf16, and any sum of a dozen of them is exact in fp32."""
    n = int(np.prod(shape))
    seed = sum(ord(c) for c in name)
    return (((np.arange(n) * 3 + seed + micro * 7 + rank * 5) % 17 - 8) / 16.0).astype(np.float32).reshape(shape)


def register(engine: libzero.Engine) -> dict[str, int]:
    ids = {}
    for name, shape, unit in LAYOUT:
        ids[name] = engine.add_param(name, shape, unit=unit, init=initial(name, shape))
    engine.finalize()
    return ids


def micro_step(engine: libzero.Engine, ids: dict[str, int], grads_of: "callable") -> None:
    """Forward through the units in order, backward in reverse, adding gradients and declaring them ready."""
    for u in range(UNITS):
        with engine.gathered(u):
            pass
    for u in reversed(range(UNITS)):
        with engine.gathered(u):
            for name, shape, unit in LAYOUT:
                if unit != u or name == UNUSED:
                    continue
                g = engine.grad(ids[name])
                g += grads_of(name, shape).astype(g.dtype)
                engine.grad_ready(ids[name])
    engine.backward_end()


def train(engine: libzero.Engine, steps: int, gas: int, world: int, rank: int) -> list[libzero.StepResult]:
    """`steps` optimizer steps of `gas` micro-steps on this rank. A one-rank engine with gas = world x G and rank
    -1 stands for every rank: micro-step j then adds rank j % world's gradient of micro-step j // world."""
    ids = register(engine)
    results = []
    for s in range(steps):
        for m in range(gas):
            if rank >= 0:
                micro_step(engine, ids, lambda name, shape: gradient(name, shape, s * gas + m, rank))
            else:
                r, j = m % world, m // world
                micro_step(engine, ids, lambda name, shape: gradient(name, shape, s * (gas // world) + j, r))
        results.append(engine.step())
    return results


def weights(engine: libzero.Engine) -> dict[str, bytes]:
    out = {}
    for u in range(UNITS):
        with engine.gathered(u):
            for name, _, unit in LAYOUT:
                if unit == u:
                    out[name] = engine.param(name).tobytes()
    return out
