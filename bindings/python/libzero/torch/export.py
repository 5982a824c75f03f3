"""The trained model as Hugging Face loads it (``TorchEngine.save_pretrained``): the full values gathered unit by
unit onto rank 0, handed to the model's own ``save_pretrained`` as its ``state_dict`` (so its config, sharding and
tied weights are written as transformers and PEFT write them), or to safetensors for a plain torch model."""

from __future__ import annotations

import os
from typing import Any

import torch

from .rank0 import share_outcome


def persistent_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The buffers ``model.state_dict()`` holds (non-persistent ones left out), by their state-dict names."""
    out: dict[str, torch.Tensor] = {}
    for prefix, module in model.named_modules():
        for name, b in module.named_buffers(recurse=False):
            if b is not None and name not in module._non_persistent_buffers_set:
                out[f"{prefix}.{name}" if prefix else name] = b
    return out


def save_pretrained(engine: Any, directory: str, adapter_only: bool | None, **kwargs: Any) -> None:
    model = engine.module
    is_peft = hasattr(model, "peft_config")
    adapter_only = is_peft if adapter_only is None else adapter_only
    # Every rank takes part in the gathers; rank 0 keeps the copies and writes; every rank learns how that went.
    state = engine.full_parameters(frozen=not adapter_only, rank0_only=True)
    error: BaseException | None = None
    if engine.engine.rank == 0:
        try:
            _write(model, directory, state, adapter_only, **kwargs)
        except Exception as e:  # noqa: BLE001 - any failure of the writer is every rank's
            error = e
    del state
    share_outcome(engine.engine, error, "save_pretrained")


def _write(model: torch.nn.Module, directory: str, state: dict[str, torch.Tensor], adapter_only: bool,
           **kwargs: Any) -> None:
    if not adapter_only:
        state.update({k: b.detach().clone() for k, b in persistent_buffers(model).items()})
    os.makedirs(directory, exist_ok=True)
    if hasattr(model, "save_pretrained"):
        # transformers' and PEFT's own writer; PEFT keeps the adapter's keys of the state dict it is given.
        model.save_pretrained(directory, state_dict=state, **kwargs)
        return
    from safetensors.torch import save_file

    # A plain torch module's state_dict names a tied weight under every module that holds it: so does the file
    # (safetensors keeps no shared storage, so each alias is a copy).
    canonical = {id(p): name for name, p in model.named_parameters()}
    for name, p in model.named_parameters(remove_duplicate=False):
        if name not in state and canonical.get(id(p)) in state:
            state[name] = state[canonical[id(p)]].clone()
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(directory, "model.safetensors"),
              metadata={"format": "pt", "producer": "libzero"})
