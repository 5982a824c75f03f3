"""How libzero's element types appear in numpy."""

from __future__ import annotations

import numpy as np

try:  # bf16 has no numpy dtype of its own; ml_dtypes (JAX's) provides one.
    import ml_dtypes

    BF16: np.dtype = np.dtype(ml_dtypes.bfloat16)
    HAVE_ML_DTYPES = True
except ImportError:  # without it, bf16 buffers are shown as their raw bits
    BF16 = np.dtype(np.uint16)
    HAVE_ML_DTYPES = False

# The C API's zero_dtype_t codes.
CODES = {"fp32": 0, "bf16": 1, "fp16": 2, "fp64": 3, "int64": 4, "uint8": 5, "int8": 6, "bytes": 7}

NUMPY = {
    "fp32": np.dtype(np.float32),
    "bf16": BF16,
    "fp16": np.dtype(np.float16),
    "fp64": np.dtype(np.float64),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "int8": np.dtype(np.int8),
    "bytes": np.dtype(np.uint8),
}


def code_of_array(array: np.ndarray, engine_dtype: str) -> int:
    """The zero_dtype_t that names an init array's elements (uint16 means bf16 bits when the engine trains bf16)."""
    dt = array.dtype
    if dt == np.float32:
        return CODES["fp32"]
    if dt == np.float16:
        return CODES["fp16"]
    if HAVE_ML_DTYPES and dt == BF16:
        return CODES["bf16"]
    if dt == np.uint16 and engine_dtype == "bf16":
        return CODES["bf16"]
    raise TypeError(
        f"initial values of dtype {dt} are not supported: pass float32 (exact for the fp32 master weights), "
        f"float16, or bfloat16 (ml_dtypes, or uint16 bits when the engine trains in bf16)"
    )


def frozen_code_of_array(array: np.ndarray, engine_dtype: str) -> tuple[int, np.ndarray]:
    """The zero_dtype_t a frozen param keeps ``array``'s elements in, and the array to register (its bytes as they
    are): numpy's own type where the C API has it, otherwise its bytes (ZERO_DTYPE_BYTES, one per element, the last
    dimension times the item size)."""
    dt = array.dtype
    for name in ("fp32", "fp16", "fp64", "int64", "uint8", "int8"):
        if dt == NUMPY[name]:
            return CODES[name], array
    if HAVE_ML_DTYPES and dt == BF16:
        return CODES["bf16"], array
    if dt == np.uint16 and engine_dtype == "bf16":
        return CODES["bf16"], array
    raw = np.ascontiguousarray(array).view(np.uint8)
    return CODES["bytes"], raw.reshape(array.shape[:-1] + (-1,)) if array.ndim > 0 else raw
