#include "optim/adam.hpp"

#include <cmath>

namespace zero {

void adam_update(float* params, const float* grads, float* m, float* v, size_t n_elems, float grad_factor,
                 const AdamHyper& h, int64_t step) {
  double bc1 = h.bias_correction ? 1.0 - std::pow(h.beta1, static_cast<double>(step)) : 1.0;
  double bc2 = h.bias_correction ? 1.0 - std::pow(h.beta2, static_cast<double>(step)) : 1.0;
  const float beta1 = static_cast<float>(h.beta1);
  const float beta2 = static_cast<float>(h.beta2);
  const float one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  const float one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  const float step_size = static_cast<float>(h.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = static_cast<float>(h.eps);
  const float l2 = h.decoupled_weight_decay ? 0.0f : static_cast<float>(h.weight_decay);
  const float decay = h.decoupled_weight_decay ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f;
  // Compiled with -ffp-contract=off (see CMakeLists.txt): no FMA may merge these operations.
  for (size_t i = 0; i < n_elems; ++i) {
    float p = params[i];
    float g = grads[i] * grad_factor;
    g = g + l2 * p;
    float mi = beta1 * m[i] + one_minus_beta1 * g;
    float vi = beta2 * v[i] + one_minus_beta2 * (g * g);
    float denom = std::sqrt(vi) * inv_sqrt_bc2 + eps;
    p = p * decay;
    p = p - step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
    params[i] = p;
  }
}

}  // namespace zero
