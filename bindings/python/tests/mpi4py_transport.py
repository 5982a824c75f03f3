"""A custom communicator over mpi4py, written against libzero.Transport: what a framework with its own process
group provides. Sums add contributions in rank order (deterministic), as libzero's MPI backend does, so training
through it gives the same bits."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round to nearest even (NaN kept quiet), as libzero's conversions do."""
    u = values.view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


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
            buf[mine] = self._sum(parts, c["dtype"])
        elif kind == "all_reduce":
            everyone = np.empty(self.size * raw.size, np.uint8)
            self.comm.Allgather([raw, MPI.BYTE], [everyone, MPI.BYTE])
            parts = everyone.view(buf.dtype).reshape(self.size, count)
            reduce = {"sum": np.add, "min": np.minimum, "max": np.maximum}[c["op"]]
            acc = parts[0].copy()
            for r in range(1, self.size):
                acc = reduce(acc, parts[r])
            buf[:] = acc
        else:
            raise ValueError(f"unknown collective {kind}")

    def _sum(self, parts: np.ndarray, dtype: str) -> np.ndarray:
        """Rank order 0..N-1; 16-bit values summed in fp32 and rounded once."""
        if dtype == "bf16":
            wide = [_bf16_to_f32(p.view(np.uint16)) for p in parts]
        elif dtype == "fp16":
            wide = [p.astype(np.float32) for p in parts]
        else:
            wide = list(parts)
        acc = wide[0].copy()
        for w in wide[1:]:
            acc += w
        if dtype == "bf16":
            return _f32_to_bf16(acc).view(parts.dtype)
        if dtype == "fp16":
            return acc.astype(np.float16)
        return acc
