"""The Hugging Face Trainer on libzero: change the import, keep ``deepspeed="ds_config.json"``.

    from libzero.transformers import Trainer, TrainingArguments
    args = TrainingArguments(output_dir="out", deepspeed="ds_config.json", per_device_train_batch_size=4,
                             gradient_accumulation_steps=4, bf16=True)
    Trainer(model=model, args=args, train_dataset=train).train()

``TrainingArguments(deepspeed=...)`` takes the DeepSpeed config for libzero (``args.libzero_config``) before
transformers sees it, so transformers neither needs nor uses DeepSpeed; its ``"auto"`` values are resolved as
transformers resolves them for DeepSpeed (libzero.config.resolve_auto), the mismatches checked at once. The Trainer
builds a :class:`libzero.torch.TorchEngine` around the model when training starts: the config's optimizer and
scheduler, or the Trainer's own (its AdamW param groups and its schedule, which then drive the engine's learning rate
every step); the Trainer's backward goes to the engine with the loss it already averaged over the window
(``scale_wrt_gas=False``); a step ends every window, the epoch's shorter last one included; mixed precision, clipping
and the loss scale are the engine's, as with DeepSpeed. ``save_model`` is collective (a PEFT model saves its adapter),
checkpoints hold the engine's sharded state and resume bit for bit. docs/huggingface.md has the whole story."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import torch
import transformers

from .config import resolve_auto
from .engine import ConfigLike
from .torch import TorchEngine
from .torch.schedule import ConfigScheduler, EngineHeldState
from .torch import initialize as _initialize

_CHECKPOINT_TAG = "libzero"  # the engine's checkpoint inside a Trainer checkpoint directory


@contextlib.contextmanager
def _without_accelerate_deepspeed() -> Iterator[None]:
    """accelerate turns DeepSpeed on from the environment (``accelerate launch --use_deepspeed`` sets
    ACCELERATE_USE_DEEPSPEED): not while libzero's arguments and Trainer are set up."""
    saved = os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["ACCELERATE_USE_DEEPSPEED"] = saved


class _LibzeroArguments:
    """What the Trainer's arguments do with ``deepspeed=``: keep it for libzero and out of transformers' reach."""

    libzero_config: dict[str, Any] | None
    libzero_precision: str

    def __post_init__(self) -> None:
        config: ConfigLike | None = self.deepspeed  # type: ignore[attr-defined]
        self.deepspeed = None  # transformers' DeepSpeed path stays off (DeepSpeed need not be installed)
        # Mixed precision is the engine's, as it is DeepSpeed's: the Trainer neither autocasts nor scales.
        self.libzero_precision = "fp16" if self.fp16 else "bf16" if self.bf16 else "fp32"  # type: ignore[attr-defined]
        self.fp16 = self.bf16 = False
        with _without_accelerate_deepspeed():
            super().__post_init__()  # type: ignore[misc]
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched > 1 and self.world_size != launched:  # type: ignore[attr-defined]
            # Each process would train on the whole dataset and the batch sizes would not add up.
            raise ValueError(
                f"the launcher started {launched} processes but the Trainer's arguments see "
                f"{self.world_size}: on CPUs transformers sets up the process group only with "  # type: ignore[attr-defined]
                "TrainingArguments(use_cpu=True)"
            )
        # What the arguments decide is resolved now (a mismatch is an error here, as in transformers); the model's
        # and the step counts' "auto" when training starts.
        self.libzero_config = None if config is None else resolve_auto(config, _WithPrecision(self), require_all=False)


@dataclasses.dataclass
class TrainingArguments(_LibzeroArguments, transformers.TrainingArguments):
    """``transformers.TrainingArguments`` whose ``deepspeed=`` config (dict, JSON text or path) is libzero's."""


@dataclasses.dataclass
class Seq2SeqTrainingArguments(_LibzeroArguments, transformers.Seq2SeqTrainingArguments):
    """``transformers.Seq2SeqTrainingArguments`` whose ``deepspeed=`` config is libzero's."""


