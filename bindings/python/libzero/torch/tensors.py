"""How torch tensors cross into the engine and back: a frozen param's storage type, its shape as the engine holds it,
numpy views over a tensor's own memory (no copies), and torch views over the engine's memory."""

from __future__ import annotations

import numpy as np
import torch

# The engine's storage type of a frozen torch dtype; any other dtype (int32, bool, float8, ...) is kept as its bytes.
_STORED = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float64: "fp64",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.int8: "int8",
}
FLOATING = (torch.float32, torch.bfloat16, torch.float16)


def stored_type(dtype: torch.dtype) -> str:
    """What a frozen tensor of ``dtype`` is registered as: its own type, or "bytes"."""
    return _STORED.get(dtype, "bytes")


def engine_shape(shape: torch.Size, dtype: torch.dtype) -> tuple[int, ...]:
    """A frozen tensor's shape as the engine holds it: its own, or for bytes the last extent times the item size
    (a scalar becomes one row of its bytes)."""
    if stored_type(dtype) != "bytes":
        return tuple(shape)
    size = torch.empty((), dtype=dtype).element_size()
    return tuple(shape[:-1]) + (shape[-1] * size,) if len(shape) > 0 else (size,)


def host_bytes(t: torch.Tensor) -> np.ndarray:
    """A numpy array over ``t``'s bytes (its own memory when it is a contiguous CPU tensor, else a copy)."""
    t = t.detach()
    if t.device.type != "cpu" or not t.is_contiguous():
        t = t.cpu().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy()


def host_values(t: torch.Tensor, compute: torch.dtype) -> np.ndarray:
    """A trained param's initial values for the engine, over ``t``'s own memory where the engine takes its dtype: fp32
    always (it starts the fp32 master exact), bf16 and fp16 as the compute dtype's bits; otherwise a float32 copy."""
    t = t.detach()
    if t.device.type != "cpu" or not t.is_contiguous():
        t = t.cpu().contiguous()
    if t.dtype == torch.float32:
        return t.numpy()
    if t.dtype == compute == torch.float16:
        return t.numpy()
    if t.dtype == compute == torch.bfloat16:
        return t.view(torch.uint16).numpy()  # bf16 bits (libzero's init dtype for uint16 when it trains bf16)
    return t.to(torch.float32).numpy()


def from_engine(view: object, dtype: torch.dtype, shape: torch.Size) -> torch.Tensor:
    """A torch tensor over an engine view (no copy), in ``dtype`` and ``shape``."""
    t = torch.from_dlpack(view)  # type: ignore[arg-type]
    if t.dtype != dtype:  # a frozen tensor kept as bytes
        t = t.view(dtype)
    return t.reshape(shape)
