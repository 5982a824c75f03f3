#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Record reference behaviour of DeepSpeed itself, for libzero's tests.

libzero reads DeepSpeed's ds_config.json and must train exactly as DeepSpeed
does.  This script runs DeepSpeed's own classes (never a re-implementation of
their formulas) on CPU, in one process, and writes what they did to a JSON
file:

  lr_schedules      learning rate used by optimizer step k = 1..K, observed
                    through a real deepspeed.initialize() engine
  nonfinite_steps   fp32 and bf16 engines (stages 0..3) given an inf loss: is
                    the step skipped, do the weights stay finite
  loss_scaling      fp16 dynamic loss scale, step by step, for a given overflow
                    pattern: (1) DeepSpeed's DynamicLossScaler as the ZeRO
                    optimizers drive it, (2) the stage-0 FP16_Optimizer /
                    FP16_UnfusedOptimizer update rule, (3) real fp16 engines
                    (ZeRO stages 0..3) with injected overflows
  optimizers        class and param_groups[0] hyper-parameters that
                    deepspeed.initialize() builds for each optimizer config
  config_keys       every ds_config key DeepSpeed reads: top level (probed),
                    per section, pydantic fields with defaults/aliases/
                    deprecations, optimizer and scheduler constructor params
  memory_estimates  DeepSpeed's stage-2 and stage-3 model-state memory
                    estimators, with and without offload to the CPU

Run (from the repository root):

  DS_ACCELERATOR=cpu DS_BUILD_OPS=0 /work/venvs/ds/bin/python \
      tests/deepspeed/make_fixtures.py --out tests/deepspeed/fixtures.json

The first run JIT-compiles DeepSpeed's small CPU ops (fused_adam, shm comm)
into ~/.cache/torch_extensions (about a minute); later runs reuse them.
The output is deterministic: no timing or random data goes into it.
"""

import argparse
import contextlib
import enum
import inspect
import io
import json
import logging
import math
import os
import pathlib
import socket
import sys
import types
import warnings

# DeepSpeed must pick its CPU accelerator and must not try to pre-build ops.
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("DS_BUILD_OPS", "0")
# Keep JIT compiles of DeepSpeed ops polite on small machines.
os.environ.setdefault("MAX_JOBS", "1")

import torch  # noqa: E402
import deepspeed  # noqa: E402
from deepspeed import comm as dist  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402

warnings.filterwarnings("ignore")

# --------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------


def quiet_deepspeed_logs():
    """DeepSpeed logs a lot at INFO; the fixtures do not need it."""
    from deepspeed.utils import logger as ds_logger
    ds_logger.setLevel(logging.ERROR)
    for name in ("DeepSpeed", "deepspeed", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.ERROR)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_single_process_dist():
    """torch.distributed with gloo, world size 1, through DeepSpeed's own init."""
    os.environ.update(MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()),
                      RANK="0",
                      WORLD_SIZE="1",
                      LOCAL_RANK="0")
    deepspeed.init_distributed(dist_backend="gloo")


