"""ZeRO beside tensor and pipeline parallelism: the data- and model-parallel groups ``initialize`` takes (process groups,
libzero communicators, or DeepSpeed's ``mpu``), and which params are duplicates of another model-parallel rank's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..comm import Comm
from .process_group import ProcessGroupComm, _machine_id, _shm_comm

GroupLike = Any  # a torch.distributed ProcessGroup or a libzero Comm

# Megatron-LM's attribute on the params it splits across tensor-parallel ranks (set_tensor_model_parallel_attributes).
TENSOR_PARALLEL_ATTRIBUTE = "tensor_model_parallel"


def _gloo_twin(dist: Any, group: Any) -> Any:
    """A gloo group of the same ranks as ``group`` (libzero moves host buffers; NCCL cannot). ``new_group`` is
    collective over the whole job, so every rank creates every group, in one order: each rank's members are
    gathered first."""
    members = sorted(dist.get_process_group_ranks(group))
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, members)
    mine = None
    for ranks in sorted({tuple(m) for m in everyone}):
        created = dist.new_group(list(ranks), backend="gloo")
        if dist.get_rank() in ranks:
            mine = created
    return mine


def group_comm(group: GroupLike) -> Comm:
    """libzero's communicator over the ranks of ``group``: a libzero ``Comm`` as it is; for a torch.distributed group,
    libzero's shared-memory communicator when its ranks are on one machine, else a transport over a gloo group of
    the same ranks."""
    if isinstance(group, Comm):
        return group
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("a process group was given, but torch.distributed is not initialised")
    gloo = group if dist.get_backend(group) == "gloo" else _gloo_twin(dist, group)
    size = dist.get_world_size(gloo)
    if size == 1:
        return Comm.single()
    machines: list[Any] = [None] * size
    dist.all_gather_object(machines, _machine_id(), group=gloo)
    if len(set(machines)) == 1:
        return _shm_comm(dist, gloo)
    return ProcessGroupComm(gloo)


def _call(mpu: Any, *names: str) -> Any:
    """The first of ``mpu``'s methods ``names`` that it has, called; None when it has none."""
    for name in names:
        method = getattr(mpu, name, None)
        if callable(method):
            return method()
    return None


def _size(group: GroupLike) -> int:
    if isinstance(group, Comm):
        return group.size
    import torch.distributed as dist

    return dist.get_world_size(group)


def _rank(group: GroupLike) -> int:
    if isinstance(group, Comm):
        return group.rank
    import torch.distributed as dist

    return dist.get_rank(group)


class ModelParallel:
    """The groups of a job with model parallelism, as ``initialize`` resolved them: ``dp`` and ``mp`` (groups as the
    caller gave them), ``tensor_rank`` (this rank's place among the tensor-parallel copies of a param: Megatron's
    tensor-parallel rank; None when nothing said it)."""

    def __init__(self, dp: GroupLike, mp: GroupLike, tensor_rank: int | None) -> None:
        self.dp, self.mp, self.tensor_rank = dp, mp, tensor_rank


