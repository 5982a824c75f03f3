"""Loading a model too large to build whole on every rank: the ranks build it on the meta device (no memory), the
engine allocates only each rank's shards, and rank 0 writes the values unit by unit from a state dict — a mapping,
or a safetensors file or directory as Hugging Face saves them — through ``zero_release_modified``, which publishes
them to every rank. Rank 0 reads one tensor at a time, so no rank holds more than its shards, one gathered unit and
one tensor of the source. (DeepSpeed's ``zero.Init`` with ``from_pretrained`` does the same with
``GatheredParameters(modifier_rank=0)``.)"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .tensors import from_engine

StateDictLike = Any  # Mapping[str, Tensor] | str | os.PathLike


class _SafetensorsFiles:
    """The tensors of a safetensors file, or of a directory's model.safetensors or sharded index, read one at a
    time."""

    def __init__(self, path: str) -> None:
        if os.path.isdir(path):
            index = os.path.join(path, "model.safetensors.index.json")
            if os.path.exists(index):
                with open(index, encoding="utf-8") as f:
                    weight_map = json.load(f)["weight_map"]
                self._file_of = {k: os.path.join(path, v) for k, v in weight_map.items()}
            else:
                single = os.path.join(path, "model.safetensors")
                if not os.path.exists(single):
                    raise FileNotFoundError(f"{path} has neither model.safetensors nor model.safetensors.index.json")
                self._file_of = {k: single for k in self._keys_of(single)}
        else:
            self._file_of = {k: path for k in self._keys_of(path)}

    @staticmethod
    def _keys_of(path: str) -> Iterable[str]:
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            return list(f.keys())

    def __contains__(self, name: object) -> bool:
        return name in self._file_of

    def shape(self, name: str) -> tuple[int, ...]:
        from safetensors import safe_open

        with safe_open(self._file_of[name], framework="pt") as f:
            return tuple(f.get_slice(name).get_shape())

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(self._file_of[name], framework="pt") as f:
            return f.get_tensor(name)


# A PEFT model's names carry this before the base model's own, and name a wrapped layer's own weights
# "<layer>.base_layer.<weight>": a base saved by transformers is found without either.
_PEFT_PREFIX = "base_model.model."
_PEFT_WRAPPED = ".base_layer."


def _key(source: Any, name: str) -> str | None:
    """The source's key for the model's param or buffer ``name``: the name itself, or the base model's name of a
    PEFT model's param."""
    if name in source:
        return name
    if name.startswith(_PEFT_PREFIX):
        base = name[len(_PEFT_PREFIX) :].replace(_PEFT_WRAPPED, ".")
        if base in source:
            return base
    return None


class Sources:
    """Where each param's initial values come from: the model's own tensors (rank 0's, broadcast by finalize), or
    the state dict, written after finalize (always for a param on the meta device). A PEFT model's names are looked
    up as the base model's too (without ``base_model.model.`` and ``.base_layer``), so the base's own files serve
    it."""

    def __init__(self, model: torch.nn.Module, state_dict: StateDictLike | None, rank: int) -> None:
        self._source: Any = None
        if state_dict is not None:
            if isinstance(state_dict, (str, os.PathLike)):
                self._source = _SafetensorsFiles(os.fspath(state_dict))
            elif isinstance(state_dict, Mapping):
                self._source = state_dict
            else:
                raise TypeError("state_dict is a mapping of names to tensors, or a safetensors file or directory")
        self._rank = rank
        self._deferred: dict[str, str] = {}  # the model's name -> the source's key
        # A param on the meta device needs the state dict on every rank that has it so (rank 0 reads it; the
        # others only look at its names, so every rank makes the same calls).
        for name, p in model.named_parameters():
            on_meta = p.device.type == "meta"
            key = _key(self._source, name) if self._source is not None else None
            if key is not None:
                # Checked on every rank (every rank has the source's names and shapes), so that a wrong source
                # fails everywhere before finalize rather than on rank 0 while the others wait.
                shape = self._source.shape(key) if hasattr(self._source, "shape") else tuple(self._source[key].shape)
                if tuple(shape) != tuple(p.shape):
                    raise ValueError(
                        f"the state dict's {key!r} has shape {tuple(shape)}, the model's {name!r} {tuple(p.shape)}"
                    )
                self._deferred[name] = key
            elif on_meta and (self._source is not None or rank == 0):
                raise ValueError(
                    f"param {name!r} is on the meta device and "
                    + ("not in the state dict" if self._source is not None else "no state_dict was given")
                    + ": rank 0 needs its values (pass state_dict= on every rank, or build the model on rank 0)"
                )
        self._check_buffers(model)

    def buffer(self, name: str, buffer: torch.Tensor) -> torch.Tensor:
        """The buffer a model will hold: rank 0's values from the state dict when it has them (a persistent buffer,
        such as BatchNorm's statistics), else the model's own; on the meta device, a real tensor (the other ranks'
        empty: the broadcast of rank 0's bytes fills them). Collective only in that every rank calls it alike."""
        key = _key(self._source, name) if self._source is not None else None
        if buffer.device.type == "meta" and self._rank != 0:
            return torch.empty(buffer.shape, dtype=buffer.dtype)
        if key is None or self._rank != 0:
            return buffer  # checked in __init__: not on the meta device
        return self._source[key].to(buffer.dtype).clone()

    def _check_buffers(self, model: torch.nn.Module) -> None:
        """Every rank's check of what buffer() will need, before finalize: a meta buffer must be in the state dict,
        and a buffer the state dict holds must have its shape."""
        for name, b in model.named_buffers():
            key = _key(self._source, name) if self._source is not None else None
            if b.device.type == "meta" and key is None and (self._source is not None or self._rank == 0):
                raise ValueError(
                    f"buffer {name!r} is on the meta device and not in the state dict (a non-persistent buffer, such "
                    "as a rotary embedding's inv_freq, is in none): build the model with "
                    "accelerate.init_empty_weights(), which leaves buffers real"
                )
            if key is not None:
                shape = self._source.shape(key) if hasattr(self._source, "shape") else tuple(self._source[key].shape)
                if tuple(shape) != tuple(b.shape):
                    raise ValueError(
                        f"the state dict's {key!r} has shape {tuple(shape)}, the buffer {name!r} {tuple(b.shape)}"
                    )

    def deferred(self, name: str, param: torch.nn.Parameter) -> bool:
        """Whether the param's values come from the state dict (after finalize) rather than from the model."""
        del param
        return name in self._deferred

    def load(self, engine: Any) -> None:
        """Rank 0 writes every deferred param's values, unit by unit, and each unit is published to every rank.
        Collective (every rank gathers and publishes the same units)."""
        if not self._deferred:
            return
        names = engine.engine.param_names
        for u in engine._units:
            members = [i for i in engine._members[u] if names[i] in self._deferred]
            if not members:
                continue
            engine.engine.gather(u)
            try:
                if self._rank == 0:
                    for i in members:
                        value = self._source[self._deferred[names[i]]]
                        dst = from_engine(engine.engine.param(i), engine._tensor_dtype[i], engine._shape[i])
                        dst.copy_(value.to(dst.dtype) if value.dtype != dst.dtype else value)
                        del value
            except BaseException:
                # The others are about to publish this unit with rank 0: aborting tells them now (their call fails
                # naming this rank) instead of after the timeout.
                engine.engine.abort()
                raise
            engine.engine.release_modified(u, 0)
