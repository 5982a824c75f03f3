"""libzero for PyTorch models, in the spirit of ``deepspeed.initialize``.

    engine = libzero.torch.initialize(model, "ds_config.json")
    for batch in data:
        loss = engine(batch)        # the model's forward
        engine.backward(loss)       # gradients go into libzero's buffers as autograd produces them
        engine.step()               # the optimizer step at the accumulation boundary

What happens to the model's parameters (those with ``requires_grad``; frozen ones stay plain torch tensors):

- stages 0-2: every ``param.data`` is a tensor over libzero's own parameter memory (DLPack, no copy), in the
  config's compute dtype (bf16/fp16 configs turn the model's trained params into bf16/fp16, as DeepSpeed does);
  ``zero_step`` writes the new values there.
- stage 3: a param's full values exist only while its unit is gathered. Each unit is gathered before its first
  module's forward and copied into a torch tensor the model computes with; a unit that is a block of a
  ``ModuleList`` is released after its forward (the tensor's storage freed, as FSDP does) and gathered again
  when backward reaches it, then released once its gradients are in; other units stay gathered from the
  model's forward to the end of its backward.
- gradients: a post-accumulate-grad hook adds each param's gradient into ``engine.grad(i)`` (the fp32
  accumulation buffer by default), drops ``param.grad`` and declares it ready, so stages 2-3 reduce buckets while
  backward goes on.

Units (stage 3's gather granularity): by default each element of every ``torch.nn.ModuleList`` is a unit and the
other params form one unit each side of them (before the first block, after the last), numbered in registration
order; ``units=fn(name, param) -> key`` groups params by any key instead.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import numpy as np
import torch

from .comm import Comm
from .engine import ConfigLike, Engine, StepResult, config_text

_TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# ---- a client optimizer's hyper-parameters as a config's optimizer block -------------------------------------------
def optimizer_block(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The DeepSpeed ``optimizer`` block equivalent to a torch optimizer's first param group (as DeepSpeed takes a
    client optimizer): AdamW, Adam, Adagrad and SGD."""
    g = optimizer.param_groups[0]
    kind = type(optimizer).__name__
    if kind in ("AdamW", "Adam"):
        if g.get("amsgrad"):
            raise NotImplementedError(f"{kind}(amsgrad=True) is not supported by libzero")
        params = {"lr": g["lr"], "betas": list(g["betas"]), "eps": g["eps"], "weight_decay": g["weight_decay"]}
        if kind == "Adam" and g["weight_decay"] != 0:
            # torch's Adam adds the decay to the gradient (L2), as DeepSpeed's "Adam" with adam_w_mode false.
            params["adam_w_mode"] = False
        return {"type": kind, "params": params}
    if kind == "Adagrad":
        return {"type": "Adagrad", "params": {"lr": g["lr"], "eps": g["eps"], "weight_decay": g["weight_decay"]}}
    if kind == "SGD":
        if g.get("momentum", 0) != 0 or g.get("nesterov"):
            raise NotImplementedError("SGD with momentum is not supported by libzero yet: use momentum=0")
        return {"type": "SGD", "params": {"lr": g["lr"], "weight_decay": g["weight_decay"]}}
    raise NotImplementedError(f"libzero runs AdamW, Adam, Adagrad, SGD (and Lion from a config); not {kind}")


def _group_overrides(group: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """What a torch param group sets differently from the first one, as add_param_group's keywords."""
    out: dict[str, Any] = {}
    for key in ("lr", "weight_decay", "eps"):
        if key in group and group[key] != base.get(key):
            out[key] = group[key]
    if "betas" in group and tuple(group["betas"]) != tuple(base.get("betas", ())):
        out["betas"] = tuple(group["betas"])
    return out


# ---- units ---------------------------------------------------------------------------------------------------------
def default_units(model: torch.nn.Module) -> Callable[[str, torch.nn.Parameter], Hashable]:
    """Each ModuleList element is a unit; the params before the first block and after the last form one each."""
    blocks: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList):
            blocks.extend(f"{name}.{child}" if name else child for child, _ in module.named_children())

    def unit_of(name: str, _param: torch.nn.Parameter) -> Hashable:
        for b in blocks:
            if name.startswith(b + "."):
                return ("block", b)
        return ("rest", None)

    return unit_of


