"""libzero.torch: a plain-torch GPT trained through libzero at stages 0-3, in one process, under mpirun (MPI backend)
and under torchrun (ProcessGroupComm over gloo). Every rank count and stage gives the weights of libzero's own
one-process run bit for bit, and torch.optim.AdamW's within a stated tolerance.

ZERO_TEST_TORCH_DEVICE=cuda puts the parity test's model and batches on the GPU (a device engine; under torchrun its
data host-staged, or over NCCL with ZERO_TORCH_TRANSPORT=nccl): what scripts/gpu-check.sh runs there with
``-k every_stage``. Its forward and backward then run torch's deterministic kernels, so that a rank's micro-batch
gives the reference's gradients bit for bit."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

import libzero
import libzero.torch as lzt
from torch_model import batch, make_model

torch.set_num_threads(1)  # the same matmul kernels in every process, so forward and backward give the same bits
DEVICE = torch.device(os.environ.get("ZERO_TEST_TORCH_DEVICE", "cpu"))
if DEVICE.type == "cuda":
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what cuBLAS needs for deterministic products
    torch.use_deterministic_algorithms(True)  # embedding's backward, among others, adds with atomics otherwise

STEPS = 20
LR = 3e-3
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _launch() -> tuple[str, int, int]:
    if os.environ.get("OMPI_COMM_WORLD_SIZE"):
        return "mpi", int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    if os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("MASTER_ADDR"):
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        return "torchrun", dist.get_rank(), dist.get_world_size()
    return "single", 0, 1


LAUNCH, RANK, WORLD = _launch()


def teardown_module() -> None:
    # torch's advice: a process group left to the interpreter's exit may abort in gloo's threads ("terminate called
    # without an active exception", seen here under load).
    if LAUNCH == "torchrun":
        import gc

        import torch.distributed as dist

        gc.collect()  # engines a test left to the collector hold the process group: let them go first
        dist.barrier()
        dist.destroy_process_group()


def comm() -> libzero.Comm:
    if LAUNCH == "mpi":
        return libzero.Comm.mpi()
    if LAUNCH == "torchrun":
        return lzt.default_comm()  # shared memory, or the process group with ZERO_TORCH_TRANSPORT=process_group
    return libzero.Comm.single()


def config(stage: int, dtype: str, world: int, gas: int = 1, **extra) -> dict:
    cfg = {
        "train_batch_size": 4 * world * gas,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": gas,
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 5000},
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
        "libzero": {"timeout_s": 120},
    }
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    cfg.update(extra)
    return cfg


def bits(params: dict[str, torch.Tensor]) -> dict[str, bytes]:
    return {name: t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes() for name, t in params.items()}


def on_device(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s micro-batch of step `step` on DEVICE."""
    xs, ys = batch(step, rank)
    return xs.to(DEVICE), ys.to(DEVICE)


_references: dict[str, dict[str, bytes]] = {}


def reference(dtype: str) -> dict[str, bytes]:
    """libzero's own one-process run at stage 0: every step accumulates the micro-batches of ranks 0..N-1 in order."""
    if dtype not in _references:
        model = make_model(dtype=DTYPES[dtype]).to(DEVICE)
        eng = lzt.initialize(model, config(0, dtype, 1, gas=WORLD), libzero.Comm.single())
        for s in range(STEPS):
            for r in range(WORLD):
                eng.backward(eng(*on_device(s, r)))
                eng.step()
        _references[dtype] = bits(eng.full_parameters())
        eng.close()
    return _references[dtype]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_stage_and_rank_count_gives_the_one_process_weights(stage, dtype):
    model = make_model(dtype=DTYPES[dtype]).to(DEVICE)
    eng = lzt.initialize(model, config(stage, dtype, WORLD), comm())
    assert eng.engine.world_size == WORLD and eng.engine.info["deterministic"]
    assert eng.engine.device == ("cuda" if DEVICE.type == "cuda" else None)
    losses = []
    for s in range(STEPS):
        loss = eng(*on_device(s, RANK))
        eng.backward(loss)
        result = eng.step()
        assert result is not None and result.step == s + 1 and not result.skipped
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses  # it learns
    got = bits(eng.full_parameters())
    if stage < 3:  # the model's own params are the engine's memory
        assert bits({n: p.detach() for n, p in model.named_parameters() if n in got}) == got
    eng.close()
    assert got == reference(dtype)


