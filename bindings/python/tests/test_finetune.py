"""Fine-tuning through libzero.torch: PEFT LoRA on small Llama and GPT-2 models built from transformers configs (no
download), frozen params sharded at stage 3, quantized and NaN-payload storage never altered, the gather context,
generate at stage 3, the Hugging Face export, and a model loaded unit by unit from a state dict without ever being
whole on any rank. Run in one process, under mpirun (2 and 3 ranks) and under torchrun (2), as test_torch.py."""

from __future__ import annotations

import os

import pytest
import torch

import libzero
import libzero.torch as lzt
from test_torch import LAUNCH, RANK, WORLD, bits, comm, teardown_module  # noqa: F401 - the same launch handling

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

torch.set_num_threads(1)
STEPS = 6
SCRATCH = os.path.join(os.environ.get("ZERO_TEST_SCRATCH", "/tmp/libzero-finetune-test"), f"{LAUNCH}-{WORLD}")


def config(stage: int, dtype: str = "fp32", world: int = WORLD, gas: int = 1) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": gas,
        "train_batch_size": 2 * world * gas,
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 3000},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
        "libzero": {"timeout_s": 120},
    }
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def gpt2():
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def llama():
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


TARGETS = {"gpt2": ["c_attn", "c_proj", "c_fc"],
           "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
MODELS = {"gpt2": gpt2, "llama": llama}


def lora(kind: str) -> torch.nn.Module:
    base = MODELS[kind]()
    torch.manual_seed(1)  # LoRA's A matrices
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                      target_modules=TARGETS[kind]))
    # B starts at zero in PEFT; a non-zero start makes every LoRA param train from the first step.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.01)
    return model


def ids_of(step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step + rank)
    return (torch.randint(0, 64, (2, 1), generator=g) + torch.arange(12) * 5) % 64


def train(eng: lzt.TorchEngine, ranks: list[int], steps: int = STEPS) -> list[float]:
    losses = []
    for s in range(steps):
        for r in ranks:
            ids = ids_of(s, r)
            out = eng(input_ids=ids, labels=ids)
            eng.backward(out.loss)
            eng.step()
            losses.append(out.loss.item())
    return losses


_references: dict[tuple[str, str], dict[str, bytes]] = {}


def reference(kind: str, dtype: str) -> dict[str, bytes]:
    """libzero's one-process run at stage 0 accumulating every rank's micro-batch in rank order, trained and
    frozen params alike."""
    key = (kind, dtype)
    if key not in _references:
        eng = lzt.initialize(lora(kind), config(0, dtype, 1, gas=WORLD), libzero.Comm.single())
        train(eng, list(range(WORLD)))
        _references[key] = bits(eng.full_parameters(frozen=True))
        eng.close()
    return _references[key]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_lora_trains_to_the_one_process_weights_with_the_base_sharded_at_stage3(kind, stage):
    model = lora(kind)
    base_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    frozen_before = bits({n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad})
    eng = lzt.initialize(model, config(stage), comm())
    mem = eng.engine.memory_stats()
    # The frozen base: whole below stage 3 (as DeepSpeed keeps it), about 1/N of it per rank at stage 3 (each unit's
    # frozen bytes padded to 64 x N).
    if stage < 3:
        assert base_bytes <= mem["frozen_param_bytes"] <= base_bytes + 64 * 64 * eng.engine.num_units
    else:
        assert base_bytes / WORLD <= mem["frozen_param_bytes"] <= base_bytes / WORLD + 64 * 64 * eng.engine.num_units
    assert mem["master_param_bytes"] == 0 and mem["grad_bytes"] < base_bytes / 4  # only the adapters have gradients
    losses = train(eng, [RANK])
    assert losses[-1] < losses[0]
    got = bits(eng.full_parameters(frozen=True))
    eng.close()
    assert {n: got[n] for n in frozen_before} == frozen_before  # the base never changed
    assert got == reference(kind, "fp32")


@pytest.mark.parametrize("reentrant", [False, True])
def test_lora_with_activation_checkpointing_at_stage3_gives_the_same_bits(reentrant):
    """The common LoRA setup: gradient checkpointing on a frozen base. Backward recomputes each block and reads its
    frozen weights (a norm's, for the gradient of its input) after the block's last adapter gradient is in, so a
    block with frozen params must stay gathered until backward reaches another block."""
    model = lora("llama")
    model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.enable_input_require_grads()
    model.train()
    eng = lzt.initialize(model, config(3), comm())
    train(eng, [RANK])
    got = bits(eng.full_parameters(frozen=True))
    eng.close()
    assert got == reference("llama", "fp32")


