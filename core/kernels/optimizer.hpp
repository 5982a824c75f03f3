// An optimizer's hyper-parameters, and the per-step float constants the kernels use.
#pragma once

#include <cstdint>

#include "kernels/kernels.hpp"

namespace zero {

struct OptimizerHyper {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;  // Adam and Lion (DeepSpeed's defaults for both)
  double eps = 1e-8;                  // Adam; Adagrad (default 1e-10)
  double weight_decay = 0.0;
  bool bias_correction = true;             // Adam
  double momentum = 0.0, dampening = 0.0;  // SGD
  bool nesterov = false;                   // SGD
};

// The optimizer's name as DeepSpeed configs and libzero's checkpoints spell it: "AdamW" (decoupled weight decay),
// "Adam" (L2), "Adagrad", "Lion", "SGD".
const char* optimizer_name(OptimizerKind kind);
// Number of fp32 state tensors per element (Adam 2; Adagrad, Lion 1; SGD 1 with momentum, else 0).
int state_count(const OptimizerHyper& h);
// Their names, as checkpoints store them.
const char* state_name(const OptimizerHyper& h, int index);

// Constants for step number `step` (1-based, counting steps taken) of a kernel whose gradients are divided by
// `grad_divisor` and then multiplied by `grad_clip` first. Computed in double, rounded to float once.
StepScalars make_step_scalars(const OptimizerHyper& h, int64_t step, double grad_divisor, double grad_clip);

}  // namespace zero
