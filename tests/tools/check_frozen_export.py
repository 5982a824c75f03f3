"""The frozen params of tests/mpi/frozen.c's export, read with the safetensors package: in the engine's
model.safetensors and in zero-ckpt's consolidated file each has its registered dtype and shape and exactly rank 0's
bytes (the test wrote them, in registration order, to expected-frozen.bin); --skip-frozen leaves them out.
    check_frozen_export.py DIR"""

import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

FROZEN = [  # name, numpy dtype, shape (tests/mpi/frozen.c's kFrozen)
    ("embed.base", None, (9, 7)),  # bf16: numpy has none, read as raw 16-bit words
    ("head.base", np.float32, (33,)),
    ("quant.packed", np.uint8, (300,)),
    ("quant.codes", np.int8, (5, 13)),
    ("quant.scale", np.float64, (3,)),
    ("quant.index", np.int64, (4,)),
    ("quant.raw", np.uint8, (17,)),
]


def raw_bytes(path: str, name: str) -> tuple[bytes, str, list[int]]:
    """A tensor's bytes from the file itself (safetensors.numpy has no bf16)."""
    import json
    import struct

    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        begin, end = header[name]["data_offsets"]
        f.seek(8 + n + begin)
        return f.read(end - begin), header[name]["dtype"], header[name]["shape"]


def main() -> None:
    d = sys.argv[1]
    expected = open(f"{d}/expected-frozen.bin", "rb").read()
    want_dtype = {"embed.base": "BF16", "head.base": "F32", "quant.packed": "U8", "quant.codes": "I8",
                  "quant.scale": "F64", "quant.index": "I64", "quant.raw": "U8"}
    for path in (f"{d}/export/model.safetensors", f"{d}/consolidated.safetensors"):
        at = 0
        for name, dtype, shape in FROZEN:
            data, st_dtype, st_shape = raw_bytes(path, name)
            n = len(data)
            assert st_dtype == want_dtype[name], (path, name, st_dtype)
            assert tuple(st_shape) == shape, (path, name, st_shape)
            assert data == expected[at : at + n], f"{path}: {name}'s bytes differ from rank 0's"
            at += n
            if dtype is not None:  # and safetensors' own reader agrees (it has no bf16: embed.base is skipped)
                with safe_open(path, framework="numpy") as f:
                    tensor = f.get_tensor(name)
                assert tensor.dtype == dtype and tensor.tobytes() == data, (path, name)
        assert at == len(expected)
    trained = load_file(f"{d}/trained.safetensors")
    assert not any(name in trained for name, _, _ in FROZEN), "--skip-frozen wrote frozen params"
    assert "embed.weight" in trained and trained["embed.weight"].dtype == np.float32
    print(f"frozen params intact in both files ({len(expected)} bytes, NaN payloads included)")


if __name__ == "__main__":
    main()
