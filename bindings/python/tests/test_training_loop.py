"""A training loop written for DeepSpeed's engine, run on libzero.torch: a plain ``loss.backward()``, an epoch whose
last accumulation window is partial, losses the caller already averaged (``scale_wrt_gas=False``, as the Hugging
Face Trainer does), the learning rate read and driven as DeepSpeed's engine has it, client state in checkpoints,
``libzero.deepspeed.initialize``'s 4-tuple, the engine as a module. In one process, under mpirun and under
torchrun: where the arithmetic is the same, the weights are the same bits."""

from __future__ import annotations

import os

import pytest
import torch

import libzero
import libzero.deepspeed
import libzero.torch as lzt
from test_torch import LAUNCH, RANK, WORLD, comm, teardown_module  # noqa: F401 - the same launch handling
from torch_model import batch, make_model

torch.set_num_threads(1)

LR = 3e-3


SCRATCH = os.path.join(os.environ.get("ZERO_TEST_SCRATCH", "/tmp/libzero-loop-test"), f"{LAUNCH}-{WORLD}")


def config(stage: int, gas: int, dtype: str = "fp32", **extra) -> dict:
    cfg = {
        "train_batch_size": 4 * WORLD * gas,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 5000},
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
        "libzero": {"timeout_s": 120},
    }
    if dtype != "fp32":
        cfg[dtype] = {"enabled": True}
    cfg.update(extra)
    return cfg


def bits(eng: lzt.TorchEngine) -> dict[str, bytes]:
    return {n: t.contiguous().view(torch.uint8).numpy().tobytes() for n, t in eng.full_parameters().items()}


