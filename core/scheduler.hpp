// Learning-rate schedules with DeepSpeed's formulas. The rate for optimizer step k (1-based, counting the steps
// taken; skipped steps do not advance the schedule) is the schedule at DeepSpeed's last_batch_iteration = k - 1.
#pragma once

#include <cstdint>

#include "config.hpp"

namespace zero {

// The rate for step `step` of a group whose configured rate is `base_lr`. Without a scheduler: base_lr.
//  WarmupLR:       min + (max - min) x gamma, gamma = log(it + 1) / log(W) (or it / W, linear) while it < W, else 1
//  WarmupDecayLR:  the same warmup, then gamma = max(0, (T - it) / max(1, T - W))
//  WarmupCosineLR: base_lr x ratio; warmup ratio = warmup_min_ratio + (1 - warmup_min_ratio) x gamma, then
//                  ratio = max(0, cos_min_ratio + (1 - cos_min_ratio) x (1 + cos(pi x (it - W + 1) / (T - W))) / 2)
// where it = step - 1, W = max(2, warmup_num_steps), T = total_num_steps. WarmupLR and WarmupDecayLR set every
// group to the same rates (warmup_min_lr, warmup_max_lr), as DeepSpeed does.
double scheduled_lr(const SchedulerConfig& s, double base_lr, int64_t step);

}  // namespace zero
