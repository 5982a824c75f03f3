"""zero-ckpt consolidate's output, read by the Python safetensors package, equals the engine's gathered weights.

    check_consolidated.py DIR     (DIR holds export-weights.bin, export/ and full-{fp32,bf16,fp16}.safetensors)
"""
import json
import struct
import sys

import numpy as np
from safetensors.numpy import load_file


def bf16_rne(values):
    """Round-to-nearest-even fp32 -> bf16 bit patterns (no NaNs in these weights)."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def raw_tensors(path):
    """The bytes of each tensor, from the safetensors header (numpy has no bfloat16 for load_file)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


def main(d):
    manifest = json.load(open(f"{d}/export/manifest.json"))
    flat = np.fromfile(f"{d}/export-weights.bin", dtype=np.float32)
    expected, at = {}, 0
    for p in manifest["params"]:
        n = p["numel"]
        expected[p["name"]] = flat[at:at + n].reshape(p["shape"])
        at += n
    assert at == flat.size, (at, flat.size)

    full32 = load_file(f"{d}/full-fp32.safetensors")
    full16 = load_file(f"{d}/full-fp16.safetensors")
    model = load_file(f"{d}/export/model.safetensors")  # stage3_gather_16bit_weights_on_model_save
    bf16 = raw_tensors(f"{d}/full-bf16.safetensors")
    assert set(full32) == set(expected) == set(full16) == set(model) == set(bf16)
    for name, want in expected.items():
        assert full32[name].dtype == np.float32 and full32[name].shape == want.shape, name
        assert np.array_equal(full32[name].view(np.uint32), want.view(np.uint32)), name
        assert np.array_equal(model[name].view(np.uint32), want.view(np.uint32)), name
        assert full16[name].dtype == np.float16
        assert np.array_equal(full16[name].view(np.uint16), want.astype(np.float16).view(np.uint16)), name
        dtype, shape, raw = bf16[name]
        assert dtype == "BF16" and list(shape) == list(want.shape), name
        assert np.array_equal(np.frombuffer(raw, dtype=np.uint16), bf16_rne(want).ravel()), name
    print(f"safetensors ok: {len(expected)} tensors in fp32, bf16 and fp16 and the 16-bit save equal the engine's "
          f"gathered weights")


if __name__ == "__main__":
    main(sys.argv[1])
