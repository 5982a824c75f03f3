"""Communicators: MPI (through libzero's MPI module), one process, or a transport written in Python."""

from __future__ import annotations

import os
from typing import Any, Protocol

from . import _native
from ._dtypes import BF16

# ZERO_MPI_COMM_WORLD in zero.h.
_MPI_COMM_WORLD = -1

# Set by the launchers of Open MPI, MPICH/Hydra and PMIx-based ones (Slurm's srun --mpi=pmix).
_MPI_LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


class Transport(Protocol):
    """What :meth:`Comm.custom` needs from a framework's own process group.

    ``rank`` and ``size`` (ints); ``run(collective)`` performs one collective to completion, in place, on
    ``collective["buf"]`` (a 1-D numpy array over libzero's buffer, valid during the call only). The other keys:
    ``kind`` ("all_gather", "reduce_scatter", "all_reduce", "broadcast"), ``dtype`` ("fp32", "bf16", "fp16",
    "fp64", "int64", "uint8"), ``count`` (elements per rank's block for all_gather and reduce_scatter, in all
    otherwise), ``op`` ("sum", "min", "max"; all_reduce), ``root`` (broadcast), ``sequence`` and ``label``
    (diagnostics). The conventions are those of zero_comm_ops_t in zero.h: reduce_scatter leaves this rank's
    block (``buf[rank * count:(rank + 1) * count]``) holding the sum over ranks of that block; bf16 and fp16 sums
    are computed in fp32 and rounded once. Optional: ``deterministic`` (True when sums add contributions in rank
    order 0..size-1: training is then bit-identical across stages and rank counts), ``local_size`` (ranks on
    this node) and ``finalize()`` (collective teardown). An exception raised by ``run`` becomes a
    :class:`~libzero.errors.CommError` with its text. A transport that only runs collectives to completion gets
    every failure check of libzero but the timeout.
    """

    rank: int
    size: int

    def run(self, collective: dict[str, Any]) -> None: ...


