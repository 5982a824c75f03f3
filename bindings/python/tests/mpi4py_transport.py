"""A custom communicator over mpi4py, written against libzero.Transport: what a framework with its own process
group provides. It moves bytes with MPI and reduces with libzero.reduce (rank order, as libzero's MPI backend), so
training through it gives the same bits."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from libzero.reduce import rank_order_reduce, rank_order_sum


class MPI4PyTransport:
    deterministic = True

    def __init__(self, comm: Any = None) -> None:
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.calls = 0

    def run(self, c: dict[str, Any]) -> None:
        self.calls += 1
        kind, buf, count = c["kind"], c["buf"], c["count"]
        raw = buf.view(np.uint8)
        if kind == "all_gather":
            self.comm.Allgather(MPI.IN_PLACE, [raw, MPI.BYTE])
        elif kind == "broadcast":
            self.comm.Bcast([raw, MPI.BYTE], root=c["root"])
        elif kind == "reduce_scatter":
            blocks = np.empty_like(raw)
            self.comm.Alltoall([raw, MPI.BYTE], [blocks, MPI.BYTE])
            mine = slice(self.rank * count, (self.rank + 1) * count)
            parts = blocks.view(buf.dtype).reshape(self.size, count)
            buf[mine] = rank_order_sum(parts, c["dtype"])
        elif kind == "all_reduce":
            everyone = np.empty(self.size * raw.size, np.uint8)
            self.comm.Allgather([raw, MPI.BYTE], [everyone, MPI.BYTE])
            parts = everyone.view(buf.dtype).reshape(self.size, count)
            buf[:] = rank_order_reduce(parts, c["op"])
        else:
            raise ValueError(f"unknown collective {kind}")
