// fp16 loss scaling with the semantics of DeepSpeed 0.19.8's DynamicLossScaler (the one its ZeRO stages use;
// checked step for step against it: tests/unit/deepspeed_test.cpp):
//  - the scale starts at 2^initial_scale_power (default 2^16);
//  - on an overflow the step is skipped; the scale is halved (never below min_loss_scale) once `hysteresis`
//    overflows have used up the tolerance (each overflow before that only decrements the remaining tolerance);
//  - the scale doubles on the (window + 1)-th consecutive step without overflow after the last one (or after the
//    start), then every `window` steps, restoring the tolerance;
//  - consecutive_hysteresis restores the tolerance after every step without overflow instead.
// At the minimum scale DeepSpeed stops at the first further overflow ("Current loss scale already at minimum");
// libzero keeps skipping with a warning and gives up after kMaxSkipsAtMinimum consecutive ones, so that no run
// skips steps forever without a word (docs/config.md).
// A static loss_scale keeps the scale fixed; overflowing steps are still skipped.
#pragma once

#include <cstdint>

#include "config/config.hpp"

namespace zero {

class LossScaler {
 public:
  LossScaler() = default;
  LossScaler(const LossScaleConfig& config, bool enabled);

  // Consecutive overflowing steps at the minimum scale after which zero_step gives up.
  static constexpr int kMaxSkipsAtMinimum = 10;

  double scale() const { return scale_; }
  // Records the outcome of one step (call once per zero_step, overflowed or not).
  void update(bool overflow);
  // Consecutive overflows while the scale was already at its minimum (0 after any step without overflow).
  int skips_at_minimum() const { return skips_at_minimum_; }

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
  int skips_at_minimum_ = 0;
};

}  // namespace zero