class _EngineOptimizer(EngineHeldState):
    """The Trainer's ``optimizer``: its ``step()`` ends the accumulation window with the engine's step (after
    however many micro-steps the window had); the param groups are the engine's."""

    def __init__(self, engine: TorchEngine) -> None:
        self.engine = engine

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.engine.optimizer.param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        return {}

    @property
    def state(self) -> dict[Any, Any]:
        return {}

    def step(self, closure: Any = None) -> None:
        del closure
        self.engine.set_gradient_accumulation_boundary(True)
        try:
            self.engine.step()
        finally:
            self.engine.set_gradient_accumulation_boundary(None)


class _EngineSchedule:
    """The Trainer's ``lr_scheduler``: the engine steps the schedule itself (not after a skipped fp16 step), so
    ``step()`` does nothing. ``get_last_lr()``, which the Trainer logs after each step, means what it means with
    DeepSpeed: under a config scheduler (which DeepSpeed steps right after the optimizer) the next step's rate,
    under the Trainer's own schedule (which the Trainer steps after logging) the rate of the step just taken."""

    def __init__(self, engine: TorchEngine) -> None:
        self.engine = engine

    def step(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs

    def get_last_lr(self) -> list[float]:
        if isinstance(self.engine.lr_scheduler, ConfigScheduler):
            return self.engine.lr_scheduler.get_last_lr()
        return self.engine.last_step_lr()

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


class _LibzeroTrainer:
    """What the Trainer does differently on libzero (mixed into transformers' Trainer and Seq2SeqTrainer)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with _without_accelerate_deepspeed():
            super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        if getattr(self.args, "libzero_config", None) is None:  # type: ignore[attr-defined]
            raise ValueError(
                "libzero.transformers' Trainer needs a config: libzero.transformers.TrainingArguments(deepspeed=...) "
                "(a DeepSpeed config: dict, JSON text or path)"
            )
        if self.is_deepspeed_enabled:  # type: ignore[attr-defined]
            raise RuntimeError("accelerate was set up for DeepSpeed before libzero's Trainer: libzero replaces it")
        self.libzero_engine: TorchEngine | None = None
        # The Trainer's backward (loss already divided by the window's micro-steps) goes to the engine.
        self.accelerator.backward = self._engine_backward  # type: ignore[attr-defined]

    # ---- the engine -------------------------------------------------------------------------------------------
    def _engine_backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        del kwargs
        assert self.libzero_engine is not None
        self.libzero_engine.backward(loss, scale_wrt_gas=False)

    def _wrap_model(self, model: torch.nn.Module, training: bool = True, dataloader: Any = None) -> torch.nn.Module:
        if self.libzero_engine is not None:
            return self.libzero_engine
        if not training:  # evaluation before training: the model as it is
            return model
        engine = self.libzero_engine = self._start_engine()
        self.optimizer = _EngineOptimizer(engine)
        schedule = getattr(self, "lr_scheduler", None)
        if schedule is not None and not isinstance(schedule, _EngineSchedule):
            # transformers 4.x creates its schedule before it wraps the model, over the client optimizer the engine
            # now reads: the engine steps it from here on (after the steps it takes only), not the Trainer.
            if engine.lr_scheduler is None and isinstance(engine.optimizer, torch.optim.Optimizer):
                engine.attach_lr_scheduler(schedule)
            self.lr_scheduler = _EngineSchedule(engine)
        return engine

    def _start_engine(self) -> TorchEngine:
        args = self.args  # type: ignore[attr-defined]
        # transformers 4.x wraps the model before it sets state.max_steps, but after it created the schedule.
        steps = self.state.max_steps or getattr(self, "_libzero_training_steps", 0)  # type: ignore[attr-defined]
        config = resolve_auto(args.libzero_config, _WithPrecision(args), self.model, steps)  # type: ignore[attr-defined]
        client = None
        if "optimizer" not in config:  # the Trainer's own optimizer (created already), as DeepSpeed takes it
            client = self.optimizer  # type: ignore[has-type]
            if not isinstance(client, torch.optim.Optimizer):
                raise ValueError("the config has no 'optimizer' block and the Trainer has no torch optimizer")
        return _initialize(self.model, config, optimizer=client)  # type: ignore[attr-defined]

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        engine = self.libzero_engine
        if engine is None:
            self._libzero_training_steps = num_training_steps
            return super().create_scheduler(num_training_steps, optimizer)  # type: ignore[misc]
        if engine.lr_scheduler is None:
            # The Trainer's schedule (args.lr_scheduler_type, warmup) over the client optimizer's groups.
            if not isinstance(engine.optimizer, torch.optim.Optimizer):
                raise ValueError(
                    "the config has an 'optimizer' block but no 'scheduler': add one (DeepSpeed's WarmupDecayLR "
                    "with \"auto\" values is what the Trainer's linear schedule becomes), or leave both to the Trainer"
                )
            self.lr_scheduler = None
            schedule = super().create_scheduler(num_training_steps, engine.optimizer)  # type: ignore[misc]
            engine.attach_lr_scheduler(schedule)
        self.lr_scheduler = _EngineSchedule(engine)
        return self.lr_scheduler

    def _maybe_log_save_evaluate(self, tr_loss: Any, grad_norm: Any, *args: Any, **kwargs: Any) -> Any:
        if self.libzero_engine is not None and self.libzero_engine.get_global_grad_norm() is not None:
            grad_norm = self.libzero_engine.get_global_grad_norm()  # the norm the engine clipped by
        return super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kwargs)  # type: ignore[misc]

    # ---- saving and resuming ------------------------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Collective once training started: every rank calls it (the Trainer does), rank 0 writes what
        ``from_pretrained`` (or, for a PEFT model, ``PeftModel.from_pretrained``) loads."""
        engine = self.libzero_engine
        if engine is None:
            return super().save_model(output_dir, _internal_call)  # type: ignore[misc]
        args = self.args  # type: ignore[attr-defined]
        output_dir = output_dir if output_dir is not None else args.output_dir
        engine.save_pretrained(output_dir)
        if args.should_save:
            if self.processing_class is not None:  # type: ignore[attr-defined]
                self.processing_class.save_pretrained(output_dir)  # type: ignore[attr-defined]
            torch.save(args, os.path.join(output_dir, transformers.trainer.TRAINING_ARGS_NAME))

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if self.libzero_engine is None:
            return super()._save_optimizer_and_scheduler(output_dir)  # type: ignore[misc]
        self.libzero_engine.save_checkpoint(output_dir, _CHECKPOINT_TAG)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if self.libzero_engine is None or checkpoint is None:
            return super()._load_optimizer_and_scheduler(checkpoint)  # type: ignore[misc]
        if not os.path.isdir(os.path.join(checkpoint, _CHECKPOINT_TAG)):
            raise FileNotFoundError(f"{checkpoint} holds no libzero checkpoint ({_CHECKPOINT_TAG}/): was it saved "
                                    "by libzero.transformers' Trainer?")
        self.libzero_engine.load_checkpoint(checkpoint, _CHECKPOINT_TAG)

    def _load_best_model(self) -> None:
        best = self.state.best_model_checkpoint  # type: ignore[attr-defined]
        if self.libzero_engine is None or best is None or not os.path.isdir(os.path.join(best, _CHECKPOINT_TAG)):
            return super()._load_best_model()  # type: ignore[misc]
        self.libzero_engine.load_checkpoint(best, _CHECKPOINT_TAG)


class _WithPrecision:
    """The training arguments as resolve_auto reads them, with the precision the user asked for (the arguments
    themselves say fp32, so that transformers neither autocasts nor scales)."""

    def __init__(self, args: Any) -> None:
        self._args = args

    def __getattr__(self, name: str) -> Any:
        if name in ("fp16", "bf16"):
            return self._args.libzero_precision == name
        return getattr(self._args, name)


class Trainer(_LibzeroTrainer, transformers.Trainer):
    """``transformers.Trainer`` training on libzero (see the module's documentation)."""


class Seq2SeqTrainer(_LibzeroTrainer, transformers.Seq2SeqTrainer):
    """``transformers.Seq2SeqTrainer`` training on libzero. Generation at stage 3 holds the whole model gathered while
    it runs, so ranks that stop at different lengths need no collective."""

    def prediction_step(self, model: Any, inputs: Any, prediction_loss_only: bool, ignore_keys: Any = None,
                        **gen_kwargs: Any) -> Any:
        engine = self.libzero_engine
        if engine is None or engine.stage != 3 or not self.args.predict_with_generate or prediction_loss_only:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys, **gen_kwargs)
        with engine.gathered_parameters():
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys, **gen_kwargs)