def engine(stage: int, gas: int, dtype: str = "fp32", **extra) -> lzt.TorchEngine:
    model = make_model(dtype={"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype])
    return lzt.initialize(model, config(stage, gas, dtype, **extra), comm())


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_plain_loss_backward_trains_as_engine_backward(stage):
    """DeepSpeed's PyTorch-style backward: the micro-step ends when loss.backward() does; the same bits."""
    runs = []
    for plain in (False, True):
        eng = engine(stage, 2)
        for s in range(6):
            loss = eng(*batch(s, RANK))
            if plain:
                loss.backward()
            else:
                eng.backward(loss)
            eng.step()
        assert eng.global_steps == 3
        runs.append(bits(eng))
        eng.close()
    assert runs[0] == runs[1]


def test_the_micro_step_of_a_plain_backward_ends_with_it():
    eng = engine(3, 2)
    eng(*batch(0, RANK)).backward()
    assert eng.engine.window["micro_steps"] == 1
    assert eng.step() is None  # one of two micro-steps
    eng(*batch(1, RANK)).backward()
    assert eng.step().step == 1
    eng.close()


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_retained_graph_s_second_backward_ends_only_its_own_micro_step(stage):
    """engine.backward(loss, retain_graph=True), then engine.backward(loss) through the same graph: two micro-steps,
    not three (the first backward's end is not run again by the second), with the bits of two forwards of the batch."""
    runs = []
    for retained in (False, True):
        eng = engine(stage, 2)
        for s in range(2):
            if retained:
                loss = eng(*batch(s, RANK))
                eng.backward(loss, retain_graph=True)
                assert eng.engine.window["micro_steps"] == 1
                eng.backward(loss)
            else:
                eng.backward(eng(*batch(s, RANK)))
                eng.backward(eng(*batch(s, RANK)))
            assert eng.engine.window["micro_steps"] == 2
            assert eng.step().step == s + 1
        runs.append(bits(eng))
        eng.close()
    assert runs[0] == runs[1]


class _ProbeTheLoss(torch.autograd.Function):
    """Identity whose backward differentiates the loss again once (as a gradient-norm probe would)."""

    probe: dict = {}

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        probe = _ProbeTheLoss.probe
        if probe.pop("armed", False):
            with torch.enable_grad():
                torch.autograd.grad(probe["loss"], probe["at"], retain_graph=True)
        return grad


@pytest.mark.parametrize("stage", [0, 3])
def test_the_micro_step_ends_after_the_backward_s_own_callbacks_and_nested_backwards(stage):
    """A backward through the loss inside engine.backward's does not end the micro-step, and final callbacks the
    backward's hooks queue run before its end: the micro-step still open, stage 3's units still gathered."""
    eng = engine(stage, 2)
    seen = []
    queue = torch.autograd.Variable._execution_engine.queue_callback

    def callback():
        seen.append((eng.engine.window["micro_steps"], eng._in_backward))

    handles = [
        eng.module.blocks[1].register_forward_hook(lambda _m, _a, out: _ProbeTheLoss.apply(out)),
        eng.module.head.weight.register_hook(lambda _grad: queue(callback)),
    ]
    out = {}
    handles.append(eng.module.blocks[1].register_forward_hook(lambda _m, _a, o: out.update(at=o)))
    loss = eng(*batch(0, RANK))
    _ProbeTheLoss.probe.update(armed=True, loss=loss, at=out["at"])
    eng.backward(loss, retain_graph=True)
    assert seen == [(0, True)]
    assert eng.engine.window["micro_steps"] == 1
    for h in handles:
        h.remove()
    _ProbeTheLoss.probe.clear()
    eng.backward(eng(*batch(1, RANK)))
    assert eng.step().step == 1
    eng.close()


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_an_epoch_remainder_steps_as_a_window_of_that_many(stage):
    """gradient_accumulation_steps 3, and a window ended after 2 (set_gradient_accumulation_boundary, as accelerate
    does): the bits of an engine configured with 2 that resumed from the same point."""
    directory = _fresh_dir(f"remainder{stage}")
    three = engine(stage, 3)
    for s in range(3):
        three.backward(three(*batch(s, RANK)))
        three.step()
    three.save_checkpoint(directory, "w1")
    three.backward(three(*batch(3, RANK)))
    assert three.step() is None
    three.set_gradient_accumulation_boundary(True)
    three.backward(three(*batch(4, RANK)))
    result = three.step()
    assert result is not None and result.step == 2
    got = bits(three)
    three.close()

    two = engine(stage, 2)
    two.load_checkpoint(directory, "w1")
    for s in (3, 4):
        two.backward(two(*batch(s, RANK)))
        expected_result = two.step()
    assert expected_result.step == 2 and expected_result.grad_norm == result.grad_norm
    assert bits(two) == got
    two.close()


@pytest.mark.parametrize("stage", [1, 3])
def test_losses_the_caller_averaged_are_averaged_over_ranks_only(stage):
    """The Hugging Face Trainer divides each micro-step's loss by the window's count and passes
    scale_wrt_gas=False: with a power-of-two count the halving is exact, so the bits equal engine.backward(loss)."""
    runs = []
    for averaged in (False, True):
        eng = engine(stage, 2)
        for s in range(6):
            loss = eng(*batch(s, RANK))
            if averaged:
                eng.backward(loss / 2, scale_wrt_gas=False)
            else:
                eng.backward(loss)
            eng.step()
        runs.append(bits(eng))
        eng.close()
    assert runs[0] == runs[1]


def test_mixing_both_scalings_in_one_window_is_refused():
    eng = engine(2, 2)
    eng.backward(eng(*batch(0, RANK)))
    eng.step()
    eng.backward(eng(*batch(1, RANK)) / 2, scale_wrt_gas=False)
    with pytest.raises(ValueError, match="mixed backward"):
        eng.step()
    eng.close()


def test_get_lr_and_the_scheduler_follow_the_config_s_scheduler():
    sched = {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": LR, "warmup_num_steps": 4,
                                            "warmup_type": "linear"}}
    eng = engine(2, 1, scheduler=sched)
    assert isinstance(eng.lr_scheduler, lzt.schedule.ConfigScheduler)
    for s in range(6):
        upcoming = eng.get_lr()
        assert eng.optimizer.param_groups[0]["lr"] == upcoming[0]
        eng.backward(eng(*batch(s, RANK)))
        result = eng.step()
        assert result.lr == upcoming[0]
        assert eng.lr_scheduler.get_last_lr() == eng.get_lr()  # DeepSpeed's: the scheduler stepped after the update
        assert eng.get_global_grad_norm() == result.grad_norm
    assert eng.get_lr()[0] == LR  # warmed up
    with pytest.raises(libzero.ZeroError, match="scheduler"):
        eng.optimizer.param_groups[0]["lr"] = 0.1
    eng.close()


def test_a_client_scheduler_drives_the_engine_and_its_state_resumes():
    directory = _fresh_dir("client")

    def build():
        model = make_model()
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
        cfg = config(3, 1)
        del cfg["optimizer"]
        return lzt.initialize(model, cfg, comm(), optimizer=opt, lr_scheduler=sched), opt, sched

    eng, opt, sched = build()
    assert eng.optimizer is opt and eng.lr_scheduler is sched
    for s in range(3):
        assert eng.get_lr() == [LR / (s + 1)] == sched.get_last_lr()
        eng.backward(eng(*batch(s, RANK)))
        assert eng.step().lr == LR / (s + 1)
    eng.save_checkpoint(directory, "c", client_state={"epoch": 7, "note": "x"})
    expected = bits(eng)
    eng.close()

    resumed, _, sched2 = build()
    path, client = resumed.load_checkpoint(directory, "c")
    assert path == os.path.join(directory, "c") and client == {"epoch": 7, "note": "x"}
    assert sched2.last_epoch == 3 and resumed.get_lr() == [LR / 4]
    assert bits(resumed) == expected
    resumed.close()


def test_both_a_config_scheduler_and_a_client_one_are_refused():
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    cfg = config(2, 1, scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 2}})
    del cfg["optimizer"]
    with pytest.raises(ValueError, match="use one"):
        lzt.initialize(model, cfg, comm(), optimizer=opt, lr_scheduler=sched)


