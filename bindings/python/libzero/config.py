"""DeepSpeed configs written for the Hugging Face Trainer: their ``"auto"`` values resolved from the training arguments
and the model, as transformers resolves them before it hands a config to DeepSpeed (the same values, the same
mismatch errors), so the config that ran under DeepSpeed runs under libzero unchanged.

    cfg = libzero.config.resolve_auto("ds_config.json", training_args, model, num_training_steps)

``training_args`` is a ``transformers.TrainingArguments`` or anything with its attribute names (below)."""

from __future__ import annotations

import copy
import json
from typing import Any

from .engine import ConfigLike, config_text

# The keys whose "auto" comes from the model's hidden size (what DeepSpeed's docs and transformers derive).
_HIDDEN_SIZE_KEYS = (
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)


class _Resolver:
    """One config being resolved: "auto" replaced, other values checked against the arguments."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.mismatches: list[str] = []

    def _node(self, key: str) -> tuple[dict[str, Any] | None, str]:
        *path, leaf = key.split(".")
        node: Any = self.config
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return None, leaf
        return (node if isinstance(node, dict) else None), leaf

    def value(self, key: str) -> Any:
        node, leaf = self._node(key)
        return None if node is None else node.get(leaf)

    def is_auto(self, key: str) -> bool:
        return self.value(key) == "auto"

    def fill(self, key: str, value: Any, argument: str | None = None, must_match: bool = True) -> None:
        """``key``'s "auto" becomes ``value``; any other value set there must equal it (when ``must_match``)."""
        node, leaf = self._node(key)
        if node is None:
            return
        if node.get(leaf) == "auto":
            node[leaf] = value
        elif must_match and node.get(leaf) is not None and node.get(leaf) != value:
            self.mismatches.append(f"- ds {key}={node.get(leaf)} vs hf {argument}={value}")


def _hidden_size(model: Any) -> int | None:
    config = getattr(model, "config", None)
    for source in (config, getattr(config, "text_config", None)):
        if source is None:
            continue
        if getattr(source, "hidden_size", None) is not None:
            return int(source.hidden_size)
        if getattr(source, "hidden_sizes", None):
            return int(max(source.hidden_sizes))
    return None


