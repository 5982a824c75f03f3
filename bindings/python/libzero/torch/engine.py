"""The torch model's engine: what every stage shares (registration, backward, step, checkpoints, full_parameters,
close), and stages 0-2, whose params live in libzero's own memory. Stage 3 (libzero.torch.stage3) overrides the stage
hooks below."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import torch

from ..comm import Comm
from ..engine import ConfigLike, Engine, StepResult
from .config import _TORCH_DTYPE, _group_overrides, engine_config
from .units import default_units, number_units


class TorchEngine:
    """A torch model trained by a libzero engine (see libzero.torch's documentation). ``engine.module`` is the model,
    ``engine.engine`` the underlying :class:`libzero.Engine`. This class runs stages 0-2; ``initialize`` picks
    :class:`~libzero.torch.Stage3Engine` for stage 3."""

    stages: tuple[int, ...] = (0, 1, 2)  # the ZeRO stages this class runs

    def __init__(
        self,
        model: torch.nn.Module,
        config: ConfigLike,
        comm: Comm | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        units: Callable[[str, torch.nn.Parameter], Hashable] | None = None,
    ) -> None:
        cfg, groups = engine_config(config, optimizer)
        self._start(model, Engine(cfg, comm), units, groups)

    def _start(self, model: torch.nn.Module, engine: Engine, units: Any, groups: list[dict[str, Any]]) -> None:
        """Takes ``engine`` over (closing it if the model cannot be set up)."""
        self.module = model
        self.engine = engine
        try:
            self._setup(model, units, groups)
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
        self._in_backward = False
        self._ready: set[int] = set()  # params whose gradient this micro-step is in
        self._handles: list[Any] = []

        # Params in registration order; units numbered by first appearance.
        unit_of = units if units is not None else default_units(model)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad and p.numel() > 0]
        raw_units = number_units(named, unit_of)
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
            self._hook_param(i, p)
        self._place_params()

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

    def _copy_unit(self, u: int, names: list[str], out: dict[str, torch.Tensor]) -> None:
        """Copies of unit ``u``'s params' full values into ``out``, by name."""
        for i in self._members[u]:
            out[names[i]] = self._params[i].detach().clone()

    def _give_back(self) -> None:
        """Makes every trained param a plain torch tensor holding its current values (the engine still open)."""
        for p in self._params:
            p.data = p.data.clone()

    # ---- the training loop ---------------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward. If it raises, what it gathered is released (the micro-step can start over)."""
        try:
            return self.module(*args, **kwargs)
        except BaseException:
            self._forward_failed(args)
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
            self._backward_ended(failed)
        self.engine.backward_end()

    def step(self) -> StepResult | None:
        """The optimizer step when ``gradient_accumulation_steps`` micro-steps have ended since the last one (call
        it after every backward, as with DeepSpeed); None otherwise."""
        self._step_calls += 1
        window = self.engine.window
        if window["micro_steps"] < window["accumulation_steps"]:
            return None
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
        out: dict[str, torch.Tensor] = {}
        names = self.engine.param_names
        for u in self._units:
            self._copy_unit(u, names, out)
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
            self._give_back()
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
        """Every unit released around a call that needs it (zero_step, checkpoints); rebound after."""
        for u in self._units:
            self.engine.release(u)
        try:
            yield
        finally:
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
            self._gradient_in(i)

        return hook
