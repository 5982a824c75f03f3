"""What rank 0 alone holds or does, made every rank's: its bytes of tensors the engine does not hold (buffers), and
work only it does (writing a file), which every rank waits for and learns the outcome of, so a failed write is an
error on every rank, never a rank that reads a file that is not there or one that waits forever."""

from __future__ import annotations

import numpy as np
import torch

from ..engine import Engine
from ..errors import ZeroError
from .tensors import host_bytes

_MESSAGE_BYTES = 4096


def share_outcome(engine: Engine, error: BaseException | None, what: str) -> None:
    """Collective over ``engine``'s communicator: rank 0's ``error`` (None: it succeeded) reaches every rank, which
    raises it (rank 0: the error itself; the others: a RuntimeError with its text). The bytes cross as the initial
    value of a one-unit stage-0 engine, whose finalize broadcasts rank 0's values under the engine's timeout; an
    error of that exchange (a rank elsewhere: ranks that diverged) names ``what`` the ranks were doing."""
    if engine.world_size == 1:
        if error is not None:
            raise error
        return
    text = b"" if error is None else f"{type(error).__name__}: {error}".encode()[: _MESSAGE_BYTES - 1]
    status = np.zeros(_MESSAGE_BYTES, np.uint8)
    status[0] = 0 if error is None else 1
    status[1 : 1 + len(text)] = np.frombuffer(text, np.uint8)
    cfg = {
        "train_batch_size": engine.world_size,
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 0},
        "optimizer": {"type": "SGD", "params": {"lr": 0}},
        "libzero": {"timeout_s": engine.info["timeout_s"]},
    }
    try:
        with Engine(cfg, engine._comm) as carrier:
            carrier.add_param("rank0.outcome", (_MESSAGE_BYTES,), init=status if carrier.rank == 0 else None,
                              frozen=True, dtype="uint8")
            carrier.finalize()
            with carrier.gathered(0):
                received = np.array(carrier.param(0), copy=True)
    except ZeroError as e:
        raise type(e)(f"{what}: while every rank learnt rank 0's outcome (collective: every rank must call "
                      f"{what}): {e.message}", e.status) from e
    if error is not None:
        raise error
    if received[0] != 0:
        message = bytes(received[1:]).rstrip(b"\0").decode(errors="replace")
        raise RuntimeError(f"rank 0 failed: {message}")


def broadcast_from_rank0(engine: Engine, tensors: list[torch.Tensor]) -> None:
    """Rank 0's bytes of ``tensors`` (buffers) on every rank, as DeepSpeed broadcasts the module at initialisation:
    through a throwaway stage-3 engine on ``engine``'s communicator, each tensor a frozen param of a unit of its own
    (its bytes as they are, whatever the dtype: no NaN rewritten, no fp32 detour; a shard and one unit at a time).
    Collective."""
    if engine.world_size == 1 or not tensors:
        return
    cfg = {
        "train_batch_size": engine.world_size,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_clipping": 0,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "SGD", "params": {"lr": 0}},
        "libzero": {"timeout_s": engine.info["timeout_s"]},
    }
    with Engine(cfg, engine._comm) as carrier:
        for k, t in enumerate(tensors):
            init = host_bytes(t) if carrier.rank == 0 else None
            carrier.add_param(f"buffer.{k}", (t.numel() * t.element_size(),), unit=k, init=init, frozen=True,
                              dtype="uint8")
        carrier.finalize()
        for k, t in enumerate(tensors):
            with carrier.gathered(k):
                received = torch.from_dlpack(carrier.param(k))
                t.data.reshape(-1).view(torch.uint8).copy_(received)
