"""The Hugging Face Trainer on libzero (libzero.transformers): the same script as with DeepSpeed, the import changed.
Under torchrun (gloo) the DeepSpeed 0.19.8 Trainer (DS_ACCELERATOR=cpu) runs the same model, data and config and the
losses, gradient norms and learning rates agree; in every launch: an epoch whose last window is partial, resuming
from a checkpoint equals training straight through (bit for bit), save_model loads back with from_pretrained (a
PEFT adapter with PeftModel.from_pretrained), evaluate and predict at stage 3, the "auto" mismatch errors, and
DeepSpeed left alone."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import libzero.transformers as lzt_tf  # noqa: E402
from libzero.torch import TorchEngine  # noqa: E402
from test_torch import LAUNCH, RANK, WORLD, teardown_module  # noqa: E402,F401 - the same launch handling

torch.set_num_threads(1)
SCRATCH = os.path.join(os.environ.get("ZERO_TEST_SCRATCH", "/tmp/libzero-trainer-test"), f"{LAUNCH}-{WORLD}")
SAMPLES = 13 * WORLD  # 13 per rank: 7 micro-batches of 2, so each epoch's last window of 2 has one


def model(lora: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=64, max_position_embeddings=32)
    m = transformers.LlamaForCausalLM(cfg)
    if lora:
        m = peft.get_peft_model(m, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    return m


class Data(torch.utils.data.Dataset):
    def __init__(self, n: int = SAMPLES) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": x, "labels": x.clone()}


def ds_config(stage: int, blocks: bool = False) -> dict:
    """A config as users write it for the Trainer: "auto" wherever the Trainer knows the value; with ``blocks`` its
    own optimizer and scheduler (else the Trainer's)."""
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                              "stage3_param_persistence_threshold": "auto"},
    }
    if blocks:
        config["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                           "weight_decay": "auto"}}
        config["scheduler"] = {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                                   "warmup_num_steps": "auto",
                                                                   "total_num_steps": "auto"}}
    return config


def arguments(mod, name: str, stage: int, **kw):
    base = dict(output_dir=os.path.join(SCRATCH, name), deepspeed=ds_config(stage), per_device_train_batch_size=2,
                gradient_accumulation_steps=2, num_train_epochs=2, learning_rate=1e-2, logging_steps=1,
                save_strategy="no", report_to=[], use_cpu=True, seed=0, data_seed=0)
    base.update(kw)
    return mod.TrainingArguments(**base)


def fresh(name: str) -> None:
    if RANK == 0:  # the others first write there after a collective (the engine's creation) that rank 0 joins later
        shutil.rmtree(os.path.join(SCRATCH, name), ignore_errors=True)


def history(trainer) -> list[tuple[float, float, float]]:
    return [(h["loss"], h["grad_norm"], h["learning_rate"]) for h in trainer.state.log_history if "loss" in h]


def weights(trainer) -> dict[str, bytes]:
    full = trainer.libzero_engine.full_parameters()
    return {n: t.contiguous().view(torch.uint8).numpy().tobytes() for n, t in full.items()}


@pytest.mark.skipif(LAUNCH != "torchrun", reason="DeepSpeed's Trainer runs under torchrun")
@pytest.mark.parametrize("stage,lora,blocks", [(1, False, False), (2, False, True), (3, False, False), (3, True, False)])
def test_the_same_script_trains_as_deepspeed_s_trainer(stage, lora, blocks):
    """Both run AdamW on the averaged, clipped gradients in different orders of operations (docs/python.md: the
    weights drift apart by about one rounding per step), and average differently where N is not a power of two
    (DeepSpeed divides in the reduction, libzero the sum once): the losses and gradient norms, which follow the
    weights, agree within 1e-5 relative over the 8 steps (measured at N = 2 and 3: losses 1.3e-7, norms 2.8e-6), the
    learning rates exactly, every step, the partial last window of each epoch included."""
    pytest.importorskip("deepspeed")
    runs = {}
    for name, mod in (("deepspeed", transformers), ("libzero", lzt_tf)):
        args = arguments(mod, f"vs-{name}", stage, deepspeed=ds_config(stage, blocks), warmup_steps=2)
        trainer = mod.Trainer(model=model(lora), args=args, train_dataset=Data())
        trainer.train()
        runs[name] = history(trainer)
        if name == "libzero":
            assert isinstance(trainer.model_wrapped, TorchEngine)
            trainer.libzero_engine.close()
    ours, theirs = runs["libzero"], runs["deepspeed"]
    assert len(ours) == len(theirs) == 8  # 4 windows per epoch, the last of one micro-batch
    for step, ((loss, norm, lr), (ds_loss, ds_norm, ds_lr)) in enumerate(zip(ours, theirs)):
        assert loss == pytest.approx(ds_loss, rel=1e-5), step
        assert norm == pytest.approx(ds_norm, rel=1e-5), step
        assert lr == ds_lr, step
    worst_loss = max(abs(a[0] - b[0]) / abs(b[0]) for a, b in zip(ours, theirs))
    worst_norm = max(abs(a[1] - b[1]) / abs(b[1]) for a, b in zip(ours, theirs))
    print(f"stage {stage}{' LoRA' if lora else ''}{' config optimizer and scheduler' if blocks else ''}, {WORLD} ranks: against DeepSpeed's Trainer the losses differ by "
          f"at most {worst_loss:.2g} (relative), the gradient norms by {worst_norm:.2g}")


