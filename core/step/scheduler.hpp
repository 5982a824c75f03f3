// Learning-rate schedules with DeepSpeed's formulas and timing: the rate of optimizer step k (1-based, counting the
// steps taken; skipped steps do not advance the schedule) is DeepSpeed's schedule at last_batch_iteration = k - 2
// (-1 for the first step), because DeepSpeed's engine steps its scheduler after the optimizer.
#pragma once

#include <cstdint>

#include "config/config.hpp"

namespace zero {

// The rate for step `step` of a group whose configured rate is `base_lr`. Without a scheduler: base_lr.
//  WarmupLR:       min + (max - min) x gamma, gamma = log(it + 1) / log(W) (or it / W, linear) while it < W, else 1;
//                  at it = -1, min. max is warmup_max_lr, or the group's own lr when the config does not set it.
//  WarmupDecayLR:  the same warmup (max 0.001 by default), then gamma = max(0, (T - it) / max(1, T - W))
//  WarmupCosineLR: base_lr x ratio; 0 at it = -1; warmup ratio = warmup_min_ratio + (1 - warmup_min_ratio) x gamma,
//                  then ratio = max(0, cos_min_ratio + (1 - cos_min_ratio) x (1 + cos(pi x p)) / 2) with
//                  p = min(1, (it - W + 1) / max(1, T - W)): it stays at cos_min_ratio past T.
// where it = step - 2 (-1 for step 1), W = max(2, warmup_num_steps), T = total_num_steps.
double scheduled_lr(const SchedulerConfig& s, double base_lr, int64_t step);

}  // namespace zero
