#include "kernels/no_fp_contraction.hpp"  // before anything else: no FMA contraction in this file

#include "kernels/optimizer.hpp"

#include <cmath>

namespace zero {

int state_count(const OptimizerHyper& h) {
  switch (h.kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdamL2:
      return 2;
    case OptimizerKind::kAdagrad:
    case OptimizerKind::kLion:
      return 1;
    case OptimizerKind::kSgd:
      return h.momentum != 0.0 ? 1 : 0;
  }
  return 0;
}

const char* optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW:
      return "AdamW";
    case OptimizerKind::kAdamL2:
      return "Adam";
    case OptimizerKind::kAdagrad:
      return "Adagrad";
    case OptimizerKind::kLion:
      return "Lion";
    case OptimizerKind::kSgd:
      return "SGD";
  }
  return "?";
}

const char* state_name(const OptimizerHyper& h, int index) {
  switch (h.kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdamL2:
      return index == 0 ? "exp_avg" : "exp_avg_sq";
    case OptimizerKind::kAdagrad:
      return "sum";
    case OptimizerKind::kLion:
      return "exp_avg";
    case OptimizerKind::kSgd:
      return "momentum_buffer";
  }
  return "";
}

StepScalars make_step_scalars(const OptimizerHyper& h, int64_t step, double grad_divisor, double grad_clip) {
  StepScalars s;
  s.grad_divisor = static_cast<float>(grad_divisor);
  s.grad_clip = static_cast<float>(grad_clip);
  const double t = static_cast<double>(step);
  switch (h.kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdamL2: {
      const double bc1 = h.bias_correction ? 1.0 - std::pow(h.beta1, t) : 1.0;
      const double bc2 = h.bias_correction ? 1.0 - std::pow(h.beta2, t) : 1.0;
      const bool decoupled = h.kind == OptimizerKind::kAdamW;
      s.a = static_cast<float>(h.beta1);
      s.b = static_cast<float>(1.0 - h.beta1);
      s.c = static_cast<float>(h.beta2);
      s.d = static_cast<float>(1.0 - h.beta2);
      s.e = static_cast<float>(h.lr / bc1);
      s.f = static_cast<float>(1.0 / std::sqrt(bc2));
      s.g = static_cast<float>(h.eps);
      s.h = decoupled ? 0.0f : static_cast<float>(h.weight_decay);
      s.i = decoupled ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f;
      break;
    }
    case OptimizerKind::kAdagrad:
      s.a = static_cast<float>(h.lr);
      s.b = static_cast<float>(h.eps);
      s.c = static_cast<float>(h.weight_decay);
      break;
    case OptimizerKind::kLion:
      s.a = static_cast<float>(h.beta1);
      s.b = static_cast<float>(1.0 - h.beta1);
      s.c = static_cast<float>(h.beta2);
      s.d = static_cast<float>(1.0 - h.beta2);
      s.e = static_cast<float>(h.lr);
      s.f = static_cast<float>(1.0 - h.lr * h.weight_decay);
      break;
    case OptimizerKind::kSgd:
      s.a = static_cast<float>(h.momentum);
      s.b = static_cast<float>(1.0 - h.dampening);
      s.c = static_cast<float>(h.lr);
      s.d = static_cast<float>(h.weight_decay);
      s.e = h.nesterov ? 1.0f : 0.0f;
      s.first_step = step == 1;
      break;
  }
  return s;
}

}  // namespace zero
