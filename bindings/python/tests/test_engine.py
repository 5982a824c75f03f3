"""The Python binding in one process: API, views and their lifetimes, errors, config check, checkpoints."""

from __future__ import annotations

import gc
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import libzero
import training
from dlpack_capsule import dltensor

SGD = {"train_batch_size": 1, "gradient_clipping": 0.0, "optimizer": {"type": "SGD", "params": {"lr": 1.0}}}


def sgd(stage: int = 0, **extra) -> dict:
    cfg = json.loads(json.dumps(SGD))
    cfg["zero_optimization"] = {"stage": stage}
    cfg.update(extra)
    return cfg


def one_param_engine(stage: int = 0, shape=(4, 3), **extra) -> tuple[libzero.Engine, int]:
    e = libzero.Engine(sgd(stage, **extra), libzero.Comm.single())
    w = e.add_param("w", shape, init=np.arange(np.prod(shape), dtype=np.float32).reshape(shape))
    e.finalize()
    return e, w


# ---- configs -----------------------------------------------------------------------------------------------------
def test_a_config_is_a_dict_json_text_or_a_path(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(sgd(2)))
    for config in (sgd(2), json.dumps(sgd(2)), path, str(path)):
        with libzero.Engine(config, libzero.Comm.single()) as e:
            assert e.info["stage"] == 2


def test_config_errors_name_the_key_and_are_value_errors():
    with pytest.raises(libzero.ConfigError, match="bogus") as info:
        libzero.Engine({**SGD, "bogus": 1}, libzero.Comm.single())
    assert isinstance(info.value, ValueError) and isinstance(info.value, libzero.ZeroError)
    assert info.value.status == 3
    with pytest.raises(FileNotFoundError):
        libzero.Engine("no/such/config.json", libzero.Comm.single())
    with pytest.raises(TypeError):
        libzero.Engine(42, libzero.Comm.single())


def test_config_check_reports_what_libzero_will_do():
    report = libzero.config_check({**sgd(3), "train_batch_size": 4}, world_size=4)
    assert "stage 3" in report.lower() or "stage: 3" in report.lower() or "3" in report
    with pytest.raises(libzero.ConfigError, match="optimizer"):
        libzero.config_check({"train_batch_size": 1}, 1)


# ---- the training calls -----------------------------------------------------------------------------------------
def test_one_sgd_step_moves_the_weights_by_the_gradient():
    e, w = one_param_engine()
    with e.gathered(0):
        g = e.grad(w)
        g += np.full((4, 3), 0.5, np.float32)
        e.grad_ready(w)
    e.backward_end()
    r = e.step()
    assert isinstance(r, libzero.StepResult)
    assert r.step == 1 and not r.skipped and r.loss_scale == 1.0 and r.lr == 1.0
    assert r.grad_norm == pytest.approx(np.sqrt(12 * 0.25))
    with e.gathered(0):
        np.testing.assert_array_equal(e.param(w), np.arange(12, dtype=np.float32).reshape(4, 3) - 0.5)
    e.close()


def test_params_are_found_by_name_and_described():
    e, w = one_param_engine(shape=(2, 5))
    assert e.param_names == ["w"] and e.param_id("w") == w
    info = e.param_info("w")
    assert info["shape"] == (2, 5) and info["numel"] == 10 and info["param_dtype"] == "fp32"
    assert e.unit_info(0)["numel"] == 10 and e.num_units == 1
    with pytest.raises(libzero.InvalidArgumentError):
        e.param_id("nope")
    with pytest.raises(libzero.InvalidArgumentError):
        e.param(7)
    e.close()


def test_calls_in_the_wrong_order_raise_invalid_state():
    e = libzero.Engine(sgd(), libzero.Comm.single())
    e.add_param("w", 3)
    with pytest.raises(libzero.InvalidStateError, match="finalize"):
        e.param(0)
    with pytest.raises(libzero.InvalidStateError):
        e.step()
    e.finalize()
    with pytest.raises(libzero.InvalidStateError):
        e.add_param("late", 2)
    with pytest.raises(libzero.InvalidStateError):
        e.param(0)  # unit 0 is not gathered
    e.close()
    with pytest.raises(libzero.InvalidStateError, match="closed"):
        e.step()


