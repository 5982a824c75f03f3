"""The learning rate as a training loop written for DeepSpeed reads and drives it: ``engine.optimizer.param_groups``
(each group's rate for the next step), ``engine.lr_scheduler`` (the config's scheduler, or the client's torch
scheduler, which libzero steps after every optimizer step that was not skipped and whose rates it hands to the
engine), and the client state a checkpoint carries beside libzero's own files."""

from __future__ import annotations

import os
from typing import Any

import torch

from ..engine import Engine

CLIENT_STATE_FILE = "client_state.pt"


class EngineHeldState:
    """An optimizer-shaped object whose gradients and state the engine holds: nothing to clear or save here."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to clear: gradients go into libzero's buffers, which the step clears."""
        del set_to_none

    def state_dict(self) -> dict[str, Any]:
        """The optimizer state is in libzero's checkpoints (``save_checkpoint``), sharded; nothing is kept here."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


class EngineParamGroups(EngineHeldState):
    """``engine.optimizer`` without a client optimizer: ``param_groups[g]["lr"]`` is the rate the next step gives
    group ``g`` (the config's scheduler evaluated there), ``params`` the torch params of the group. Writing ``lr``
    sets it (``zero_set_lr``; refused with a config scheduler, which sets it every step)."""

    def __init__(self, engine: Engine, params: list[list[torch.nn.Parameter]]) -> None:
        self._engine = engine
        self._params = params

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [_Group(self._engine, g, params) for g, params in enumerate(self._params)]


class _Group(dict):  # type: ignore[type-arg]
    """One param group as a dict whose ``lr`` entry reads and writes the engine's."""

    def __init__(self, engine: Engine, group: int, params: list[torch.nn.Parameter]) -> None:
        super().__init__(params=params, lr=engine.get_lr(group))
        self._engine = engine
        self._group = group

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "lr":
            self._engine.set_lr(float(value), self._group)
        super().__setitem__(key, value)


class ConfigScheduler:
    """``engine.lr_scheduler`` for a config's ``scheduler`` block: the engine evaluates it at every step; this reads
    it. ``step()`` does nothing: the engine's step advances it (a skipped fp16 step does not)."""

    def __init__(self, engine: Engine, groups: int) -> None:
        self._engine = engine
        self._groups = groups

    def get_last_lr(self) -> list[float]:
        """DeepSpeed's meaning: its engine steps the scheduler right after the optimizer, so the rates the scheduler
        last set are the next step's."""
        return self.get_lr()

    def get_lr(self) -> list[float]:
        """The rates the next step uses."""
        return [self._engine.get_lr(g) for g in range(self._groups)]

    def step(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs

    def state_dict(self) -> dict[str, Any]:
        """The schedule's position is the engine's step counter, which libzero's checkpoints hold."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


def push_client_rates(engine: Engine, optimizer: torch.optim.Optimizer) -> None:
    """The client optimizer's rates (what its torch scheduler last set) become the engine's, group by group."""
    for g, group in enumerate(optimizer.param_groups):
        engine.set_lr(float(group["lr"]), g)


def step_client_scheduler(engine: Engine, optimizer: torch.optim.Optimizer, scheduler: Any, **kwargs: Any) -> None:
    """After an optimizer step the engine took: the client's torch scheduler steps and its rates become the
    engine's. The engine's step stands for ``optimizer.step()``, which torch's schedulers look for (they warn that
    a schedule value was skipped when they see a scheduler step before any optimizer step)."""
    optimizer._opt_called = True  # what torch's optimizer.step() wrapper records for its schedulers
    scheduler.step(**kwargs)
    push_client_rates(engine, optimizer)


def restore_client_scheduler(engine: Engine, optimizer: torch.optim.Optimizer, scheduler: Any, state: Any) -> None:
    """A client scheduler's saved state, and its last rates in the optimizer and the engine (a torch scheduler's
    load_state_dict restores its own position only)."""
    scheduler.load_state_dict(state)
    for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
        group["lr"] = lr
    push_client_rates(engine, optimizer)


def save_client_state(path: str, state: dict[str, Any]) -> None:
    """Rank 0's part of a checkpoint that libzero does not shard: the client state and the client scheduler's."""
    torch.save(state, os.path.join(path, CLIENT_STATE_FILE))


def load_client_state(path: str) -> dict[str, Any]:
    """What save_client_state wrote under ``path`` (empty when the checkpoint has none: saved by the C API or
    another binding)."""
    file = os.path.join(path, CLIENT_STATE_FILE)
    if not os.path.exists(file):
        return {}
    loaded = torch.load(file, map_location="cpu", weights_only=False)
    return loaded if isinstance(loaded, dict) else {}


class LearningRates:
    """The learning rate of a torch engine as DeepSpeed's engine exposes it: ``optimizer``, ``lr_scheduler``,
    ``get_lr()``; a client scheduler stepped after every step taken. Mixed into TorchEngine, whose ``engine``,
    ``_params`` and ``_trained`` it reads."""

    engine: Engine
    _params: list[torch.nn.Parameter]
    _trained: list[bool]
    _last_step_lr: list[float] | None = None

    def _setup_schedule(
        self, groups: list[dict[str, Any]], optimizer: Any, lr_scheduler: Any, config_scheduler: bool
    ) -> None:
        """``optimizer`` and ``lr_scheduler`` as DeepSpeed's engine has them: the client's, or views of the engine's
        param groups and of the config's scheduler."""
        n_groups = max(1, len(groups))
        if optimizer is not None:
            self.optimizer = optimizer
        else:
            members: list[list[torch.nn.Parameter]] = [[] for _ in range(n_groups)]
            for i, p in enumerate(self._params):
                if self._trained[i]:
                    members[0].append(p)
            self.optimizer = EngineParamGroups(self.engine, members)
        self._client_scheduler = lr_scheduler
        if lr_scheduler is not None:
            push_client_rates(self.engine, optimizer)  # what the scheduler set at its construction
            self.lr_scheduler = lr_scheduler
        elif config_scheduler:
            self.lr_scheduler = ConfigScheduler(self.engine, n_groups)
        else:
            self.lr_scheduler = None
        self._n_groups = n_groups

    def get_lr(self) -> list[float]:
        """Each param group's learning rate for the next step (DeepSpeed's ``get_lr``)."""
        return [self.engine.get_lr(g) for g in range(self._n_groups)]

    def last_step_lr(self) -> list[float]:
        """Each group's learning rate in the last step taken (before any: the first step's)."""
        return list(self._last_step_lr) if self._last_step_lr is not None else self.get_lr()

    def attach_lr_scheduler(self, lr_scheduler: Any) -> None:
        """A client torch scheduler of the client optimizer, given after initialize (the Hugging Face Trainer
        creates its schedule once the optimizer is prepared): stepped after every step taken from now on, its
        current rates the engine's at once."""
        if self.lr_scheduler is not None:
            raise ValueError("the engine already has a learning-rate scheduler")
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise ValueError("a client lr_scheduler needs the client optimizer it schedules (initialize(optimizer=))")
        push_client_rates(self.engine, self.optimizer)
        self._client_scheduler = self.lr_scheduler = lr_scheduler

    def _stepped_with(self, rates: list[float], lr_kwargs: dict[str, Any] | None) -> None:
        """After a step that was taken with ``rates``: they are the last step's, and the schedule moves on."""
        self._last_step_lr = rates
        if self._client_scheduler is not None:
            step_client_scheduler(self.engine, self.optimizer, self._client_scheduler, **(lr_kwargs or {}))