class TorchEngine:
    """A torch model trained by a libzero engine (see the module's documentation). ``engine.module`` is the model,
    ``engine.engine`` the underlying :class:`libzero.Engine`."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: ConfigLike,
        comm: Comm | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        units: Callable[[str, torch.nn.Parameter], Hashable] | None = None,
    ) -> None:
        cfg = json.loads(config_text(config))
        groups = optimizer.param_groups if optimizer is not None else []
        if optimizer is not None:
            if "optimizer" in cfg:
                # DeepSpeed lets the client optimizer win too; say so instead of dropping the block silently.
                warnings.warn(
                    "both a config 'optimizer' block and a client optimizer were given: the client optimizer's "
                    f"{type(optimizer).__name__} hyper-parameters are used (as DeepSpeed does), the block is ignored",
                    stacklevel=3,
                )
            cfg["optimizer"] = optimizer_block(optimizer)
        elif "optimizer" not in cfg:
            raise ValueError("the config has no 'optimizer' block: give one, or pass a torch optimizer")
        self.module = model
        self.engine = Engine(cfg, comm)
        info = self.engine.info
        self.stage = int(info["stage"])
        self._gas = int(info["gradient_accumulation_steps"])
        self._dtype = _TORCH_DTYPE[info["param_dtype"]]
        self._fp16 = info["param_dtype"] == "fp16"
        self._micro = 0

        # Params in registration order; units numbered by first appearance.
        unit_of = units if units is not None else default_units(model)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        keys: dict[Hashable, int] = {}
        raw_units = []
        for i, (name, p) in enumerate(named):
            key = unit_of(name, p)
            if key == ("rest", None):
                # The params outside every block: one unit before the first block, one after the last.
                key = ("rest", "after" if any(k[0] == "block" for k in keys if isinstance(k, tuple)) else "before")
            keys.setdefault(key, len(keys))
            raw_units.append(keys[key])
        group_of: dict[int, int] = {}
        for gi, g in enumerate(groups[1:], start=1):
            gid = self.engine.add_param_group(f"group{gi}", **_group_overrides(g, groups[0]))
            for p in g["params"]:
                group_of[id(p)] = gid
        self._params: list[torch.nn.Parameter] = []
        self._unit: list[int] = []
        self._is_block = {keys[k]: isinstance(k, tuple) and k[0] == "block" for k in keys}
        for (name, p), u in zip(named, raw_units):
            init = p.detach().to(torch.float32).cpu().contiguous().numpy()
            self.engine.add_param(name, tuple(p.shape), unit=u, group=group_of.get(id(p), 0), init=init)
            self._params.append(p)
            self._unit.append(u)
        self.engine.finalize()
        self._units = sorted(set(self._unit))
        self._members = {u: [i for i, pu in enumerate(self._unit) if pu == u] for u in self._units}
        self._gathered: set[int] = set()
        self._grads_in: dict[int, int] = {u: 0 for u in self._units}

        for i, p in enumerate(self._params):
            p.register_post_accumulate_grad_hook(self._grad_hook(i))
        if self.stage < 3:
            self._bind_full()
        else:
            self._full = [torch.empty(tuple(p.shape), dtype=self._dtype) for p in self._params]
            for i, p in enumerate(self._params):
                self._full[i].untyped_storage().resize_(0)
                p.data = self._full[i]
            self._hook_stage3()

    # ---- the training loop ---------------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward."""
        return self.module(*args, **kwargs)

    forward = __call__

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of ``loss`` (times the fp16 loss scale), then the end of the micro-step."""
        if self._fp16:
            loss = loss * self.engine.loss_scale
        loss.backward()
        if self.stage == 3:
            for u in sorted(self._gathered):
                self._release(u)
        self.engine.backward_end()
        self._micro += 1

    def step(self) -> StepResult | None:
        """The optimizer step when ``gradient_accumulation_steps`` micro-steps have ended since the last one (call
        it after every backward, as with DeepSpeed); None otherwise."""
        if self._micro < self._gas:
            return None
        self._micro = 0
        if self.stage < 3:
            for u in self._units:
                self.engine.release(u)
            try:
                return self.engine.step()
            finally:
                self._bind_full()
        return self.engine.step()

    def is_gradient_accumulation_boundary(self) -> bool:
        return self._micro >= self._gas

    @property
    def loss_scale(self) -> float:
        return self.engine.loss_scale

    def set_lr(self, lr: float, group: int = -1) -> None:
        self.engine.set_lr(lr, group)

    def save_checkpoint(self, directory: str, tag: str) -> None:
        if self.stage < 3:
            for u in self._units:
                self.engine.release(u)
        try:
            self.engine.save_checkpoint(directory, tag)
        finally:
            if self.stage < 3:
                self._bind_full()

    def load_checkpoint(self, directory: str, tag: str | None = None) -> None:
        if self.stage < 3:
            for u in self._units:
                self.engine.release(u)
        try:
            self.engine.load_checkpoint(directory, tag)
        finally:
            if self.stage < 3:
                self._bind_full()

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every trained param's full values (copies, in the compute dtype), by name. Collective at stage 3."""
        out = {}
        for u in self._units:
            gathered_here = u not in self._gathered and self.stage == 3
            if gathered_here:
                self.engine.gather(u)
            for i in self._members[u]:
                name = self.engine.param_names[i]
                if self.stage == 3:
                    out[name] = torch.from_dlpack(self.engine.param(i)).clone()
                else:
                    out[name] = self._params[i].detach().clone()
            if gathered_here:
                self.engine.release(u)
        return out

    def close(self) -> None:
        self.engine.close()

    # ---- stages 0-2: params in engine memory --------------------------------------------------------------------
    def _bind_full(self) -> None:
        for u in self._units:
            self.engine.gather(u)  # free below stage 3
        for i, p in enumerate(self._params):
            view = torch.from_dlpack(self.engine.param(i))
            if p.data.data_ptr() != view.data_ptr() or p.dtype != view.dtype:
                p.data = view

    # ---- gradients -------------------------------------------------------------------------------------------------
    def _grad_hook(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(p: torch.Tensor) -> None:
            g = p.grad
            if g is None:
                return
            dst = torch.from_dlpack(self.engine.grad(i))
            dst.add_(g.reshape(dst.shape))
            p.grad = None
            self.engine.grad_ready(i)
            if self.stage == 3:
                u = self._unit[i]
                self._grads_in[u] += 1
                if self._is_block[u] and self._grads_in[u] == len(self._members[u]) and u in self._gathered:
                    self._release(u)

        return hook

    # ---- stage 3: gather, copy, free ---------------------------------------------------------------------------------
    def _gather(self, u: int) -> None:
        if u in self._gathered:
            return
        self.engine.gather(u)
        self._gathered.add(u)
        for i in self._members[u]:
            full = self._full[i]
            full.untyped_storage().resize_(full.numel() * full.element_size())
            full.copy_(torch.from_dlpack(self.engine.param(i)))

    def _release(self, u: int) -> None:
        if u not in self._gathered:
            return
        for i in self._members[u]:
            self._full[i].untyped_storage().resize_(0)
        self._gathered.discard(u)
        self.engine.release(u)

    def _hook_stage3(self) -> None:
        owners: dict[int, list[torch.nn.Module]] = {}
        param_unit = {id(p): self._unit[i] for i, p in enumerate(self._params)}
        for module in self.module.modules():
            us = sorted({param_unit[id(p)] for p in module.parameters(recurse=False) if id(p) in param_unit})
            for u in us:
                owners.setdefault(u, []).append(module)
        block_modules: dict[int, torch.nn.Module] = {}
        for name, module in self.module.named_modules():
            if isinstance(module, torch.nn.ModuleList):
                for child in module.children():
                    us = {param_unit[id(p)] for p in child.parameters() if id(p) in param_unit}
                    if len(us) == 1:
                        (u,) = us
                        if self._is_block[u]:
                            block_modules[u] = child

        # Units other than blocks: gathered when the first module owning them runs, kept to the end of backward.
        for u, modules in owners.items():
            for m in modules:
                m.register_forward_pre_hook(lambda _m, _a, u=u: self._gather(u))

        for u, block in block_modules.items():
            block.register_forward_pre_hook(lambda _m, _a, u=u: self._gather(u))
            block.register_forward_hook(self._after_block_forward(u))

        # The model's own forward: start of a micro-step (gradient counts) and, without autograd, releases at end.
        def before(_m: torch.nn.Module, _a: Any) -> None:
            for u in self._units:
                self._grads_in[u] = 0

        def after(_m: torch.nn.Module, _a: Any, _out: Any) -> None:
            if not torch.is_grad_enabled():
                for u in sorted(self._gathered):
                    self._release(u)

        self.module.register_forward_pre_hook(before)
        self.module.register_forward_hook(after)

    def _after_block_forward(self, u: int) -> Callable[..., None]:
        def hook(_m: torch.nn.Module, _args: Any, output: Any) -> None:
            tensors = [t for t in _tensors(output) if t.requires_grad]
            self._release(u)
            if tensors:
                # Before backward computes anything inside this block: gather it again.
                torch.autograd.graph.register_multi_grad_hook(tensors, lambda _g: self._gather(u), mode="any")

        return hook


def _tensors(x: Any) -> Iterable[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _tensors(v)


def initialize(
    model: torch.nn.Module,
    config: ConfigLike,
    comm: Comm | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    units: Callable[[str, torch.nn.Parameter], Hashable] | None = None,
) -> TorchEngine:
    """Trains ``model`` with libzero as ``config`` says (a DeepSpeed config: dict, JSON text or path). Without an
    ``optimizer`` block the hyper-parameters come from ``optimizer`` (AdamW, Adam, Adagrad, SGD), as DeepSpeed takes a
    client optimizer. ``comm`` by default: torch.distributed's default group when it is initialised (torchrun),
    else MPI_COMM_WORLD under an MPI launcher, else one process."""
    if comm is None:
        import torch.distributed as dist

        comm = ProcessGroupComm() if dist.is_available() and dist.is_initialized() else Comm.world()
    return TorchEngine(model, config, comm=comm, optimizer=optimizer, units=units)


# ---- torch.distributed as libzero's transport -------------------------------------------------------------------------
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
            buf[self.rank * count : (self.rank + 1) * count] = _rank_order_sum(parts, c["dtype"])
        elif kind == "all_reduce":
            everyone = torch.empty(self.size * raw.numel(), dtype=torch.uint8)
            dist.all_gather_into_tensor(everyone, raw.clone(), group=group)
            parts = everyone.numpy().view(buf.dtype).reshape(self.size, count)
            reduce = {"sum": np.add, "min": np.minimum, "max": np.maximum}[c["op"]]
            acc = parts[0].copy()
            for r in range(1, self.size):
                acc = reduce(acc, parts[r])
            buf[:] = acc
        else:
            raise ValueError(f"unknown collective {kind}")


def _rank_order_sum(parts: np.ndarray, dtype: str) -> np.ndarray:
    """Rank order 0..N-1; bf16 and fp16 summed in fp32 and rounded once to nearest even, as libzero's backends do."""
    if dtype == "bf16":
        bits = parts.view(np.uint16)
        acc = (bits[0].astype(np.uint32) << 16).view(np.float32).copy()
        for r in range(1, len(parts)):
            acc += (bits[r].astype(np.uint32) << 16).view(np.float32)
        u = acc.view(np.uint32)
        out = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        nan = np.isnan(acc)
        out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
        return out.view(parts.dtype)
    if dtype == "fp16":
        acc = parts[0].astype(np.float32)
        for r in range(1, len(parts)):
            acc += parts[r].astype(np.float32)
        return acc.astype(np.float16)
    acc = parts[0].copy()
    for r in range(1, len(parts)):
        acc += parts[r]
    return acc


def ProcessGroupComm(group: Any = None) -> Comm:  # noqa: N802 - a constructor in the API's spelling
    """A libzero communicator over a torch.distributed process group (the default group when None): jobs started
    with ``torchrun`` need no MPI. Blocking: libzero's failure checks apply, its timeout does not (use the process
    group's own timeout)."""
    return Comm.custom(_ProcessGroupTransport(group))