def test_init_values_must_match_the_shape():
    e = libzero.Engine(sgd(), libzero.Comm.single())
    with pytest.raises(libzero.InvalidArgumentError, match="6 elements"):
        e.add_param("w", (2, 2), init=np.zeros(6, np.float32))
    with pytest.raises(TypeError, match="int32"):
        e.add_param("w", (2,), init=np.zeros(2, np.int32))
    e.close()


def test_gathered_releases_when_the_block_raises():
    e, w = one_param_engine(stage=3)
    with pytest.raises(RuntimeError):
        with e.gathered(0):
            raise RuntimeError("the user's forward failed")
    assert not e.unit_info(0)["gathered"]
    e.close()


def test_statistics_report_the_engine_s_bytes_and_traffic():
    # One fp32 param of 12 elements at stage 2 on one rank: its unit is padded to 16 elements (a multiple of 16 x N),
    # SGD without momentum keeps no state, and the gradient bucket holds the one unit.
    e, w = one_param_engine(stage=2)
    m = e.memory_stats()
    assert m == {"param_bytes": 64, "grad_bytes": 64, "master_param_bytes": 0, "optimizer_state_bytes": 0,
                 "bucket_bytes": 64, "gathered_bytes": 0, "frozen_param_bytes": 0, "total_bytes": 192}, m
    assert e.memory_placement() == {"host_bytes": 192, "nvme_bytes": 0, "staging_bytes": 0}
    before = e.comm_stats()
    with e.gathered(0):
        e.grad(w)[...] = 1.0
        e.grad_ready(w)
    e.backward_end()
    e.step()
    c = e.comm_stats()
    # One bucket reduced (a reduce-scatter of the unit: 16 fp32 = 64 bytes; one rank sends none of it) and the new
    # params all-gathered after the step; every collective call agreed first (control messages, counted apart).
    assert c["reduce_scatter"]["calls"] - before["reduce_scatter"]["calls"] == 1
    assert c["reduce_scatter"]["bytes"] - before["reduce_scatter"]["bytes"] == 64
    assert c["reduce_scatter"]["wire_bytes"] == 0
    assert c["all_gather"]["calls"] - before["all_gather"]["calls"] == 1
    assert c["control"]["calls"] > before["control"]["calls"]
    assert c["sequence"] == before["sequence"] + sum(
        c[k]["calls"] - before[k]["calls"] for k in ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "control"))
    recent = e.recent_collectives()
    assert recent[-1]["state"] == "done" and recent[-1]["kind"] == "all-gather"
    assert "all-gather of the new params of unit 0" in recent[-1]["label"]
    assert [r["sequence"] for r in recent] == sorted(r["sequence"] for r in recent)
    e.set_num_threads(1)
    assert e.info["optimizer_threads"] == 1
    e.close()


def test_set_lr_applies_to_the_next_step():
    e, w = one_param_engine()
    e.set_lr(0.25)
    with e.gathered(0):
        e.grad(w)[...] += 1.0
        e.grad_ready(w)
    e.backward_end()
    assert e.step().lr == 0.25
    with e.gathered(0):
        assert e.param(w)[0, 0] == -0.25
    e.close()


