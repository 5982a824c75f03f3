"""The torch model's engine: what every stage shares (registration, backward, step, checkpoints, full_parameters,
close), and stages 0-2, whose params live in libzero's own memory. Stage 3 (libzero.torch.stage3) overrides the stage
hooks below."""

from __future__ import annotations

import contextlib
import json
import os
import weakref
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import torch

from ..comm import Comm
from ..engine import ConfigLike, Engine, StepResult
from ..errors import ZeroError
from . import loading
from .config import _TORCH_DTYPE, _group_overrides, engine_config
from .rank0 import broadcast_from_rank0, share_outcome
from .schedule import LearningRates, load_client_state, restore_client_scheduler, save_client_state
from .tensors import FLOATING, engine_shape, from_engine, host_bytes, host_values, stored_type
from .units import default_units, number_units


# What a micro-step whose backward raised leaves behind.
_UNFINISHED = (
    "a backward raised in the middle of a micro-step: part of its gradients are already in libzero's buffers (at "
    "stages 2-3 reduced across ranks), so that micro-step can neither be retried nor undone. Close the engine and go "
    "on from a checkpoint (initialize again, then load_checkpoint)"
)

# The engines alive, so that GatheredParameters finds the one that holds the params it is given.
_ENGINES: "weakref.WeakSet[TorchEngine]" = weakref.WeakSet()


def _cuda_device(named: list[tuple[str, torch.nn.Parameter]]) -> torch.device | None:
    """The GPU the model's params are on (None for a CPU or meta model); params on two devices are refused."""
    devices = {p.device for _, p in named if p.device.type != "meta"}
    if len(devices) > 1:
        raise ValueError(f"the model's params are on {len(devices)} devices ({sorted(map(str, devices))}): libzero "
                         "trains a model on one device per process; move it with model.to(device) first")
    device = next(iter(devices), None)
    if device is None or device.type == "cpu":
        return None
    if device.type != "cuda":
        raise ValueError(f"the model's params are on {device}: libzero runs on the CPU or on CUDA GPUs")
    return device