@pytest.mark.skipif(WORLD != 1, reason="one process")
def test_torch_adamw_on_the_full_batch_agrees_within_one_rounding_per_step():
    """torch's AdamW and libzero's perform the same update with operations in a different order, and the full
    batch's mean loss is reduced in a different order than two micro-batches' means averaged: each step may differ
    by a rounding of the weight (2^-21 for |w| < 4, the model's range), so after STEPS steps |Δw| <= STEPS x 2^-21.
    Two documented differences are left out: a param that never gets a gradient ('unused') is decayed by libzero
    (and DeepSpeed) but skipped by torch."""
    n = 2
    eng = lzt.initialize(make_model(), config(0, "fp32", 1, gas=n), libzero.Comm.single())
    for s in range(STEPS):
        for r in range(n):
            eng.backward(eng(*batch(s, r)))
            eng.step()
    mine = eng.full_parameters()
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    for s in range(STEPS):
        xs, ys = zip(*(batch(s, r) for r in range(n)))
        model(torch.cat(xs), torch.cat(ys)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # DeepSpeed's (and libzero's) default clipping
        opt.step()
        opt.zero_grad()
    tolerance = STEPS * 2.0**-21
    for name, p in model.named_parameters():
        if name.startswith("unused"):
            continue
        assert (p.detach() - mine[name]).abs().max().item() <= tolerance, name


@pytest.mark.skipif(WORLD != 1, reason="one process")
def test_a_client_optimizer_stands_for_the_config_s_optimizer_block():
    def run(client: bool) -> dict[str, bytes]:
        model = make_model()
        cfg = config(2, "fp32", 1)
        cfg["optimizer"]["params"].update(betas=[0.8, 0.95], eps=1e-7)
        opt = None
        if client:
            del cfg["optimizer"]
            opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01, betas=(0.8, 0.95), eps=1e-7)
        eng = lzt.initialize(model, cfg, libzero.Comm.single(), optimizer=opt)
        for s in range(3):
            eng.backward(eng(*batch(s, 0)))
            eng.step()
        out = bits(eng.full_parameters())
        eng.close()
        return out

    assert run(client=True) == run(client=False)
    model = make_model()
    with pytest.warns(UserWarning, match="client optimizer"):  # DeepSpeed's rule: the client optimizer wins
        eng = lzt.initialize(model, config(2, "fp32", 1), libzero.Comm.single(),
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.5))
    eng.backward(eng(*batch(0, 0)))
    assert eng.step().lr == 0.5
    eng.close()


@pytest.mark.skipif(WORLD != 1, reason="one process")
def test_a_client_optimizer_s_param_groups_keep_their_hyper_parameters():
    """SGD with two groups (the weights at lr 0.1, everything else at 0.05), one step without clipping, against
    torch's SGD: the same update w - lr * g, to within torch's fused multiply-add (one rounding)."""

    def groups(model):
        weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
        others = [p for n, p in model.named_parameters() if not n.endswith("weight")]
        return [{"params": weights}, {"params": others, "lr": 0.05}]

    model = make_model()
    cfg = config(1, "fp32", 1, gradient_clipping=0.0)
    del cfg["optimizer"]
    eng = lzt.initialize(model, cfg, libzero.Comm.single(), optimizer=torch.optim.SGD(groups(model), lr=0.1))
    eng.backward(eng(*batch(0, 0)))
    eng.step()
    mine = eng.full_parameters()
    eng.close()

    ref = make_model()
    opt = torch.optim.SGD(groups(ref), lr=0.1)
    ref(*batch(0, 0)).backward()
    opt.step()
    start = dict(make_model().named_parameters())
    for name, p in ref.named_parameters():
        if name.startswith("unused"):
            continue
        torch.testing.assert_close(mine[name], p.detach(), rtol=2**-23, atol=2**-24)
    moved = (mine["pos"] - start["pos"].detach()).abs().max().item()
    assert 0 < moved  # the second group did move, at its own rate (checked against torch's above)