class Comm:
    """A communicator. Engines keep theirs alive, so closing it (or dropping it) early is safe."""

    def __init__(self, native: Any, transport: str = "custom", machines: int = 1) -> None:
        self._native = native
        #: What carries the collectives: "mpi", "shm", "single", "custom" (a framework's own transport), "nccl"
        #: (data over NCCL) or "split(CONTROL, DATA)".
        self.transport = transport
        #: The machines a shared-memory communicator spans (``Comm.shm_nodes``: TCP between them); 1 otherwise.
        self.machines = machines
        # Communicators this one made for itself (libzero.torch's control side of an NCCL one): finalized with it.
        self._owned: list[Comm] = []

    @staticmethod
    def mpi(comm: Any = None) -> "Comm":
        """Over MPI: ``comm`` is an mpi4py communicator, a Fortran handle (int), or None for MPI_COMM_WORLD.

        libzero duplicates it, so its messages never match yours. If MPI is not initialised yet, libzero
        initialises it (MPI_THREAD_SERIALIZED) and finalises it at exit. Collective.
        """
        if comm is None:
            handle = _MPI_COMM_WORLD
        elif hasattr(comm, "py2f"):
            handle = int(comm.py2f())
        elif isinstance(comm, int):
            handle = comm
        else:
            raise TypeError(f"Comm.mpi expects an mpi4py communicator, a Fortran handle or None, not {type(comm)!r}")
        return Comm(_native.Comm.mpi(handle), "mpi")

    @staticmethod
    def shm(name: str, rank: int, size: int, join_timeout_s: float = 300.0) -> "Comm":
        """Over shared memory, for ``size`` processes on one machine started by any launcher: each passes its
        ``rank`` and the same ``name`` (unique to the job; a POSIX shared-memory object of that name exists while
        the ranks join). No MPI. The collectives and failure safety are the MPI module's shared-memory ones (the
        same bits). Collective: returns once every rank has joined, or raises after ``join_timeout_s``.
        libzero.torch picks it by itself under torchrun when every rank is on one machine."""
        return Comm(_native.Comm.shm(name, rank, size, join_timeout_s), "shm")

    @staticmethod
    def shm_nodes(
        listener: Any,
        name: str,
        rank: int,
        size: int,
        ranks_per_node: int,
        addresses: list,
        join_timeout_s: float = 300.0,
    ) -> "Comm":
        """``Comm.shm`` for a job over several machines, without MPI: machine k holds the ``ranks_per_node``
        consecutive ranks from k * ranks_per_node (torchrun's placement); each machine's ranks share memory and the
        ranks with the same place on every machine talk over TCP, with the bits of the one-machine collectives.
        ``listener``: this rank's ``Comm.listener(host)``, made first; ``addresses``: every rank's listener's
        ``address``, in rank order (gathered by the job's bootstrap). libzero.torch picks it by itself under torchrun
        when the ranks span machines in equal blocks."""
        return Comm(
            _native.Comm.shm_nodes(listener, name, rank, size, ranks_per_node, list(addresses), join_timeout_s),
            "shm",
            size // ranks_per_node if ranks_per_node > 0 else 1,
        )

    @staticmethod
    def listener(host: str) -> Any:
        """A TCP listener for ``Comm.shm_nodes`` on ``host`` (the address the other machines reach this one by;
        "" listens everywhere and gives the machine's name); ``.address`` is what the other ranks dial."""
        return _native.Listener(host)

    @staticmethod
    def single() -> "Comm":
        """One process, no MPI: every collective is a local copy."""
        return Comm(_native.Comm.single(), "single")

    @staticmethod
    def split(control: "Comm", data: "Comm") -> "Comm":
        """One communicator over two: control messages (the agreement before every call, checks, small sums) over
        ``control``, data collectives (gradients, parameters) over ``data``; both span the same ranks in the same
        order. Both stay yours to finalize: ``finalize()`` on the split agrees over ``control`` and finalizes
        neither. Local."""
        return Comm(_native.Comm.split(control._native, data._native), f"split({control.transport}, {data.transport})")

    @staticmethod
    def nccl(control: "Comm", device: int = 0, timeout_s: float = 300.0) -> "Comm":
        """Data over NCCL on CUDA device ``device``, control over ``control`` (a host communicator: ``Comm.shm``,
        ``Comm.mpi``, a gloo transport), bootstrapped over ``control``. For a device engine (``Engine(...,
        device="cuda")``). NCCL is loaded at run time (libnccl.so.2: torch's nvidia-nccl wheel, or
        ZERO_NCCL_LIBRARY). Several processes on one GPU need a distinct NCCL_HOSTID each. Collective: every rank
        gets the communicator or the same error within ``timeout_s``. ``finalize()`` tears down the NCCL side;
        ``control`` stays yours to finalize."""
        return Comm(_native.Comm.nccl(control._native, device, timeout_s), "nccl")

    @staticmethod
    def custom(transport: Transport) -> "Comm":
        """Over a framework's own transport (see :class:`Transport`)."""
        return Comm(_native.Comm.custom(transport, BF16))

    @staticmethod
    def world() -> "Comm":
        """MPI_COMM_WORLD when the process was started by an MPI launcher (mpirun, mpiexec, srun), else one
        process. A job of several processes started by another launcher (torchrun sets WORLD_SIZE) is refused
        rather than turned into unrelated one-process trainings: give it a communicator over its own process group
        (libzero.torch.ProcessGroupComm, Comm.custom)."""
        if any(os.environ.get(v) for v in _MPI_LAUNCHER_VARIABLES):
            return Comm.mpi()
        if int(os.environ.get("WORLD_SIZE", "1") or "1") > 1:
            raise RuntimeError(
                f"WORLD_SIZE={os.environ['WORLD_SIZE']} but no MPI launcher started this process (torchrun?): pass "
                "a communicator over your process group, e.g. libzero.torch.ProcessGroupComm() after "
                "torch.distributed.init_process_group('gloo')"
            )
        return Comm.single()

    @property
    def rank(self) -> int:
        return int(self._native.rank)

    @property
    def size(self) -> int:
        return int(self._native.size)

    def finalize(self) -> None:
        """Collective teardown: agrees with every rank that the communicator is done, frees the backend's
        collective resources and, if libzero initialised MPI, finalises it. Engines on it fail afterwards. A split
        communicator finalizes only what it made itself (``Comm.nccl``'s NCCL side), not the communicators it was
        given."""
        self._native.finalize()
        for part in self._owned:
            part.finalize()

    def close(self) -> None:
        """Drops this reference (local)."""
        self._native.close()

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        try:
            return f"<libzero.Comm rank {self.rank} of {self.size}>"
        except Exception:  # closed
            return "<libzero.Comm (closed)>"