def test_the_engine_is_a_module_that_nothing_wraps_again():
    model = make_model()
    eng = lzt.initialize(model, config(2, 1), comm())
    assert isinstance(eng, torch.nn.Module) and eng.module is model
    assert [id(p) for p in eng.parameters()] == [id(p) for p in model.parameters()]
    eng.zero_grad()
    assert eng.eval() is eng and not model.training
    eng.train()
    assert model.training
    eng.backward(eng(*batch(0, RANK)))
    assert eng.step().step == 1
    eng.close()


def test_fp16_plain_backward_needs_the_loss_scale_as_deepspeed_s_does():
    runs = []
    for how in ("engine", "scale"):
        eng = engine(2, 1, "fp16", fp16={"enabled": True, "initial_scale_power": 8})
        for s in range(3):
            loss = eng(*batch(s, RANK))
            if how == "engine":
                eng.backward(loss)
            else:
                eng.scale(loss).backward()
            eng.step()
        runs.append(bits(eng))
        if how == "scale":
            with pytest.raises(RuntimeError, match=r"engine.scale\(loss\).backward\(\)"):
                eng(*batch(3, RANK)).backward()
        eng.close()
    assert runs[0] == runs[1]


def test_deepspeed_initialize_returns_deepspeed_s_four_tuple():
    model = make_model()
    data = [batch(s, 0) for s in range(8)]
    eng, opt, loader, sched = libzero.deepspeed.initialize(
        model=model, model_parameters=model.parameters(), training_data=data, config=config(1, 1), comm=comm()
    )
    assert isinstance(eng, lzt.TorchEngine) and sched is None
    assert opt.param_groups[0]["lr"] == LR
    per_rank = -(-len(data) // WORLD)  # DistributedSampler pads to a multiple of the ranks
    assert len(loader) == -(-per_rank // 4)
    inputs, targets = next(iter(loader))
    assert inputs.shape == (min(4, per_rank), 4, 16) and targets.shape == inputs.shape
    eng.close()

    # Param groups: the config's optimizer with a group of its own (no weight decay on 1-d params).
    model = make_model()
    decay = [p for p in model.parameters() if p.ndim > 1]
    rest = [p for p in model.parameters() if p.ndim <= 1]
    eng, opt, _, _ = libzero.deepspeed.initialize(
        model=model, model_parameters=[{"params": decay}, {"params": rest, "weight_decay": 0.0, "lr": LR / 2}],
        config=config(2, 1), comm=comm()
    )
    assert eng.get_lr() == [LR, LR / 2]
    eng.backward(eng(*batch(0, RANK)))
    assert eng.step().step == 1
    eng.close()


def _fresh_dir(name: str) -> str:
    """A checkpoint directory every rank sees, emptied of an earlier run's tags (never overwritten) by rank 0; the
    other ranks first touch it in the save, a collective that rank 0 reaches after this."""
    directory = os.path.join(SCRATCH, name)
    if RANK == 0:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
    return directory


def test_a_client_state_rank_0_cannot_write_is_an_error_on_every_rank():
    eng = engine(1, 1)
    directory = _fresh_dir("unpicklable")
    with pytest.raises(Exception) as raised:
        eng.save_checkpoint(directory, "t", client_state={"f": lambda: 0})  # a lambda does not pickle
    if RANK != 0:
        assert "rank 0 failed" in str(raised.value)
    # The engine goes on: the failure was rank 0's file, after libzero's own collective save.
    eng.backward(eng(*batch(0, RANK)))
    assert eng.step().step == 1
    eng.close()


class _FailsOnce(torch.autograd.Function):
    """Identity forward; the first backward raises (an out-of-memory in the middle of backward, say)."""

    raised = False

    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        if not _FailsOnce.raised:
            _FailsOnce.raised = True
            raise RuntimeError("out of memory (test)")
        return g


@pytest.mark.parametrize("plain", [False, True])
def test_a_backward_that_raises_leaves_a_clear_error_not_a_misleading_one(plain):
    """The failure comes after the head's and the last blocks' gradients went in (it sits after the first block)."""
    eng = engine(1, 1)
    model = eng.module
    hook = model.blocks[0].register_forward_hook(lambda _m, _a, out: _FailsOnce.apply(out))
    _FailsOnce.raised = False
    loss = eng(*batch(0, RANK))
    with pytest.raises(RuntimeError, match="out of memory"):
        if plain:
            loss.backward()
        else:
            eng.backward(loss)
    hook.remove()
    # Part of that micro-step's gradients went in: the next use says so, and what to do.
    with pytest.raises(RuntimeError, match="neither be retried nor undone"):
        eng.backward(eng(*batch(1, RANK)))
    eng.close()


def test_a_backward_that_raises_before_any_gradient_leaves_the_micro_step_as_it_was():
    eng = engine(2, 1)
    _FailsOnce.raised = False
    with pytest.raises(RuntimeError, match="out of memory"):
        eng.backward(_FailsOnce.apply(eng(*batch(0, RANK))))
    eng.backward(eng(*batch(0, RANK)))  # nothing went in: the micro-step starts over
    assert eng.step().step == 1
    eng.close()