@pytest.mark.parametrize("stage", [1, 3])
def test_lora_in_bf16_gives_the_one_process_bits(stage):
    eng = lzt.initialize(lora("llama"), config(stage, "bf16"), comm())
    train(eng, [RANK])
    got = bits(eng.full_parameters(frozen=True))
    eng.close()
    assert got == reference("llama", "bf16")


class Quantized(torch.nn.Module):
    """Frozen storage a numeric cast would destroy: packed 4-bit pairs (uint8), int8 codes, bf16 words holding packed
    data (NaN payloads among them, as bitsandbytes' quant_storage=bfloat16 may give), an int32 index and a bool mask
    (kept as bytes); and one trained param."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.packed = torch.nn.Parameter(torch.randint(0, 256, (40, 3), generator=g, dtype=torch.uint8),
                                         requires_grad=False)
        self.codes = torch.nn.Parameter(torch.randint(-128, 128, (17,), generator=g, dtype=torch.int8),
                                        requires_grad=False)
        words = torch.randint(0, 1 << 16, (33,), generator=g, dtype=torch.int32).to(torch.int16)
        words[:4] = torch.tensor([0x7F81, -0x003D, 0x7FA5, 0x7F80], dtype=torch.int16)  # NaNs with payloads, +inf
        self.storage = torch.nn.Parameter(words.view(torch.bfloat16), requires_grad=False)
        self.index = torch.nn.Parameter(torch.arange(5, dtype=torch.int32) * 1000003, requires_grad=False)
        self.mask = torch.nn.Parameter(torch.tensor([True, False, True]), requires_grad=False)
        self.scale = torch.nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.scale * x * self.packed[:3, 0].float()).sum()


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_quantized_and_nan_payload_storage_is_never_altered(stage, tmp_path):
    model = Quantized()
    before = bits({n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad})
    cfg = config(stage, "bf16")
    eng = lzt.initialize(model, cfg, comm())
    assert {p.dtype for n, p in model.named_parameters() if n != "scale"} == {
        torch.uint8, torch.int8, torch.bfloat16, torch.int32, torch.bool}
    for _ in range(2):
        eng.backward(eng(torch.ones(3, dtype=torch.bfloat16)))
        eng.step()
    with eng.gathered_parameters():
        now = bits({n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad})
    assert now == before
    # Through a checkpoint into a new engine whose frozen params start as zeros.
    directory = os.path.join(SCRATCH, f"quantized-s{stage}")
    if RANK == 0 and os.path.exists(directory):
        import shutil

        shutil.rmtree(directory)
    eng.save_checkpoint(directory, "t")
    other = Quantized()
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    eng2 = lzt.initialize(other, cfg, comm())
    eng2.load_checkpoint(directory, "t")
    got = bits(eng2.full_parameters(frozen=True))
    eng.close()
    eng2.close()
    assert {n: got[n] for n in before} == before


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_the_gather_context_reads_and_publishes_the_modifier_s_writes(stage):
    model = lora("gpt2")
    eng = lzt.initialize(model, config(stage), comm())
    train(eng, [RANK], steps=2)
    writer = WORLD - 1
    wte = model.base_model.model.transformer.wte.weight  # frozen
    lora_a = next(p for n, p in model.named_parameters() if "lora_A" in n)  # trained
    with lzt.GatheredParameters([wte, lora_a], modifier_rank=writer):
        assert wte.shape == (64, 32) and lora_a.shape[1] == 32  # full values inside, at every stage
        if RANK == writer:
            with torch.no_grad():
                wte.fill_(0.25)
                lora_a.fill_(-0.5)
        elif stage == 3:
            with torch.no_grad():
                wte.fill_(9.0)  # another rank's writes are discarded
    with eng.gathered_parameters([wte, lora_a]):
        assert torch.all(wte == 0.25) and torch.all(lora_a == -0.5)
    # Training goes on from the published values on every rank alike: the ranks' weights stay equal.
    train(eng, [RANK], steps=2)
    got = eng.full_parameters(frozen=True)
    eng.close()
    assert torch.all(got["base_model.model.transformer.wte.weight"] == 0.25)  # on every rank


@pytest.mark.skipif(WORLD == 1, reason="several ranks")
def test_ranks_that_name_different_modifier_ranks_all_get_a_mismatch():
    model = lora("gpt2")
    eng = lzt.initialize(model, config(3), comm())
    wte = model.base_model.model.transformer.wte.weight
    with pytest.raises(libzero.MismatchError, match="different modifier ranks"):
        with eng.gathered_parameters([wte], modifier_rank=RANK):
            pass
    # Nothing moved: the engine goes on.
    with eng.gathered_parameters([wte], modifier_rank=0):
        pass
    train(eng, [RANK], steps=1)
    eng.close()


def test_a_stage3_state_dict_outside_a_gather_is_refused_not_empty(tmp_path):
    model = lora("llama")
    eng = lzt.initialize(model, config(3), comm())
    with pytest.raises(RuntimeError, match="released"):
        model.save_pretrained(str(tmp_path / "never"))  # PEFT's own save: it would write shape-(0,) adapters
    with eng.gathered_parameters():
        sd = model.state_dict()
    assert all(t.numel() > 0 for t in sd.values())
    eng.close()


@pytest.mark.parametrize("stage", [0, 3])
def test_save_pretrained_loads_back_with_from_pretrained(stage):
    # A full model: transformers' from_pretrained gets the trained weights.
    model = gpt2()
    eng = lzt.initialize(model, config(stage), comm())
    train(eng, [RANK], steps=2)
    directory = os.path.join(SCRATCH, f"export-s{stage}")
    eng.save_pretrained(directory)  # collective; returns on every rank once rank 0 wrote it
    trained = eng.full_parameters(frozen=True)
    eng.close()
    loaded = transformers.GPT2LMHeadModel.from_pretrained(directory)
    state = dict(loaded.named_parameters())
    assert bits({n: state[n].detach() for n in trained}) == bits(trained)

    # A PEFT model: the adapter alone, loaded onto a fresh base with PeftModel.from_pretrained.
    model = lora("gpt2")
    eng = lzt.initialize(model, config(stage), comm())
    train(eng, [RANK], steps=2)
    directory = os.path.join(SCRATCH, f"adapter-s{stage}")
    eng.save_pretrained(directory)
    adapters = eng.full_parameters()
    eng.close()
    assert os.path.exists(os.path.join(directory, "adapter_model.safetensors"))
    restored = peft.PeftModel.from_pretrained(gpt2(), directory)
    state = dict(restored.named_parameters())
    assert bits({n: state[n].detach() for n in adapters}) == bits(adapters)


def test_generate_at_stage3_lets_ranks_stop_at_different_lengths():
    model = gpt2()
    eng = lzt.initialize(model, config(3), comm())
    train(eng, [RANK], steps=2)
    prompt = ids_of(0, RANK)[:1, :4]
    new_tokens = 2 + 3 * RANK  # every rank a different length: no collective may run per token
    got = eng.generate(input_ids=prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                       pad_token_id=0)
    weights = eng.full_parameters(frozen=True)
    eng.close()
    plain = gpt2()
    plain.load_state_dict(weights, strict=False)
    want = plain.generate(input_ids=prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                          pad_token_id=0)
    assert torch.equal(got, want) and got.shape[1] == 4 + new_tokens


@pytest.mark.skipif(LAUNCH != "torchrun", reason="synced generation goes through torch.distributed")
def test_generate_per_forward_gathers_stays_in_step_under_torchrun():
    model = gpt2()
    eng = lzt.initialize(model, config(3), comm())
    prompt = ids_of(0, RANK)[:1, :4]
    got = eng.generate(input_ids=prompt, keep_gathered=False, max_new_tokens=2 + 3 * RANK, do_sample=False,
                       pad_token_id=0)
    assert got.shape[1] == 4 + 2 + 3 * RANK
    eng.close()


@pytest.mark.parametrize("stage", [1, 3])
def test_a_model_on_the_meta_device_loads_unit_by_unit_from_a_state_dict(stage):
    source = gpt2()
    directory = os.path.join(SCRATCH, f"pretrained-s{stage}")
    if RANK == 0:
        source.save_pretrained(directory)
    # Every rank waits for rank 0's file: a tiny engine's finalize is the barrier.
    from libzero.torch.rank0 import share_outcome

    barrier = libzero.Engine(config(0), comm())
    share_outcome(barrier, None, "the test's wait for rank 0's files")
    barrier.close()
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(source.config)
    # GPT-2 has no non-persistent buffers on the meta device to compute; its params come from the state dict.
    eng = lzt.initialize(model, config(stage), comm(), state_dict=directory)
    got = eng.full_parameters(frozen=True)
    want = dict(source.named_parameters())
    assert bits(got) == bits({n: want[n].detach() for n in got})
    train(eng, [RANK], steps=1)  # and it trains
    eng.close()


@pytest.mark.skipif(LAUNCH != "torchrun", reason="DeepSpeed runs under torchrun")
def test_lora_at_zero3_agrees_with_deepspeed_s():
    """The same LoRA model, data and config through DeepSpeed's ZeRO-3 (on CPU: DS_ACCELERATOR=cpu) and libzero's.
    Both run AdamW on the averaged, clipped gradients; their operations differ in order (the update's, and the
    gradient reduction's), so each step may leave each adapter weight one rounding apart — 2^-21 for |w| < 4, as
    docs/python.md derives for torch's AdamW — and after STEPS steps |Δw| <= STEPS x 2^-21. Losses follow the weights:
    the first step's are the same model's on the same data (equal to a rounding); later ones within 1e-4."""
    deepspeed = pytest.importorskip("deepspeed")
    cfg = config(3)
    cfg["gradient_clipping"] = 1.0
    ds_model = lora("llama")
    ds_engine, *_ = deepspeed.initialize(model=ds_model, config=cfg,
                                         model_parameters=[p for p in ds_model.parameters() if p.requires_grad])
    ds_losses = []
    for s in range(STEPS):
        ids = ids_of(s, RANK)
        loss = ds_engine(input_ids=ids, labels=ids).loss
        ds_engine.backward(loss)
        ds_engine.step()
        ds_losses.append(loss.item())
    adapters = [(n, p) for n, p in ds_model.named_parameters() if p.requires_grad]
    with deepspeed.zero.GatheredParameters([p for _, p in adapters]):
        ds_weights = {n: p.detach().clone() for n, p in adapters}
    ds_engine.destroy()

    eng = lzt.initialize(lora("llama"), cfg, comm())
    losses = train(eng, [RANK])
    weights = eng.full_parameters()
    eng.close()
    assert set(weights) == set(ds_weights)
    worst = max((weights[n] - ds_weights[n]).abs().max().item() for n in weights)
    assert worst <= STEPS * 2.0**-21, worst
    assert losses[0] == pytest.approx(ds_losses[0], rel=1e-6)
    assert losses == pytest.approx(ds_losses, rel=1e-4)
    print(f"libzero against DeepSpeed ZeRO-3: largest adapter difference {worst:.3g}, losses {losses} / {ds_losses}")


def real_adapters(model: torch.nn.Module) -> None:
    """docs/python.md's recipe: a PEFT model over a base on the meta device has its adapters on the meta device too;
    they are made real and initialised as PEFT initialises them (the same on every rank: seeded)."""
    from peft.tuners.lora import LoraLayer

    torch.manual_seed(1)
    for module in model.modules():
        if isinstance(module, LoraLayer):
            module.lora_A.to_empty(device="cpu")
            module.lora_B.to_empty(device="cpu")
            module.reset_lora_parameters("default", True)


@pytest.mark.parametrize("stage", [2, 3])
def test_lora_over_a_base_on_the_meta_device_loads_from_the_base_s_own_files(stage):
    import accelerate

    source = llama()
    directory = os.path.join(SCRATCH, f"llama-s{stage}")
    if RANK == 0:
        source.save_pretrained(directory)
    from libzero.torch.rank0 import share_outcome

    barrier = libzero.Engine(config(0), comm())
    share_outcome(barrier, None, "the test's wait for rank 0's files")  # every rank waits for rank 0's files
    barrier.close()
    with accelerate.init_empty_weights():  # params on the meta device, buffers (rotary inv_freq) real
        base = transformers.LlamaForCausalLM(source.config)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                      target_modules=TARGETS["llama"]))
    real_adapters(model)
    eng = lzt.initialize(model, config(stage), comm(), state_dict=directory)  # PEFT's names found without prefix
    got = eng.full_parameters(frozen=True)
    want = dict(source.named_parameters())
    for name, value in got.items():
        if "lora_" not in name:
            base_name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            assert bits({name: value}) == bits({name: want[base_name].detach()})
    losses = train(eng, [RANK], steps=3)
    assert losses[-1] < losses[0]
    eng.close()


class WithStats(torch.nn.Module):
    """A frozen base with persistent buffers (BatchNorm's statistics) and a trained head; the head's weight is tied to
    a second name (a plain torch module's state_dict lists both)."""

    def __init__(self) -> None:
        super().__init__()
        self.base = torch.nn.Linear(6, 6)
        self.norm = torch.nn.BatchNorm1d(6)
        self.head = torch.nn.Linear(6, 6, bias=False)
        self.alias = self.head  # the same module (and weight) under a second name
        self.base.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.base(x))).pow(2).mean()


@pytest.mark.parametrize("stage", [0, 3])
def test_generators_nesting_and_foreign_tensors_in_the_gather_context(stage):
    torch.manual_seed(3)
    model = WithStats()
    eng = lzt.initialize(model, config(stage), comm())
    writer = WORLD - 1
    with lzt.GatheredParameters(model.base.parameters(), modifier_rank=writer):  # a generator, read once
        if RANK == writer:
            with torch.no_grad():
                model.base.weight.fill_(0.5)
    with lzt.GatheredParameters([model.base.weight]):
        assert torch.all(model.base.weight == 0.5)  # on every rank
    with lzt.GatheredParameters([]), lzt.GatheredParameters([torch.ones(2)]):
        pass  # nothing the engine holds: nothing to do, as in DeepSpeed
    with eng.gathered_parameters():  # an inner publish keeps the outer block's params gathered
        with eng.gathered_parameters([model.head.weight], modifier_rank=0):
            if RANK == 0:
                with torch.no_grad():
                    model.head.weight.fill_(-1.0)
        assert model.head.weight.shape == (6, 6) and torch.all(model.head.weight == -1.0)
        assert model.base.weight.shape == (6, 6)
    eng.close()


@pytest.mark.skipif(WORLD == 1, reason="several ranks")
def test_an_unpublished_write_below_stage3_is_named_in_the_error():
    model = WithStats()
    eng = lzt.initialize(model, config(1), comm())
    with pytest.raises(libzero.MismatchError, match="not published"):
        with eng.gathered_parameters([model.base.weight], modifier_rank=RANK):
            pass
    with eng.gathered_parameters([model.base.weight], modifier_rank=0):  # and publishing works again
        pass
    eng.close()


@pytest.mark.parametrize("stage", [1, 3])
def test_buffers_load_from_the_state_dict_real_or_on_the_meta_device(stage):
    torch.manual_seed(4)
    source = WithStats()
    with torch.no_grad():
        source.norm.running_mean.copy_(torch.arange(6.0))
        source.norm.running_var.fill_(3.0)
    state = {k: v.clone() for k, v in source.state_dict().items()}
    for build in ("real", "meta"):
        if build == "meta":
            with torch.device("meta"):
                model = WithStats()
        else:
            model = WithStats()  # real buffers at their constructor's values: the state dict's must win
        eng = lzt.initialize(model, config(stage), comm(), state_dict=state)
        assert torch.equal(model.norm.running_mean, torch.arange(6.0)) and torch.all(model.norm.running_var == 3.0)
        got = eng.full_parameters(frozen=True)
        assert torch.equal(got["base.weight"], source.base.weight.detach())
        eng.close()


def test_a_plain_torch_export_names_tied_weights_as_its_state_dict_does():
    model = WithStats()
    eng = lzt.initialize(model, config(3), comm())
    directory = os.path.join(SCRATCH, "plain-export")
    eng.save_pretrained(directory)
    eng.close()
    from safetensors.torch import load_file

    fresh = WithStats()
    fresh.load_state_dict(load_file(os.path.join(directory, "model.safetensors")), strict=True)
    assert torch.equal(fresh.alias.weight, fresh.head.weight)


@pytest.mark.parametrize("stage", [1, 3])
def test_a_checkpoint_without_the_frozen_params_keeps_the_loading_engine_s(stage):
    directory = os.path.join(SCRATCH, f"exclude-s{stage}")
    if RANK == 0:  # an earlier run's checkpoint (tags are never overwritten); the others wait in the save
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
    torch.manual_seed(5)
    eng = lzt.initialize(WithStats(), config(stage), comm())
    tag = eng.save_checkpoint(directory, "t", exclude_frozen_parameters=True)
    eng.close()
    torch.manual_seed(6)
    other = WithStats()
    mine = other.base.weight.detach().clone()
    eng = lzt.initialize(other, config(stage), comm())
    eng.load_checkpoint(directory, tag)
    assert torch.equal(eng.full_parameters(frozen=True)["base.weight"], mine)
    eng.close()


def test_an_export_rank_0_cannot_write_fails_on_every_rank():
    model = gpt2()
    eng = lzt.initialize(model, config(3), comm())
    blocker = os.path.join(SCRATCH, "a-file-not-a-directory")
    if RANK == 0:
        os.makedirs(SCRATCH, exist_ok=True)
        with open(blocker, "w", encoding="utf-8") as f:
            f.write("x")
    # Rank 0's writer fails (the directory's parent is a file); every rank learns it, none waits forever.
    with pytest.raises((OSError, RuntimeError), match="Not a directory|rank 0 failed"):
        eng.save_pretrained(os.path.join(blocker, "export"))
    # The engine goes on: the gathers it made were complete on every rank.
    train(eng, [RANK], steps=1)
    eng.close()
