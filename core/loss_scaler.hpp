// fp16 loss scaling with DeepSpeed's semantics (DynamicLossScaler):
//  - the scale starts at 2^initial_scale_power (default 2^16);
//  - on an overflow the step is skipped; the scale is halved (never below min_loss_scale) once `hysteresis`
//    overflows have used up the tolerance (each overflow before that only decrements the remaining tolerance);
//  - after `loss_scale_window` consecutive steps without overflow since the last one, the scale doubles (and the
//    tolerance is restored);
//  - consecutive_hysteresis restores the tolerance after every step without overflow instead.
// A static loss_scale keeps the scale fixed; overflowing steps are still skipped.
#pragma once

#include <cstdint>

#include "config.hpp"

namespace zero {

class LossScaler {
 public:
  LossScaler() = default;
  LossScaler(const LossScaleConfig& config, bool enabled);

  double scale() const { return scale_; }
  // Records the outcome of one step (call once per zero_step, overflowed or not).
  void update(bool overflow);

  // State, for checkpoints.
  struct State {
    double scale = 1.0;
    int hysteresis_left = 1;
    int64_t iteration = 0, last_overflow_iteration = -1;
  };
  State state() const { return State{scale_, hysteresis_left_, iteration_, last_overflow_iteration_}; }
  void restore(const State& s) {
    scale_ = s.scale, hysteresis_left_ = s.hysteresis_left, iteration_ = s.iteration;
    last_overflow_iteration_ = s.last_overflow_iteration;
  }

 private:
  LossScaleConfig config_;
  bool dynamic_ = false;
  double scale_ = 1.0;
  int hysteresis_left_ = 1;
  int64_t iteration_ = 0;
  int64_t last_overflow_iteration_ = -1;
};

}  // namespace zero
