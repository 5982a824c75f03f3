"""Work only rank 0 does (writing a file) made collective: every rank waits for rank 0 to finish and learns whether it
failed, so a failed write is an error on every rank, never a rank that reads a file that is not there or one that
waits forever."""

from __future__ import annotations

import numpy as np

from ..engine import Engine

_MESSAGE_BYTES = 4096


def share_outcome(engine: Engine, error: BaseException | None) -> None:
    """Collective over ``engine``'s communicator: rank 0's ``error`` (None: it succeeded) reaches every rank, which
    raises it (rank 0: the error itself; the others: a RuntimeError with its text). The bytes cross as the initial
    value of a one-unit stage-0 engine, whose finalize broadcasts rank 0's values under the engine's timeout."""
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
    with Engine(cfg, engine._comm) as carrier:
        carrier.add_param("rank0.outcome", (_MESSAGE_BYTES,), init=status if carrier.rank == 0 else None, frozen=True,
                          dtype="uint8")
        carrier.finalize()
        with carrier.gathered(0):
            received = np.array(carrier.param(0), copy=True)
    if error is not None:
        raise error
    if received[0] != 0:
        message = bytes(received[1:]).rstrip(b"\0").decode(errors="replace")
        raise RuntimeError(f"rank 0 failed: {message}")