# ---- views ---------------------------------------------------------------------------------------------------------
def test_a_view_of_a_released_stage3_unit_raises_instead_of_reading_other_weights():
    e = libzero.Engine(sgd(3, zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0}),
                       libzero.Comm.single())
    a = e.add_param("a", 5, unit=0, init=np.ones(5, np.float32))
    b = e.add_param("b", 5, unit=1, init=np.full(5, 2.0, np.float32))
    e.finalize()
    e.gather(0)
    va = e.param(a)
    half = va[1:3]  # slices are views with the same lease
    assert va.valid and float(va.sum()) == 5.0
    e.release(0)
    e.gather(1)  # may reuse unit 0's buffer for unit 1
    for use in (lambda: va[0], lambda: va + 1, lambda: np.sum(va), lambda: repr(va), lambda: half[0],
                lambda: va.copy(), lambda: va.tobytes(), lambda: va.__dlpack__(), lambda: va.fill(0)):
        with pytest.raises(libzero.StaleViewError, match="released"):
            use()
    assert not va.valid
    np.testing.assert_array_equal(e.param(b), np.full(5, 2.0, np.float32))
    e.release(1)
    e.gather(0)  # gathered again: a new generation, the old view stays stale
    with pytest.raises(libzero.StaleViewError, match="call engine.param"):
        va[0]
    assert e.param(a)[0] == 1.0
    e.release(0)
    e.close()


def test_a_gradient_view_ends_at_grad_ready():
    e, w = one_param_engine(stage=2)
    with e.gathered(0):
        g = e.grad(w)
        g[0, 0] += 1.0
        e.grad_ready(w)
        with pytest.raises(libzero.StaleViewError, match="grad_ready"):
            g += 1.0
    e.backward_end()
    e.close()


def test_views_behave_as_arrays_and_return_plain_arrays():
    e, w = one_param_engine()
    with e.gathered(0):
        v = e.param(w)
        assert isinstance(v, np.ndarray) and isinstance(v, libzero.View)
        assert v.dtype == np.float32 and v.shape == (4, 3) and v.flags["C_CONTIGUOUS"]
        total = v + 1
        assert type(total) is np.ndarray
        assert type(np.matmul(v, np.ones(3, np.float32))) is np.ndarray
        assert isinstance(v[1], libzero.View) and v[1, 2] == 5.0
        plain = v.numpy()
        assert type(plain) is np.ndarray and np.shares_memory(plain, v)
    e.close()


def test_dlpack_exports_engine_memory_without_a_copy():
    e, w = one_param_engine()
    with e.gathered(0):
        g = e.grad(w)
        consumer = np.from_dlpack(g)
        g[2, 1] = 3.5  # the consumer sees the engine's buffer
        assert consumer[2, 1] == 3.5 and np.shares_memory(consumer, g)
        if consumer.flags.writeable:  # numpy 2 imports DLPack tensors writable, numpy 1 read-only
            consumer[0, 1] = -1.5  # the consumer writes into the engine's buffer
            assert g[0, 1] == -1.5
        assert g.__dlpack_device__() == (1, 0)
        e.grad_ready(w)
    e.backward_end()
    e.close()


def test_bf16_views_carry_their_type_through_dlpack():
    e = libzero.Engine({**sgd(1), "bf16": {"enabled": True}}, libzero.Comm.single())
    w = e.add_param("w", (2, 3), init=np.array([[1, 2, 3], [4, 5, -0.5]], np.float32))
    e.finalize()
    with e.gathered(0):
        v = e.param(w)
        if libzero.HAVE_ML_DTYPES:
            assert v.dtype.name == "bfloat16"
            assert v.astype(np.float32)[1, 2] == -0.5
        else:
            assert v.dtype == np.uint16
        assert v.view(np.uint16)[0, 0] == 0x3F80  # 1.0 in bf16
        capsule = v.__dlpack__()
        t = dltensor(capsule)
        assert (t.code, t.bits, t.lanes, t.ndim) == (4, 16, 1, 2)  # kDLBfloat, whatever numpy shows
        assert (t.shape[0], t.shape[1]) == (2, 3) and t.data == v.__array_interface__["data"][0]
        del capsule  # unconsumed: the capsule frees its tensor
    e.close()