@pytest.mark.skipif(WORLD != 1, reason="one process")
def test_gradient_accumulation_steps_at_the_boundary_only():
    eng = lzt.initialize(make_model(), config(2, "fp32", 1, gas=3), libzero.Comm.single())
    results = []
    for m in range(6):
        eng.backward(eng(*batch(m, 0)))
        results.append(eng.step())
    assert [r is not None for r in results] == [False, False, True, False, False, True]
    assert results[-1].step == 2
    eng.close()


@pytest.mark.skipif(WORLD != 1, reason="one process")
def test_an_evaluation_forward_at_stage3_leaves_no_unit_gathered():
    eng = lzt.initialize(make_model(), config(3, "fp32", 1), libzero.Comm.single())
    with torch.no_grad():
        loss = eng(*batch(0, 0))
    assert torch.isfinite(loss)
    assert not any(eng.engine.unit_info(u)["gathered"] for u in range(eng.engine.num_units))
    eng.backward(eng(*batch(0, 0)))  # and training goes on
    assert eng.step() is not None
    eng.close()


@pytest.mark.skipif(WORLD != 1, reason="one process")
@pytest.mark.parametrize("stage", [1, 3])
def test_a_checkpoint_resumes_the_same_bits(tmp_path, stage):
    def engine():
        return lzt.initialize(make_model(), config(stage, "fp32", 1), libzero.Comm.single())

    straight = engine()
    for s in range(4):
        straight.backward(straight(*batch(s, 0)))
        straight.step()
        if s == 1:
            straight.save_checkpoint(str(tmp_path), "s1")
    expected = bits(straight.full_parameters())
    straight.close()
    resumed = engine()
    resumed.load_checkpoint(str(tmp_path))
    for s in (2, 3):
        resumed.backward(resumed(*batch(s, 0)))
        resumed.step()
    assert bits(resumed.full_parameters()) == expected
    resumed.close()


@pytest.mark.skipif(WORLD != 1, reason="one process")
def test_fp16_scales_the_loss_and_trains():
    cfg = config(2, "fp32", 1, fp16={"enabled": True, "initial_scale_power": 8})
    eng = lzt.initialize(make_model(dtype=torch.float16), cfg, libzero.Comm.single())
    assert eng.loss_scale == 256.0
    first = last = None
    for s in range(STEPS):
        loss = eng(*batch(s, 0))
        eng.backward(loss)
        eng.step()
        first = loss.item() if first is None else first
        last = loss.item()
    assert last < first - 0.5
    eng.close()


def _gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def _gpt2_batch(step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step + rank)
    return (torch.randint(0, 64, (4, 1), generator=g) + torch.arange(16) * 3) % 64


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_hugging_face_gpt2_trains_to_the_one_process_weights(stage):
    """transformers' GPT2LMHeadModel built from a config (no download): tied input and output embeddings, its blocks
    in transformer.h (a ModuleList), keyword arguments and a ModelOutput."""
    model = _gpt2()
    eng = lzt.initialize(model, config(stage, "fp32", WORLD), comm())
    assert eng.engine.num_units == 4  # the embeddings, 2 blocks, the final norm
    first = None
    for s in range(STEPS):
        ids = _gpt2_batch(s, RANK)
        out = eng(input_ids=ids, labels=ids)
        eng.backward(out.loss)
        eng.step()
        first = out.loss.item() if first is None else first
    assert out.loss.item() < first
    got = bits(eng.full_parameters())
    eng.close()

    ref = lzt.initialize(_gpt2(), config(0, "fp32", 1, gas=WORLD), libzero.Comm.single())
    for s in range(STEPS):
        for r in range(WORLD):
            ids = _gpt2_batch(s, r)
            ref.backward(ref(input_ids=ids, labels=ids).loss)
            ref.step()
    assert got == bits(ref.full_parameters())
    ref.close()


