"""The Python binding under mpirun (2 and 3 ranks): the same bits as one process, over libzero's MPI backend and over
a transport written in Python; failures on one rank become errors on every rank; the GIL is free while waiting."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

import libzero
import training
from mpi4py_transport import MPI4PyTransport

WORLD = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()
GAS = 2
STEPS = 3

if WORLD < 2:
    pytest.skip("run under mpirun -np 2 or more", allow_module_level=True)


def reference(stage: int, dtype: str) -> dict[str, bytes]:
    """One process, every rank's micro-steps accumulated: the weights the distributed run must reproduce."""
    cfg = training.config(stage, gas=GAS * WORLD, world=1, dtype=dtype, clip=1.0)
    with libzero.Engine(cfg, libzero.Comm.single()) as e:
        training.train(e, steps=STEPS, gas=GAS * WORLD, world=WORLD, rank=-1)
        return training.weights(e)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("backend", ["mpi", "python", "split"])
def test_the_same_weights_as_one_process(stage, dtype, backend):
    transport = MPI4PyTransport()
    if backend == "mpi":
        comm = libzero.Comm.mpi(MPI.COMM_WORLD)
    elif backend == "python":
        comm = libzero.Comm.custom(transport)
    else:  # control over MPI, data over shared memory
        name = MPI.COMM_WORLD.bcast(f"libzero-pytest-split-{time.time_ns()}" if RANK == 0 else None)
        comm = libzero.Comm.split(libzero.Comm.mpi(MPI.COMM_WORLD), libzero.Comm.shm(name, RANK, WORLD))
        assert comm.transport == "split(mpi, shm)"
    with libzero.Engine(training.config(stage, gas=GAS, world=WORLD, dtype=dtype, clip=1.0), comm) as e:
        assert e.info["deterministic"]
        results = training.train(e, steps=STEPS, gas=GAS, world=WORLD, rank=RANK)
        got = training.weights(e)
    assert all(not r.skipped for r in results)
    assert (transport.calls > 0) == (backend == "python")
    initial = {name: training.initial(name, shape).astype(np.float32) for name, shape, _ in training.LAYOUT}
    assert any(got[name] != initial[name].tobytes() for name in got if dtype == "fp32") or dtype == "bf16"
    assert got == reference(stage, dtype)


def test_nccl_where_it_cannot_run_fails_alike_on_every_rank():
    """No GPU here (or no NCCL): every rank gets the same kind of error at once, and the control communicator
    still trains."""
    control = libzero.Comm.mpi(MPI.COMM_WORLD)
    try:
        nccl = libzero.Comm.nccl(control, device=0, timeout_s=20)
    except libzero.errors.UnsupportedError as e:
        assert "zero_comm_create_nccl" in str(e)
    else:
        nccl.close()
        pytest.skip("NCCL runs here")
    with libzero.Engine(training.config(2, gas=GAS, world=WORLD, dtype="fp32", clip=1.0), control) as e:
        training.train(e, steps=1, gas=GAS, world=WORLD, rank=RANK)


def test_a_registration_that_differs_on_one_rank_fails_on_every_rank():
    with libzero.Engine(training.config(2, 1, WORLD), libzero.Comm.mpi()) as e:
        e.add_param("w", (4, 3) if RANK != WORLD - 1 else (3, 4))
        with pytest.raises(libzero.MismatchError, match="w"):
            e.finalize()


def test_a_rank_that_gathers_another_unit_fails_on_every_rank():
    cfg = training.config(3, 1, WORLD)
    with libzero.Engine(cfg, libzero.Comm.mpi()) as e:
        ids = training.register(e)
        assert ids
        with pytest.raises(libzero.MismatchError):
            e.gather(1 if RANK == 0 else 2)


def test_an_engine_aborted_on_one_rank_fails_the_others_collectives():
    cfg = training.config(3, 1, WORLD)
    e = libzero.Engine(cfg, libzero.Comm.mpi())
    training.register(e)
    if RANK == 1:
        e.abort()
        with pytest.raises(libzero.AbortedError):
            e.gather(0)
    else:
        with pytest.raises(libzero.RemoteError, match="rank 1"):
            e.gather(0)
    e.close()


def test_the_gil_is_free_while_a_rank_waits_for_the_others():
    cfg = training.config(3, 1, WORLD)
    with libzero.Engine(cfg, libzero.Comm.mpi()) as e:
        training.register(e)
        ticks = [0]
        stop = threading.Event()

        def count():
            while not stop.is_set():
                ticks[0] += 1
                time.sleep(0.001)

        t = threading.Thread(target=count)
        MPI.COMM_WORLD.Barrier()
        if RANK == 0:
            t.start()
        else:
            time.sleep(1.0)  # rank 0 waits in its all-gather for this long
        e.gather(0)
        if RANK == 0:
            stop.set()
            t.join()
            # With the GIL held through the wait, the counter could not move at all.
            assert ticks[0] > 100, ticks[0]
        e.release(0)


def test_closing_an_engine_from_another_thread_while_a_call_waits():
    """A watchdog's abort() + close() while the main thread waits in a collective: the waiting call returns an
    error and the engine is destroyed when it does, not under it."""
    cfg = training.config(2, 1, WORLD)
    e = libzero.Engine(cfg, libzero.Comm.mpi())
    ids = training.register(e)
    MPI.COMM_WORLD.Barrier()
    if RANK == 0:
        def watchdog():
            time.sleep(0.5)
            e.abort()
            e.close()

        t = threading.Thread(target=watchdog)
        t.start()
        with pytest.raises((libzero.AbortedError, libzero.InvalidStateError)):
            e.backward_end()  # the others are late: this rank waits here
        t.join()
        assert e.closed
    else:
        time.sleep(1.5)
        with pytest.raises((libzero.RemoteError, libzero.AbortedError)):
            e.backward_end()
        e.close()
    assert ids
