#include "scheduler.hpp"

#include <algorithm>
#include <cmath>

namespace zero {

double scheduled_lr(const SchedulerConfig& s, double base_lr, int64_t step) {
  if (s.kind == SchedulerConfig::Kind::kNone) return base_lr;
  const double it = static_cast<double>(step - 1);
  const double warmup = static_cast<double>(std::max<int64_t>(2, s.warmup_num_steps));
  const bool warming = it < warmup;
  const double warm_gamma = s.warmup_log ? std::log(it + 1.0) / std::log(warmup) : it / warmup;
  switch (s.kind) {
    case SchedulerConfig::Kind::kWarmupLR:
      return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * (warming ? warm_gamma : 1.0);
    case SchedulerConfig::Kind::kWarmupDecayLR: {
      const double total = static_cast<double>(s.total_num_steps);
      const double gamma = warming ? warm_gamma : std::max(0.0, (total - it) / std::max(1.0, total - warmup));
      return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
    }
    case SchedulerConfig::Kind::kWarmupCosineLR: {
      double ratio;
      if (warming) {
        ratio = s.warmup_min_ratio + (1.0 - s.warmup_min_ratio) * warm_gamma;
      } else {
        const double total = static_cast<double>(s.total_num_steps);
        const double progress = (it - warmup + 1.0) / (total - warmup);
        ratio = std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * (1.0 + std::cos(M_PI * progress)) / 2.0);
      }
      return base_lr * ratio;
    }
    case SchedulerConfig::Kind::kNone:
      break;
  }
  return base_lr;
}

}  // namespace zero