# ---- models that trip simple stage-3 schemes ----------------------------------------------------------------------
class _Out:
    """A block's output that is not a tensor, tuple or dict."""

    def __init__(self, h: torch.Tensor) -> None:
        self.h = h


class _Block(torch.nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        if mode == "moe":  # a ModuleList inside a block
            self.experts = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))

    def forward(self, x: torch.Tensor) -> Any:
        h = x + self.b(torch.tanh(self.a(x)))
        if self.mode == "moe":
            h = h + sum(e(h) for e in self.experts)
        if self.mode == "aux":  # an auxiliary loss kept on the module, added outside (MoE load balancing)
            self.aux = (self.a.weight**2).sum() * 1e-3
        if self.mode == "complex":  # a view that reinterprets the param's bytes
            h = h + torch.view_as_complex(self.a.weight.reshape(-1, 2)).abs().mean()
        return _Out(h) if self.mode == "object" else h


class _Model(torch.nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.inp = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.ModuleList(_Block(mode) for _ in range(3))
        self.out = torch.nn.Linear(8, 1)
        if mode == "tied":
            self.blocks[2].a.weight = self.blocks[0].a.weight
        if mode == "weight_norm":  # a forward pre-hook of the user's that reads the params
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.out = torch.nn.utils.weight_norm(self.out)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h, aux = self.inp(x), 0.0
        for b in self.blocks:
            if self.mode in ("checkpoint", "reentrant"):
                h = torch.utils.checkpoint.checkpoint(b, h, use_reentrant=self.mode == "reentrant")
            elif self.mode == "user_hooks":  # the user's own saved-tensor hooks (these ones change nothing)
                with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                    h = b(h)
            else:
                h = b(h)
            h = h.h if self.mode == "object" else h
            aux = aux + (b.aux if self.mode == "aux" else 0.0)
        return torch.nn.functional.mse_loss(self.out(h), y) + aux


def _sgd_stage3(model: torch.nn.Module) -> lzt.TorchEngine:
    """A one-process stage-3 engine with plain SGD, for tests about stage 3's handling of the model."""
    return lzt.initialize(model, {"train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
                                  "zero_optimization": {"stage": 3}}, libzero.Comm.single())


def _train_model(mode: str, stage: int, steps: int = 3, between=None) -> dict[str, bytes]:
    torch.manual_seed(0)
    cfg = {"train_batch_size": 4, "gradient_clipping": 0.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    eng = lzt.initialize(_Model(mode), cfg, libzero.Comm.single())
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(4, 4, generator=g), torch.randn(4, 1, generator=g)
        loss = eng(x, y)
        if between is not None:
            between(eng, x, y)
        eng.backward(loss)
        eng.step()
    out = bits(eng.full_parameters())
    eng.close()
    return out


@pytest.mark.skipif(WORLD != 1, reason="one process")
@pytest.mark.parametrize(
    "mode", ["plain", "object", "aux", "moe", "tied", "checkpoint", "reentrant", "user_hooks", "complex", "weight_norm"]
)
def test_stage3_follows_gradients_wherever_they_flow(mode):
    """Block outputs that are objects, losses kept on modules, lists inside blocks, weights tied across blocks,
    activation checkpointing (both kinds), the user's own saved-tensor hooks, views that reinterpret a param's bytes
    and pre-hooks that read params: stage 3 re-gathers whatever backward needs, or leaves the memory to what still
    holds it, and every one gives stage 0's bits."""
    assert _train_model(mode, 3) == _train_model(mode, 0)


@pytest.mark.skipif(WORLD != 1, reason="one process")
def test_stage3_releases_blocks_during_backward_even_with_unused_params():
    """At most a block or two gathered at a time in backward, although a param of every block gets no gradient."""

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.used(x))

    class Partly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)
            return x.sum()

    eng = lzt.initialize(Partly(), {"train_batch_size": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
                                    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}},
                         libzero.Comm.single())
    peak = [0]
    gather = eng._gather

    def counting(u):
        gather(u)
        peak[0] = max(peak[0], sum(1 for v in eng._gathered if v in eng._block_module))

    eng._gather = counting
    for _ in range(2):
        eng.backward(eng(torch.randn(2, 16)))
        eng.step()
    assert peak[0] <= 2, peak[0]
    eng.close()