def js(v, depth=0):
    """Convert a Python / torch / pydantic value into something json.dumps accepts,
    keeping numbers exact (json writes floats with repr, which round-trips)."""
    if depth > 8:
        return repr(v)
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, enum.Enum):
        return js(v.value, depth + 1)
    if isinstance(v, int):
        return int(v)  # also turns DeepSpeed's pp_int into a plain int
    if isinstance(v, float):
        if math.isfinite(v):
            return float(v)
        return repr(v)  # "inf", "nan": JSON has no literal for them
    if isinstance(v, torch.Tensor):
        return js(v.tolist(), depth + 1)
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, (list, tuple)):
        return [js(x, depth + 1) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted(js(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return {str(k): js(x, depth + 1) for k, x in v.items()}
    if isinstance(v, pathlib.PurePath):
        return str(v)
    if hasattr(v, "model_dump"):
        try:
            return js(v.model_dump(), depth + 1)
        except Exception:
            pass
    if isinstance(v, type):
        return f"{v.__module__}.{v.__qualname__}"
    if callable(v):
        return f"<callable {getattr(v, '__qualname__', repr(v))}>"
    return repr(v)


def exc_record(e):
    return {"type": type(e).__name__, "message": str(e)}


class TinyModel(torch.nn.Module):
    """nn.Linear(4, 4) with fixed weights. Its loss sum(W x + b) with x = ones
    has gradient exactly 1.0 for every weight and bias element, which makes the
    gradient that reaches the optimizer easy to read."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        with torch.no_grad():
            self.lin.weight.copy_(torch.arange(16, dtype=torch.float32).reshape(4, 4) / 16)
            self.lin.bias.zero_()

    def forward(self, x):
        return self.lin(x)


def make_engine(config, model=None):
    """A real deepspeed.initialize() on CPU."""
    torch.manual_seed(0)
    model = model or TinyModel()
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model,
                                                           model_parameters=model.parameters(),
                                                           config=config)
    return engine, optimizer, scheduler


def innermost_torch_optimizer(engine):
    """The torch.optim.Optimizer that actually updates the (master) weights.
    fp32 without ZeRO: engine.optimizer itself.  fp16 / ZeRO: wrappers keep
    the real one in .optimizer."""
    opt = engine.optimizer
    while not isinstance(opt, torch.optim.Optimizer) and hasattr(opt, "optimizer"):
        opt = opt.optimizer
    return opt


def spy_on_step(torch_opt):
    """Wrap the real optimizer's step() on this instance.  Every call records
    param_groups[0]['lr'] and the mean gradient of the first parameter at the
    moment step() runs, i.e. exactly what the update of that step uses (the
    optimizers read group['lr'] and p.grad inside step())."""
    calls = []
    original = torch_opt.step

    def step(*args, **kwargs):
        g = torch_opt.param_groups[0]
        p0 = g["params"][0]
        calls.append({
            "lr": float(g["lr"]),
            "grad_mean": None if p0.grad is None else float(p0.grad.float().mean()),
        })
        return original(*args, **kwargs)

    torch_opt.step = step
    return calls


# --------------------------------------------------------------------------
# a. Learning-rate schedules as DeepSpeed's engine applies them
# --------------------------------------------------------------------------

SCHEDULE_CASES = [
    ("WarmupLR_log", 30, {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.01, "warmup_num_steps": 10, "warmup_type": "log"}
    }),
    ("WarmupLR_linear", 30, {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.01, "warmup_num_steps": 10, "warmup_type": "linear"}
    }),
    ("WarmupLR_no_max_lr", 30, {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0.001, "warmup_num_steps": 10, "warmup_type": "linear"}
    }),
    ("WarmupLR_defaults", 30, {
        "type": "WarmupLR",
        "params": {}
    }),
    ("WarmupDecayLR_log", 30, {
        "type": "WarmupDecayLR",
        "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 5, "total_num_steps": 20}
    }),
    ("WarmupDecayLR_no_max_lr", 30, {
        "type": "WarmupDecayLR",
        "params": {"warmup_min_lr": 0, "warmup_num_steps": 5, "total_num_steps": 20, "warmup_type": "linear"}
    }),
    ("WarmupDecayLR_linear", 30, {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 5, "total_num_steps": 20,
            "warmup_type": "linear"
        }
    }),
    ("WarmupCosineLR_log", 30, {
        "type": "WarmupCosineLR",
        "params": {"total_num_steps": 20, "warmup_num_steps": 5, "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01}
    }),
    ("WarmupCosineLR_linear", 30, {
        "type": "WarmupCosineLR",
        "params": {
            "total_num_steps": 20, "warmup_num_steps": 5, "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01,
            "warmup_type": "linear"
        }
    }),
    ("WarmupCosineLR_total_eq_warmup", 12, {
        "type": "WarmupCosineLR",
        "params": {"total_num_steps": 5, "warmup_num_steps": 5, "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01}
    }),
    ("WarmupLR_warmup_num_steps_1", 5, {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.01, "warmup_num_steps": 1, "warmup_type": "linear"}
    }),
]


def run_schedule(name, K, sched_cfg, grad_accum=1):
    """fp32, AdamW lr 0.01 (DeepSpeed's default FusedAdam), one engine per case.

    How the lr "used by step k" is read: the real optimizer's step() is wrapped
    (spy_on_step) and param_groups[0]['lr'] is read inside it, right before
    the original step() runs.  The engine calls optimizer.step() first and
    lr_scheduler.step() after it (DeepSpeedEngine._take_model_step), so the
    value seen there is the one the update of step k is computed with.  We
    also record engine.get_lr() read just before engine.step() and the
    scheduler's last_batch_iteration at that point."""
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": grad_accum,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "scheduler": sched_cfg,
        "steps_per_print": 10**9,
    }
    rec = {"config": config, "K": K}
    try:
        engine, _, sched = make_engine(config)
    except Exception as e:
        rec["initialize_error"] = exc_record(e)
        return rec
    opt = innermost_torch_optimizer(engine)
    rec["scheduler_class"] = type(sched).__name__
    rec["optimizer_lr_after_initialize"] = float(opt.param_groups[0]["lr"])
    rec["scheduler_last_batch_iteration_after_initialize"] = getattr(sched, "last_batch_iteration", None)
    for attr in ("min_lrs", "max_lrs", "org_lrs", "warmup_num_steps", "total_num_steps", "warmup_type"):
        if hasattr(sched, attr):
            rec[f"scheduler.{attr}"] = js(getattr(sched, attr))
    calls = spy_on_step(opt)
    before = []
    x = torch.ones(1, 4)
    try:
        for k in range(1, K + 1):
            for micro in range(grad_accum):
                if micro == grad_accum - 1:
                    before.append({
                        "engine_get_lr": float(engine.get_lr()[0]),
                        "scheduler_last_batch_iteration": sched.last_batch_iteration,
                    })
                loss = engine(x).sum()
                engine.backward(loss)
                engine.step()
    except Exception as e:
        rec["step_error"] = dict(exc_record(e), at_optimizer_step=len(calls) + 1)
    rec["lr_used_by_step"] = [c["lr"] for c in calls]  # index 0 is step k = 1
    rec["engine_get_lr_before_step"] = [b["engine_get_lr"] for b in before]
    rec["scheduler_last_batch_iteration_before_step"] = [b["scheduler_last_batch_iteration"] for b in before]
    rec["optimizer_step_calls"] = len(calls)
    rec["engine_global_steps"] = engine.global_steps
    return rec


def record_schedules():
    out = {
        "_how": ("lr_used_by_step[k-1] = optimizer.param_groups[0]['lr'] read inside the real "
                 "optimizer's step() (wrapped on the instance) during optimizer step k; the engine "
                 "calls optimizer.step() before lr_scheduler.step(). fp32, no ZeRO, AdamW lr 0.01, "
                 "train_micro_batch_size_per_gpu 1."),
    }
    for name, K, cfg in SCHEDULE_CASES:
        out[name] = run_schedule(name, K, cfg)
    # Gradient accumulation: the scheduler advances per optimizer step, not per micro-batch.
    out["WarmupLR_linear_grad_accum_2"] = run_schedule("WarmupLR_linear_grad_accum_2", 12, SCHEDULE_CASES[1][2],
                                                       grad_accum=2)
    return out


# --------------------------------------------------------------------------
# b. fp16 dynamic loss scaling
# --------------------------------------------------------------------------

DEFAULT_OVERFLOW_STEPS = [3, 4, 10, 11, 12, 25, 40, 41]  # 1-based optimizer steps

LOSS_SCALE_CASES = [
    ("pow16_window4_hyst2", {
        "initial_scale_power": 16, "loss_scale_window": 4, "hysteresis": 2, "consecutive_hysteresis": False
    }, DEFAULT_OVERFLOW_STEPS),
    ("pow16_window4_hyst2_consecutive", {
        "initial_scale_power": 16, "loss_scale_window": 4, "hysteresis": 2, "consecutive_hysteresis": True
    }, DEFAULT_OVERFLOW_STEPS),
    # Isolated overflows two steps apart: tells consecutive_hysteresis false/true apart.
    ("pow16_window4_hyst2_isolated", {
        "initial_scale_power": 16, "loss_scale_window": 4, "hysteresis": 2, "consecutive_hysteresis": False
    }, [3, 5, 7, 20, 22]),
    ("pow16_window4_hyst2_consecutive_isolated", {
        "initial_scale_power": 16, "loss_scale_window": 4, "hysteresis": 2, "consecutive_hysteresis": True
    }, [3, 5, 7, 20, 22]),
    ("pow4_min1_window1000_hyst1_always_overflow", {
        "initial_scale_power": 4, "min_loss_scale": 1, "loss_scale_window": 1000, "hysteresis": 1
    }, list(range(1, 61))),
]
N_LOSS_SCALE_STEPS = 60


def raise_rule(steps):
    """From the recorded steps (not from DeepSpeed's formula): for every step at
    which the scale went up, how many consecutive non-overflow steps, counting
    that step, had been seen since the last overflow (or since the start)."""
    out = []
    clean = 0
    for s in steps:
        if s["overflow"]:
            clean = 0
            continue
        clean += 1
        if s["scale_after"] > s["scale_used"]:
            out.append({"step": s["step"], "clean_steps_including_this_one": clean})
    return out


def fp16_section(cfg):
    return dict({"enabled": True}, **cfg)


def record_dynamic_loss_scaler(cfg, overflow_steps):
    """DeepSpeed's DynamicLossScaler, built exactly as ZeRO stage 1/2/3 build it:
    CreateLossScaler(dtype=fp16, static_loss_scale=fp16.loss_scale,
    dynamic_scaling=True, dynamic_loss_args=DeepSpeedFP16Config(...).dynamic_loss_scale_args()).
    The ZeRO optimizers call loss_scaler.update_scale(overflow) exactly once per
    optimizer step (stage_1_and_2.py step() / stage3.py
    _loss_scale_update_and_overflow_cleanup), before applying the update; a step
    with overflow is skipped.  So per step: scale_used = cur_scale (the loss was
    multiplied by it in backward), then update_scale(overflow), then scale_after."""
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler
    from deepspeed.runtime.precision_config import DeepSpeedFP16Config
    fp16_cfg = DeepSpeedFP16Config(**fp16_section(cfg))
    args = fp16_cfg.dynamic_loss_scale_args()
    scaler = CreateLossScaler(dtype=torch.half,
                              static_loss_scale=fp16_cfg.loss_scale,
                              dynamic_scaling=True,
                              dynamic_loss_args=args)
    rec = {
        "class": f"{type(scaler).__module__}.{type(scaler).__name__}",
        "dynamic_loss_args": js(args),
        "raise_error_at_min_scale": getattr(scaler, "raise_error_at_min_scale", None),
        "steps": [],
    }
    for k in range(1, N_LOSS_SCALE_STEPS + 1):
        ovf = k in overflow_steps
        used = float(scaler.cur_scale)
        hyst_before = scaler.cur_hysteresis
        try:
            scaler.update_scale(ovf)
        except Exception as e:
            rec["raised"] = dict(exc_record(e), at_step=k, scale_used=used, hysteresis_before=hyst_before)
            break
        rec["steps"].append({
            "step": k,
            "overflow": ovf,
            "scale_used": used,
            "skipped": ovf,
            "scale_after": float(scaler.cur_scale),
            "hysteresis_before": hyst_before,
            "hysteresis_after": scaler.cur_hysteresis,
        })
    rec["raise_rule_observed"] = raise_rule(rec["steps"])
    return rec


def record_stage0_update_rule(cfg, overflow_steps):
    """Without ZeRO, fp16 uses FP16_Optimizer (FusedAdam) or FP16_UnfusedOptimizer
    (any other optimizer).  Both keep a LossScaleConfig and their own
    _update_scale(skip), which is called once per step like the ZeRO one.  We
    build the LossScaleConfig as DeepSpeedEngine._configure_fp16_optimizer does
    and call DeepSpeed's FP16_UnfusedOptimizer._update_scale on it (same code as
    FP16_Optimizer._update_scale)."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaleConfig, LossScaleProfile
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.precision_config import DeepSpeedFP16Config
    fp16_cfg = DeepSpeedFP16Config(**fp16_section(cfg))
    lsc = LossScaleConfig(low_precision_dtype=torch.float16,
                          dynamic_loss_scale=True,
                          static_loss_scale=fp16_cfg.loss_scale,
                          dynamic_loss_args=fp16_cfg.dynamic_loss_scale_args(),
                          profile=LossScaleProfile.UNFUSED)
    holder = types.SimpleNamespace(loss_scale_config=lsc, verbose=False)
    rec = {
        "note": "FP16_UnfusedOptimizer._update_scale applied to a LossScaleConfig; hysteresis is not used here",
        "same_source_as_FP16_Optimizer": (inspect.getsource(FP16_UnfusedOptimizer._update_scale).replace(
            "\n", "") == inspect.getsource(FP16_Optimizer._update_scale).replace("\n", "")),
        "steps": [],
    }
    for k in range(1, N_LOSS_SCALE_STEPS + 1):
        ovf = k in overflow_steps
        used = float(lsc.cur_scale)
        try:
            FP16_UnfusedOptimizer._update_scale(holder, ovf)
        except Exception as e:
            rec["raised"] = dict(exc_record(e), at_step=k)
            break
        rec["steps"].append({"step": k, "overflow": ovf, "scale_used": used, "skipped": ovf,
                             "scale_after": float(lsc.cur_scale)})
    rec["raise_rule_observed"] = raise_rule(rec["steps"])
    return rec


TRUE_GRAD = 2.0**-20


def record_fp16_engine(stage, cfg, overflow_steps):
    """A real fp16 engine.  DeepSpeed's CPU accelerator says fp16 is unsupported
    on CPUs without oneDNN fp16 (engine sanity check raises "Type fp16 is not
    supported on your device."), so for these runs only that one check is
    patched to True; everything else is DeepSpeed's code on CPU fp16 tensors.

    Optimizer: torch SGD lr 1 (no momentum); WarmupLR linear 0.001 -> 0.01
    over 10 steps shows how skipped steps affect the schedule.
    gradient_clipping is set to 0 (DeepSpeed's default is 1.0, which would
    rescale the gradient and hide what the loss scale does).
    The loss is sum(W x + b) * 2**-20, so the true gradient is exactly 2**-20
    for every element (a power of two, exact in fp16) and the scaled fp16
    gradient (scale <= 2**31 within 60 steps, so <= 2**11) never overflows by
    itself; an overflow is injected at step k by multiplying the loss by inf.
    grad_seen_over_true is the mean fp32 gradient handed to the real
    optimizer's step() divided by 2**-20: 1.0 means the loss scale was divided
    out exactly."""
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "SGD", "params": {"lr": 1.0}},
        "scheduler": {"type": "WarmupLR", "params": {
            "warmup_min_lr": 0.001, "warmup_max_lr": 0.01, "warmup_num_steps": 10, "warmup_type": "linear"}},
        "fp16": fp16_section(cfg),
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    rec = {"config": config, "steps": []}
    try:
        engine, opt, _ = make_engine(config)
    except Exception as e:
        rec["initialize_error"] = exc_record(e)
        return rec
    rec["optimizer_wrapper"] = type(opt).__name__
    calls = spy_on_step(innermost_torch_optimizer(engine))
    x = torch.ones(1, 4, dtype=torch.half)
    for k in range(1, N_LOSS_SCALE_STEPS + 1):
        ovf = k in overflow_steps
        used = float(opt.loss_scale)
        hyst = getattr(getattr(opt, "loss_scaler", None), "cur_hysteresis", None)
        n_calls = len(calls)
        skipped_before = engine.skipped_steps
        try:
            loss = engine(x).float().sum() * TRUE_GRAD
            if ovf:
                loss = loss * float("inf")
            engine.backward(loss)
            engine.step()
        except Exception as e:
            rec["raised"] = dict(exc_record(e), at_step=k, scale_used=used)
            break
        call = calls[-1] if len(calls) > n_calls else None
        rec["steps"].append({
            "step": k,
            "overflow": ovf,
            "scale_used": used,
            "skipped": engine.skipped_steps > skipped_before,
            "scale_after": float(opt.loss_scale),
            "hysteresis_before": hyst,
            "lr_used": None if call is None else call["lr"],
            "grad_seen_over_true": None if call is None else call["grad_mean"] / TRUE_GRAD,
        })
    rec["raise_rule_observed"] = raise_rule(rec["steps"])
    rec["engine_skipped_steps"] = engine.skipped_steps
    rec["engine_global_steps"] = engine.global_steps
    return rec


def record_loss_scaling():
    acc_cls = type(get_accelerator())
    real_fp16_check = acc_cls.is_fp16_supported
    out = {
        "_how": ("Steps are 1-based optimizer steps. scale_used: the loss scale the step's backward "
                 "used; scale_after: the scale after the step's update_scale; skipped: the optimizer "
                 "update was not applied."),
        "accelerator_reports_fp16_supported": bool(real_fp16_check(get_accelerator())),
        "cases": {},
    }
    for name, cfg, ovf in LOSS_SCALE_CASES:
        case = {"fp16_config": fp16_section(cfg), "overflow_steps": ovf}
        case["zero_DynamicLossScaler"] = record_dynamic_loss_scaler(cfg, ovf)
        case["stage0_FP16_Optimizer_update_rule"] = record_stage0_update_rule(cfg, ovf)
        acc_cls.is_fp16_supported = lambda self: True
        try:
            case["engine"] = {f"zero_stage_{s}": record_fp16_engine(s, cfg, ovf) for s in (0, 1, 2, 3)}
        finally:
            acc_cls.is_fp16_supported = real_fp16_check
        # Cross-check: do the engines follow the stand-alone update rules?
        def seq(r):
            return [(st["scale_used"], st["skipped"], st["scale_after"]) for st in r["steps"]], r.get("raised", {}).get("at_step")
        for s, r in case["engine"].items():
            ref = case["stage0_FP16_Optimizer_update_rule" if s == "zero_stage_0" else "zero_DynamicLossScaler"]
            r["matches_update_rule_above"] = seq(r) == seq(ref)
        out["cases"][name] = case
    # What the engine does with fp16 on this CPU when nothing is patched.
    try:
        make_engine({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True},
                     "optimizer": {"type": "SGD", "params": {"lr": 1.0}}})
        out["unpatched_fp16_engine_on_cpu"] = "ok"
    except Exception as e:
        out["unpatched_fp16_engine_on_cpu"] = exc_record(e)
    # DeepSpeed's own defaults for the dynamic scaler.
    from deepspeed.runtime.fp16.loss_scaler import LOSS_SCALE_PROFILE_DEFAULTS
    from deepspeed.runtime.precision_config import DeepSpeedFP16Config
    out["fp16_config_defaults"] = js(DeepSpeedFP16Config().model_dump())
    out["dynamic_loss_scale_args_for_defaults"] = js(DeepSpeedFP16Config(enabled=True).dynamic_loss_scale_args())
    out["LOSS_SCALE_PROFILE_DEFAULTS"] = {
        str(k.value): js(vars(v)) for k, v in LOSS_SCALE_PROFILE_DEFAULTS.items()
    }
    return out


# --------------------------------------------------------------------------
# b2. Non-finite gradients in fp32 and bf16
# --------------------------------------------------------------------------

NONFINITE_VARIANTS = [
    # (name, dtype, gradient_clipping, extra zero_optimization keys, extra bf16 keys)
    ("fp32", "fp32", 1.0, {}, {}),
    ("fp32_noclip", "fp32", 0.0, {}, {}),
    ("fp32_compute_grad_norm_false", "fp32", 0.0, {"compute_grad_norm": False}, {}),
    ("fp32_compute_grad_norm_false_clip", "fp32", 1.0, {"compute_grad_norm": False}, {}),
    ("bf16", "bf16", 1.0, {}, {}),
    ("bf16_noclip", "bf16", 0.0, {}, {}),
    ("bf16_check_grad_overflow_false", "bf16", 1.0, {}, {"check_grad_overflow": False}),
    ("bf16_check_grad_overflow_false_noclip", "bf16", 0.0, {}, {"check_grad_overflow": False}),
]


def record_nonfinite_engine(stage, dtype, clip, zero_extra, bf16_extra):
    """A real engine: a clean step, a step whose loss is multiplied by inf (every
    gradient inf or nan), a clean step.  Records whether DeepSpeed skipped the
    poisoned step (engine.skipped_steps) and whether the weights stayed finite."""
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "gradient_clipping": clip,
        "zero_optimization": dict({"stage": stage}, **zero_extra),
        "steps_per_print": 10**9,
    }
    if dtype == "bf16":
        config["bf16"] = dict({"enabled": True}, **bf16_extra)
    rec = {"config": config}
    try:
        engine, _, _ = make_engine(config)
    except Exception as e:
        rec["initialize_error"] = exc_record(e)
        return rec
    x = torch.ones(1, 4, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
    steps = []
    for k, poison in ((1, False), (2, True), (3, False)):
        skipped_before = engine.skipped_steps
        try:
            loss = engine(x).float().sum()
            if poison:
                loss = loss * float("inf")
            engine.backward(loss)
            engine.step()
        except Exception as e:
            rec["raised"] = dict(exc_record(e), at_step=k)
            break
        finite = all(bool(torch.isfinite(p.detach().float()).all()) for p in engine.module.parameters())
        steps.append({"step": k, "poisoned": poison, "skipped": engine.skipped_steps > skipped_before,
                      "weights_finite": finite})
    rec["steps"] = steps
    rec["optimizer_wrapper"] = type(engine.optimizer).__name__
    return rec


ONE_ELEMENT_VARIANTS = [
    # (name, dtype, gradient_clipping, extra zero_optimization keys, extra bf16 keys, poison value)
    ("bf16_check_grad_overflow_false_one_inf", "bf16", 1.0, {}, {"check_grad_overflow": False}, "inf"),
    ("bf16_check_grad_overflow_false_one_nan", "bf16", 1.0, {}, {"check_grad_overflow": False}, "nan"),
    ("bf16_check_grad_overflow_false_noclip_one_inf", "bf16", 0.0, {}, {"check_grad_overflow": False}, "inf"),
    ("fp32_compute_grad_norm_false_one_inf", "fp32", 0.0, {"compute_grad_norm": False}, {}, "inf"),
]


def record_one_element_engine(stage, dtype, clip, zero_extra, bf16_extra, poison):
    """SGD lr 0.01 (no momentum), so a weight moves by exactly lr x the gradient it was given: one step whose
    gradient is 1.0 everywhere except lin.weight[0, 0], which a tensor hook sets to `poison` (inf or nan).
    Records, for the finite elements, whether they moved, and the clip factor they were given ((before - after)
    / lr, the same for all of them), and whether the poisoned weight is finite."""
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
        "gradient_clipping": clip,
        "zero_optimization": dict({"stage": stage}, **zero_extra),
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    if dtype == "bf16":
        config["bf16"] = dict({"enabled": True}, **bf16_extra)
    rec = {"config": config, "poison": poison}
    model = TinyModel()
    bad = float(poison)

    def hook(g):
        g = g.clone()
        g[0, 0] = bad
        return g

    model.lin.weight.register_hook(hook)
    try:
        engine, _, _ = make_engine(config, model)
    except Exception as e:
        rec["initialize_error"] = exc_record(e)
        return rec
    x = torch.ones(1, 4, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
    before = engine.module.lin.weight.detach().float().clone()
    skipped_before = engine.skipped_steps
    try:
        engine.backward(engine(x).float().sum())
        engine.step()
    except Exception as e:
        rec["raised"] = exc_record(e)
        return rec
    after = engine.module.lin.weight.detach().float()
    moved = (before - after).flatten()[1:]
    rec["skipped"] = engine.skipped_steps > skipped_before
    rec["poisoned_weight_finite"] = bool(torch.isfinite(after[0, 0]))
    rec["finite_weights_moved"] = bool((moved != 0).any())
    rec["finite_weights_finite"] = bool(torch.isfinite(after.flatten()[1:]).all())
    return rec


def record_nonfinite_steps():
    out = {"_how": ("Stage s, variant v: a clean step, a step with loss x inf, a clean step. skipped: "
                    "engine.skipped_steps grew; weights_finite: every module weight finite after the step. "
                    "one_element: one step in which a single gradient element is inf or nan (SGD)."),
           "cases": {}, "one_element": {}}
    for name, dtype, clip, zero_extra, bf16_extra in NONFINITE_VARIANTS:
        out["cases"][name] = {f"zero_stage_{s}": record_nonfinite_engine(s, dtype, clip, zero_extra, bf16_extra)
                              for s in (0, 1, 2, 3)}
    for name, dtype, clip, zero_extra, bf16_extra, poison in ONE_ELEMENT_VARIANTS:
        out["one_element"][name] = {
            f"zero_stage_{s}": record_one_element_engine(s, dtype, clip, zero_extra, bf16_extra, poison)
            for s in (1, 2)}
    return out


# --------------------------------------------------------------------------
# c. Optimizer defaults
# --------------------------------------------------------------------------

OPTIMIZER_CASES = [
    {"type": "AdamW", "params": {"lr": 0.01}},
    {"type": "Adam", "params": {"lr": 0.01}},
    {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
    {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
    {"type": "Adam", "params": {"lr": 0.01, "adam_w_mode": False}},
    {"type": "Adam", "params": {"lr": 0.01, "adam_w_mode": False, "torch_adam": True}},
    {"type": "AdamW", "params": {"lr": 0.01, "adam_w_mode": False}},
    {"type": "Lion"},
    {"type": "Lion", "params": {}},
    {"type": "Adagrad", "params": {"lr": 0.01}},
    {"type": "SGD", "params": {"lr": 0.01}},
    {"type": "adamw", "params": {"lr": 0.01}},
]

# The same optimizer types with ZeRO-Offload (optimizer on the CPU): DeepSpeed
# then builds its own CPU optimizers (DeepSpeedCPUAdam / CPULion / CPUAdagrad),
# which is also the only way Lion runs on a CPU.  JIT-compiles cpu_adam,
# cpu_lion and cpu_adagrad on the first run.
OFFLOAD_ZERO = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
OFFLOAD_OPTIMIZER_CASES = [
    {"type": "AdamW", "params": {"lr": 0.01}},
    {"type": "Adam", "params": {"lr": 0.01}},
    {"type": "Adam", "params": {"lr": 0.01, "adam_w_mode": False}},
    {"type": "Lion"},
    {"type": "Lion", "params": {}},
    {"type": "Adagrad", "params": {"lr": 0.01}},
]

OPT_ATTRS = ("adam_w_mode", "adamw_mode", "bias_correction", "set_grad_none", "fp32_optimizer_states")


def record_optimizers():
    out = {
        "_how": ("deepspeed.initialize on CPU, fp32; 'cases' without ZeRO, 'offload_cases' with "
                 f"zero_optimization {json.dumps(OFFLOAD_ZERO)}; param_groups[0] without 'params'."),
        "cases": [],
        "offload_cases": [],
    }
    todo = [("cases", c, None) for c in OPTIMIZER_CASES] + [("offload_cases", c, OFFLOAD_ZERO)
                                                            for c in OFFLOAD_OPTIMIZER_CASES]
    for bucket, opt_cfg, zero in todo:
        config = {"train_micro_batch_size_per_gpu": 1, "optimizer": opt_cfg, "steps_per_print": 10**9}
        if zero:
            config["zero_optimization"] = zero
        rec = {"optimizer_config": opt_cfg}
        try:
            engine, _, _ = make_engine(config)
            opt = innermost_torch_optimizer(engine)
            rec["class"] = f"{type(opt).__module__}.{type(opt).__name__}"
            rec["param_group_0"] = {k: js(v) for k, v in sorted(opt.param_groups[0].items()) if k != "params"}
            rec["defaults"] = {k: js(v) for k, v in sorted(getattr(opt, "defaults", {}).items())}
            rec["attributes"] = {a: js(getattr(opt, a)) for a in OPT_ATTRS if hasattr(opt, a)}
            # torch.optim.Adam(W): decoupled_weight_decay says whether decay is AdamW-style.
            if "decoupled_weight_decay" in opt.param_groups[0]:
                rec["decoupled_weight_decay"] = bool(opt.param_groups[0]["decoupled_weight_decay"])
        except Exception as e:
            rec["error"] = exc_record(e)
        out[bucket].append(rec)

    # DeepSpeed's default gradient_clipping (GRADIENT_CLIPPING_DEFAULT) is
    # applied when the config does not set it.  Show its effect: fp32, no ZeRO,
    # SGD lr 1; TinyModel's true gradient is 1.0 in each of its 20 elements
    # (global norm sqrt(20)); grad_mean_seen is the mean gradient the optimizer
    # received in step 1.
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT
    clip = {"GRADIENT_CLIPPING_DEFAULT": GRADIENT_CLIPPING_DEFAULT, "true_grad": 1.0,
            "true_global_norm": math.sqrt(20)}
    for label, extra in (("not_set", {}), ("set_0", {"gradient_clipping": 0.0}), ("set_1", {"gradient_clipping": 1.0})):
        config = dict({"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**9,
                       "optimizer": {"type": "SGD", "params": {"lr": 1.0}}}, **extra)
        engine, _, _ = make_engine(config)
        calls = spy_on_step(innermost_torch_optimizer(engine))
        engine.backward(engine(torch.ones(1, 4)).sum())
        engine.step()
        clip[label] = {"config_gradient_clipping": engine.gradient_clipping(), "grad_mean_seen": calls[0]["grad_mean"]}
    out["gradient_clipping_default_effect"] = clip
    return out


# --------------------------------------------------------------------------
# d. Every config key DeepSpeed knows
# --------------------------------------------------------------------------

_MISSING = object()


class KeyProbe(dict):
    """A dict that logs every key DeepSpeed's config code looks up in it
    (get, [], in, keys()), with the default passed to get().  Dict values and
    dict defaults are wrapped too, so lookups inside old-style (non-pydantic)
    sections are logged with a dotted path."""

    def __init__(self, data, path, log):
        super().__init__(data)
        self._path = path
        self._log = log

    def _note(self, key, how, default=_MISSING):
        entry = self._log.setdefault(self._path, {}).setdefault(str(key), {"how": set()})
        entry["how"].add(how)
        if default is not _MISSING and "default" not in entry:
            entry["default"] = js(default)

    def _wrap(self, key, v):
        if type(v) is dict:
            return KeyProbe(v, f"{self._path}.{key}" if self._path else str(key), self._log)
        return v

    def get(self, key, default=None):
        self._note(key, "get", default)
        v = dict.get(self, key, _MISSING)
        return self._wrap(key, default if v is _MISSING else v)

    def __getitem__(self, key):
        self._note(key, "getitem")
        return self._wrap(key, dict.__getitem__(self, key))

    def __contains__(self, key):
        self._note(key, "in")
        return dict.__contains__(self, key)

    def keys(self):
        probe = self

        class _Keys:

            def __contains__(self, key):
                probe._note(key, "in")
                return dict.__contains__(probe, key)

            def __iter__(self):
                return iter(dict.keys(probe))

            def __len__(self):
                return dict.__len__(probe)

        return _Keys()


def probe_config(cfg):
    """Build a DeepSpeedConfig from a KeyProbe; return (log, error)."""
    from deepspeed.runtime.config import DeepSpeedConfig
    log = {}
    err = None
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            DeepSpeedConfig(KeyProbe(cfg, "", log))
    except Exception as e:
        err = exc_record(e)
    return log, err


def all_config_models():
    """Every subclass of DeepSpeed's pydantic base, DeepSpeedConfigModel."""
    import importlib
    # Importing these defines the section models (subclasses register themselves).
    for mod in ("deepspeed.runtime.config", "deepspeed.runtime.engine", "deepspeed.inference.config",
                "deepspeed.runtime.zenflow.zenflow_config", "deepspeed.module_inject.auto_ep_config",
                "deepspeed.runtime.tensor_parallel.config"):
        with contextlib.suppress(Exception):
            importlib.import_module(mod)
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel
    seen = {}
    stack = [DeepSpeedConfigModel]
    while stack:
        c = stack.pop()
        for s in c.__subclasses__():
            if s not in seen.values():
                seen[f"{s.__module__}.{s.__qualname__}"] = s
                stack.append(s)
    return seen


def _nested_models(annotation):
    """DeepSpeedConfigModel classes mentioned in a field annotation."""
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel
    found = []
    stack = [annotation]
    while stack:
        a = stack.pop()
        if isinstance(a, type) and issubclass(a, DeepSpeedConfigModel):
            found.append(f"{a.__module__}.{a.__qualname__}")
        stack.extend(getattr(a, "__args__", ()) or ())
    return sorted(set(found))


def describe_model(cls):
    """Field names, aliases, defaults and deprecations of one pydantic model."""
    fields = {}
    for name, f in cls.model_fields.items():
        d = {"annotation": str(f.annotation).replace("typing.", "")}
        if f.alias and f.alias != name:
            d["alias"] = f.alias
        if f.validation_alias and f.validation_alias != f.alias:
            d["validation_alias"] = js(f.validation_alias)
        if f.is_required():
            d["required"] = True
        else:
            try:
                d["default"] = js(f.get_default(call_default_factory=True))
            except Exception as e:
                d["default_error"] = exc_record(e)
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        if extra.get("deprecated"):
            d["deprecated"] = {k: js(v) for k, v in extra.items()}
        nested = _nested_models(f.annotation)
        if nested:
            d["model"] = nested
        fields[name] = d
    cfg = getattr(cls, "model_config", {})
    return {
        "extra": cfg.get("extra"),
        "populate_by_name": cfg.get("populate_by_name"),
        "fields": dict(sorted(fields.items())),
        "accepted_keys": sorted(set(fields) | {d["alias"]
                                               for d in fields.values() if "alias" in d}),
    }


def constants_of(module_name):
    """UPPER_CASE string constants of a DeepSpeed constants module, paired with
    their NAME_DEFAULT companion when there is one."""
    mod = __import__(module_name, fromlist=["_"])
    out = {}
    for name in sorted(dir(mod)):
        if not name.isupper() or name.endswith("_DEFAULT") or name.startswith("_"):
            continue
        v = getattr(mod, name)
        if not isinstance(v, str) or "\n" in v:
            continue
        d = {"key": v}
        if hasattr(mod, name + "_DEFAULT"):
            d["default"] = js(getattr(mod, name + "_DEFAULT"))
        out[name] = d
    return out


def ctor_params(cls):
    """Constructor keyword parameters and their defaults (inspect.signature)."""
    try:
        sig = inspect.signature(cls.__init__)
    except (TypeError, ValueError) as e:
        return {"error": exc_record(e)}
    out = {}
    for p in list(sig.parameters.values())[1:]:
        if p.name in ("params", "optimizer") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        out[p.name] = "<required>" if p.default is inspect.Parameter.empty else js(p.default)
    return out


def record_config_keys():
    from deepspeed.runtime import config as rc
    from deepspeed.runtime import lr_schedules
    from deepspeed.runtime.precision_config import BFLOAT16, BFLOAT16_OLD
    from pydantic import ValidationError

    out = {}

    # 1. Top level: keys looked up while building a DeepSpeedConfig.
    base = {"train_micro_batch_size_per_gpu": 1}
    log, err = probe_config(base)
    assert err is None, err
    top = {k: v for k, v in log.get("", {}).items()}
    # Second pass: give each discovered key an empty section {} so that the
    # lookups inside it are logged too; classify the section by passing one
    # unknown key (pydantic models forbid extras and name themselves).
    from deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError
    models = all_config_models()
    by_short = {}
    for name, cls in models.items():
        by_short.setdefault(cls.__name__, name)

    def model_from_validation_error(ve):
        """ValidationError.title names the model that was validated; its loc
        leads to the nested model that rejected the unknown key."""
        full = by_short.get(ve.title)
        if not full:
            return ve.title
        cls = models[full]
        for part in ve.errors()[0]["loc"][:-1]:
            f = cls.model_fields.get(part)
            nested = _nested_models(f.annotation) if f is not None else []
            if not nested:
                break
            cls = models[nested[0]]
        return cls.__name__

    # Seeds for sections whose inner lookups only happen when some key is set.
    seeds = {
        "optimizer": {"type": "Adam", "params": {}},
        "scheduler": {"type": "WarmupLR", "params": {}},
    }
    sections = {}
    for key in sorted(top):
        if key in base:
            continue
        sec = {}
        log2, err2 = probe_config(dict(base, **{key: seeds.get(key, {})}))
        if err2 is None:
            for path, keys in log2.items():
                if path == key or path.startswith(key + "."):
                    sec.setdefault("keys_looked_up", {})[path] = {
                        k: dict(v, how=sorted(v["how"])) for k, v in sorted(keys.items())
                    }
        elif err2["type"] == DeepSpeedConfigError.__name__:
            sec["rejected"] = err2  # a removed feature: any value is an error
            sections[key] = sec
            continue
        else:
            continue  # a scalar key: a dict there is simply a type error
        try:
            DeepSpeedConfig(dict(base, **{key: {"__no_such_key__": 1}}))
            sec["unknown_key_in_section"] = "ignored"
        except ValidationError as ve:
            sec["unknown_key_in_section"] = "rejected (pydantic extra=forbid)"
            sec["pydantic_model"] = model_from_validation_error(ve)
        except Exception as e:
            sec["unknown_key_in_section"] = exc_record(e)
        # A key whose {} value caused no lookup and no model is a scalar (or an
        # opaque value): not a section.
        if sec.get("keys_looked_up") or "pydantic_model" in sec:
            sections[key] = sec
    out["top"] = {
        "_how": ("keys DeepSpeedConfig looks up at the top level of a config containing only "
                 "train_micro_batch_size_per_gpu; default = what its code passes to dict.get()"),
        "keys": {k: dict(v, how=sorted(v["how"])) for k, v in sorted(top.items())},
        "sorted": sorted(top),
    }
    out["sections_probed"] = sections

    # Unknown keys: top level vs. pydantic sections.
    _, e_top = probe_config(dict(base, __no_such_top_level_key__=1))
    _, e_zero = probe_config(dict(base, zero_optimization={"__no_such_key__": 1}))
    out["strictness"] = {
        "unknown_top_level_key": "ignored" if e_top is None else e_top,
        "unknown_zero_optimization_key": "ignored" if e_zero is None else e_zero,
        "pydantic_drops_value_auto": ("DeepSpeedConfigModel.__init__ (strict=False) drops every "
                                      "key whose value is the string 'auto' before validation"),
    }
    # Removed keys DeepSpeed rejects.
    out["removed_keys"] = {
        "top": {k: v for k, v in sorted(getattr(rc, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {}).items())},
        "zero_optimization": {k: v for k, v in sorted(getattr(rc, "_REMOVED_ZERO_CONFIG_KEYS", {}).items())},
    }
    # Legacy spellings.
    legacy = {"top_level_aliases": {BFLOAT16_OLD: BFLOAT16}}
    c = DeepSpeedConfig(dict(base, bfloat16={"enabled": True}))
    legacy["bfloat16_enabled_gives_bf16_enabled"] = c.bfloat16_config.enabled
    c = DeepSpeedConfig(dict(base, zero_optimization=True))
    legacy["zero_optimization_true_gives_stage"] = c.zero_config.stage
    c = DeepSpeedConfig(dict(base, zero_optimization=False))
    legacy["zero_optimization_false_gives_stage"] = c.zero_config.stage
    out["legacy"] = legacy

    # 2. Pydantic models, all of them, plus the well-known sections by name.
    out["pydantic_models"] = {name: describe_model(cls) for name, cls in sorted(models.items())}
    named = {
        "zero_optimization": "DeepSpeedZeroConfig",
        "offload_param": "DeepSpeedZeroOffloadParamConfig",
        "offload_optimizer": "DeepSpeedZeroOffloadOptimizerConfig",
        "fp16": "DeepSpeedFP16Config",
        "bf16": "DeepSpeedBF16Config",
    }
    for key, sec in sections.items():
        if "pydantic_model" in sec:
            named.setdefault(key, sec["pydantic_model"])
    out["sections"] = {}
    for key, short in sorted(named.items()):
        full = by_short.get(short)
        if full:
            out["sections"][key] = dict(model=full, **describe_model(models[full]))
    # Old-style sections: the keys looked up inside them (from the probe).
    for key, sec in sorted(sections.items()):
        if "keys_looked_up" in sec and key not in out["sections"]:
            inner = sec["keys_looked_up"].get(key, {})
            out["sections"][key] = {
                "model": None,
                "keys": inner,
                "accepted_keys": sorted(inner),
                "unknown_key_in_section": sec.get("unknown_key_in_section"),
            }
    # "pipeline" is merged item by item into a dict of defaults (no lookups to
    # probe); record the resulting defaults.
    out["sections"]["pipeline"] = {
        "model": None,
        "resulting_defaults": js(DeepSpeedConfig(dict(base)).pipeline),
        "note": "get_pipeline_config() starts from these defaults and overlays the user's keys",
    }

    # 3. Constants modules (names of keys and their _DEFAULT values).
    out["constants"] = {}
    for m in ("deepspeed.runtime.constants", "deepspeed.runtime.activation_checkpointing.config",
              "deepspeed.runtime.swap_tensor.constants", "deepspeed.profiling.constants",
              "deepspeed.runtime.zero.offload_config", "deepspeed.runtime.model_checkpointing.constants",
              "deepspeed.runtime.data_pipeline.constants", "deepspeed.autotuning.constants"):
        try:
            out["constants"][m] = constants_of(m)
        except Exception as e:
            out["constants"][m] = {"error": exc_record(e)}

    # 4. optimizer.params: what the engine itself pops, and constructor params
    #    of each class it may build for a given "type".
    from deepspeed.ops.adam import FusedAdam, DeepSpeedCPUAdam
    from deepspeed.ops.lion import FusedLion, DeepSpeedCPULion
    from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
    from deepspeed.ops.lamb import FusedLamb
    out["optimizer.params"] = {
        "_engine_keys": {
            "torch_adam": {"for": ["Adam", "AdamW"], "default": False,
                           "meaning": "use torch.optim.Adam/AdamW instead of FusedAdam/DeepSpeedCPUAdam"},
            "adam_w_mode": {"for": ["Adam", "AdamW"], "default": rc.ADAM_W_MODE_DEFAULT,
                            "meaning": "type Adam: AdamW-style decay unless false; type AdamW: always AdamW"},
            "fp32_optimizer_states": {"for": ["Adam", "AdamW"], "meaning": "DeepSpeedCPUAdam only"},
            "foreach": {"for": ["Adam", "AdamW"], "meaning": "passed to torch.optim when torch_adam"},
            "max_grad_norm": {"rejected": "ValueError: use top-level gradient_clipping"},
        },
        "_known_types_lowercased": sorted(rc.DEEPSPEED_OPTIMIZERS),
        "_other_types": "any other name is looked up as torch.optim.<type> (case-sensitive)",
        "Adam/AdamW -> FusedAdam": ctor_params(FusedAdam),
        "Adam/AdamW offload -> DeepSpeedCPUAdam": ctor_params(DeepSpeedCPUAdam),
        "Adam torch_adam -> torch.optim.Adam": ctor_params(torch.optim.Adam),
        "AdamW torch_adam -> torch.optim.AdamW": ctor_params(torch.optim.AdamW),
        "Lion -> FusedLion": ctor_params(FusedLion),
        "Lion offload -> DeepSpeedCPULion": ctor_params(DeepSpeedCPULion),
        "Adagrad -> torch.optim.Adagrad": ctor_params(torch.optim.Adagrad),
        "Adagrad offload -> DeepSpeedCPUAdagrad": ctor_params(DeepSpeedCPUAdagrad),
        "Lamb -> FusedLamb": ctor_params(FusedLamb),
        "SGD -> torch.optim.SGD": ctor_params(torch.optim.SGD),
    }
    # 5. scheduler.params: constructor params of each DeepSpeed schedule.
    out["scheduler.params"] = {
        name: ctor_params(getattr(lr_schedules, name)) for name in lr_schedules.VALID_LR_SCHEDULES
    }
    out["scheduler.params"]["_other_types"] = "any other name is looked up as torch.optim.lr_scheduler.<type>"
    return out


# --------------------------------------------------------------------------


def to_json(v, indent=0):
    """JSON text with one level of nesting per line, but every object or array
    that holds no other object or array written on a single line (keeps the
    per-step records readable and the file small).  Key order is kept."""
    def is_leaf(x):
        items = x.values() if isinstance(x, dict) else x
        return not any(isinstance(i, (dict, list)) for i in items)

    pad = " " * (indent + 1)
    if isinstance(v, dict) and v and not is_leaf(v):
        body = ",\n".join(f"{pad}{json.dumps(k)}: {to_json(x, indent + 1)}" for k, x in v.items())
        return "{\n" + body + "\n" + " " * indent + "}"
    if isinstance(v, list) and v and not is_leaf(v):
        body = ",\n".join(pad + to_json(x, indent + 1) for x in v)
        return "[\n" + body + "\n" + " " * indent + "]"
    return json.dumps(v)


# DeepSpeed's model-state memory estimators (deepspeed.runtime.zero.stage_1_and_2 and .stage3), called as a user
# would call them before choosing a stage: bytes per GPU and per node's CPU, with and without ZeRO-Offload.  The
# cases are P params in layers of L = P / 8, on N = 8 GPUs in one node, 6 in two nodes and 3 in one, with L a
# multiple of 16 x N so that libzero's padding adds nothing and the two estimates can be compared byte for byte.
MEMORY_ESTIMATE_CASES = [
    {"total_params": 25165824, "largest_layer_params": 3145728, "num_gpus_per_node": 8, "num_nodes": 1},
    {"total_params": 25165824, "largest_layer_params": 3145728, "num_gpus_per_node": 3, "num_nodes": 2},
    {"total_params": 25165824, "largest_layer_params": 3145728, "num_gpus_per_node": 3, "num_nodes": 1},
]


def record_memory_estimates():
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    cases = []
    for case in MEMORY_ESTIMATE_CASES:
        per_gpu = {"num_gpus_per_node": case["num_gpus_per_node"], "num_nodes": case["num_nodes"]}
        out = dict(case)
        for cpu_offload in (False, True):
            cpu, gpu = estimate_zero2_model_states_mem_needs(case["total_params"], cpu_offload=cpu_offload,
                                                             **per_gpu)
            out[f"zero2_offload_{str(cpu_offload).lower()}"] = {"cpu_mem": cpu, "gpu_mem": gpu}
        for cpu_offload, cpu_offload_params in ((False, False), (True, False), (True, True)):
            cpu, gpu, largest = estimate_zero3_model_states_mem_needs(
                case["total_params"], case["largest_layer_params"], cpu_offload=cpu_offload,
                cpu_offload_params=cpu_offload_params, zero_init=True, **per_gpu)
            key = "zero3_" + ("offload_both" if cpu_offload_params else "offload_optimizer" if cpu_offload
                              else "no_offload")
            out[key] = {"cpu_mem": cpu, "gpu_mem": gpu, "largest_layer_memory": largest}
        cases.append(out)
    return {"_how": "estimate_zero2_model_states_mem_needs / estimate_zero3_model_states_mem_needs (zero_init=True, "
                    "additional_buffer_factor=1.5, their defaults) for each case",
            "cases": cases}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where to write the JSON fixtures")
    ap.add_argument("--only", choices=["lr_schedules", "loss_scaling", "nonfinite_steps", "optimizers",
                                       "config_keys", "memory_estimates"],
                    action="append", help="record only these parts (default: all); the other parts of an "
                                          "existing --out file are kept")
    args = ap.parse_args()

    quiet_deepspeed_logs()
    init_single_process_dist()
    quiet_deepspeed_logs()
    torch.manual_seed(0)

    parts = {
        "lr_schedules": record_schedules,
        "loss_scaling": record_loss_scaling,
        "nonfinite_steps": record_nonfinite_steps,
        "optimizers": record_optimizers,
        "config_keys": record_config_keys,
        "memory_estimates": record_memory_estimates,
    }
    result = {
        "generator": "tests/deepspeed/make_fixtures.py",
        "versions": {
            "deepspeed": deepspeed.__version__,
            "torch": torch.__version__.split("+")[0],
            "python": ".".join(map(str, sys.version_info[:3])),
        },
        "accelerator": get_accelerator()._name,
        "world_size": dist.get_world_size(),
    }
    if args.only and os.path.exists(args.out):
        with open(args.out) as f:
            kept = json.load(f)
        result = dict(kept, **result)
    for name, fn in parts.items():
        if args.only and name not in args.only:
            continue
        print(f"[make_fixtures] recording {name} ...", file=sys.stderr, flush=True)
        result[name] = fn()
        quiet_deepspeed_logs()
    # Shut the gloo group down before exit (avoids a noisy abort message).
    with contextlib.suppress(Exception):
        torch.distributed.destroy_process_group()
    with open(args.out, "w") as f:
        f.write(to_json(result))
        f.write("\n")
    print(f"[make_fixtures] wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