def test_without_ml_dtypes_bf16_is_shown_as_its_bits():
    code = (
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "import numpy as np, libzero\n"
        "assert not libzero.HAVE_ML_DTYPES\n"
        "e = libzero.Engine({'train_batch_size': 1, 'bf16': {'enabled': True}, "
        "'optimizer': {'type': 'SGD', 'params': {'lr': 1}}}, libzero.Comm.single())\n"
        "w = e.add_param('w', 2, init=np.array([0x3F80, 0x4000], np.uint16))\n"
        "e.finalize(); e.gather(0)\n"
        "v = e.param(w); assert v.dtype == np.uint16 and v.tolist() == [0x3F80, 0x4000], v\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_views_keep_the_engine_alive_and_outlive_close_safely():
    e, w = one_param_engine()
    e.gather(0)
    v = e.param(w)
    plain = v.numpy()
    del e
    gc.collect()
    assert v[1, 1] == 4.0  # the engine lives as long as its views
    v._lease.engine.close()
    with pytest.raises(libzero.StaleViewError, match="close"):
        v[0, 0]
    assert plain[1, 1] == 4.0  # the memory stays until the last array over it goes
    del v, plain
    gc.collect()


# ---- checkpoints -------------------------------------------------------------------------------------------------
def test_a_checkpoint_restores_weights_and_optimizer_state(tmp_path):
    cfg = training.config(stage=2, gas=1, world=1)

    def run(steps, save_at=None, load=False):
        with libzero.Engine(cfg, libzero.Comm.single()) as e:
            ids = training.register(e)
            if load:
                e.load_checkpoint(tmp_path)
            for s in range(steps):
                training.micro_step(e, ids, lambda n, sh: training.gradient(n, sh, s, 0))
                e.step()
                if save_at == s:
                    e.save_checkpoint(tmp_path, f"step{s}")
            return training.weights(e)

    straight = run(3)
    run(1, save_at=0)
    assert (tmp_path / "latest").exists()
    # Resume: two more steps from the checkpoint, gradients of steps 1 and 2.
    with libzero.Engine(cfg, libzero.Comm.single()) as e:
        ids = training.register(e)
        e.load_checkpoint(tmp_path)
        for s in (1, 2):
            training.micro_step(e, ids, lambda n, sh: training.gradient(n, sh, s, 0))
            e.step()
        assert training.weights(e) == straight
    with pytest.raises(libzero.InvalidArgumentError):
        with libzero.Engine(cfg, libzero.Comm.single()) as e:
            training.register(e)
            e.save_checkpoint(tmp_path, "step0")  # an existing tag is never overwritten


def test_a_corrupt_checkpoint_raises_checkpoint_corrupt(tmp_path):
    cfg = training.config(stage=1, gas=1, world=1)
    with libzero.Engine(cfg, libzero.Comm.single()) as e:
        training.register(e)
        e.save_checkpoint(tmp_path, "t")
    shard = next((tmp_path / "t").glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with libzero.Engine(cfg, libzero.Comm.single()) as e:
        training.register(e)
        with pytest.raises(libzero.CheckpointCorruptError, match="checksum|corrupt"):
            e.load_checkpoint(tmp_path, "t")


# ---- the same bits as the engine's own single-process run ----------------------------------------------------------
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_every_stage_gives_the_same_weights(stage, dtype):
    def run(stage_):
        with libzero.Engine(training.config(stage_, gas=2, world=1, dtype=dtype, clip=1.0),
                            libzero.Comm.single()) as e:
            training.train(e, steps=3, gas=2, world=1, rank=0)
            return training.weights(e)

    assert run(stage) == run(0)


# ---- custom communicators ------------------------------------------------------------------------------------------
class _Failing:
    rank, size = 0, 1

    def run(self, c):
        raise ConnectionError(f"the transport lost its peer during {c['kind']}")


def test_a_transport_error_becomes_a_comm_error_with_its_text():
    with pytest.raises(libzero.CommError, match="lost its peer"):
        e = libzero.Engine(sgd(), libzero.Comm.custom(_Failing()))
        e.add_param("w", 3)
        e.finalize()


def test_exceptions_mirror_the_status_codes():
    import re
    from pathlib import Path

    from libzero import errors

    # Every status the header declares, whatever their number: each has its own class, which carries it.
    header = (Path(__file__).resolve().parents[3] / "capi/include/zero/zero.h").read_text()
    statuses = {name: int(value) for name, value in re.findall(r"\b(ZERO_ERR_[A-Z_]+) = (\d+)", header)}
    assert len(statuses) >= 13 and "ZERO_ERR_ABORTED" in statuses
    classes = set()
    for name, status in statuses.items():
        err = errors._from_status(status, "m")
        assert err.status == status and err.message == "m" and isinstance(err, libzero.ZeroError), name
        assert type(err) is not libzero.ZeroError, f"{name} has no class of its own"
        assert libzero._native.status_string(status) == name
        classes.add(type(err))
    assert len(classes) == len(statuses)
    unknown = errors._from_status(max(statuses.values()) + 1, "m")
    assert type(unknown) is libzero.ZeroError and unknown.status == max(statuses.values()) + 1
    assert issubclass(libzero.TimeoutError, TimeoutError)
    assert issubclass(libzero.RemoteError, libzero.CommError)
    assert issubclass(libzero.FileSystemError, OSError)
    assert issubclass(libzero.OutOfMemoryError, MemoryError)


def test_the_library_version_is_the_package_s():
    assert libzero.library_version() == libzero.__version__


def test_ndarray_methods_that_bypass_ufuncs_check_the_view_too():
    import copy

    e = libzero.Engine(sgd(3, zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0}),
                       libzero.Comm.single())
    a = e.add_param("a", 4, unit=0, init=np.ones(4, np.float32))
    e.add_param("b", 4, unit=1, init=np.full(4, 2.0, np.float32))
    e.finalize()
    e.gather(0)
    v = e.param(a)
    e.release(0)
    e.gather(1)
    for use in (lambda: v.dot(np.ones(4, np.float32)), lambda: v.put([0], 9.0), lambda: v.flatten(),
                lambda: v.take([0]), lambda: v.argmax(), lambda: v.sort(), lambda: copy.copy(v),
                lambda: copy.deepcopy(v), lambda: v.max(), lambda: v.cumsum()):
        with pytest.raises(libzero.StaleViewError):
            use()
    np.testing.assert_array_equal(e.param(1), np.full(4, 2.0, np.float32))  # nothing written into unit 1
    e.release(1)
    e.close()


def test_dlpack_export_refuses_what_it_cannot_describe_and_copies_on_request():
    e, w = one_param_engine()
    with e.gathered(0):
        v = e.param(w)
        with pytest.raises(BufferError, match="negative strides"):
            v[:, ::-1].__dlpack__()
        with pytest.raises(BufferError, match="kDLCPU"):
            v.__dlpack__(dl_device=(2, 0))
        with pytest.raises(BufferError, match="int32"):
            v.view(np.int32).__dlpack__()
        if np.lib.NumpyVersion(np.__version__) >= "2.1.0":  # from_dlpack's copy argument
            copied = np.from_dlpack(v, copy=True)
            copied[0, 0] = 42.0
            assert v[0, 0] == 0.0 and not np.shares_memory(copied, v)
        else:
            capsule = v.__dlpack__(copy=True)
            t = dltensor(capsule)
            assert t.data != v.__array_interface__["data"][0] and (t.shape[0], t.shape[1]) == v.shape
            del capsule
    e.close()


def test_a_torchrun_style_job_without_mpi_is_refused_not_split_into_single_processes(monkeypatch):
    for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="WORLD_SIZE=2"):
        libzero.Comm.world()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert libzero.Comm.world().size == 1