@pytest.mark.skipif(WORLD != 1, reason="one process")
def test_torch_autograd_grad_and_user_hooks_at_stage3_see_real_params():
    torch.manual_seed(0)
    model = _Model("plain")
    eng = _sgd_stage3(model)
    seen = []
    model.inp.weight.register_hook(lambda g: seen.append(float(model.inp.weight.sum())))
    loss = eng(torch.randn(4, 4), torch.randn(4, 1))
    (g,) = torch.autograd.grad(loss, [model.inp.weight])
    assert g.shape == (8, 4) and seen and all(v == v for v in seen)  # read without a crash, finite
    eng.close()


@pytest.mark.skipif(WORLD != 1, reason="one process")
def test_a_second_gradient_for_a_param_in_one_backward_is_a_clear_error():
    class Shared(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(2):  # the same block twice, each under reentrant checkpointing: two accumulations
                x = torch.utils.checkpoint.checkpoint(self.blocks[0], x, use_reentrant=True)
            return x.sum()

    eng = lzt.initialize(Shared(), {"train_batch_size": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}},
                         libzero.Comm.single())
    with pytest.raises(RuntimeError, match="second gradient.*use_reentrant=False"):
        eng.backward(eng(torch.randn(2, 4, requires_grad=True)))
    eng.engine.close()


@pytest.mark.skipif(WORLD != 1, reason="one process")
def test_close_after_the_engine_failed_still_destroys_it_and_removes_the_hooks():
    torch.manual_seed(0)
    model = _Model("plain")
    eng = _sgd_stage3(model)
    eng.engine.abort()
    with pytest.raises(libzero.AbortedError):
        eng.close()
    assert eng.engine.closed
    hooks = [m._forward_pre_hooks for m in model.modules()] + [m._forward_hooks for m in model.modules()]
    assert not any(hooks)  # the model is the user's again (its trained params empty: the values died with it)


@pytest.mark.skipif(WORLD != 1, reason="one process")
def test_a_no_grad_forward_between_forward_and_backward_leaves_the_training_forward_alone():
    def evaluate(eng, x, y):  # an EMA/teacher/metric pass in the middle of a micro-step
        with torch.no_grad():
            eng(x, y)

    assert _train_model("plain", 3, between=evaluate) == _train_model("plain", 0)


@pytest.mark.skipif(WORLD != 1, reason="one process")
def test_stage3_params_between_steps_are_empty_placeholders_not_freed_memory():
    torch.manual_seed(0)
    model = _Model("plain")
    eng = _sgd_stage3(model)
    w = model.blocks[0].a.weight
    assert w.shape == (0,) and float(w.sum()) == 0.0  # readable, clearly not the weights
    full = eng.full_parameters()["blocks.0.a.weight"]
    assert full.shape == (8, 8)
    eng.close()  # gives the model back: plain tensors with the current values
    assert torch.equal(model.blocks[0].a.weight.detach(), full)
    loss = model(torch.randn(2, 4), torch.randn(2, 1))
    loss.backward()  # no libzero hook left
    assert model.blocks[0].a.weight.grad is not None


