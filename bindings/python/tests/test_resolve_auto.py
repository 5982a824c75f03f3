"""libzero.config.resolve_auto against transformers' own resolution of "auto" for DeepSpeed (HfTrainerDeepSpeedConfig,
which needs DeepSpeed and accelerate installed): the same config out of the same TrainingArguments and model, and
the same mismatch errors. One process."""

from __future__ import annotations

import copy
import json

import pytest

import libzero
import libzero.config

transformers = pytest.importorskip("transformers")
pytest.importorskip("deepspeed")
pytest.importorskip("accelerate")
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig  # noqa: E402

ZERO2 = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                      "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": "auto",
                          "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}
ZERO3 = copy.deepcopy(ZERO2)
ZERO3["zero_optimization"] = {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                              "stage3_param_persistence_threshold": "auto", "stage3_gather_16bit_weights_on_model_save":
                              True}


def args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=3, gradient_accumulation_steps=4,
                learning_rate=2e-4, weight_decay=0.05, adam_beta1=0.85, adam_beta2=0.97, adam_epsilon=1e-7,
                max_grad_norm=0.5, warmup_steps=7, bf16=True, use_cpu=True, report_to=[])
    base.update(kw)
    return transformers.TrainingArguments(**base)


def model(hidden: int = 48):
    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=96, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    return transformers.LlamaForCausalLM(cfg)


def hf_resolved(config: dict, a, m, steps: int) -> dict:
    hf = HfTrainerDeepSpeedConfig(copy.deepcopy(config))
    hf.trainer_config_process(a)
    hf.trainer_config_finalize(a, m, steps)
    return hf.config


@pytest.mark.parametrize("name,config", [("zero2", ZERO2), ("zero3", ZERO3)])
def test_the_values_transformers_gives_deepspeed(tmp_path, name, config):
    a, m = args(tmp_path), model()
    expected = hf_resolved(config, a, m, 120)
    got = libzero.config.resolve_auto(config, a, m, 120)
    assert got == expected, name
    assert "auto" not in json.dumps(got)
    libzero.config_check(got, world_size=a.world_size)  # libzero takes it as it is
    assert config["optimizer"]["params"]["lr"] == "auto"  # the caller's config is left alone


def test_stage_3_keys_below_stage_3_go_where_transformers_leaves_them_auto(tmp_path):
    config = copy.deepcopy(ZERO3)
    config["zero_optimization"]["stage"] = 2
    a, m = args(tmp_path), model()
    expected = hf_resolved(config, a, m, 120)
    assert expected["zero_optimization"]["stage3_prefetch_bucket_size"] == "auto"
    for key in ("stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"):
        del expected["zero_optimization"][key]
    assert libzero.config.resolve_auto(config, a, m, 120) == expected


def test_a_ratio_of_warmup_and_fp16(tmp_path):
    a, m = args(tmp_path, warmup_steps=0.1, bf16=False, fp16=False), model(64)
    assert libzero.config.resolve_auto(ZERO3, a, m, 55) == hf_resolved(ZERO3, a, m, 55)


def test_set_values_that_differ_from_the_arguments_fail_as_in_transformers(tmp_path):
    config = copy.deepcopy(ZERO2)
    config["gradient_accumulation_steps"] = 2
    config["optimizer"]["params"]["lr"] = 1e-3
    a, m = args(tmp_path), model()
    with pytest.raises(ValueError) as ours:
        libzero.config.resolve_auto(config, a, m, 120)
    with pytest.raises(ValueError) as theirs:
        hf_resolved(config, a, m, 120)
    assert str(ours.value) == str(theirs.value)
    assert "ds gradient_accumulation_steps=2 vs hf gradient_accumulation_steps=4" in str(ours.value)


def test_what_cannot_be_resolved_is_named(tmp_path):
    with pytest.raises(ValueError, match="still \"auto\": scheduler.params.total_num_steps"):
        libzero.config.resolve_auto(ZERO2, args(tmp_path), model())
    with pytest.raises(ValueError, match="zero_optimization.reduce_bucket_size"):
        libzero.config.resolve_auto(ZERO2, args(tmp_path), None, 10)


def test_the_engine_s_auto_error_names_the_resolver():
    with pytest.raises(libzero.ConfigError, match=r"libzero.config.resolve_auto"):
        libzero.Engine({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})
