// Learning-rate schedules against DeepSpeed's formulas evaluated by hand, and the engine applying them.
#include <gtest/gtest.h>

#include <cmath>

#include "comm/single_communicator.hpp"
#include "engine/engine.hpp"
#include "step/scheduler.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

// Optimizer step k runs at DeepSpeed's iteration k - 2 (step 1 at iteration -1: the schedule is built before the
// first step and stepped after each). tests/unit/deepspeed_test.cpp checks every rate against DeepSpeed's own.
TEST(Scheduler, WarmupLrLogAndLinear) {
  SchedulerConfig s;
  s.kind = SchedulerConfig::Kind::kWarmupLR;
  s.warmup_min_lr = 0.0;
  s.warmup_max_lr = 0.01;
  s.warmup_max_lr_given = true;
  s.warmup_num_steps = 10;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 123.0, 1), 0.0);  // iteration -1: the minimum
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 123.0, 2), 0.0);  // iteration 0: log(1) / log(10) = 0
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 123.0, 6), 0.01 * std::log(5.0) / std::log(10.0));
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 123.0, 12), 0.01);  // iteration 10: warmup over
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 123.0, 500), 0.01);
  s.warmup_log = false;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 123.0, 6), 0.01 * 4.0 / 10.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 123.0, 11), 0.01 * 9.0 / 10.0);
  s.warmup_num_steps = 1;  // DeepSpeed uses max(2, warmup_num_steps)
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 123.0, 3), 0.01 * 1.0 / 2.0);
  s.warmup_max_lr_given = false;  // WarmupLR without warmup_max_lr warms up to the group's own rate
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0.02, 3), 0.02 * 1.0 / 2.0);
}

TEST(Scheduler, WarmupDecayLrDecaysLinearlyToZero) {
  SchedulerConfig s;
  s.kind = SchedulerConfig::Kind::kWarmupDecayLR;
  s.warmup_min_lr = 0.0;
  s.warmup_max_lr = 0.1;
  s.warmup_max_lr_given = true;
  s.warmup_num_steps = 10;
  s.total_num_steps = 110;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 12), 0.1 * (110.0 - 10.0) / 100.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 62), 0.1 * (110.0 - 60.0) / 100.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 112), 0.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 500), 0.0);
}

TEST(Scheduler, WarmupCosineLrScalesEachGroupsRate) {
  SchedulerConfig s;
  s.kind = SchedulerConfig::Kind::kWarmupCosineLR;
  s.warmup_num_steps = 10;
  s.total_num_steps = 110;
  s.warmup_min_ratio = 0.1;
  s.cos_min_ratio = 0.01;
  s.warmup_log = false;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 1), 0.0);  // iteration -1: ratio 0, as in DeepSpeed
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 2), 2.0 * 0.1);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 7), 2.0 * (0.1 + 0.9 * 0.5));
  // Iteration 10 is the first cosine step, already 1 of 100 into the cosine.
  const double r = 0.01 + 0.99 * (1 + std::cos(M_PI * 1.0 / 100.0)) / 2;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 12), 2.0 * r);
  EXPECT_NEAR(scheduled_lr(s, 2.0, 111), 2.0 * 0.01, 1e-12);   // iteration 109: the end of the cosine
  EXPECT_NEAR(scheduled_lr(s, 2.0, 5000), 2.0 * 0.01, 1e-12);  // and it stays there
}

TEST(Scheduler, TheEngineUsesTheScheduleAndRefusesSetLr) {
  Config c = parse_config(R"({"optimizer": {"type": "SGD", "params": {"lr": 1.0}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.5, "warmup_max_lr": 1.5,
      "warmup_num_steps": 4, "warmup_type": "linear"}}})",
                          1);
  Engine e(c, make_single_communicator());
  const float zero_init[1] = {0.0f};
  e.add_param(ParamShape{"w", {1}, 0, 0}, ParamInit{zero_init, DType::kF32});
  e.finalize();
  double expected_w = 0.0;
  for (int step = 1; step <= 6; ++step) {
    static_cast<float*>(e.grad_data(0))[0] += 1.0f;
    e.grad_ready(0);
    e.backward_end();
    StepResult r = e.step();
    const double lr = step == 1 ? 0.5 : 0.5 + 1.0 * std::min(1.0, (step - 2) / 4.0);
    EXPECT_DOUBLE_EQ(r.lr, lr) << "step " << step;
    expected_w -= lr;  // plain SGD on a unit gradient
    e.gather(0);
    EXPECT_FLOAT_EQ(static_cast<float*>(e.param_data(0))[0], static_cast<float>(expected_w)) << "step " << step;
    e.release(0);
  }
  EXPECT_THROW(e.set_lr(0, 0.1), Error);
}

}  // namespace
}  // namespace zero
