"""The reductions a transport written in Python needs (libzero.Comm.custom), with the arithmetic of libzero's own
backends: contributions added in rank order 0..N-1, bf16 and fp16 summed in fp32 and rounded once to nearest
even. A transport that moves bytes with an all-to-all (reduce-scatter) or an all-gather (all-reduce) and reduces
here is deterministic and gives the MPI backend's bits (libzero.torch.ProcessGroupComm does exactly that)."""

from __future__ import annotations

import numpy as np


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round to nearest even; a NaN stays a (quiet) NaN."""
    u = values.view(np.uint32)
    out = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def rank_order_sum(parts: np.ndarray, dtype: str) -> np.ndarray:
    """The element-wise sum of ``parts[0] + parts[1] + ... + parts[N-1]`` (one row per rank) in libzero's
    ``dtype`` ("fp32", "bf16", "fp16", "fp64", "int64"); bf16 rows may be shown as any 2-byte dtype."""
    if dtype == "bf16":
        acc = _bf16_to_f32(parts[0].view(np.uint16)).copy()
        for r in range(1, len(parts)):
            acc += _bf16_to_f32(parts[r].view(np.uint16))
        return _f32_to_bf16(acc).view(parts.dtype)
    if dtype == "fp16":
        acc = parts[0].astype(np.float32)
        for r in range(1, len(parts)):
            acc += parts[r].astype(np.float32)
        return acc.astype(np.float16)
    acc = parts[0].copy()
    for r in range(1, len(parts)):
        acc += parts[r]
    return acc


def rank_order_reduce(parts: np.ndarray, op: str) -> np.ndarray:
    """An all-reduce's control values (fp64, int64) reduced with ``op`` ("sum", "min", "max") in rank order."""
    reduce = {"sum": np.add, "min": np.minimum, "max": np.maximum}[op]
    acc = parts[0].copy()
    for r in range(1, len(parts)):
        acc = reduce(acc, parts[r])
    return acc
