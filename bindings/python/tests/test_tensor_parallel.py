"""ZeRO beside tensor parallelism in libzero.torch, under torchrun with 2 tensor-parallel ranks (4 ranks: 2 x 2, 6
ranks: 2 x 3 data-parallel): examples/python/tensor_parallel.py's Megatron-style GPT, given DeepSpeed's ``mpu``.

Every param's gradient is a dyadic value the test chooses (the loss is the forward's output times zero plus
sum(param x G), each product taken while the param is gathered), so that sums over ranks and micro-steps are exact
and the whole job must train, bit for bit, to the weights of one process holding the whole model and stepping once
per D x G micro-steps (one per data-parallel rank and micro-step), with clipping engaged: every tensor-parallel rank
clips by the whole model's norm, its LayerNorms and row-parallel biases counted once."""

from __future__ import annotations

import importlib.util
import os
import zlib

import pytest
import torch
import torch.distributed as dist

import libzero
import libzero.torch as lzt

torch.set_num_threads(1)

_EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "python", "tensor_parallel.py")
_spec = importlib.util.spec_from_file_location("tensor_parallel_example", _EXAMPLE)
tp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tp)

if not dist.is_initialized():
    dist.init_process_group("gloo")
TP = 2
STEPS = 6
GAS = 2
CLIP = 0.6  # the norms are near 0.4, 0.8 and 1.2 on steps with factors 1, 2 and 3 (0.35, 0.7 and 1.0 on 6 ranks)


