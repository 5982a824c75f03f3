#include "step/scheduler.hpp"

#include <algorithm>
#include <cmath>

namespace zero {

// DeepSpeed's engine steps the scheduler after the optimizer, and builds it at last_batch_iteration = -1: so
// optimizer step 1 runs with the schedule at iteration -1, and step k >= 2 with iteration k - 2 (checked against
// DeepSpeed 0.19.8's own numbers: tests/deepspeed/fixtures.json, tests/unit/deepspeed_test.cpp).
double scheduled_lr(const SchedulerConfig& s, double base_lr, int64_t step) {
  if (s.kind == SchedulerConfig::Kind::kNone) return base_lr;
  const int64_t iteration = step <= 1 ? -1 : step - 2;
  const double it = static_cast<double>(iteration);
  const double warmup = static_cast<double>(std::max<int64_t>(2, s.warmup_num_steps));
  const bool warming = it < warmup;
  // DeepSpeed's exact expressions (inverse_log_warm_up x log(it + 1)), so that the rates agree to the last bit.
  const double warm_gamma = s.warmup_log ? (1.0 / std::log(warmup)) * std::log(it + 1.0) : it / warmup;
  switch (s.kind) {
    case SchedulerConfig::Kind::kWarmupLR:
    case SchedulerConfig::Kind::kWarmupDecayLR: {
      const double max_lr = s.warmup_max_lr_given ? s.warmup_max_lr : base_lr;
      if (iteration < 0) return s.warmup_min_lr;  // DeepSpeed: "before it has started", the minimum
      double gamma = warm_gamma;
      if (!warming) {
        const double total = static_cast<double>(s.total_num_steps);
        gamma = s.kind == SchedulerConfig::Kind::kWarmupLR
                    ? 1.0
                    : std::max(0.0, (total - it) / std::max(1.0, total - warmup));
      }
      return s.warmup_min_lr + (max_lr - s.warmup_min_lr) * gamma;
    }
    case SchedulerConfig::Kind::kWarmupCosineLR: {
      if (iteration < 0) return 0.0;  // DeepSpeed: ratio 0 before it has started
      double ratio;
      if (warming) {
        ratio = s.warmup_min_ratio + warm_gamma * (1.0 - s.warmup_min_ratio);
      } else {
        const double real_last = it - warmup + 1.0;
        const double real_total = std::max(1.0, static_cast<double>(s.total_num_steps) - warmup);
        const double progress = std::min(1.0, real_last / real_total);
        ratio = (1.0 + std::cos(M_PI * progress)) / 2.0;
        ratio = std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * ratio);
      }
      return base_lr * ratio;
    }
    case SchedulerConfig::Kind::kNone:
      break;
  }
  return base_lr;
}

}  // namespace zero
