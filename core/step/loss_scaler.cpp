#include "step/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

namespace zero {

LossScaler::LossScaler(const LossScaleConfig& config, bool enabled) : config_(config) {
  if (!enabled) return;
  dynamic_ = config.static_scale == 0.0;
  scale_ = dynamic_ ? std::ldexp(1.0, config.initial_scale_power) : config.static_scale;
  hysteresis_left_ = config.hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    if (config_.hysteresis == 1 || hysteresis_left_ <= 1) {
      skips_at_minimum_ = scale_ == config_.min_scale ? skips_at_minimum_ + 1 : 0;
      scale_ = std::max(scale_ / 2.0, config_.min_scale);
    } else {
      hysteresis_left_ -= 1;
    }
    last_overflow_iteration_ = iteration_;
  } else {
    skips_at_minimum_ = 0;
    if (config_.consecutive_hysteresis) hysteresis_left_ = config_.hysteresis;
    // DeepSpeed's stable interval: the steps without overflow before this one.
    const int64_t stable = iteration_ - last_overflow_iteration_ - 1;
    if (stable > 0 && stable % config_.window == 0) {
      if (!config_.consecutive_hysteresis) hysteresis_left_ = config_.hysteresis;
      scale_ *= 2.0;
    }
  }
  iteration_ += 1;
}

}  // namespace zero