@pytest.mark.parametrize("stage", [0, 3])
def test_resuming_from_a_checkpoint_equals_training_straight_through(stage):
    fresh(f"resume-{stage}")
    straight = lzt_tf.Trainer(model=model(), args=arguments(lzt_tf, f"resume-{stage}", stage, save_strategy="steps",
                                                             save_steps=3), train_dataset=Data())
    straight.train()
    expected = weights(straight)
    straight.libzero_engine.close()
    checkpoint = os.path.join(SCRATCH, f"resume-{stage}", "checkpoint-3")
    assert os.path.isdir(os.path.join(checkpoint, "libzero"))
    resumed = lzt_tf.Trainer(model=model(), args=arguments(lzt_tf, f"resumed-{stage}", stage), train_dataset=Data())
    resumed.train(resume_from_checkpoint=checkpoint)
    assert resumed.state.global_step == 8
    assert weights(resumed) == expected
    resumed.libzero_engine.close()


@pytest.mark.parametrize("stage", [2, 3])
def test_save_model_loads_back_with_from_pretrained_and_evaluate_agrees(stage):
    fresh(f"save-{stage}")
    evaluated = 3 * WORLD  # one batch of 3 per rank
    trainer = lzt_tf.Trainer(model=model(), args=arguments(lzt_tf, f"save-{stage}", stage, per_device_eval_batch_size=3),
                             train_dataset=Data(), eval_dataset=Data(evaluated))
    trainer.train()
    trained = trainer.libzero_engine.full_parameters()
    metrics = trainer.evaluate()
    directory = os.path.join(SCRATCH, f"save-{stage}", "final")
    trainer.save_model(directory)  # collective
    predictions = trainer.predict(Data(evaluated))
    trainer.libzero_engine.close()
    loaded = transformers.LlamaForCausalLM.from_pretrained(directory)
    for name, p in loaded.named_parameters():
        assert torch.equal(p, trained[name]), name
    # The loaded model's own evaluation is the Trainer's (the mean of the ranks' batch losses; rank r evaluates
    # samples 3r..3r+2), and its logits the predictions.
    with torch.no_grad():
        ids = torch.stack([Data(evaluated)[i]["input_ids"] for i in range(evaluated)])
        losses = [loaded(input_ids=ids[3 * r : 3 * r + 3], labels=ids[3 * r : 3 * r + 3]).loss.item()
                  for r in range(WORLD)]
        assert sum(losses) / WORLD == pytest.approx(metrics["eval_loss"], rel=1e-6)
        assert torch.allclose(torch.as_tensor(predictions.predictions), loaded(input_ids=ids).logits, atol=1e-5)


def test_a_peft_model_saves_its_adapter_at_stage_3():
    fresh("adapter")
    trainer = lzt_tf.Trainer(model=model(lora=True), args=arguments(lzt_tf, "adapter", 3), train_dataset=Data())
    trainer.train()
    trained = trainer.libzero_engine.full_parameters()
    directory = os.path.join(SCRATCH, "adapter", "final")
    trainer.save_model(directory)
    trainer.libzero_engine.close()
    assert os.path.exists(os.path.join(directory, "adapter_model.safetensors"))
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(model().config)
    loaded = peft.PeftModel.from_pretrained(base, directory)
    adapters = {n: p for n, p in loaded.named_parameters() if "lora_" in n}
    assert adapters and all(torch.equal(p, trained[n]) for n, p in adapters.items())


def test_deepspeed_is_neither_needed_nor_used():
    args = arguments(lzt_tf, "plain", 2)
    assert args.deepspeed is None and args.libzero_config["gradient_accumulation_steps"] == 2
    trainer = lzt_tf.Trainer(model=model(), args=args, train_dataset=Data())
    assert not trainer.is_deepspeed_enabled
    trainer.train()
    assert isinstance(trainer.model_wrapped, TorchEngine)  # not DistributedDataParallel around it
    trainer.libzero_engine.close()


def test_values_that_contradict_the_arguments_fail_as_in_transformers():
    config = ds_config(2)
    config["gradient_accumulation_steps"] = 3
    with pytest.raises(ValueError, match="ds gradient_accumulation_steps=3 vs hf gradient_accumulation_steps=2"):
        arguments(lzt_tf, "mismatch", 2, deepspeed=config)
    with pytest.raises(ValueError, match=r"TrainingArguments\(deepspeed=...\)"):
        lzt_tf.Trainer(model=model(), args=transformers.TrainingArguments(output_dir=os.path.join(SCRATCH, "x"),
                                                                          use_cpu=True, report_to=[]))
