"""libzero for PyTorch models, in the spirit of ``deepspeed.initialize``.

    engine = libzero.torch.initialize(model, "ds_config.json")
    for batch in data:
        loss = engine(batch)        # the model's forward
        engine.backward(loss)       # gradients go into libzero's buffers as autograd produces them
        engine.step()               # the optimizer step at the accumulation boundary

What happens to the model (docs/python.md has the whole story):

- params with ``requires_grad`` are registered with the engine (rank 0's values); frozen params and floating-point
  buffers get rank 0's values too and, with a bf16/fp16 config, that dtype (DeepSpeed casts the module likewise);
- stages 0-2: every trained ``param.data`` is a tensor over libzero's own parameter memory (DLPack, no copy);
  ``zero_step`` writes the new values there;
- stage 3: a unit is gathered before the first module owning its params runs, its values copied into tensors the
  model computes with; a unit whose params are exactly one module's (a ``ModuleList`` block) is released after
  that module's forward, and autograd keeps, instead of those tensors, where to find them again: backward
  gathers the unit anew when it needs it (a saved-tensor hook), and releases it when its last gradient is in.
  Released params show an empty placeholder (shape [0]), as DeepSpeed's do;
- gradients: a post-accumulate-grad hook adds each param's gradient into ``engine.grad(i)``, drops
  ``param.grad`` and declares it ready, so stages 2-3 reduce buckets while backward goes on.

Units (stage 3's gather granularity): by default each element of the outermost ``torch.nn.ModuleList``s is a unit
and the other params form one unit each side of them (before the first block, after the last), numbered in
registration order; ``units=fn(name, param) -> key`` groups params by any key instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import numpy as np
import torch

from .comm import Comm
from .engine import ConfigLike, Engine, StepResult, config_text
from .errors import ZeroError
from .reduce import rank_order_reduce, rank_order_sum

_TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# ---- a client optimizer's hyper-parameters as a config's optimizer block -------------------------------------------
_UNSUPPORTED_OPTIONS = {
    # option: (the value libzero runs, what to call it)
    "amsgrad": (False, "amsgrad"),
    "maximize": (False, "maximize"),
    "momentum": (0, "momentum"),
    "nesterov": (False, "nesterov"),
    "dampening": (0, "dampening"),
    "lr_decay": (0, "Adagrad's lr_decay"),
    "initial_accumulator_value": (0, "Adagrad's initial_accumulator_value"),
}


def optimizer_block(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The DeepSpeed ``optimizer`` block equivalent to a torch optimizer (as DeepSpeed takes a client optimizer):
    AdamW, Adam, Adagrad and SGD without momentum. Options libzero does not run, in any param group, are refused."""
    kind = type(optimizer).__name__
    if kind not in ("AdamW", "Adam", "Adagrad", "SGD"):
        raise NotImplementedError(f"libzero runs AdamW, Adam, Adagrad, SGD (and Lion from a config); not {kind}")
    for gi, group in enumerate(optimizer.param_groups):
        for key, (supported, what) in _UNSUPPORTED_OPTIONS.items():
            if key in group and group[key] not in (supported, None):
                raise NotImplementedError(
                    f"{kind} param group {gi} sets {what} = {group[key]!r}; libzero runs {kind} without it"
                )
    g = optimizer.param_groups[0]
    if kind in ("AdamW", "Adam"):
        params = {"lr": g["lr"], "betas": list(g["betas"]), "eps": g["eps"], "weight_decay": g["weight_decay"]}
        if kind == "Adam" and any(group["weight_decay"] != 0 for group in optimizer.param_groups):
            # torch's Adam adds the decay to the gradient (L2), as DeepSpeed's "Adam" with adam_w_mode false.
            params["adam_w_mode"] = False
        return {"type": kind, "params": params}
    if kind == "Adagrad":
        return {"type": "Adagrad", "params": {"lr": g["lr"], "eps": g["eps"], "weight_decay": g["weight_decay"]}}
    return {"type": "SGD", "params": {"lr": g["lr"], "weight_decay": g["weight_decay"]}}


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
    """Each element of a ModuleList is a unit (the outermost list: a list inside a block stays in that block); the
    params before the first block and after the last form one unit each."""
    blocks: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and not any(name.startswith(b + ".") for b in blocks):
            blocks.extend(f"{name}.{child}" if name else child for child, _ in module.named_children())

    def unit_of(name: str, _param: torch.nn.Parameter) -> Hashable:
        for b in blocks:
            if name.startswith(b + "."):
                return ("block", b)
        return ("rest", None)

    return unit_of