def teardown_module() -> None:
    import gc

    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def whole_gradient(name: str, shape: torch.Size, step: int, micro: int, dp: int) -> torch.Tensor:
    """The gradient data-parallel rank ``dp`` adds to the whole param ``name``: multiples of 2^-10."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}/{step}/{micro}/{dp}".encode()))
    return torch.randint(-8, 9, tuple(shape), generator=g).float() * 2.0**-10 * (step % 3 + 1)


part = tp.part_of


class Probes:
    """Forward pre-hooks (after the engine's, which gather a unit) adding sum(param x G) for each param of a module,
    so that backward gives each param exactly G."""

    def __init__(self, model: torch.nn.Module, whole_shapes: dict[str, torch.Size], size: int, rank: int) -> None:
        self.terms: list[torch.Tensor] = []
        self.step = self.micro = self.dp = 0
        for prefix, module in model.named_modules():
            own = [(f"{prefix}.{k}" if prefix else k, p) for k, p in module._parameters.items() if p is not None]
            if own:
                module.register_forward_pre_hook(self._hook(own, whole_shapes, size, rank))

    def _hook(self, own, whole_shapes, size, rank):
        def hook(module, inputs):
            for name, p in own:
                g = part(whole_gradient(name, whole_shapes[name], self.step, self.micro, self.dp), p, size, rank)
                self.terms.append((p * g).sum())

        return hook

    def loss(self, output: torch.Tensor) -> torch.Tensor:
        total = output.sum() * 0.0 + sum(self.terms)
        self.terms = []
        return total


def config(stage: int, gas: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": CLIP,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
    }


@pytest.mark.parametrize("stage,given", [(0, "mpu"), (1, "mpu"), (2, "mpu"), (3, "mpu"), (2, "groups")])
def test_every_part_equals_the_whole_model_s_one_process_weights(stage, given):
    mpu = tp.ModelParallelUnit(TP)
    tp_rank, dp_rank, dp = mpu.get_tensor_model_parallel_rank(), dist.get_rank(mpu.data_group), mpu.dp
    model = tp.TensorParallelGPT(group=mpu.model_group, size=TP, rank=tp_rank)
    whole_values = tp.whole_init(model)
    tp.load_part(model, whole_values)
    if given == "mpu":
        engine = lzt.initialize(model, config(stage, GAS), mpu=mpu)
    else:  # the model-parallel group is the tensor-parallel one (no pipeline)
        engine = lzt.initialize(
            model, config(stage, GAS), dp_group=mpu.data_group, mp_group=mpu.model_group, tp_group=mpu.model_group
        )
    whole_model = tp.TensorParallelGPT()
    tp.load_part(whole_model, whole_values)
    reference = lzt.initialize(whole_model, config(stage, GAS * dp), comm=libzero.Comm.single())
    shapes = {n: v.shape for n, v in whole_values.items()}
    probes, whole_probes = Probes(model, shapes, TP, tp_rank), Probes(whole_model, shapes, 1, 0)
    tokens = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(5))
    clipped = 0
    for step in range(1, STEPS + 1):
        for micro in range(GAS):
            probes.step, probes.micro, probes.dp = step, micro, dp_rank
            engine.backward(probes.loss(engine(tokens)))
            engine.step()
            for d in range(dp):  # the whole job's micro-steps, in one process
                whole_probes.step, whole_probes.micro, whole_probes.dp = step, micro, d
                reference.backward(whole_probes.loss(reference(tokens)))
                reference.step()
        norm = engine.get_global_grad_norm()
        assert norm == reference.get_global_grad_norm(), f"step {step}: the norms differ"
        clipped += norm > CLIP
        mine, whole = engine.full_parameters(), reference.full_parameters()
        params = dict(model.named_parameters())
        for name, value in mine.items():
            want = part(whole[name], params[name], TP, tp_rank)
            assert torch.equal(value, want), f"step {step}: {name} on tensor-parallel rank {tp_rank} differs"
    assert 0 < clipped < STEPS, f"clipping engaged on {clipped} of {STEPS} steps"
    engine.close()
    reference.close()


def test_a_model_with_tensor_parallel_params_and_no_groups_is_refused():
    model = tp.TensorParallelGPT()
    with pytest.raises(ValueError, match="tensor_model_parallel"):
        lzt.initialize(model, config(1, 1))


def test_groups_that_do_not_make_up_the_job_are_refused():
    mpu = tp.ModelParallelUnit(TP)
    model = tp.TensorParallelGPT(group=mpu.model_group, size=TP, rank=mpu.get_tensor_model_parallel_rank())
    with pytest.raises(ValueError, match="do not make up the job"):
        lzt.initialize(model, config(1, 1), dp_group=mpu.data_group, mp_group=dist.new_group(backend="gloo"))


def test_a_model_parallel_group_without_a_tensor_parallel_rank_is_refused():
    mpu = tp.ModelParallelUnit(TP)
    model = tp.TensorParallelGPT(group=mpu.model_group, size=TP, rank=mpu.get_tensor_model_parallel_rank())
    with pytest.raises(ValueError, match="tp_group="):
        lzt.initialize(model, config(1, 1), dp_group=mpu.data_group, mp_group=mpu.model_group)


def test_sequence_parallel_params_are_refused():
    mpu = tp.ModelParallelUnit(TP)
    model = tp.TensorParallelGPT(group=mpu.model_group, size=TP, rank=mpu.get_tensor_model_parallel_rank())
    model.ln_f.weight.sequence_parallel = True
    with pytest.raises(ValueError, match="sequence_parallel"):
        lzt.initialize(model, config(1, 1), mpu=mpu)


def test_the_parts_compute_the_whole_model_s_forward():
    """The split model is the whole model: the same logits up to the order of each split sum (a row-parallel or
    vocab-parallel sum adds TP partial sums, each of at most 128 products of values below 4 in magnitude: a
    reassociated fp32 sum of n terms moves by at most n x 2^-24 x the sum of their magnitudes, under 1e-4 here through
    the two blocks and the head)."""
    mpu = tp.ModelParallelUnit(TP)
    model = tp.TensorParallelGPT(group=mpu.model_group, size=TP, rank=mpu.get_tensor_model_parallel_rank())
    whole_values = tp.whole_init(model)
    tp.load_part(model, whole_values)
    whole_model = tp.TensorParallelGPT()
    tp.load_part(whole_model, whole_values)
    tokens = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        split, whole = model(tokens), whole_model(tokens)
    assert (split - whole).abs().max().item() < 1e-4
