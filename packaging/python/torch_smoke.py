"""libzero.torch from an installed wheel with PyPI's torch: a small regression model trained at stage 3 (every rank
its own batch), the loss checked to fall. Run alone or under mpirun."""

import torch

import libzero.torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
          "zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
engine = libzero.torch.initialize(model, config)
generator = torch.Generator().manual_seed(1 + engine.engine.rank)
w_true = torch.linspace(-1, 1, 16)
losses = []
for _ in range(100):
    x = torch.randn(8, 16, generator=generator)
    loss = torch.nn.functional.mse_loss(engine(x).squeeze(1), torch.tanh(x @ w_true))
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
assert last < 0.5 * first, (first, last)
print(f"rank {engine.engine.rank}/{engine.engine.world_size}: libzero.torch {libzero.__version__} with torch {torch.__version__}, "
      f"loss {first:.3f} -> {last:.3f}")
