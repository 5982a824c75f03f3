"""The Hugging Face Trainer on libzero (libzero.transformers): the same script as with DeepSpeed, the import changed.
Under torchrun (gloo) the DeepSpeed 0.19.8 Trainer (DS_ACCELERATOR=cpu) runs the same model, data and config and the
losses, gradient norms and learning rates agree; in every launch: an epoch whose last window is partial, resuming
from a checkpoint equals training straight through (bit for bit), save_model loads back with from_pretrained (a
PEFT adapter with PeftModel.from_pretrained), evaluate and predict at stage 3, gradient checkpointing, fp16's skipped
steps, load_best_model_at_end, Seq2SeqTrainer generation at stage 3, the "auto" mismatch errors, and DeepSpeed left
alone; in one process, resuming what 2 ranks saved."""

from __future__ import annotations

import math
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
    # No key-value cache in training: transformers 4.57 builds the attention mask otherwise with the cache on, and
    # gradient checkpointing turns it off, so the two runs of test_gradient_checkpointing_trains_to_the_same_bits would
    # take different attention kernels where torch picks its flash kernel for one of them (an AVX-512 machine here).
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, use_cache=False)
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
    if lora and int(transformers.__version__.split(".")[0]) < 5:
        # DeepSpeed's side fails, not libzero's: its scheduler steps over more learning rates than its optimizer of
        # the LoRA model has param groups (a ValueError from torch's LRScheduler.step).
        pytest.skip("DeepSpeed 0.19.8's Trainer with a PEFT model fails under transformers 4.x")
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
    # The Trainer's evaluation loop over the loaded model as it is (a Trainer that has not trained runs the model
    # without the engine) gives the same loss (the loop's normalisation of the loss differs between transformers
    # versions: 4.57 divides by the labels before the shift), and the model's logits are the predictions.
    plain = arguments(lzt_tf, f"save-{stage}-plain", stage, per_device_eval_batch_size=3)
    theirs = lzt_tf.Trainer(model=loaded, args=plain).evaluate(Data(evaluated))
    assert theirs["eval_loss"] == pytest.approx(metrics["eval_loss"], rel=1e-6)
    with torch.no_grad():
        ids = torch.stack([Data(evaluated)[i]["input_ids"] for i in range(evaluated)])
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


@pytest.mark.parametrize("stage", [2, 3])
def test_gradient_checkpointing_trains_to_the_same_bits(stage):
    """The Trainer's gradient_checkpointing (transformers' non-reentrant checkpoint, recomputing each layer in
    backward; at stage 3 the recompute gathers the layer's unit again): the same forward arithmetic, so the same
    weights as without it, bit for bit."""
    runs = []
    for checkpointing in (False, True):
        fresh(f"checkpointing-{stage}-{checkpointing}")
        trainer = lzt_tf.Trainer(model=model(), args=arguments(lzt_tf, f"checkpointing-{stage}-{checkpointing}", stage,
                                                               gradient_checkpointing=checkpointing,
                                                               gradient_checkpointing_kwargs={"use_reentrant": False}),
                                 train_dataset=Data())
        trainer.train()
        runs.append(weights(trainer))
        trainer.libzero_engine.close()
    assert runs[0] == runs[1]


