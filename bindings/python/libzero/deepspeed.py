"""DeepSpeed's entry points for a loop written for DeepSpeed: ``import libzero.deepspeed as deepspeed``.

    model_engine, optimizer, _, lr_scheduler = deepspeed.initialize(model=model, config="ds_config.json",
                                                                    model_parameters=model.parameters())
    for batch in data:
        loss = model_engine(batch)
        model_engine.backward(loss)
        model_engine.step()

``initialize`` returns DeepSpeed's 4-tuple (engine, optimizer, training dataloader, lr scheduler) around a
:class:`libzero.torch.TorchEngine`; ``zero.GatheredParameters`` is libzero.torch's. DeepSpeed need not be installed,
and when it is, it is not used."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

import torch

from .comm import Comm
from .engine import ConfigLike, config_text
from .torch import GatheredParameters, TorchEngine
from .torch import initialize as _initialize

zero = SimpleNamespace(GatheredParameters=GatheredParameters)


def initialize(
    args: Any = None,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    model_parameters: Iterable[Any] | None = None,
    training_data: torch.utils.data.Dataset | None = None,
    lr_scheduler: Any = None,
    mpu: Any = None,
    dist_init_required: bool | None = None,
    collate_fn: Callable[..., Any] | None = None,
    config: ConfigLike | None = None,
    config_params: ConfigLike | None = None,
    comm: Comm | None = None,
) -> tuple[TorchEngine, Any, torch.utils.data.DataLoader | None, Any]:
    """``deepspeed.initialize`` on libzero. ``config`` (or ``config_params``, or ``args.deepspeed_config``): a
    DeepSpeed config. ``model_parameters``: the params to train (the model's ``requires_grad`` params are; a
    param outside them is refused) or a list of param-group dicts, whose hyper-parameters override the config's
    optimizer block for their params, as DeepSpeed builds its optimizer. ``training_data``: a dataset, returned as
    a DataLoader of ``train_micro_batch_size_per_gpu`` with a DistributedSampler over the data-parallel ranks.
    ``mpu``: the model-parallel unit of a tensor- or pipeline-parallel job (``get_data_parallel_group``,
    ``get_model_parallel_group``, ``get_tensor_model_parallel_rank`` or ``get_model_parallel_rank``): ZeRO runs over
    the data-parallel group, the gradient norm and skip over the whole job (docs/python.md)."""
    if model is None:
        raise ValueError("deepspeed.initialize needs model=")
    del dist_init_required  # libzero.torch picks its communicator (torch.distributed when initialised)
    if config is None:
        config = config_params
    if config is None and args is not None:
        config = getattr(args, "deepspeed_config", None)
    if config is None:
        raise ValueError("deepspeed.initialize needs a config (config=, config_params= or args.deepspeed_config)")
    if model_parameters is not None and optimizer is None:
        optimizer = _optimizer_for(model, list(model_parameters), config)
        if optimizer is not None:  # it stands for the config's block, built from it
            cfg = json.loads(config_text(config))
            del cfg["optimizer"]
            config = cfg
    engine = _initialize(model, config, comm=comm, optimizer=optimizer, lr_scheduler=lr_scheduler, mpu=mpu)
    loader = None
    if training_data is not None:
        loader = _loader(training_data, config, engine, collate_fn)
    return engine, engine.optimizer, loader, engine.lr_scheduler


def _optimizer_for(model: torch.nn.Module, given: list[Any], config: ConfigLike) -> torch.optim.Optimizer | None:
    """Param-group dicts as a torch optimizer of the config's type (the engine reads its groups' hyper-parameters;
    it never steps); plain params are checked against the model's trained ones and need no optimizer."""
    trained = {id(p) for p in model.parameters() if p.requires_grad}
    if not any(isinstance(g, dict) for g in given):
        stray = [p for p in given if isinstance(p, torch.Tensor) and p.requires_grad and id(p) not in trained]
        if stray:
            raise ValueError("model_parameters holds params that are not the model's")
        return None
    cfg = json.loads(config_text(config))
    block = cfg.get("optimizer")
    if block is None:
        raise ValueError("model_parameters as param groups need the config's 'optimizer' block")
    params = block.get("params", {})
    # DeepSpeed's "Adam" decays weights as AdamW unless adam_w_mode is false.
    adam = torch.optim.AdamW if params.get("adam_w_mode", True) else torch.optim.Adam
    kinds = {"adamw": torch.optim.AdamW, "adam": adam, "adagrad": torch.optim.Adagrad, "sgd": torch.optim.SGD}
    kind = kinds.get(str(block.get("type", "")).lower())
    if kind is None:
        raise NotImplementedError(f"param groups with the optimizer type {block.get('type')!r}")
    defaults = {k: v for k, v in params.items() if k in ("lr", "betas", "eps", "weight_decay")}
    return kind([dict(g) if isinstance(g, dict) else {"params": [g]} for g in given], **defaults)


def _loader(
    data: torch.utils.data.Dataset, config: ConfigLike, engine: TorchEngine, collate_fn: Callable[..., Any] | None
) -> torch.utils.data.DataLoader:
    cfg = json.loads(config_text(config))
    world = engine.engine.world_size
    micro = cfg.get("train_micro_batch_size_per_gpu")
    if micro is None:
        micro = int(cfg["train_batch_size"]) // (engine.gradient_accumulation_steps() * world)
    sampler = torch.utils.data.distributed.DistributedSampler(data, num_replicas=world, rank=engine.engine.rank)
    return torch.utils.data.DataLoader(data, batch_size=int(micro), sampler=sampler, collate_fn=collate_fn)
