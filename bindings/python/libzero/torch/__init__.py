"""libzero for PyTorch models, in the spirit of ``deepspeed.initialize``.

    engine = libzero.torch.initialize(model, "ds_config.json")
    for batch in data:
        loss = engine(batch)        # the model's forward
        engine.backward(loss)       # gradients go into libzero's buffers as autograd produces them
        engine.step()               # the optimizer step at the accumulation boundary

What happens to the model (docs/python.md has the whole story):

- params with ``requires_grad`` are registered with the engine (rank 0's values); frozen params and floating-point
  buffers get rank 0's values too and, with a bf16/fp16 config, that dtype (DeepSpeed casts the module likewise);
- stages 0-2: every trained ``param.data`` is a tensor over libzero's own parameter memory (DLPack, no copy);
  ``zero_step`` writes the new values there;
- stage 3: a unit is gathered before the first module owning its params runs, its values copied into tensors the
  model computes with; a unit whose params are exactly one module's (a ``ModuleList`` block) is released after
  that module's forward, and autograd keeps, instead of those tensors, where to find them again: backward
  gathers the unit anew when it needs it (a saved-tensor hook), and releases it when its last gradient is in.
  Released params show an empty placeholder (shape [0]), as DeepSpeed's do;
- gradients: a post-accumulate-grad hook adds each param's gradient into ``engine.grad(i)``, drops
  ``param.grad`` and declares it ready, so stages 2-3 reduce buckets while backward goes on.

Units (stage 3's gather granularity): by default each element of the outermost ``torch.nn.ModuleList``s is a unit
and the other params form one unit each side of them (before the first block, after the last), numbered in
registration order; ``units=fn(name, param) -> key`` groups params by any key instead.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

from ..comm import Comm
from ..engine import ConfigLike, Engine
from .config import engine_config, optimizer_block
from .engine import TorchEngine
from .gathered import GatheredParameters
from .loading import StateDictLike
from .model_parallel import (
    duplicate_rule,
    group_comm,
    refuse_unknown_layout,
    refuse_unsupported_params,
    resolve_groups,
)
from .process_group import ProcessGroupComm, default_comm
from .stage3 import Stage3Engine
from .units import default_units

# The package's private names, importable from libzero.torch as well (where tests and tools look for them).
from .config import _TORCH_DTYPE, _UNSUPPORTED_OPTIONS, _group_overrides  # noqa: F401
from .process_group import _ProcessGroupTransport  # noqa: F401
from .stage3 import _Saved  # noqa: F401

__all__ = [
    "initialize",
    "TorchEngine",
    "Stage3Engine",
    "GatheredParameters",
    "ProcessGroupComm",
    "default_comm",
    "optimizer_block",
    "default_units",
]


def initialize(
    model: torch.nn.Module,
    config: ConfigLike,
    comm: Comm | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    units: Callable[[str, torch.nn.Parameter], Hashable] | None = None,
    state_dict: StateDictLike | None = None,
    lr_scheduler: Any = None,
    *,
    dp_group: Any = None,
    mp_group: Any = None,
    tp_group: Any = None,
    mpu: Any = None,
    model_parallel_duplicate: Callable[[str, torch.nn.Parameter], bool] | None = None,
) -> TorchEngine:
    """Trains ``model`` with libzero as ``config`` says (a DeepSpeed config: dict, JSON text or path). Without an
    ``optimizer`` block the hyper-parameters come from ``optimizer`` (AdamW, Adam, Adagrad, SGD), as DeepSpeed takes a
    client optimizer. ``comm`` by default: torch.distributed's default group when it is initialised (torchrun; a
    gloo group beside it when the default is NCCL), else MPI_COMM_WORLD under an MPI launcher, else one process.

    ``state_dict``: the initial values of the params and buffers it names (a mapping of names to tensors, or a
    safetensors file or Hugging Face directory; a PEFT model's params are found under the base model's names too),
    which rank 0 writes after the engine allocated its shards, one unit at a time: build the model with its params
    on the meta device (``with accelerate.init_empty_weights(): model = ...``, which leaves buffers real) on every rank
    and pass the same ``state_dict`` everywhere, and no rank needs more than its shards and one unit. Without it,
    rank 0's model gives the values (the other ranks may build theirs on the meta device).

    ``lr_scheduler``: a torch scheduler of ``optimizer`` (when the config has no ``scheduler`` block), stepped after
    every optimizer step taken, its rates handed to the engine (DeepSpeed's client scheduler).

    Tensor and pipeline parallelism (docs/python.md, "ZeRO with tensor and pipeline parallelism"): ``dp_group`` and
    ``mp_group`` with ``tp_group`` (torch.distributed groups or libzero communicators), or DeepSpeed's ``mpu``: the
    engine runs over the data-parallel group, and the gradient norm, clip and non-finite skip span the model-parallel
    one. A param without Megatron's ``tensor_model_parallel`` attribute is a duplicate on tensor-parallel ranks other
    than 0 (left out of the norm there), as is one marked ``shared``; ``model_parallel_duplicate(name, param)``
    decides instead. ``dp_group`` alone: ZeRO over that group, without model parallelism.

    Returns a :class:`Stage3Engine` at stage 3, a :class:`TorchEngine` below (``libzero.deepspeed.initialize``
    returns DeepSpeed's 4-tuple instead)."""
    groups_mp = resolve_groups(comm, dp_group, mp_group, tp_group, mpu)
    mp_comm = None
    if groups_mp is None:
        if dp_group is not None:
            comm = group_comm(dp_group)
        refuse_unknown_layout(model, comm)
        comm = comm if comm is not None else default_comm()
    else:
        duplicate = duplicate_rule(groups_mp, model_parallel_duplicate)
        refuse_unsupported_params(model)
        # Both communicators before the engine: building one may be collective over the whole job (a gloo twin of an
        # NCCL group), and a rank whose engine creation failed would leave the others in it.
        comm = group_comm(groups_mp.dp)
        mp_comm = group_comm(groups_mp.mp)
    cfg, groups = engine_config(config, optimizer)
    engine = Engine(cfg, comm)
    if mp_comm is not None:
        try:
            engine.set_model_parallel(mp_comm)
        except BaseException:
            engine.close()
            raise
    # The stage as the engine read it (libzero's parser, its defaults and spellings), not as the config text says.
    cls = Stage3Engine if int(engine.info["stage"]) == 3 else TorchEngine
    out = cls.__new__(cls)  # not cls(...): that would create a second engine
    out._start(model, engine, units, groups, state_dict, optimizer, lr_scheduler, "scheduler" in cfg,
               duplicate_rule(None, model_parallel_duplicate) if mp_comm is None else duplicate)
    return out
