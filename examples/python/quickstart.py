import numpy as np
import libzero

engine = libzero.Engine({"train_batch_size": 64, "zero_optimization": {"stage": 2},
                         "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}})
w = engine.add_param("w", (16,), init=np.zeros(16, np.float32))
engine.finalize()                                  # collective: every rank registered the same params
rng, w_true = np.random.default_rng(engine.rank), np.linspace(-1, 1, 16, dtype=np.float32)
for step in range(300):
    x = rng.standard_normal((32, 16)).astype(np.float32)   # this rank's batch
    with engine.gathered(0):
        err = x @ engine.param(w) - x @ w_true
        engine.grad(w)[...] += 2 * x.T @ err / len(x)        # your backward adds the gradient here
        engine.grad_ready(w)
    engine.backward_end()
    result = engine.step()
with engine.gathered(0):
    print(f"rank {engine.rank}/{engine.world_size}: step {result.step}, "
          f"max |w - w_true| = {np.abs(engine.param(w) - w_true).max():.1e}")
