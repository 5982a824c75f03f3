"""A device engine from Python, on libzero's host emulator of a device (a test tool, not a device): the same bits as
the CPU engine at every stage, device memory reached only through explicit copies and DLPack, views that go stale
as host views do. On a GPU the same calls take ``device="cuda"``. Under mpirun (several ranks) the device engine's
collectives go through host memory (host-staged), with the same bits as the CPU engine at that rank count."""

from __future__ import annotations

import os

import numpy as np
import pytest

import libzero
from dlpack_capsule import dltensor
from libzero.views import KDLCPU, KDLEXTDEV, DeviceView

SHAPES = {"a": (7,), "b": (3, 5), "w": (64, 33), "big": (5000,)}
UNITS = {"a": 0, "b": 0, "w": 1, "big": 2}
RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
WORLD = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))


def comm() -> libzero.Comm:
    return libzero.Comm.mpi() if WORLD > 1 else libzero.Comm.single()


def config(stage: int, dtype: str) -> dict:
    cfg = {
        "train_batch_size": 2 * WORLD,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000, "stage3_param_persistence_threshold": 0},
    }
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True, "stochastic_rounding": True}
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    return cfg


def gradient(step: int, micro: int, name: str) -> np.ndarray:
    """Dyadic values (multiples of 2^-8), each rank its own: sums over micro-steps and ranks are exact."""
    rng = np.random.default_rng(100000 * RANK + 1000 * step + 10 * micro + sorted(SHAPES).index(name))
    return (rng.integers(-512, 513, size=SHAPES[name]) / 256.0).astype(np.float32)


def train(stage: int, dtype: str, device: str | None) -> dict[str, np.ndarray]:
    """Three steps of two micro-steps; the params read back as host arrays."""
    with libzero.Engine(config(stage, dtype), comm(), device=device) as e:
        rng = np.random.default_rng(5)
        ids = {}
        for name, shape in SHAPES.items():
            init = (rng.integers(-64, 65, size=shape) / 64.0).astype(np.float32)
            ids[name] = e.add_param(name, shape, init=init, unit=UNITS[name])
        e.finalize()
        for step in range(1, 4):
            for micro in range(2):
                for name in reversed(SHAPES):  # backward order
                    with e.gathered(UNITS[name]):
                        g = e.grad(ids[name])
                        if device is None:
                            g += gradient(step, micro, name)
                        else:
                            g.copy_from(g.numpy() + gradient(step, micro, name))
                        e.grad_ready(ids[name])
                e.backward_end()
            e.step()
        out = {}
        for name in SHAPES:
            with e.gathered(UNITS[name]):
                p = e.param(ids[name])
                out[name] = np.array(p, copy=True) if device is None else p.numpy()
        return out


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_emulated_device_trains_as_the_cpu_engine_bit_for_bit(stage, dtype):
    cpu = train(stage, dtype, None)
    dev = train(stage, dtype, "emulator")
    for name in SHAPES:
        assert cpu[name].dtype == dev[name].dtype
        assert cpu[name].tobytes() == dev[name].tobytes(), name


def test_device_memory_is_exported_as_such_and_never_as_a_host_array():
    with libzero.Engine(config(3, "bf16"), libzero.Comm.single(), device="emulator") as e:
        w = e.add_param("w", (4, 3), init=np.ones((4, 3), np.float32))
        e.finalize()
        assert e.device == "emulator"
        with e.gathered(0):
            p = e.param(w)
            assert isinstance(p, DeviceView) and p.shape == (4, 3) and p.nbytes == 24
            assert p.__dlpack_device__() == (KDLEXTDEV, 0)
            capsule = p.__dlpack__()
            t = dltensor(capsule)
            assert (t.device_type, t.device_id, t.ndim, t.shape[0], t.shape[1]) == (KDLEXTDEV, 0, 2, 4, 3)
            assert (t.code, t.bits) == (4, 16)  # bf16
            assert t.data == e._n.address(w, False)
            del capsule
            # The emulator's memory has no stream a consumer could name, and no consumer may read it.
            with pytest.raises(BufferError, match="takes no stream"):
                p.__dlpack__(stream=7)
            with pytest.raises(BufferError, match="dl_device"):
                p.__dlpack__(dl_device=(KDLCPU, 0))
            with pytest.raises(BufferError, match="copy=True"):
                p.__dlpack__(copy=True)
            with pytest.raises(RuntimeError, match="Unsupported device"):  # numpy's words for kDLExtDev
                np.from_dlpack(p)
            with pytest.raises(TypeError, match="host must not touch"):
                np.asarray(p)
            # No stream (-1, None) is what a consumer of the emulator's memory may pass; DLPack 1.0 is versioned.
            assert "dltensor" in repr(p.__dlpack__(stream=-1)) and "dltensor" in repr(p.__dlpack__(stream=None))
            assert "dltensor_versioned" in repr(p.__dlpack__(max_version=(1, 0)))
            assert (p.numpy().view(np.uint16) == 0x3F80).all()  # 1.0 in bf16, with or without ml_dtypes
            with pytest.raises(libzero.InvalidArgumentError, match="shape"):
                p.copy_from(np.zeros(5))
            # A consumer stream is the device's: the emulator has none to take from Python.
            with pytest.raises(libzero.InvalidArgumentError, match="no default stream"):
                e._n.order_stream(0)
        # Released: the view is stale, as a host view would be.
        assert not p.valid
        with pytest.raises(libzero.StaleViewError):
            p.numpy()
        with pytest.raises(libzero.StaleViewError):
            p.__dlpack__()
        g = e.grad(w)
        e.grad_ready(w)
        with pytest.raises(libzero.StaleViewError):
            g.copy_from(np.zeros((4, 3)))


def test_a_cpu_engine_has_no_device_and_no_stream():
    with libzero.Engine(config(0, "fp32"), libzero.Comm.single()) as e:
        assert e.device is None
        with pytest.raises(libzero.InvalidStateError, match="zero_engine_set_device first"):
            e.set_stream(0)
        with pytest.raises(libzero.InvalidStateError, match="no device"):
            e._n.order_stream(1)
    with pytest.raises(libzero.InvalidArgumentError, match="tpu"):
        libzero.Engine(config(0, "fp32"), libzero.Comm.single(), device="tpu")
    # The emulator is one device per process: a second engine on it is refused while the first lives.
    with libzero.Engine(config(0, "fp32"), libzero.Comm.single(), device="emulator"):
        with pytest.raises(libzero.ZeroError, match="another device engine"):
            libzero.Engine(config(0, "fp32"), libzero.Comm.single(), device="emulator")