def test_stage3_with_the_whole_model_in_one_unit_warns_that_it_saves_nothing():
    big = torch.nn.Linear(1100, 1000)  # 1.1 M params and no block list: one unit
    with pytest.warns(UserWarning, match="stage 3 with one unit"):
        eng = lzt.initialize(big, config(3, "fp32", WORLD), comm())
    eng.close()
    small = torch.nn.Linear(8, 8)  # a small model in one unit is no mistake
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        eng = lzt.initialize(small, config(3, "fp32", WORLD), comm())
    eng.close()


@pytest.mark.skipif(WORLD != 1, reason="one process")
def test_a_bf16_config_casts_frozen_params_and_buffers_as_deepspeed_does():
    class LoRA(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base = torch.nn.Linear(8, 8)
            self.base.requires_grad_(False)
            self.a, self.b = torch.nn.Linear(8, 2, bias=False), torch.nn.Linear(2, 8, bias=False)
            self.register_buffer("scale", torch.tensor(0.5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (self.base(x) + self.scale * self.b(self.a(x))).float().pow(2).mean()

    model = LoRA()
    eng = lzt.initialize(model, {"train_batch_size": 2, "bf16": {"enabled": True},
                                 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}, libzero.Comm.single())
    assert {t.dtype for t in list(model.parameters()) + list(model.buffers())} == {torch.bfloat16}
    eng.backward(eng(torch.randn(2, 8, dtype=torch.bfloat16)))
    assert eng.step() is not None
    eng.close()


@pytest.mark.skipif(WORLD != 1, reason="one process")
def test_client_optimizer_options_libzero_does_not_run_are_refused_in_every_group():
    model = make_model()
    params = list(model.parameters())
    for opt in (torch.optim.AdamW(params, maximize=True),
                torch.optim.SGD([{"params": params[:2]}, {"params": params[2:], "momentum": 0.9}], lr=0.1),
                torch.optim.Adam([{"params": params[:2]}, {"params": params[2:]}], amsgrad=True)):
        with pytest.raises(NotImplementedError, match="param group"):
            lzt.optimizer_block(opt)
    adam = torch.optim.Adam([{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.1}])
    assert lzt.optimizer_block(adam)["params"]["adam_w_mode"] is False  # torch's Adam: L2 decay in the gradient


@pytest.mark.skipif(WORLD == 1, reason="several ranks")
def test_frozen_params_and_buffers_take_rank_0_s_values_as_in_deepspeed():
    torch.manual_seed(RANK)  # every rank builds a different model
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))
    model[0].requires_grad_(False)
    with torch.no_grad():
        model[1].running_mean.fill_(float(RANK))
    eng = lzt.initialize(model, config(1, "fp32", WORLD), comm())
    torch.manual_seed(0)
    rank0 = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))
    assert torch.equal(model[0].weight, rank0[0].weight) and torch.equal(model[2].weight.detach(), rank0[2].weight)
    assert torch.equal(model[1].running_mean, torch.zeros(4))
    eng.close()


# DeepSpeed's documented ZeRO-2 (fp16) and ZeRO-3 (bf16) configs, which leave the optimizer to the client.
_DS_DOC_CONFIGS = {
    "zero2-fp16": {
        "train_micro_batch_size_per_gpu": 4,
        "fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                 "hysteresis": 2, "min_loss_scale": 1},
        "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 2e8,
                              "overlap_comm": True, "reduce_scatter": True, "reduce_bucket_size": 2e8,
                              "contiguous_gradients": True},
    },
    "zero3-bf16": {
        "train_micro_batch_size_per_gpu": 4,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True, "sub_group_size": 1e9,
                              "reduce_bucket_size": 1e6, "stage3_prefetch_bucket_size": 1e6,
                              "stage3_param_persistence_threshold": 1e4, "stage3_max_live_parameters": 1e9,
                              "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": True},
        "gradient_clipping": 1.0,
        "steps_per_print": 2000,
        "wall_clock_breakdown": False,
    },
}