def test_fp16_steps_skipped_for_overflow_do_not_advance_the_schedule():
    """fp16 with a loss scale that overflows at first (2^20; and again in the epochs' one-sample last windows, whose
    per-token gradients are larger): the engine skips those steps and halves the scale, as DeepSpeed does; the
    Trainer's warmup schedule advances only on the steps taken, so every logged learning rate is the one the last step
    taken ran with (the Trainer's convention, which the comparison with DeepSpeed's checks): the schedule's value
    after one step fewer than were taken."""
    fresh("fp16")
    config = ds_config(2)
    config["fp16"] = {"enabled": "auto", "initial_scale_power": 20, "hysteresis": 1}
    del config["bf16"]

    class Skips(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.after_step: list[int] = []

        def on_step_end(self, args, state, control, **kw):
            self.after_step.append(trainer.libzero_engine.skipped_steps)

    skips = Skips()
    args = arguments(lzt_tf, "fp16", 2, deepspeed=config, fp16=True, max_steps=12, warmup_steps=4,
                     lr_scheduler_type="linear")
    trainer = lzt_tf.Trainer(model=model(), args=args, train_dataset=Data(), callbacks=[skips])
    trainer.train()
    engine = trainer.libzero_engine
    assert 1 <= engine.skipped_steps < 12 and engine.loss_scale < 2.0**20
    logged = history(trainer)
    assert len(logged) == len(skips.after_step) == 12
    for step, ((_, norm, lr), skipped) in enumerate(zip(logged, skips.after_step), start=1):
        before = max(step - skipped - 1, 0)
        # 4 warmup steps to 1e-2, then linear decay to 0 at step 12 (torch's LambdaLR over the steps taken).
        assert lr == pytest.approx(1e-2 * min(before / 4, (12 - before) / 8), rel=1e-12, abs=0), step
        was_skipped = skipped > (skips.after_step[step - 2] if step > 1 else 0)
        assert was_skipped == (not math.isfinite(norm)), step
    engine.close()


def test_load_best_model_at_end_restores_the_best_checkpoint():
    """Evaluated and saved every 2 steps, the best checkpoint by the highest eval loss (so not the last one): at the
    end the engine holds that checkpoint's weights, so evaluating again gives exactly its metric."""
    fresh("best")
    evaluated = 3 * WORLD
    args = arguments(lzt_tf, "best", 3, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
                     load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=True,
                     per_device_eval_batch_size=3)
    trainer = lzt_tf.Trainer(model=model(), args=args, train_dataset=Data(), eval_dataset=Data(evaluated))
    trainer.train()
    best = trainer.state.best_model_checkpoint
    assert best is not None and not best.endswith(f"checkpoint-{trainer.state.global_step}")
    assert trainer.evaluate()["eval_loss"] == trainer.state.best_metric
    trainer.libzero_engine.close()


class Pairs(torch.utils.data.Dataset):
    """Source and target sequences for a small T5."""

    def __len__(self) -> int:
        return 4 * WORLD

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = torch.randint(2, 64, (8,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": x, "labels": x.flip(0)}


def test_seq2seq_generation_at_stage_3_with_different_lengths_per_rank():
    """Seq2SeqTrainer.predict with predict_with_generate at stage 3, each rank asked for another number of new
    tokens (so the ranks run different numbers of forward passes, which no collective may depend on): every rank's
    generations are what the trained model's own generate gives for its samples."""
    fresh("seq2seq")
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=64, d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    t5 = transformers.T5ForConditionalGeneration(config)
    args = lzt_tf.Seq2SeqTrainingArguments(
        output_dir=os.path.join(SCRATCH, "seq2seq"), deepspeed=ds_config(3), per_device_train_batch_size=2,
        per_device_eval_batch_size=4, max_steps=2, learning_rate=1e-2, predict_with_generate=True, save_strategy="no",
        report_to=[], use_cpu=True, seed=0)
    trainer = lzt_tf.Seq2SeqTrainer(model=t5, args=args, train_dataset=Pairs())
    trainer.train()
    new_tokens = 3 + 2 * RANK
    out = trainer.predict(Pairs(), max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    trained = trainer.libzero_engine.full_parameters()
    trainer.libzero_engine.close()
    reference = transformers.T5ForConditionalGeneration(config)
    reference.load_state_dict(trained, strict=False)
    reference.tie_weights()
    for name, p in reference.named_parameters():  # every param loaded (the tied ones through the weights they share)
        assert torch.equal(p, trained[name]), name
    reference.eval()  # as predict() runs it: no dropout
    mine = torch.stack([Pairs()[i]["input_ids"] for i in range(4 * RANK, 4 * RANK + 4)])
    with torch.no_grad():
        expected = reference.generate(input_ids=mine, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    # predict() pads each rank's generations to the longest over ranks before gathering them.
    gathered = torch.as_tensor(out.predictions)
    ours = gathered[4 * RANK : 4 * RANK + 4, : expected.shape[1]]
    assert torch.equal(ours, expected)


@pytest.mark.skipif(LAUNCH != "single", reason="resumes in one process what torchrun's 2 ranks saved")
def test_resume_from_a_checkpoint_saved_at_another_rank_count():
    """A Trainer checkpoint written by 2 ranks under torchrun (stage 3: each rank's shards) resumes in one process:
    the engine reshards it, so training starts from exactly the saved weights and goes on to max_steps."""
    import subprocess
    import sys

    directory = os.path.join(SCRATCH, "ranks")
    shutil.rmtree(directory, ignore_errors=True)
    writer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trainer_checkpoint_writer.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", writer,
                    directory], check=True, env=env, timeout=240)
    saved = torch.load(os.path.join(directory, "weights.pt"))

    class AtStart(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            self.weights = trainer.libzero_engine.full_parameters()

    at_start = AtStart()
    args = arguments(lzt_tf, "ranks-resumed", 3, max_steps=6)
    trainer = lzt_tf.Trainer(model=model(), args=args, train_dataset=Data(26), callbacks=[at_start])
    trainer.train(resume_from_checkpoint=os.path.join(directory, "checkpoint-4"))
    assert at_start.weights.keys() == saved.keys()
    assert all(torch.equal(at_start.weights[n], saved[n]) for n in saved)
    assert trainer.state.global_step == 6
    assert weights(trainer) != {n: t.contiguous().view(torch.uint8).numpy().tobytes() for n, t in saved.items()}
    trainer.libzero_engine.close()