def _warmup_steps(args: Any, num_training_steps: int) -> int:
    if hasattr(args, "get_warmup_steps"):
        return int(args.get_warmup_steps(num_training_steps))
    steps = getattr(args, "warmup_steps", 0) or 0
    ratio = getattr(args, "warmup_ratio", 0.0) or 0.0
    return int(steps) if steps > 0 else int(-(-num_training_steps * ratio // 1))


def resolve_auto(
    config: ConfigLike,
    args: Any,
    model: Any = None,
    num_training_steps: int | None = None,
    auto_find_batch_size: bool = False,
    require_all: bool = True,
) -> dict[str, Any]:
    """The DeepSpeed ``config`` (dict, JSON text or path; not modified) with its ``"auto"`` values resolved from the
    training arguments ``args``: batch sizes (``per_device_train_batch_size``, ``gradient_accumulation_steps``,
    ``world_size``), ``gradient_clipping`` (``max_grad_norm``), the optimizer's ``lr``, ``betas``, ``eps``,
    ``weight_decay``, the scheduler's warmup bounds, ``fp16``/``bf16``; with ``model`` the bucket and persistence
    sizes from its ``config.hidden_size``; with ``num_training_steps`` the scheduler's total and warmup steps.
    A value that is set (not "auto") and differs from the arguments is a ValueError listing every such key, with
    transformers' wording; so is an "auto" left unresolved (a hidden-size key without a model that has one, a
    scheduler step count without ``num_training_steps``; stage-3 keys that transformers leaves "auto" below stage 3,
    where DeepSpeed ignores them, are removed), unless ``require_all`` is False: then those stay "auto" for
    a later call that has the model and the step count."""
    resolver = _Resolver(copy.deepcopy(json.loads(config_text(config))))
    fill = resolver.fill
    world = int(getattr(args, "world_size", 1) or 1)
    micro = args.per_device_train_batch_size
    gas = args.gradient_accumulation_steps
    fill("train_micro_batch_size_per_gpu", micro, "per_device_train_batch_size", not auto_find_batch_size)
    fill("gradient_accumulation_steps", gas, "gradient_accumulation_steps")
    fill("train_batch_size", world * micro * gas, "train_batch_size (calculated)", not auto_find_batch_size)
    fill("gradient_clipping", args.max_grad_norm, "max_grad_norm")
    fill("optimizer.params.lr", args.learning_rate, "learning_rate")
    fill("optimizer.params.betas", [args.adam_beta1, args.adam_beta2], "adam_beta1+adam_beta2")
    fill("optimizer.params.eps", args.adam_epsilon, "adam_epsilon")
    fill("optimizer.params.weight_decay", args.weight_decay, "weight_decay")
    fill("scheduler.params.warmup_min_lr", 0, must_match=False)
    fill("scheduler.params.warmup_max_lr", args.learning_rate, "learning_rate")
    fp16 = bool(getattr(args, "fp16", False) or getattr(args, "fp16_full_eval", False))
    bf16 = bool(getattr(args, "bf16", False) or getattr(args, "bf16_full_eval", False))
    fill("fp16.enabled", fp16, "fp16|fp16_full_eval")
    fill("bf16.enabled", bf16, "bf16|bf16_full_eval")

    hidden_keys = [k for k in _HIDDEN_SIZE_KEYS if resolver.is_auto(k)]
    if hidden_keys and model is not None:
        hidden = _hidden_size(model)
        if hidden is None:
            raise ValueError(
                "The model's config file has neither `hidden_size` nor `hidden_sizes` entry, therefore it's not "
                f"possible to automatically fill out the following `auto` entries in the DeepSpeed config file: "
                f"{hidden_keys}. You can fix that by replacing `auto` values for these keys with an integer value of "
                "your choice."
            )
        fill("zero_optimization.reduce_bucket_size", hidden * hidden, must_match=False)
        if resolver.value("zero_optimization.stage") == 3:
            fill("zero_optimization.stage3_prefetch_bucket_size", int(0.9 * hidden * hidden), must_match=False)
            fill("zero_optimization.stage3_param_persistence_threshold", 10 * hidden, must_match=False)
    if resolver.value("zero_optimization.stage") != 3:
        # transformers leaves these "auto" below stage 3, where DeepSpeed ignores them: they go.
        zero = resolver.config.get("zero_optimization", {})
        for key in _HIDDEN_SIZE_KEYS[1:]:
            if zero.get(key.split(".")[1]) == "auto":
                del zero[key.split(".")[1]]
    if num_training_steps is not None:
        fill("scheduler.params.total_num_steps", num_training_steps, "num_training_steps (calculated)")
        fill("scheduler.params.warmup_num_steps", max(1, _warmup_steps(args, num_training_steps)), "warmup_steps")

    if resolver.mismatches:
        raise ValueError(
            "Please correct the following DeepSpeed config values that mismatch TrainingArguments values:\n"
            + "\n".join(resolver.mismatches)
            + "\nThe easiest method is to set these DeepSpeed config values to 'auto'."
        )
    left = sorted(_auto_keys(resolver.config))
    if left and require_all:
        raise ValueError(
            f"these DeepSpeed config values are still \"auto\": {', '.join(left)} (give resolve_auto the model, "
            "whose config.hidden_size sizes the buckets, and num_training_steps, which the scheduler's step counts "
            "need; or set them)"
        )
    return resolver.config


def _auto_keys(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [k for key, v in node.items() for k in _auto_keys(v, f"{prefix}{key}.")]
    return [prefix[:-1]] if node == "auto" else []
