"""torch.distributed as libzero's transport, and the communicator ``initialize`` uses when given none."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from ..comm import Comm
from ..reduce import rank_order_reduce, rank_order_sum


def default_comm() -> Comm:
    """Under torch.distributed (torchrun): libzero's shared-memory communicator when every rank is on this machine
    (the speed of an mpirun job, no MPI), and across machines when each holds the same number of consecutive ranks
    (torchrun's placement: shared memory within a machine, TCP between them); else a transport over
    torch.distributed's default group (a gloo group beside it when the default one is not gloo: NCCL cannot move
    host buffers). ZERO_TORCH_TRANSPORT=process_group keeps the latter everywhere; ZERO_TORCH_TRANSPORT=nccl puts a
    CUDA model's data collectives on NCCL (libzero's NCCL module on torch.cuda.current_device(), bootstrapped over
    and with its control messages on the shared-memory communicator above; several processes on one GPU need a
    distinct NCCL_HOSTID each). Without torch.distributed, Comm.world(); refuses a torchrun job that has
    not initialised torch.distributed, which would otherwise train N unrelated models."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        transport = os.environ.get("ZERO_TORCH_TRANSPORT", "auto")
        if transport not in ("auto", "shm", "process_group", "nccl"):
            raise ValueError(f"ZERO_TORCH_TRANSPORT={transport!r}: expected auto, shm, process_group or nccl")
        if dist.get_world_size(group) > 1:
            # Every rank decides from what every rank says, so they all take the same transport (or all raise).
            said: list[Any] = [None] * dist.get_world_size(group)
            dist.all_gather_object(said, (_machine_id(), transport), group=group)
            if len({t for _, t in said}) > 1:
                raise RuntimeError(f"ZERO_TORCH_TRANSPORT differs between ranks: {[t for _, t in said]}")
            if transport != "process_group":
                machines = [m for m, _ in said]
                control = None
                if len(set(machines)) == 1:
                    control = _shm_comm(dist, group)
                elif per_machine := _ranks_per_machine(machines):
                    control = _shm_nodes_comm(dist, group, per_machine, machines)
                if control is not None and transport == "nccl":
                    device = torch.cuda.current_device() if torch.cuda.is_available() else 0
                    comm = Comm.nccl(control, device=device)
                    comm._owned.append(control)  # made here: finalized with the NCCL communicator
                    return comm
                if control is not None:
                    return control
                if transport in ("shm", "nccl"):
                    raise RuntimeError(
                        f"ZERO_TORCH_TRANSPORT={transport}, but the ranks are not spread over the machines in equal "
                        f"blocks of consecutive ranks: {machines}"
                    )
        return ProcessGroupComm(group)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not any(
        os.environ.get(v) for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
    ):
        raise RuntimeError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} (torchrun?) but torch.distributed is not initialised: call "
            "torch.distributed.init_process_group('gloo') first, or pass comm="
        )
    return Comm.world()


def _machine_id() -> str:
    """This machine, as shared memory sees it: the host name, the kernel's boot id and the mount namespace (whose
    /dev/shm the segment lives in). Containers that share a host name but not /dev/shm still differ in the last.
    ZERO_TORCH_MACHINE_ID, where set, says it instead: ranks that give the same id must share /dev/shm (containers
    that do, for one); ranks that give different ids talk over TCP even on one machine (torchrun agents started with
    --nnodes on one machine, to try the path between machines)."""
    import socket

    chosen = os.environ.get("ZERO_TORCH_MACHINE_ID")
    if chosen:
        return f"id:{chosen}"
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    try:
        mounts = os.readlink("/proc/self/ns/mnt")
    except OSError:
        mounts = ""
    return f"{socket.gethostname()}/{boot}/{mounts}"


def _ranks_per_machine(machines: list) -> int:
    """L when every machine holds L consecutive ranks (and L > 0), else 0."""
    per = machines.count(machines[0])
    if len(machines) % per != 0:
        return 0
    blocks = [machines[i : i + per] for i in range(0, len(machines), per)]
    firsts = [b[0] for b in blocks]
    if any(len(set(b)) != 1 for b in blocks) or len(set(firsts)) != len(firsts):
        return 0
    return per


def _route_to(host: str) -> str:
    """This machine's address on the route towards `host` (a UDP socket's connect picks the interface and sends
    nothing); "" if there is none."""
    import socket

    try:
        family = socket.getaddrinfo(host, None)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return probe.getsockname()[0]
    except OSError:
        return ""


def _is_loopback(address: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _listen_address(dist: Any, group: Any, machines: list) -> str:
    """The address the other machines reach this one by: ZERO_TORCH_LISTEN_ADDR, else the one this machine's routes
    use towards MASTER_ADDR. On the master's own machine that route is often loopback (MASTER_ADDR a name that
    /etc/hosts maps to 127.0.1.1): then the route towards another machine's address, gathered first."""
    chosen = os.environ.get("ZERO_TORCH_LISTEN_ADDR")
    if chosen:
        return chosen
    mine = _route_to(os.environ.get("MASTER_ADDR", "127.0.0.1"))
    routes: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(routes, mine, group=group)
    me = machines[dist.get_rank(group)]
    if not mine or _is_loopback(mine):
        for other, machine in zip(routes, machines):
            if machine != me and other and not _is_loopback(other):
                found = _route_to(other)
                if found and not _is_loopback(found):
                    return found
    return mine  # loopback only when every "machine" is this one (tests), or "": every interface, by name


def _shm_nodes_comm(dist: Any, group: Any, ranks_per_node: int, machines: list) -> Comm:
    """The shared-memory communicator across machines: each rank's listener first, the addresses gathered over the
    process group, the job's name drawn by rank 0."""
    import uuid

    name = [f"libzero-{uuid.uuid4().hex}" if dist.get_rank(group) == 0 else None]
    dist.broadcast_object_list(name, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    listener = Comm.listener(_listen_address(dist, group, machines))
    addresses: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(addresses, listener.address, group=group)
    timeout = float(os.environ.get("ZERO_TORCH_JOIN_TIMEOUT_S", "300"))
    return Comm.shm_nodes(
        listener, name[0], dist.get_rank(group), dist.get_world_size(group), ranks_per_node, addresses, timeout
    )


def _shm_comm(dist: Any, group: Any) -> Comm:
    """The shared-memory communicator under a name rank 0 draws and sends to the others over the process group."""
    import uuid

    name = [f"libzero-{uuid.uuid4().hex}" if dist.get_rank(group) == 0 else None]
    dist.broadcast_object_list(name, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    timeout = float(os.environ.get("ZERO_TORCH_JOIN_TIMEOUT_S", "300"))
    return Comm.shm(name[0], dist.get_rank(group), dist.get_world_size(group), timeout)


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
