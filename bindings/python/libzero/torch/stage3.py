"""Stage 3 under autograd: a unit's full values exist only while it is gathered.

A gathered unit's values are copied into tensors the model computes with (self._full); released, the params show
empty placeholders (shape [0], as DeepSpeed's), so that code touching them between uses fails clearly. Autograd never
keeps those tensors: a saved-tensor hook, active during the model's forward, replaces every tensor over a gathered
param by where to find it (_Saved), and unpacking it in backward gathers the unit again if it was released. So a block
can be released right after its forward, however backward later reaches it."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import ZeroError
from .engine import TorchEngine
from .tensors import from_engine


class _Saved:
    """What autograd keeps at stage 3 instead of a tensor over a gathered param: where to find it again."""

    __slots__ = ("param", "dtype", "size", "stride", "offset")

    def __init__(self, param: int, t: torch.Tensor) -> None:
        self.param = param
        self.dtype = t.dtype  # a view may reinterpret the param's bytes (view_as_complex, .view(int32))
        self.size = t.size()
        self.stride = t.stride()
        self.offset = t.storage_offset()


class Stage3Engine(TorchEngine):
    """A torch model trained by a libzero engine at stage 3: units are gathered before the modules that own them run
    and released after (see libzero.torch's documentation)."""

    stages = (3,)
    _full: list[torch.Tensor]  # set by _setup_stage3, declared here for the methods above it
    _forward_depth: int

    # ---- TorchEngine's stage hooks -------------------------------------------------------------------------------
    def _hook_param(self, i: int, p: torch.nn.Parameter) -> None:
        super()._hook_param(i, p)
        self._handles.append(p.register_hook(self._before_accumulate(i)))

    def _place_params(self) -> None:
        # Counted before the params become shape-[0] placeholders.
        elements = sum(p.numel() for p in self._params)
        self._setup_stage3()
        if len(self._units) == 1 and elements > 1 << 20:
            # stacklevel: this, _setup, _start, then initialize or TorchEngine.__init__, then the user's call.
            warnings.warn(
                "stage 3 with one unit: the whole model is gathered at once, which saves no memory; put the "
                "blocks in a torch.nn.ModuleList or pass units=fn(name, param) -> key",
                stacklevel=5,
            )

    def _forward_failed(self, args: tuple[Any, ...]) -> None:
        if self._forward_depth > 0:  # torch skips always_call hooks for KeyboardInterrupt and the like
            self._forward_depth = 1
            self._after_forward(self.module, args, None)
        try:
            self._release_all()
        except ZeroError:
            pass  # the forward's own error is the one to see

    def _backward_ended(self, failed: bool) -> None:
        for u in self._units:
            self._grads_in[u] = 0
        try:
            self._release_all()
        except ZeroError:
            if not failed:
                raise  # otherwise the backward's own error is the one to see

    def _gradient_in(self, i: int) -> None:
        u = self._unit[i]
        self._grads_in[u] += 1
        # Its last gradient in, a block of trained params only is done with. A block with frozen params is not:
        # backward may still read them (a frozen norm's weight, for the gradient of its input under LoRA) after the
        # last trained gradient; it goes when backward reaches another block.
        if (u in self._block_module and self._grads_in[u] == self._trained_in[u] and not self._frozen_in[u]
                and not self._modifying):
            self._release(u)

    def _copy_unit(self, u: int, names: list[str], out: dict[str, torch.Tensor], frozen: bool = False) -> None:
        if u in self._gathered:
            super()._copy_unit(u, names, out, frozen)
            return
        with self.engine.gathered(u):
            for i in self._members[u]:
                if self._trained[i] or frozen:
                    out[names[i]] = self._engine_tensor(i).clone()

    def _give_back(self) -> None:
        self._release_all()
        values = self.full_parameters(frozen=True)
        for name, p in zip(self.engine.param_names, self._params):
            p.data = values[name]
        self._full = []

    @contextlib.contextmanager
    def _released(self) -> Iterator[None]:
        """Every unit released around a call that needs it (zero_step, checkpoints); the next forward gathers."""
        self._release_all()
        yield

    # ---- the model outside training ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def gathered_parameters(self, params: Any = None, modifier_rank: int | None = None) -> Iterator[None]:
        units = self._units_of(params if params is None or isinstance(params, torch.Tensor) else list(params))
        newly = [u for u in units if u not in self._gathered]  # the others stay gathered for whoever gathered them
        self._modifying += 1  # the model's own hooks release nothing meanwhile (a forward, a generate inside)
        failed = True
        try:
            for u in newly:
                self._gather(u)
            yield
            failed = False
        finally:
            self._modifying -= 1
            try:
                if modifier_rank is not None and not failed:
                    for k, u in enumerate(units):
                        try:
                            self._release(u, modifier_rank=int(modifier_rank))
                            if u not in newly:  # an enclosing block (or the forward) holds it: gathered again
                                self._gather(u)
                        except ZeroError:
                            for rest in units[k + 1 :]:
                                if rest in newly:
                                    with contextlib.suppress(ZeroError):
                                        self._release(rest)
                            raise
                else:
                    for u in newly:
                        self._release(u)
            except ZeroError:
                if not failed:
                    raise  # otherwise the block's own error is the one to see

    def generate(self, *args: Any, keep_gathered: bool = True, **kwargs: Any) -> Any:
        if keep_gathered:
            with self.gathered_parameters(), torch.no_grad():
                return self.module.generate(*args, **kwargs)
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "generate(keep_gathered=False) keeps ranks in step through torch.distributed (synced_gpus), which is "
                "not initialised: launch with torchrun, or let generate keep the units gathered"
            )
        with torch.no_grad():
            return self.module.generate(*args, synced_gpus=True, **kwargs)

    def _check_state_dict(self, _module: torch.nn.Module, state: dict, _prefix: str, _meta: Any) -> None:
        """A state dict taken between uses would hold the released params' empty placeholders: refuse it."""
        for i, p in enumerate(self._params):
            if self._unit[i] not in self._gathered and p.data.numel() == 0 and self._shape[i].numel() > 0:
                raise RuntimeError(
                    f"state_dict() at ZeRO stage 3 while param {self.engine.param_names[i]!r} is released (its "
                    "values are sharded across ranks, the model holds an empty placeholder): use "
                    "engine.save_pretrained(directory), engine.full_parameters(frozen=True), or take it inside "
                    "`with engine.gathered_parameters():` (collective)"
                )

    # ---- gathering and releasing ---------------------------------------------------------------------------------
    def _before_accumulate(self, i: int) -> Callable[[torch.Tensor], None]:
        """Autograd accumulates a gradient into a param of the param's own shape, so a gradient that reaches a
        released unit (a first layer whose input needs no gradient) gathers it back first."""

        def hook(_grad: torch.Tensor) -> None:
            self._gather(self._unit[i])

        return hook

    def _engine_tensor(self, i: int) -> torch.Tensor:
        """Param ``i``'s full values in the engine's gathered unit (a view, not a copy)."""
        return from_engine(self.engine.param(i), self._tensor_dtype[i], self._shape[i])

    def _setup_stage3(self) -> None:
        on = self._device  # the full params live where the model computes: the engine's device, or host memory
        self._full = [torch.empty(tuple(self._shape[i]), dtype=self._tensor_dtype[i], device=on)
                      for i in range(len(self._params))]
        self._empty = [torch.empty(0, dtype=self._tensor_dtype[i], device=on) for i in range(len(self._params))]
        self._trained_in = {u: sum(self._trained[i] for i in self._members[u]) for u in self._units}
        self._frozen_in = {u: len(self._members[u]) - self._trained_in[u] for u in self._units}
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
            self._handles.append(block.register_forward_pre_hook(lambda _m, _a, u=u: self._enter_block(u),
                                                                 prepend=True))
            self._handles.append(block.register_forward_hook(self._after_block_forward(u), always_call=True))
        self._handles.append(self.module._register_state_dict_hook(self._check_state_dict))
        # First in, last out: around every gather the model's own hooks (a root owning params) do.
        self._handles.append(self.module.register_forward_pre_hook(self._before_forward, prepend=True))
        self._handles.append(self.module.register_forward_hook(self._after_forward, always_call=True))

    def _enter_block(self, u: int) -> None:
        """Before a block's forward. Inside backward that forward is an activation checkpoint's recompute: backward
        has reached this block, so the other blocks are done with (as when it unpacks a tensor of this block)."""
        self._gather(u)
        if self._backward_running():
            self._release_other_blocks(u)

    def _release_other_blocks(self, u: int) -> None:
        """Backward has reached block ``u``: the other blocks it gathered back are done with (a later need gathers
        again), so at most one block is held at a time."""
        if self._modifying:
            return
        for v in [v for v in self._gathered if v in self._block_module and v != u]:
            self._release(v)

    def _gather(self, u: int) -> None:
        if u in self._gathered:
            return
        self.engine.gather(u)
        self._gathered.add(u)
        for i in self._members[u]:
            full = self._full[i]
            full.untyped_storage().resize_(full.numel() * full.element_size())
            full.copy_(self._engine_tensor(i))
            self._by_storage[full.untyped_storage().data_ptr()] = i
            self._params[i].data = full

    def _release(self, u: int, modifier_rank: int | None = None) -> None:
        """Gives unit ``u`` back; with ``modifier_rank``, that rank's values (what it wrote into the params) become
        every rank's first (zero_release_modified)."""
        if u not in self._gathered:
            if modifier_rank is not None:
                raise RuntimeError(f"unit {u} is not gathered: nothing to publish")
            return
        if modifier_rank is not None and self.engine.rank == modifier_rank:
            for i in self._members[u]:
                self._engine_tensor(i).copy_(self._full[i])
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
                self._full[i] = torch.empty(tuple(full.shape), dtype=full.dtype, device=full.device)
                self._full[i].untyped_storage().resize_(0)
            else:
                storage.resize_(0)
        if modifier_rank is None:
            self.engine.release(u)
            return
        try:
            self.engine.release_modified(u, modifier_rank)
        except ZeroError:
            # Refused before anything moved (ranks disagreed, one rank failed): the unit is still gathered in the
            # engine, and released here as it is, unchanged; after a failure that broke the engine there is
            # nothing left to release.
            with contextlib.suppress(ZeroError):
                if self.engine.unit_info(u)["gathered"]:
                    self.engine.release(u)
            raise

    def _release_all(self) -> None:
        for u in sorted(self._gathered):
            self._release(u)

    # ---- autograd's saved tensors --------------------------------------------------------------------------------
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
            self._release_other_blocks(self._unit[x.param])
        out = torch.empty(0, dtype=x.dtype, device=self._device)
        return out.set_(self._full[x.param].untyped_storage(), x.offset, x.size, x.stride)

    # ---- the forward hooks ---------------------------------------------------------------------------------------
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
            if before is not None and not self._modifying:  # no autograd: release what this forward gathered
                for u in sorted(self._gathered - before):
                    self._release(u)

    def _after_block_forward(self, u: int) -> Callable[..., None]:
        def hook(_m: torch.nn.Module, _args: Any, _output: Any) -> None:
            # An activation-checkpoint recompute keeps its block for its backward; gathered_parameters holds its own.
            if not self._backward_running() and not self._modifying:
                self._release(u)

        return hook
