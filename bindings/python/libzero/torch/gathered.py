"""``deepspeed.zero.GatheredParameters`` for the params of any live libzero.torch engine."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from .engine import _ENGINES, TorchEngine


def engine_of(params: list[torch.Tensor]) -> TorchEngine | None:
    """The live engine that holds any of ``params``, or None when none does; ValueError when they are spread over
    several engines."""
    found = []
    for engine in list(_ENGINES):
        if engine.engine.closed:
            continue
        held = {id(p) for p in engine._params}
        if any(id(p) in held for p in params):
            found.append(engine)
    if len(found) > 1:
        raise ValueError("the params given belong to several libzero.torch engines: gather each engine's apart")
    return found[0] if found else None


@contextlib.contextmanager
def GatheredParameters(  # noqa: N802 - DeepSpeed's spelling
    params: Any, modifier_rank: int | None = None, enabled: bool = True
) -> Iterator[None]:
    """``deepspeed.zero.GatheredParameters`` for a model libzero trains: the params' full values inside the block;
    with ``modifier_rank``, that rank's writes published to every rank at its end. Collective (see
    :meth:`TorchEngine.gathered_parameters`). ``params``: a param or an iterable of them (a generator such as
    ``module.parameters()`` too); tensors no engine holds are whole already and left alone, as DeepSpeed does."""
    listed = [params] if isinstance(params, torch.Tensor) else list(params)  # a generator is read once
    engine = engine_of(listed) if enabled else None
    if engine is None:
        yield
        return
    with engine.gathered_parameters(listed, modifier_rank):
        yield
