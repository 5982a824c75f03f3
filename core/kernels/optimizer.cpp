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
      AdamScalars& a = s.adam;
      a.beta1 = static_cast<float>(h.beta1);
      a.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
      a.beta2 = static_cast<float>(h.beta2);
      a.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
      a.step_size = static_cast<float>(h.lr / bc1);
      a.inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bc2));
      a.eps = static_cast<float>(h.eps);
      a.l2 = decoupled ? 0.0f : static_cast<float>(h.weight_decay);
      a.decay = decoupled ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f;
      break;
    }
    case OptimizerKind::kAdagrad:
      s.adagrad = AdagradScalars{};
      s.adagrad.lr = static_cast<float>(h.lr);
      s.adagrad.eps = static_cast<float>(h.eps);
      s.adagrad.l2 = static_cast<float>(h.weight_decay);
      break;
    case OptimizerKind::kLion:
      s.lion = LionScalars{};
      s.lion.beta1 = static_cast<float>(h.beta1);
      s.lion.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
      s.lion.beta2 = static_cast<float>(h.beta2);
      s.lion.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
      s.lion.lr = static_cast<float>(h.lr);
      s.lion.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
      break;
    case OptimizerKind::kSgd:
      s.sgd = SgdScalars{};
      s.sgd.momentum = static_cast<float>(h.momentum);
      s.sgd.one_minus_dampening = static_cast<float>(1.0 - h.dampening);
      s.sgd.lr = static_cast<float>(h.lr);
      s.sgd.l2 = static_cast<float>(h.weight_decay);
      s.sgd.nesterov = h.nesterov;
      s.sgd.first_step = step == 1;
      break;
  }
  return s;
}

}  // namespace zero