def resolve_groups(
    comm: Comm | None, dp_group: GroupLike, mp_group: GroupLike, tp_group: GroupLike, mpu: Any
) -> ModelParallel | None:
    """The data- and model-parallel groups from ``initialize``'s arguments, checked; None without model parallelism.
    ``mpu``: DeepSpeed's (Megatron's) object, asked for ``get_data_parallel_group``, ``get_model_parallel_group`` and
    the tensor-parallel rank (``get_tensor_model_parallel_rank``; ``get_model_parallel_rank`` where the mpu has no
    pipeline, whose model-parallel group is then tensor-parallel). ``tp_group``: the tensor-parallel group, whose rank
    says which copies of a whole param count."""
    tensor_rank = _rank(tp_group) if tp_group is not None else None
    if mpu is not None:
        if dp_group is not None or mp_group is not None or tp_group is not None:
            raise ValueError("pass either mpu= or dp_group=/mp_group=/tp_group=, not both")
        dp_group = _call(mpu, "get_data_parallel_group")
        mp_group = _call(mpu, "get_model_parallel_group")
        if dp_group is None or mp_group is None:
            raise ValueError("mpu= needs get_data_parallel_group() and get_model_parallel_group() (DeepSpeed's mpu)")
        tensor_rank = _call(mpu, "get_tensor_model_parallel_rank")
        pipeline = _call(mpu, "get_pipeline_model_parallel_world_size", "get_pipe_parallel_world_size")
        if tensor_rank is None and (pipeline is None or int(pipeline) == 1):
            tensor_rank = _call(mpu, "get_model_parallel_rank")
        for name, group in (("data", dp_group), ("model", mp_group)):
            said = _call(mpu, f"get_{name}_parallel_world_size")
            if said is not None and int(said) != _size(group):
                raise ValueError(
                    f"mpu.get_{name}_parallel_world_size() is {said}, but its {name}-parallel group has "
                    f"{_size(group)} ranks"
                )
    if mp_group is None:
        if dp_group is not None and comm is not None:
            raise ValueError("pass either comm= or dp_group=, not both")
        if tp_group is not None:
            raise ValueError("tp_group= needs mp_group= (and dp_group=)")
        return None
    if dp_group is None:
        raise ValueError(
            "mp_group= needs dp_group= too: the engine's communicator is the data-parallel group beside it"
        )
    if comm is not None:
        raise ValueError("with dp_group= the data-parallel group is the engine's communicator: leave comm= out")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
        if _size(dp_group) * _size(mp_group) != world:
            raise ValueError(
                f"the data-parallel group ({_size(dp_group)} ranks) and the model-parallel group "
                f"({_size(mp_group)} ranks) do not make up the job's {world} ranks: the model-parallel group holds "
                "every tensor and pipeline part of one model replica, the data-parallel group the replicas"
            )
    return ModelParallel(dp_group, mp_group, int(tensor_rank) if tensor_rank is not None else None)


def duplicate_rule(
    groups: ModelParallel | None, duplicate: Callable[[str, torch.nn.Parameter], bool] | None
) -> Callable[[str, torch.nn.Parameter], bool]:
    """Which params are this rank's uncounted copies (ZERO_PARAM_MODEL_PARALLEL_DUPLICATE): ``duplicate`` where given;
    with model parallelism Megatron's rule (``param_is_not_tensor_parallel_duplicate`` and ``param_is_not_shared``):
    the params without ``tensor_model_parallel`` on tensor-parallel ranks other than 0, and those marked ``shared``
    (a tied embedding's copy on the last pipeline stage); none without."""
    if duplicate is not None:
        return duplicate
    if groups is None:
        return lambda name, p: False
    if groups.tensor_rank is None:
        raise ValueError(
            "with mp_group= libzero must know which copies of a whole param count in the norm: pass tp_group= (the "
            "tensor-parallel group: its rank 0's copies count), model_parallel_duplicate=, or an mpu with "
            "get_tensor_model_parallel_rank()"
        )
    if groups.tensor_rank == 0:
        return lambda name, p: bool(getattr(p, "shared", False))
    return lambda name, p: bool(getattr(p, "shared", False)) or not getattr(p, TENSOR_PARALLEL_ATTRIBUTE, False)


def refuse_unsupported_params(model: torch.nn.Module) -> None:
    """Megatron's params whose gradients it reduces after backward, which libzero takes during backward: a sequence-
    parallel LayerNorm's (summed over tensor-parallel ranks by finalize_model_grads) and an expert's (allreduce=False:
    reduced over its own expert-data-parallel group). Trained through libzero, their copies would drift apart."""
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if getattr(p, "sequence_parallel", False):
            raise ValueError(
                f"{name!r} has sequence_parallel=True: Megatron sums its gradient over the tensor-parallel ranks after "
                "backward, and libzero takes gradients during backward; train without sequence parallelism"
            )
        if getattr(p, "allreduce", True) is False:
            raise ValueError(
                f"{name!r} has allreduce=False (an expert of a mixture of experts): its gradient is reduced over its "
                "own expert-data-parallel group, which libzero does not take yet"
            )


def refuse_unknown_layout(model: torch.nn.Module, comm: Comm | None) -> None:
    """A model with tensor-parallel params (``tensor_model_parallel``) trained without groups would clip and skip
    per tensor-parallel rank and average gradients across unrelated parts: refused."""
    if comm is not None:
        return
    split = [n for n, p in model.named_parameters() if getattr(p, TENSOR_PARALLEL_ATTRIBUTE, False)]
    if split:
        raise ValueError(
            f"the model has tensor-parallel params ({split[0]!r} has tensor_model_parallel=True) but no model-parallel "
            "group was given: pass mpu= (DeepSpeed's), or dp_group= and mp_group= (docs/python.md, 'ZeRO with tensor "
            "and pipeline parallelism')"
        )