@pytest.mark.skipif(WORLD != 1, reason="one process")
@pytest.mark.parametrize("name", sorted(_DS_DOC_CONFIGS))
def test_deepspeed_s_documented_configs_train_with_a_client_optimizer(name):
    model = make_model()
    eng = lzt.initialize(model, _DS_DOC_CONFIGS[name], libzero.Comm.single(),
                         optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3))
    losses = []
    for s in range(10):
        loss = eng(*batch(s, 0))
        eng.backward(loss)
        result = eng.step()
        losses.append(loss.item())
    assert not result.skipped and losses[-1] < losses[0] - 0.3, losses
    eng.close()


@pytest.mark.skipif(LAUNCH != "torchrun", reason="torchrun's default transport")
def test_torchrun_on_one_machine_runs_over_shared_memory_unless_told_otherwise():
    told = os.environ.get("ZERO_TORCH_TRANSPORT", "auto")
    assert comm().transport == ("custom" if told == "process_group" else "shm")


@pytest.mark.skipif(LAUNCH != "torchrun" or torch.cuda.is_available(), reason="torchrun on a machine without a GPU")
def test_torchrun_over_nccl_without_a_gpu_fails_alike_on_every_rank(monkeypatch):
    # ZERO_TORCH_TRANSPORT=nccl: libzero's NCCL module for the data, bootstrapped over shared memory. Where it cannot
    # run, every rank gets the same refusal at once (none waits for another), naming the call.
    monkeypatch.setenv("ZERO_TORCH_TRANSPORT", "nccl")
    with pytest.raises(libzero.errors.UnsupportedError, match="zero_comm_create_nccl"):
        lzt.default_comm()


@pytest.mark.skipif(LAUNCH != "torchrun" or not os.environ.get("ZERO_TORCH_MACHINE_ID"),
                    reason="torchrun across machines (agents that say they are on different ones)")
def test_torchrun_across_machines_runs_over_shared_memory_and_tcp():
    # Each torchrun agent's ranks say their own machine: not one machine, so "shm" here is the communicator across
    # machines (the fallback would be the process group's, "custom").
    assert int(os.environ["LOCAL_WORLD_SIZE"]) < WORLD
    assert comm().transport == "shm"
    assert comm().machines == WORLD // int(os.environ["LOCAL_WORLD_SIZE"])


@pytest.mark.skipif(LAUNCH == "single" or os.environ.get("ZERO_TORCH_TRANSPORT") == "process_group",
                    reason="several ranks, over a transport with libzero's failure safety")
def test_a_rank_that_aborts_is_named_by_the_others_within_seconds():
    import time

    eng = lzt.initialize(make_model(), config(2, "fp32", WORLD), comm())
    eng.backward(eng(*batch(0, RANK)))
    if RANK == WORLD - 1:
        eng.engine.abort()
    else:
        began = time.monotonic()
        with pytest.raises(libzero.errors.RemoteError, match=f"rank {WORLD - 1}"):
            eng.step()
        assert time.monotonic() - began < 10
    eng.engine.close()



def test_a_cpu_or_meta_model_trains_on_the_cpu_engine():
    """The device engine is chosen by the model's params: a CPU model, a meta-device one (its params take the
    engine's memory) and a mix of the two need none. (A CUDA model's device engine is the GPU check's.)"""
    from libzero.torch.engine import _cuda_device

    assert _cuda_device(list(torch.nn.Linear(3, 2).named_parameters())) is None
    assert _cuda_device(list(torch.nn.Linear(3, 2, device="meta").named_parameters())) is None
    mixed = [("a", torch.nn.Parameter(torch.zeros(2))), ("b", torch.nn.Parameter(torch.zeros(2, device="meta")))]
    assert _cuda_device(mixed) is None
    engine = lzt.initialize(torch.nn.Linear(3, 2), {"train_batch_size": 1, "optimizer": {"type": "SGD", "params":
                                                     {"lr": 0.1}}}, comm=libzero.Comm.single())
    assert engine.engine.device is None
    engine.close()
