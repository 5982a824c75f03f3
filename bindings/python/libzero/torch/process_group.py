"""torch.distributed as libzero's transport, and the communicator ``initialize`` uses when given none."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from ..comm import Comm
from ..reduce import rank_order_reduce, rank_order_sum


def _default_comm() -> Comm:
    """torch.distributed's default group when it is initialised (a gloo group beside it when the default one is not
    gloo: NCCL cannot move host buffers), else Comm.world(); refuses a torchrun job that has not initialised
    torch.distributed, which would otherwise train N unrelated models."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if dist.get_backend() == "gloo":
            return ProcessGroupComm()
        return ProcessGroupComm(dist.new_group(backend="gloo"))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not any(
        os.environ.get(v) for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
    ):
        raise RuntimeError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} (torchrun?) but torch.distributed is not initialised: call "
            "torch.distributed.init_process_group('gloo') first, or pass comm="
        )
    return Comm.world()


class _ProcessGroupTransport:
    """Collectives over a torch.distributed process group (gloo on CPUs), deterministic: reduce-scatter and
    all-reduce move bytes with all-to-all / all-gather and sum in rank order here, so results equal the MPI
    backend's bit for bit."""

    deterministic = True

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def run(self, c: dict[str, Any]) -> None:
        dist, group = self.dist, self.group
        buf = c["buf"]
        raw = torch.from_numpy(buf.view(np.uint8))
        kind, count = c["kind"], c["count"]
        if kind == "all_gather":
            block = raw.numel() // self.size
            mine = raw[self.rank * block : (self.rank + 1) * block].clone()
            dist.all_gather_into_tensor(raw, mine, group=group)
        elif kind == "broadcast":
            root = dist.get_global_rank(group, c["root"]) if group is not None else c["root"]
            dist.broadcast(raw, src=root, group=group)
        elif kind == "reduce_scatter":
            blocks = torch.empty_like(raw)
            dist.all_to_all_single(blocks, raw.clone(), group=group)
            parts = blocks.numpy().view(buf.dtype).reshape(self.size, count)
            buf[self.rank * count : (self.rank + 1) * count] = rank_order_sum(parts, c["dtype"])
        elif kind == "all_reduce":
            everyone = torch.empty(self.size * raw.numel(), dtype=torch.uint8)
            dist.all_gather_into_tensor(everyone, raw.clone(), group=group)
            parts = everyone.numpy().view(buf.dtype).reshape(self.size, count)
            buf[:] = rank_order_reduce(parts, c["op"])
        else:
            raise ValueError(f"unknown collective {kind}")


def ProcessGroupComm(group: Any = None) -> Comm:  # noqa: N802 - a constructor in the API's spelling
    """A libzero communicator over a torch.distributed process group (the default group when None): jobs started
    with ``torchrun`` need no MPI. Blocking: libzero's failure checks apply, its timeout does not (use the process
    group's own timeout)."""
    return Comm.custom(_ProcessGroupTransport(group))