class TorchEngine(LearningRates, torch.nn.Module):
    """A torch model trained by a libzero engine (see libzero.torch's documentation). ``engine.module`` is the model,
    ``engine.engine`` the underlying :class:`libzero.Engine`. This class runs stages 0-2; ``initialize`` picks
    :class:`~libzero.torch.Stage3Engine` for stage 3.

    It is a ``torch.nn.Module`` wrapping the model, as DeepSpeed's engine is, so that code that takes a module
    (``parameters()``, ``zero_grad()``, ``train()``, a framework's unwrapping through ``.module``) takes it and
    nothing wraps it again in DistributedDataParallel."""

    stages: tuple[int, ...] = (0, 1, 2)  # the ZeRO stages this class runs

    def __init__(
        self,
        model: torch.nn.Module,
        config: ConfigLike,
        comm: Comm | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        units: Callable[[str, torch.nn.Parameter], Hashable] | None = None,
        lr_scheduler: Any = None,
    ) -> None:
        cfg, groups = engine_config(config, optimizer)
        self._start(model, Engine(cfg, comm), units, groups, None, optimizer, lr_scheduler, "scheduler" in cfg)

    def _start(
        self,
        model: torch.nn.Module,
        engine: Engine,
        units: Any,
        groups: list[dict[str, Any]],
        state_dict: loading.StateDictLike | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
        config_scheduler: bool = False,
        duplicate: Callable[[str, torch.nn.Parameter], bool] | None = None,
    ) -> None:
        """Takes ``engine`` over (closing it if the model cannot be set up). ``duplicate(name, param)``: this rank's
        copy is one another model-parallel rank counts in the norm (ZERO_PARAM_MODEL_PARALLEL_DUPLICATE)."""
        torch.nn.Module.__init__(self)
        self.module = model
        self.engine = engine
        self._duplicate = duplicate if duplicate is not None else (lambda name, p: False)
        self._state_dict = state_dict
        try:
            if lr_scheduler is not None and config_scheduler:
                raise ValueError(
                    "both a config 'scheduler' block and a client lr_scheduler were given: use one (the config's "
                    "runs inside the engine; a client torch scheduler is stepped after every optimizer step)"
                )
            if lr_scheduler is not None and optimizer is None:
                raise ValueError("a client lr_scheduler needs the client optimizer it schedules (optimizer=)")
            self._setup(model, units, groups)
            self._setup_schedule(groups, optimizer, lr_scheduler, config_scheduler)
        except BaseException:
            self.engine.close()
            raise

    def _setup(self, model: torch.nn.Module, units: Any, groups: list[dict[str, Any]]) -> None:
        info = self.engine.info
        self.stage = int(info["stage"])
        if self.stage not in self.stages:
            raise ValueError(
                f"{type(self).__name__} runs stages {', '.join(map(str, self.stages))}, not the config's stage "
                f"{self.stage}: use libzero.torch.initialize, which picks the class for the stage"
            )
        self._gas = int(info["gradient_accumulation_steps"])
        self._dtype = _TORCH_DTYPE[info["param_dtype"]]
        self._fp16 = info["param_dtype"] == "fp16"
        self._step_calls = 0  # step() calls, for is_gradient_accumulation_boundary (DeepSpeed's micro_steps)
        self._global_steps = 0
        self._skipped_steps = 0
        self._in_backward = False  # inside engine.backward
        self._plain = False  # inside a loss.backward() the user called (the micro-step ends when it does)
        self._scaled = False  # engine.scale(loss) was called for the backward to come (fp16)
        self._scale_wrt_gas: set[bool] = set()  # how the window's micro-steps scaled their loss
        self._boundary: bool | None = None  # set_gradient_accumulation_boundary's override
        self._grad_norm: float | None = None
        self._unfinished: str | None = None  # why the micro-step cannot go on (a backward raised in it)
        self._ready: set[int] = set()  # params whose gradient this micro-step is in
        self._handles: list[Any] = []
        self._modifying = 0  # gathered_parameters blocks open (stage 3 keeps their units gathered)

        # Every param, trained (requires_grad) and frozen, in registration order; units numbered by first appearance.
        # Frozen floating-point params take the compute dtype, as DeepSpeed casts the module; other dtypes (packed
        # quantized storage) are kept as they are. Both are sharded at stage 3 with their unit.
        unit_of = units if units is not None else default_units(model)
        named = [(n, p) for n, p in model.named_parameters() if p.numel() > 0]
        cuda = _cuda_device(named)
        self._device = cuda if cuda is not None else torch.device("cpu")
        if cuda is not None:  # a device engine on the model's GPU (several ranks: collectives through host memory)
            with torch.cuda.device(cuda):
                self.engine.set_device("cuda")
        raw_units = number_units(named, unit_of)
        group_of: dict[int, int] = {}
        for gi, g in enumerate(groups[1:], start=1):
            gid = self.engine.add_param_group(f"group{gi}", **_group_overrides(g, groups[0]))
            for p in g["params"]:
                group_of[id(p)] = gid
        self._params: list[torch.nn.Parameter] = []
        self._unit: list[int] = []
        self._trained: list[bool] = []
        self._tensor_dtype: list[torch.dtype] = []  # what the model computes with
        self._shape: list[torch.Size] = []
        sources = loading.Sources(model, self._state_dict, self.engine.rank)
        rank0 = self.engine.rank == 0  # initial values are read on rank 0 only: no copies elsewhere
        for (name, p), u in zip(named, raw_units):
            trained = p.requires_grad
            dtype = self._dtype if trained or p.dtype in FLOATING else p.dtype
            init = None
            if rank0 and not sources.deferred(name, p):
                value = p.detach() if dtype == p.dtype or trained else p.detach().to(dtype)
                init = host_values(value, self._dtype) if trained else host_bytes(value)
            if trained:
                self.engine.add_param(name, tuple(p.shape), unit=u, group=group_of.get(id(p), 0), init=init,
                                      model_parallel_duplicate=self._duplicate(name, p))
            else:
                self.engine.add_param(name, engine_shape(p.shape, dtype), unit=u, init=init, frozen=True,
                                      dtype=stored_type(dtype))
            self._params.append(p)
            self._unit.append(u)
            self._trained.append(trained)
            self._tensor_dtype.append(dtype)
            self._shape.append(p.shape)
        self.engine.finalize()
        self._stream_handle = None
        self._follow_stream()
        # A param built on the meta device cannot take a real tensor as its data: a real (empty) one replaces it in
        # every module that holds it (tied weights included); the engine's memory backs it from here on.
        meta = {id(p): i for i, p in enumerate(self._params) if p.device.type == "meta"}
        if meta:
            for module in model.modules():
                for key, p in list(module._parameters.items()):
                    i = meta.get(id(p)) if p is not None else None
                    if i is None:
                        continue
                    if self._params[i].device.type == "meta":
                        self._params[i] = torch.nn.Parameter(torch.empty(0, dtype=self._tensor_dtype[i]),
                                                             requires_grad=p.requires_grad)
                    module._parameters[key] = self._params[i]
        self._units = sorted(set(self._unit))
        self._members = {u: [i for i, pu in enumerate(self._unit) if pu == u] for u in self._units}
        # Values that come from a state dict (a model built on the meta device): rank 0 writes each unit's.
        sources.load(self)

        # Buffers stay whole on every rank, as DeepSpeed keeps them (a forward may update them: BatchNorm's
        # statistics); floating-point ones take the compute dtype, and every rank gets rank 0's bytes.
        # A buffer on the meta device is replaced by a real one, and one the state dict holds takes its values
        # (on rank 0; the broadcast below gives them to the others).
        buffers: dict[int, torch.Tensor] = {}
        for prefix, module in model.named_modules():
            for key, b in list(module._buffers.items()):
                if b is None or b.numel() == 0:
                    continue
                if id(b) in buffers:  # a buffer two modules share: already done
                    module._buffers[key] = buffers[id(b)]
                    continue
                name = f"{prefix}.{key}" if prefix else key
                real = sources.buffer(name, b)
                if real.is_floating_point() and real.dtype != self._dtype:
                    real = real.to(self._dtype)
                module._buffers[key] = buffers[id(b)] = real
        broadcast_from_rank0(self.engine, list(buffers.values()))

        for i, p in enumerate(self._params):
            if self._trained[i]:
                self._hook_param(i, p)
        self._place_params()
        _ENGINES.add(self)

    # ---- what a stage does its own way (Stage3Engine overrides these) -----------------------------------------------
    def _hook_param(self, i: int, p: torch.nn.Parameter) -> None:
        """libzero's hooks on trained param ``i``."""
        self._handles.append(p.register_post_accumulate_grad_hook(self._grad_hook(i)))

    def _place_params(self) -> None:
        """The trained params' values where the model computes with them, once the engine is finalized."""
        self._bind_full()

    def _forward_failed(self, args: tuple[Any, ...]) -> None:
        """Cleans up after a forward that raised (called with the forward's error being handled)."""

    def _backward_ended(self, failed: bool) -> None:
        """Cleans up after a backward (``failed``: it raised), before the micro-step ends."""

    def _gradient_in(self, i: int) -> None:
        """Param ``i``'s gradient has been declared ready."""

    def _copy_unit(self, u: int, names: list[str], out: dict[str, torch.Tensor], frozen: bool = False) -> None:
        """Copies of unit ``u``'s trained params' full values (and its frozen ones with ``frozen``) into ``out``."""
        for i in self._members[u]:
            if self._trained[i] or frozen:
                out[names[i]] = self._params[i].detach().clone()

    def _give_back(self) -> None:
        """Makes every param a plain torch tensor holding its current values (the engine still open)."""
        for p in self._params:
            p.data = p.data.clone()

    # ---- the training loop ---------------------------------------------------------------------------------------
    def _follow_stream(self) -> None:
        """A device engine's work is ordered on torch's current stream by events, as the model's own kernels are:
        handed over again whenever the current stream changes (``with torch.cuda.stream(s)``)."""
        if self._device.type != "cuda":
            return
        stream = torch.cuda.current_stream(self._device)
        if stream.cuda_stream != self._stream_handle:
            self.engine.set_stream(stream)
            self._stream_handle = stream.cuda_stream

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward. If it raises, what it gathered is released (the micro-step can start over)."""
        if self._plain:  # the last loss.backward() raised before it ended
            self._plain = False
            self._ready.clear()
            self._backward_ended(True)
            self._unfinished = _UNFINISHED
        self._check_finished()
        self._follow_stream()
        try:
            return self.module(*args, **kwargs)
        except BaseException:
            self._forward_failed(args)
            raise

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> None:
        """Backward of ``loss`` (times the fp16 loss scale), then the end of the micro-step. ``param.grad`` stays
        None: each gradient went into libzero's buffers (the step's ``grad_norm`` reports their norm).

        ``scale_wrt_gas`` (DeepSpeed's): True averages the window's gradients over its micro-steps at the step;
        False says the loss was already divided by them (the Hugging Face Trainer does so), and the step averages
        over ranks only. A plain ``loss.backward()`` works too (as DeepSpeed's does): the micro-step ends when it
        does, with ``scale_wrt_gas=True``; in fp16 it must be ``engine.scale(loss).backward()``."""
        if self._plain:
            raise RuntimeError("engine.backward inside a loss.backward() that has not ended")
        self._check_finished()
        self._follow_stream()
        if self._fp16 and not self._scaled:
            loss = loss * self.engine.loss_scale
        # The micro-step ends in autograd's final callbacks, as a plain loss.backward()'s does. Ending it after
        # backward returns gives glibc's heap another order of the same allocations, which fragments it at stage 2
        # (up to 300 MiB more in a Trainer run: bench/README.md, "The Hugging Face Trainer").
        ended = queued = False

        def end() -> None:
            nonlocal ended
            ended = True  # a micro-step end that raises has run: its error is the one to see
            self._end_backward(scale_wrt_gas)

        def root_gradient(_grad: torch.Tensor) -> None:
            nonlocal queued
            if not queued:  # a backward through the loss inside this one (a probe's autograd.grad) is not its end
                queued = True
                _queue_last(end)

        hook = loss.register_hook(root_gradient) if loss.requires_grad else None
        self._in_backward = True
        failed = True
        try:
            loss.backward(retain_graph=retain_graph)
            failed = False
        finally:
            if hook is not None:
                hook.remove()  # a retained graph's next backward ends its own micro-step, not this one
            if not ended:
                self._in_backward = False
                if failed and self._ready:  # gradients of it went in (nothing did otherwise: it can start over)
                    self._unfinished = _UNFINISHED
                self._ready.clear()
                self._backward_ended(failed)
        if not ended:
            self._end_micro_step(scale_wrt_gas)

    def _check_finished(self) -> None:
        if self._unfinished is not None:
            raise RuntimeError(self._unfinished)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the current fp16 loss scale (the loss itself otherwise), for a backward the caller runs:
        ``engine.scale(loss).backward()``, as DeepSpeed's ``scale``."""
        if not self._fp16:
            return loss
        self._scaled = True
        return loss * self.engine.loss_scale

    def _end_micro_step(self, scale_wrt_gas: bool) -> None:
        self._scaled = False
        self.engine.backward_end()
        self._scale_wrt_gas.add(bool(scale_wrt_gas))

    def _backward_running(self) -> bool:
        """Inside a backward, engine.backward's or the user's own (an activation-checkpoint recompute runs there)."""
        return self._in_backward or self._plain or torch._C._current_graph_task_id() != -1

    def _begin_plain_backward(self) -> None:
        """The first gradient of a ``loss.backward()`` the user called: its end will end the micro-step."""
        if self._fp16 and not self._scaled:
            raise RuntimeError(
                "fp16: loss.backward() outside engine.backward has no loss scale, so small gradients underflow: call "
                "engine.scale(loss).backward() (as with DeepSpeed) or engine.backward(loss)"
            )
        self._plain = True
        _queue_last(lambda: self._end_backward(True))

    def _end_backward(self, scale_wrt_gas: bool) -> None:
        """A backward that ran through has ended (autograd's final callbacks): so does the micro-step."""
        self._in_backward = self._plain = False
        self._ready.clear()
        self._backward_ended(False)
        self._end_micro_step(scale_wrt_gas)

    def step(self, lr_kwargs: dict[str, Any] | None = None) -> StepResult | None:
        """The optimizer step at the accumulation boundary (call it after every backward, as with DeepSpeed); None
        otherwise. The boundary is ``gradient_accumulation_steps`` micro-steps, or what
        ``set_gradient_accumulation_boundary`` says: True after fewer steps over those (an epoch's remainder,
        averaged over the micro-steps it had). A client lr_scheduler is stepped after every step taken (with
        ``lr_kwargs``), not after a skipped fp16 step."""
        self._check_finished()
        self._follow_stream()
        self._step_calls += 1
        window = self.engine.window
        ended = int(window["micro_steps"])
        boundary = self._boundary if self._boundary is not None else ended >= int(window["accumulation_steps"])
        if not boundary or ended == 0:
            return None
        if len(self._scale_wrt_gas) > 1:
            raise ValueError(
                "the micro-steps of one accumulation window mixed backward(scale_wrt_gas=True) and "
                "scale_wrt_gas=False: their gradients cannot be averaged as one"
            )
        averaged = self._scale_wrt_gas == {False}
        rates = self.get_lr()
        with self._released():
            result = self.engine.step(partial_window=ended < int(window["accumulation_steps"]), loss_averaged=averaged)
        self._scale_wrt_gas.clear()
        self._grad_norm = result.grad_norm
        if result.skipped:
            self._skipped_steps += 1
        else:
            self._global_steps = result.step
            self._stepped_with(rates, lr_kwargs)
        return result

    def is_gradient_accumulation_boundary(self) -> bool:
        """As DeepSpeed's: True during the micro-step whose step() will run the optimizer (what
        set_gradient_accumulation_boundary set, where it was called)."""
        if self._boundary is not None:
            return self._boundary
        return (self._step_calls + 1) % self._gas == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool | None) -> None:
        """DeepSpeed's: overrides where the window ends (accelerate calls it before every backward); with True the
        next step() steps after however many micro-steps the window has. None: the window ends after
        gradient_accumulation_steps micro-steps again."""
        self._boundary = None if is_boundary is None else bool(is_boundary)

    def gradient_accumulation_steps(self) -> int:
        return self._gas

    def get_global_grad_norm(self) -> float | None:
        """The gradient norm of the last step (before clipping; None before the first), as DeepSpeed's."""
        return self._grad_norm

    @property
    def global_steps(self) -> int:
        return self._global_steps

    @property
    def skipped_steps(self) -> int:
        """Steps skipped for non-finite gradients (fp16 overflow) since this engine started, as DeepSpeed's."""
        return self._skipped_steps

    @property
    def loss_scale(self) -> float:
        return self.engine.loss_scale

    def set_lr(self, lr: float, group: int = -1) -> None:
        self.engine.set_lr(lr, group)

    def save_checkpoint(
        self,
        save_dir: str,
        tag: str | None = None,
        client_state: dict[str, Any] | None = None,
        exclude_frozen_parameters: bool = False,
    ) -> str:
        """Writes ``save_dir/tag`` (``global_step<N>`` by default, as DeepSpeed names it). Collective. Returns the
        tag. ``exclude_frozen_parameters`` (DeepSpeed's name) leaves the frozen params' bytes out: a load keeps the
        loading engine's own. ``client_state`` (any picklable dict) and a client lr_scheduler's state are stored by
        rank 0 beside libzero's files, and ``load_checkpoint`` returns them."""
        tag = tag if tag is not None else f"global_step{self._global_steps}"
        with self._released():
            self.engine.save_checkpoint(save_dir, tag, exclude_frozen=exclude_frozen_parameters)
        error: BaseException | None = None
        if self.engine.rank == 0:
            state = {"client_state": dict(client_state or {})}
            if self._client_scheduler is not None:
                state["lr_scheduler"] = self._client_scheduler.state_dict()
            try:
                save_client_state(os.path.join(save_dir, tag), state)
            except Exception as e:  # every rank must hear of it, not only rank 0
                error = e
        share_outcome(self.engine, error, "save_checkpoint")
        return tag

    def load_checkpoint(
        self, load_dir: str, tag: str | None = None, load_lr_scheduler_states: bool = True
    ) -> tuple[str, dict[str, Any]]:
        """Loads ``load_dir/tag`` (the latest when None), saved at any rank count and stage. Collective. Returns the
        path loaded and the ``client_state`` saved with it (empty when none was), as DeepSpeed's does; a client
        lr_scheduler takes its saved state (unless ``load_lr_scheduler_states`` is False)."""
        with self._released():
            self.engine.load_checkpoint(load_dir, tag)
        if tag is None:
            with open(os.path.join(load_dir, "latest"), encoding="utf-8") as f:
                tag = f.read().strip()
        path = os.path.join(load_dir, tag)
        try:
            with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
                self._global_steps = int(json.load(f).get("step", self._global_steps))
        except (OSError, ValueError):
            pass
        state = load_client_state(path)
        if load_lr_scheduler_states and self._client_scheduler is not None and "lr_scheduler" in state:
            restore_client_scheduler(self.engine, self.optimizer, self._client_scheduler, state["lr_scheduler"])
        self._scale_wrt_gas.clear()
        return path, dict(state.get("client_state", {}))

    def full_parameters(self, frozen: bool = False, rank0_only: bool = False) -> dict[str, torch.Tensor]:
        """Every trained param's full values (copies, in the compute dtype), by name; with ``frozen`` the frozen ones
        too (in their dtype). Collective at stage 3 (one unit gathered at a time); with ``rank0_only`` the other ranks
        take part but keep nothing (an empty dict)."""
        out: dict[str, torch.Tensor] = {}
        names = self.engine.param_names
        keep = not rank0_only or self.engine.rank == 0
        for u in self._units:
            self._copy_unit(u, names, out if keep else {}, frozen)
        return out

    # ---- the model outside training: gathered values, generation, export ---------------------------------------------
    def _units_of(self, params: Any) -> list[int]:
        """The units holding ``params`` (a param, an iterable of them, or None: every unit), in order. Tensors the
        engine does not hold (buffers, empty params) are whole anyway: they add no unit, as DeepSpeed leaves
        non-ZeRO params alone."""
        if params is None:
            return list(self._units)
        wanted = {id(params)} if isinstance(params, torch.Tensor) else {id(p) for p in params}
        index = {id(p): i for i, p in enumerate(self._params)}
        return sorted({self._unit[index[k]] for k in wanted if k in index})

    @contextlib.contextmanager
    def gathered_parameters(self, params: Any = None, modifier_rank: int | None = None) -> Iterator[None]:
        """DeepSpeed's ``GatheredParameters``: inside the block every param of ``params`` (None: the whole model)
        holds its full values, at every stage. With ``modifier_rank`` what that rank writes into them (``p.data``,
        in place) becomes every rank's when the block ends — trained params' fp32 master included, frozen params'
        bytes too; the other ranks' writes are discarded. Collective: every rank enters with the same params and
        modifier rank, between micro-steps. If the block raises, nothing is published."""
        units = self._units_of(params if params is None or isinstance(params, torch.Tensor) else list(params))
        self._modifying += 1
        failed = True
        try:
            yield
            failed = False
        finally:
            self._modifying -= 1
            if modifier_rank is not None and not failed:
                for u in units:  # the params are views of the unit: publish it and keep it bound
                    try:
                        self.engine.release_modified(u, int(modifier_rank))
                    except ZeroError as e:
                        raise type(e)(
                            f"{e.message} (the unit's values were not published: below stage 3 the modifier rank's "
                            "writes stay in its own copy, so the ranks' values of these params now differ; enter "
                            "gathered_parameters again with a modifier rank every rank names, or load a checkpoint)",
                            e.status,
                        ) from e
                    self.engine.gather(u)

    def generate(self, *args: Any, keep_gathered: bool = True, **kwargs: Any) -> Any:
        """The model's ``generate`` (Hugging Face's, or any module method of that name), with the params it needs. At
        stage 3 ``keep_gathered`` holds every unit gathered for the whole generation, so that it runs without a
        collective and ranks may stop at different lengths; ``keep_gathered=False`` gathers per forward and passes
        ``synced_gpus=True`` (ranks that finish keep joining the gathers until all are done), which needs
        torch.distributed (torchrun). Collective at stage 3."""
        del keep_gathered  # the params are whole below stage 3
        with torch.no_grad():
            return self.module.generate(*args, **kwargs)

    def save_pretrained(self, save_directory: str, adapter_only: bool | None = None, **kwargs: Any) -> None:
        """Writes the model as Hugging Face loads it: ``from_pretrained(save_directory)`` (or, for a PEFT model,
        ``PeftModel.from_pretrained``) gets the trained values. Collective (stage 3 gathers one unit at a time); rank 0
        writes, through the model's own ``save_pretrained`` where it has one (config, sharding, tied weights), with
        the full values as its ``state_dict``. ``adapter_only`` (default: whether the model is a PEFT model) writes
        the trained params only, as PEFT saves an adapter; otherwise trained and frozen params and persistent
        buffers. Other keywords go to the model's ``save_pretrained``."""
        from .export import save_pretrained

        save_pretrained(self, save_directory, adapter_only, **kwargs)

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
            self._give_back()
        finally:
            self.engine.close()

    # ---- stages 0-2: params in engine memory --------------------------------------------------------------------
    def _bind_full(self) -> None:
        for u in self._units:
            self.engine.gather(u)  # free below stage 3
        for i, p in enumerate(self._params):
            view = from_engine(self.engine.param(i), self._tensor_dtype[i], self._shape[i])
            if p.data.data_ptr() != view.data_ptr() or p.dtype != view.dtype:
                p.data = view

    @contextlib.contextmanager
    def _released(self) -> Iterator[None]:
        """Every unit released around a call that needs it (zero_step, checkpoints); rebound after."""
        for u in self._units:
            self.engine.release(u)
        try:
            yield
        except BaseException:
            # The call failed: its error is the one to see, not a later gather's on an engine it left unusable.
            with contextlib.suppress(Exception):
                self._bind_full()
            raise
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
            if not self._in_backward and not self._plain:
                self._begin_plain_backward()
            self._ready.add(i)
            dst = torch.from_dlpack(self.engine.grad(i))
            dst.add_(g.reshape(dst.shape))
            p.grad = None
            self.engine.grad_ready(i)
            self._gradient_in(i)

        return hook


def _queue_last(callback: Callable[[], None]) -> None:
    """Runs ``callback`` when the running backward has ended, after the final callbacks its hooks queued (through a
    callback that queues it again: autograd runs callbacks queued by callbacks after those already queued)."""
    queue = torch.autograd.Variable._execution_engine.queue_callback
    queue(lambda: queue(callback))