@pytest.mark.parametrize("example_name", ["zero3_bf16_nvme.json", "zero3_fp32_nvme.json"])
def test_nvme_offload_trains_the_same_bits(tmp_path, example_name):
    """examples/configs/zero3_bf16_nvme.json (offload_optimizer and offload_param to NVMe) with its paths pointed at a
    scratch directory: the fp32 master, Adam's state and the bf16 param shard in files there, the same weights as
    without. zero3_fp32_nvme.json: fp32 params are their own master, so the optimizer file holds Adam's state and the
    params file the one fp32 copy of the shard. The directory is ZERO_TEST_NVME_DIR's (CTest: on the build tree's disk) or pytest's tmp_path; it must
    support O_DIRECT, or the test fails (it never skips: a machine where it cannot run must show up as one)."""
    import tempfile

    scratch = os.environ.get("ZERO_TEST_NVME_DIR")
    if scratch:
        os.makedirs(scratch, exist_ok=True)
        tmp_path = pathlib.Path(tempfile.mkdtemp(prefix="python-nvme-", dir=scratch))
    example = pathlib.Path(__file__).resolve().parents[3] / "examples" / "configs" / example_name
    offloaded = json.loads(example.read_text())
    offloaded["gradient_accumulation_steps"] = 1
    z = offloaded["zero_optimization"]
    z["sub_group_size"] = 1024  # several chunks for this small model
    z["stage3_param_persistence_threshold"] = 0  # the unit is sharded, so its params go to NVMe too
    z["offload_optimizer"]["nvme_path"] = z["offload_param"]["nvme_path"] = str(tmp_path)
    z["offload_optimizer"]["buffer_count"] = 3
    cfg = json.loads(json.dumps(offloaded))
    del cfg["zero_optimization"]["offload_optimizer"], cfg["zero_optimization"]["offload_param"]
    init = np.linspace(-1, 1, 5000, dtype=np.float32)
    engines = []
    for config in (cfg, offloaded):
        e = libzero.Engine(config, libzero.Comm.single())
        e.add_param("w", (5000,), init=init)
        try:
            e.finalize()
        except libzero.FileSystemError as err:
            e.close()
            pytest.fail(f"NVMe offload cannot run under {tmp_path} (no O_DIRECT there? set ZERO_TEST_NVME_DIR to a "
                        f"directory on a disk): {err}")
        engines.append(e)
    memory, offload = engines
    placement = offload.memory_placement()
    # The optimizer file's arrays (the master in bf16, m, v): 5008 elements padded to 5120; the param shard padded to
    # 4 KiB (bf16: 6144 elements, fp32: 5120)
    fp32 = "bf16" not in offloaded
    arrays, param_size, param_file_elems = (2, 4, 5120) if fp32 else (3, 2, 6144)
    assert placement["nvme_bytes"] == arrays * 5120 * 4 + param_file_elems * param_size
    # 3 chunks of 1024 elements per array; the params' buffer (one 4 KiB-aligned shard) and copy (one shard: the
    # unit padded to 16 elements, 5008)
    assert placement["staging_bytes"] == arrays * 3 * 1024 * 4 + param_file_elems * param_size + 5008 * param_size
    assert len(list(tmp_path.iterdir())) == 2
    for step in range(3):
        for e in engines:
            with e.gathered(0):
                pass
            e.grad("w")[...] += np.sin(np.arange(5000, dtype=np.float32) * (step + 1))
            e.grad_ready("w")
            e.backward_end()
            e.step()
    with memory.gathered(0), offload.gathered(0):
        assert memory.param("w").numpy().tobytes() == offload.param("w").numpy().tobytes()
    for e in engines:
        e.close()
    assert list(tmp_path.iterdir()) == []  # the file goes with the engine


def test_a_frozen_param_s_init_in_another_dtype_is_refused_not_reinterpreted():
    import numpy as np

    e = libzero.Engine({"train_batch_size": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}},
                       libzero.Comm.single())
    with pytest.raises(libzero.InvalidArgumentError, match="give init in its dtype"):
        e.add_param("q", (3,), init=np.int32([1, 2, 3]), frozen=True, dtype="fp32")
    e.add_param("raw", (3,), init=np.zeros(12, np.uint8), frozen=True, dtype="fp32")  # raw bytes are taken as they are
    e.add_param("w", (2,), init=np.ones(2, np.float32))
    e.finalize()
    e.close()