class _Saved:
    """What autograd keeps at stage 3 instead of a tensor over a gathered param: where to find it again."""

    __slots__ = ("param", "dtype", "size", "stride", "offset")

    def __init__(self, param: int, t: torch.Tensor) -> None:
        self.param = param
        self.dtype = t.dtype  # a view may reinterpret the param's bytes (view_as_complex, .view(int32))
        self.size = t.size()
        self.stride = t.stride()
        self.offset = t.storage_offset()


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
            block = optimizer_block(optimizer)
            if "optimizer" in cfg:
                # DeepSpeed lets the client optimizer win too; say so instead of dropping the block silently.
                warnings.warn(
                    "both a config 'optimizer' block and a client optimizer were given: the client optimizer's "
                    f"{type(optimizer).__name__} hyper-parameters are used (as DeepSpeed does), the block is ignored",
                    stacklevel=3,
                )
            cfg["optimizer"] = block
        elif "optimizer" not in cfg:
            raise ValueError("the config has no 'optimizer' block: give one, or pass a torch optimizer")
        self.module = model
        self.engine = Engine(cfg, comm)
        try:
            self._setup(model, units, groups)
        except BaseException:
            self.engine.close()
            raise

    def _setup(self, model: torch.nn.Module, units: Any, groups: list[dict[str, Any]]) -> None:
        info = self.engine.info
        self.stage = int(info["stage"])
        self._gas = int(info["gradient_accumulation_steps"])
        self._dtype = _TORCH_DTYPE[info["param_dtype"]]
        self._fp16 = info["param_dtype"] == "fp16"
        self._ended = 0  # micro-steps ended (backward) since the last optimizer step
        self._step_calls = 0  # step() calls, for is_gradient_accumulation_boundary (DeepSpeed's micro_steps)
        self._global_steps = 0
        self._in_backward = False
        self._ready: set[int] = set()  # params whose gradient this micro-step is in
        self._handles: list[Any] = []

        # Params in registration order; units numbered by first appearance.
        unit_of = units if units is not None else default_units(model)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad and p.numel() > 0]
        keys: dict[Hashable, int] = {}
        raw_units = []
        for name, p in named:
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
        rank0 = self.engine.rank == 0  # initial values are read on rank 0 only: no copies elsewhere
        for (name, p), u in zip(named, raw_units):
            # fp32 initial values: bf16/fp16 training keeps them exact as its master weights (DeepSpeed casts the
            # module first and starts its master weights from the rounded values).
            init = p.detach().to(torch.float32).cpu().contiguous().numpy() if rank0 else None
            self.engine.add_param(name, tuple(p.shape), unit=u, group=group_of.get(id(p), 0), init=init)
            self._params.append(p)
            self._unit.append(u)
        self.engine.finalize()
        self._units = sorted(set(self._unit))
        self._members = {u: [i for i, pu in enumerate(self._unit) if pu == u] for u in self._units}

        # What the engine does not train: cast as DeepSpeed casts the module, and rank 0's values everywhere.
        trained = {id(p) for p in self._params}
        untrained = [p for p in model.parameters() if id(p) not in trained]
        buffers = [b for b in model.buffers() if b.is_floating_point()]
        if self._dtype != torch.float32:
            for t in untrained + buffers:
                t.data = t.data.to(self._dtype)
        self._broadcast_from_rank0(untrained + buffers)

        for i, p in enumerate(self._params):
            self._handles.append(p.register_post_accumulate_grad_hook(self._grad_hook(i)))
            if self.stage == 3:
                self._handles.append(p.register_hook(self._before_accumulate(i)))
        if self.stage < 3:
            self._bind_full()
        else:
            self._setup_stage3()
            if len(self._units) == 1 and sum(p.numel() for p in self._params) > 1 << 20:
                warnings.warn(
                    "stage 3 with one unit: the whole model is gathered at once, which saves no memory; put the "
                    "blocks in a torch.nn.ModuleList or pass units=fn(name, param) -> key",
                    stacklevel=4,
                )

    # ---- the training loop ---------------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward. If it raises, what it gathered is released (the micro-step can start over)."""
        try:
            return self.module(*args, **kwargs)
        except BaseException:
            if self.stage == 3:
                if self._forward_depth > 0:  # torch skips always_call hooks for KeyboardInterrupt and the like
                    self._forward_depth = 1
                    self._after_forward(self.module, args, None)
                try:
                    self._release_all()
                except ZeroError:
                    pass  # the forward's own error is the one to see
            raise

    forward = __call__

    def train(self, mode: bool = True) -> "TorchEngine":
        self.module.train(mode)
        return self

    def eval(self) -> "TorchEngine":
        self.module.eval()
        return self

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> None:
        """Backward of ``loss`` (times the fp16 loss scale), then the end of the micro-step. ``param.grad`` stays
        None: each gradient went into libzero's buffers (the step's ``grad_norm`` reports their norm)."""
        if self._fp16:
            loss = loss * self.engine.loss_scale
        self._in_backward = True
        failed = True
        try:
            loss.backward(retain_graph=retain_graph)
            failed = False
        finally:
            self._in_backward = False
            self._ready.clear()
            if self.stage == 3:
                for u in self._units:
                    self._grads_in[u] = 0
                try:
                    self._release_all()
                except ZeroError:
                    if not failed:
                        raise  # otherwise the backward's own error is the one to see
        self.engine.backward_end()
        self._ended += 1

    def step(self) -> StepResult | None:
        """The optimizer step when ``gradient_accumulation_steps`` micro-steps have ended since the last one (call
        it after every backward, as with DeepSpeed); None otherwise."""
        self._step_calls += 1
        if self._ended < self._gas:
            return None
        self._ended = 0
        with self._released():
            result = self.engine.step()
        if not result.skipped:
            self._global_steps = result.step
        return result

    def is_gradient_accumulation_boundary(self) -> bool:
        """As DeepSpeed's: True during the micro-step whose step() will run the optimizer."""
        return (self._step_calls + 1) % self._gas == 0

    @property
    def global_steps(self) -> int:
        return self._global_steps

    @property
    def loss_scale(self) -> float:
        return self.engine.loss_scale

    def set_lr(self, lr: float, group: int = -1) -> None:
        self.engine.set_lr(lr, group)

    def save_checkpoint(self, directory: str, tag: str | None = None) -> str:
        """Writes ``directory/tag`` (``global_step<N>`` by default, as DeepSpeed names it). Collective. Returns the
        tag."""
        tag = tag if tag is not None else f"global_step{self._global_steps}"
        with self._released():
            self.engine.save_checkpoint(directory, tag)
        return tag

    def load_checkpoint(self, directory: str, tag: str | None = None) -> str:
        """Loads ``directory/tag`` (the latest when None), saved at any rank count and stage. Collective. Returns
        the path loaded."""
        with self._released():
            self.engine.load_checkpoint(directory, tag)
        if tag is None:
            with open(os.path.join(directory, "latest"), encoding="utf-8") as f:
                tag = f.read().strip()
        path = os.path.join(directory, tag)
        try:
            with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
                self._global_steps = int(json.load(f).get("step", self._global_steps))
        except (OSError, ValueError):
            pass
        return path

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every trained param's full values (copies, in the compute dtype), by name. Collective at stage 3."""
        out = {}
        names = self.engine.param_names
        for u in self._units:
            if self.stage == 3 and u not in self._gathered:
                with self.engine.gathered(u):
                    for i in self._members[u]:
                        out[names[i]] = torch.from_dlpack(self.engine.param(i)).clone()
            else:
                for i in self._members[u]:
                    out[names[i]] = self._params[i].detach().clone()
        return out

    def close(self) -> None:
        """Gives the model back: removes libzero's hooks, makes every trained param a plain torch tensor holding its
        current values (in the compute dtype; collective at stage 3, which gathers them), then destroys the engine.
        If the engine has failed (a stage-3 gather raises), it is destroyed anyway and the error raised: the stage-3
        params keep their empty placeholders, the values being lost with the engine."""
        for h in self._handles:
            h.remove()
        self._handles = []
        if self.engine.closed:
            return
        try:
            if self.stage == 3:
                self._release_all()
                values = self.full_parameters()
                for name, p in zip(self.engine.param_names, self._params):
                    p.data = values[name]
                self._full = []
            else:
                for p in self._params:
                    p.data = p.data.clone()
        finally:
            self.engine.close()

    # ---- what the engine does not train -----------------------------------------------------------------------------
    def _broadcast_from_rank0(self, tensors: list[torch.Tensor]) -> None:
        """Rank 0's values of frozen params and floating-point buffers on every rank, as DeepSpeed broadcasts the
        module at initialisation: through a throwaway stage-3 engine on the same communicator (rank 0's initial
        values are what every engine starts from; stage 3 keeps a shard and one unit at a time). fp32, bf16 and
        fp16 tensors travel as fp32, exactly; other dtypes are left as they are."""
        if self.engine.world_size == 1:
            return
        movable = [t for t in tensors if t.dtype in (torch.float32, torch.bfloat16, torch.float16) and t.numel() > 0]
        if not movable:
            return
        cfg = {
            "train_batch_size": self.engine.world_size,
            "train_micro_batch_size_per_gpu": 1,
            "gradient_clipping": 0,
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
            "optimizer": {"type": "SGD", "params": {"lr": 0}},
            "libzero": {"timeout_s": self.engine.info["timeout_s"]},
        }
        with Engine(cfg, self.engine._comm) as carrier:
            for k, t in enumerate(movable):
                init = t.detach().to(torch.float32).reshape(-1).contiguous().numpy() if carrier.rank == 0 else None
                carrier.add_param(f"untrained.{k}", (t.numel(),), unit=k, init=init)
            carrier.finalize()
            for k, t in enumerate(movable):
                with carrier.gathered(k):
                    t.data.copy_(torch.from_dlpack(carrier.param(k)).reshape(t.shape))

    # ---- stages 0-2: params in engine memory --------------------------------------------------------------------
    def _bind_full(self) -> None:
        for u in self._units:
            self.engine.gather(u)  # free below stage 3
        for i, p in enumerate(self._params):
            view = torch.from_dlpack(self.engine.param(i))
            if p.data.data_ptr() != view.data_ptr() or p.dtype != view.dtype:
                p.data = view

    @contextlib.contextmanager
    def _released(self) -> Iterator[None]:
        """Every unit released around a call that needs it (zero_step, checkpoints); stages 0-2 rebind after."""
        if self.stage < 3:
            for u in self._units:
                self.engine.release(u)
        else:
            self._release_all()
        try:
            yield
        finally:
            if self.stage < 3:
                self._bind_full()

    # ---- gradients -------------------------------------------------------------------------------------------------
    def _grad_hook(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(p: torch.Tensor) -> None:
            g = p.grad
            if g is None:
                return
            if i in self._ready:
                raise RuntimeError(
                    f"{self.engine.param_names[i]!r} received a second gradient in one backward (a param shared by "
                    "modules under reentrant activation checkpointing?): libzero takes one per param and micro-step "
                    "(use torch.utils.checkpoint with use_reentrant=False)"
                )
            self._ready.add(i)
            dst = torch.from_dlpack(self.engine.grad(i))
            dst.add_(g.reshape(dst.shape))
            p.grad = None
            self.engine.grad_ready(i)
            if self.stage == 3:
                u = self._unit[i]
                self._grads_in[u] += 1
                if u in self._block_module and self._grads_in[u] == len(self._members[u]):
                    self._release(u)

        return hook

    def _before_accumulate(self, i: int) -> Callable[[torch.Tensor], None]:
        """Stage 3: autograd accumulates a gradient into a param of the param's own shape, so a gradient that
        reaches a released unit (a first layer whose input needs no gradient) gathers it back first."""

        def hook(_grad: torch.Tensor) -> None:
            self._gather(self._unit[i])

        return hook

    # ---- stage 3 -------------------------------------------------------------------------------------------------------
    # A gathered unit's values are copied into tensors the model computes with (self._full); released, the params
    # show empty placeholders (shape [0], as DeepSpeed's), so that code touching them between uses fails clearly.
    # Autograd never keeps those tensors: a saved-tensor hook, active during the model's forward, replaces every
    # tensor over a gathered param by where to find it (_Saved), and unpacking it in backward gathers the unit again
    # if it was released. So a block can be released right after its forward, however backward later reaches it.
    def _setup_stage3(self) -> None:
        self._full = [torch.empty(tuple(p.shape), dtype=self._dtype) for p in self._params]
        self._empty = [torch.empty(0, dtype=self._dtype) for _ in self._params]
        for i, p in enumerate(self._params):
            self._full[i].untyped_storage().resize_(0)
            p.data = self._empty[i]
        self._gathered: set[int] = set()
        self._by_storage: dict[int, int] = {}  # data_ptr of a gathered param's storage -> param index
        self._grads_in: dict[int, int] = {u: 0 for u in self._units}
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._forward_depth = 0
        self._nograd_before: list[set[int] | None] = []

        # A unit's block: the deepest module whose params are exactly the unit's. It is released after its
        # forward; the other units stay gathered until the micro-step ends.
        param_unit = {id(p): self._unit[i] for i, p in enumerate(self._params)}
        self._block_module: dict[int, torch.nn.Module] = {}
        containers = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.ParameterList, torch.nn.ParameterDict)
        for module in self.module.modules():
            if isinstance(module, containers):  # never called: its forward hooks would never run
                continue
            mine = [param_unit[id(p)] for p in module.parameters() if id(p) in param_unit]
            if mine and len(set(mine)) == 1 and len(mine) == len(self._members[mine[0]]):
                self._block_module[mine[0]] = module  # modules() goes outside in: the deepest such module wins
        owners: dict[int, list[torch.nn.Module]] = {}
        for module in self.module.modules():
            for u in sorted({param_unit[id(p)] for p in module.parameters(recurse=False) if id(p) in param_unit}):
                owners.setdefault(u, []).append(module)
        # Prepended: the gather runs before the user's own pre-hooks (weight_norm, spectral_norm) read the params.
        for u, modules in owners.items():
            for m in modules:
                self._handles.append(m.register_forward_pre_hook(lambda _m, _a, u=u: self._gather(u), prepend=True))
        for u, block in self._block_module.items():
            self._handles.append(block.register_forward_pre_hook(lambda _m, _a, u=u: self._gather(u), prepend=True))
            self._handles.append(block.register_forward_hook(self._after_block_forward(u), always_call=True))
        # First in, last out: around every gather the model's own hooks (a root owning params) do.
        self._handles.append(self.module.register_forward_pre_hook(self._before_forward, prepend=True))
        self._handles.append(self.module.register_forward_hook(self._after_forward, always_call=True))

    def _gather(self, u: int) -> None:
        if u in self._gathered:
            return
        self.engine.gather(u)
        self._gathered.add(u)
        for i in self._members[u]:
            full = self._full[i]
            full.untyped_storage().resize_(full.numel() * full.element_size())
            full.copy_(torch.from_dlpack(self.engine.param(i)))
            self._by_storage[full.untyped_storage().data_ptr()] = i
            self._params[i].data = full

    def _release(self, u: int) -> None:
        if u not in self._gathered:
            return
        self._gathered.discard(u)
        for i in self._members[u]:
            full = self._full[i]
            self._by_storage.pop(full.untyped_storage().data_ptr(), None)
            self._params[i].data = self._empty[i]
            storage = full.untyped_storage()
            # References beyond this tensor's and `storage` itself: something still uses the values (autograd
            # tensors saved outside libzero's hook — under a checkpoint region's or a user's own saved-tensor
            # hooks, a submodule called directly —, a view the model handed out). Leave them that memory (it
            # holds exactly the values they saw) and use a new one from the next gather on.
            if torch._C._storage_Use_Count(storage._cdata) > 2:
                self._full[i] = torch.empty(tuple(full.shape), dtype=full.dtype)
                self._full[i].untyped_storage().resize_(0)
            else:
                storage.resize_(0)
        self.engine.release(u)

    def _release_all(self) -> None:
        for u in sorted(self._gathered):
            self._release(u)

    def _pack(self, t: torch.Tensor) -> Any:
        try:
            i = self._by_storage.get(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):  # tensors without a plain storage
            return t
        return t if i is None else _Saved(i, t)

    def _unpack(self, x: Any) -> torch.Tensor:
        if not isinstance(x, _Saved):
            return x
        self._gather(self._unit[x.param])
        if self._unit[x.param] in self._block_module:
            # Backward has reached this block: the other blocks it gathered back are done with (a later need
            # gathers again), so at most one block is held at a time.
            for u in [u for u in self._gathered if u in self._block_module and u != self._unit[x.param]]:
                self._release(u)
        out = torch.empty(0, dtype=x.dtype)
        return out.set_(self._full[x.param].untyped_storage(), x.offset, x.size, x.stride)

    def _before_forward(self, _m: torch.nn.Module, _a: Any) -> None:
        if self._forward_depth == 0:
            self._nograd_before.append(None if torch.is_grad_enabled() else set(self._gathered))
            self._saved_hooks.__enter__()
        self._forward_depth += 1

    def _after_forward(self, _m: torch.nn.Module, _a: Any, _out: Any) -> None:
        self._forward_depth -= 1
        if self._forward_depth == 0:
            self._saved_hooks.__exit__(None, None, None)
            before = self._nograd_before.pop()
            if before is not None:  # no autograd: release what this forward gathered, nothing else
                for u in sorted(self._gathered - before):
                    self._release(u)

    def _after_block_forward(self, u: int) -> Callable[..., None]:
        def hook(_m: torch.nn.Module, _args: Any, _output: Any) -> None:
            if not self._in_backward:  # an activation-checkpoint recompute keeps its block for its backward
                self._release(u)

        return hook


def initialize(
    model: torch.nn.Module,
    config: ConfigLike,
    comm: Comm | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    units: Callable[[str, torch.nn.Parameter], Hashable] | None = None,
) -> TorchEngine:
    """Trains ``model`` with libzero as ``config`` says (a DeepSpeed config: dict, JSON text or path). Without an
    ``optimizer`` block the hyper-parameters come from ``optimizer`` (AdamW, Adam, Adagrad, SGD), as DeepSpeed takes a
    client optimizer. ``comm`` by default: torch.distributed's default group when it is initialised (torchrun; a
    gloo group beside it when the default is NCCL), else MPI_COMM_WORLD under an MPI launcher, else one process."""
    return TorchEngine(model, config, comm=comm if comm is not None else _default_comm(), optimizer=optimizer,
                       units=units)


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
