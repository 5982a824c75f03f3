"""The config a torch model trains under: a client optimizer's hyper-parameters as a config's optimizer block (as
DeepSpeed takes a client optimizer), its other param groups as libzero param groups, and the compute dtype."""

from __future__ import annotations

import json
import warnings
from typing import Any

import torch

from ..engine import ConfigLike, config_text

_TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

_UNSUPPORTED_OPTIONS = {
    # option: (the value libzero runs, what to call it)
    "amsgrad": (False, "amsgrad"),
    "maximize": (False, "maximize"),
    "momentum": (0, "momentum"),
    "nesterov": (False, "nesterov"),
    "dampening": (0, "dampening"),
    "lr_decay": (0, "Adagrad's lr_decay"),
    "initial_accumulator_value": (0, "Adagrad's initial_accumulator_value"),
}


def optimizer_block(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The DeepSpeed ``optimizer`` block equivalent to a torch optimizer (as DeepSpeed takes a client optimizer):
    AdamW, Adam, Adagrad and SGD without momentum. Options libzero does not run, in any param group, are refused."""
    kind = type(optimizer).__name__
    if kind not in ("AdamW", "Adam", "Adagrad", "SGD"):
        raise NotImplementedError(f"libzero runs AdamW, Adam, Adagrad, SGD (and Lion from a config); not {kind}")
    for gi, group in enumerate(optimizer.param_groups):
        for key, (supported, what) in _UNSUPPORTED_OPTIONS.items():
            if key in group and group[key] not in (supported, None):
                raise NotImplementedError(
                    f"{kind} param group {gi} sets {what} = {group[key]!r}; libzero runs {kind} without it"
                )
    g = optimizer.param_groups[0]
    if kind in ("AdamW", "Adam"):
        params = {"lr": g["lr"], "betas": list(g["betas"]), "eps": g["eps"], "weight_decay": g["weight_decay"]}
        if kind == "Adam" and any(group["weight_decay"] != 0 for group in optimizer.param_groups):
            # torch's Adam adds the decay to the gradient (L2), as DeepSpeed's "Adam" with adam_w_mode false.
            params["adam_w_mode"] = False
        return {"type": kind, "params": params}
    if kind == "Adagrad":
        return {"type": "Adagrad", "params": {"lr": g["lr"], "eps": g["eps"], "weight_decay": g["weight_decay"]}}
    return {"type": "SGD", "params": {"lr": g["lr"], "weight_decay": g["weight_decay"]}}


def _group_overrides(group: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """What a torch param group sets differently from the first one, as add_param_group's keywords."""
    out: dict[str, Any] = {}
    for key in ("lr", "weight_decay", "eps"):
        if key in group and group[key] != base.get(key):
            out[key] = group[key]
    if "betas" in group and tuple(group["betas"]) != tuple(base.get("betas", ())):
        out["betas"] = tuple(group["betas"])
    return out


def engine_config(
    config: ConfigLike, optimizer: torch.optim.Optimizer | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The config the engine is created with (the client optimizer's block in place of the config's) and the torch
    param groups (none without a client optimizer). Called by what the user called (initialize, TorchEngine):
    the warning names the user's line."""
    cfg = json.loads(config_text(config))
    groups = optimizer.param_groups if optimizer is not None else []
    if optimizer is not None:
        block = optimizer_block(optimizer)
        if "optimizer" in cfg:
            # DeepSpeed lets the client optimizer win too; say so instead of dropping the block silently.
            warnings.warn(
                "both a config 'optimizer' block and a client optimizer were given: the client optimizer's "
                f"{type(optimizer).__name__} hyper-parameters are used (as DeepSpeed does), the block is ignored",
                stacklevel=3,
            )
        cfg["optimizer"] = block
    elif "optimizer" not in cfg:
        raise ValueError("the config has no 'optimizer' block: give one, or pass a torch optimizer")
    return cfg, groups
