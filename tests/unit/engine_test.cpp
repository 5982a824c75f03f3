// The engine on one rank: the order of calls, and the optimizer's arithmetic against a double-precision Adam.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "comm/single_communicator.hpp"
#include "engine/engine.hpp"
#include "numeric/dtype.hpp"
#include "util/error.hpp"
#include "util/log.hpp"

namespace zero {
namespace {

std::unique_ptr<Engine> make_engine(int stage, const std::string& extra = "", const std::string& optimizer = "") {
  std::string json =
      R"({"optimizer": )" +
      (optimizer.empty() ? std::string(R"({"type": "AdamW", "params": {"lr": 0.1, "weight_decay": 0.5}})")
                         : optimizer) +
      R"(, "zero_optimization": {"stage": )" + std::to_string(stage) + R"(, "stage3_param_persistence_threshold": 0})" +
      extra + "}";
  return std::make_unique<Engine>(parse_config(json, 1), make_single_communicator());
}

ParamInit f32(const float* values) { return ParamInit{values, DType::kF32}; }

template <typename F>
void expect_status(zero_status_t want, const std::string& fragment, F&& f) {
  try {
    f();
    ADD_FAILURE() << "no error; expected " << want;
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), want) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

// A param's values, read the way every stage allows: between a gather and a release of its unit.
std::vector<float> read_param(Engine& e, int param, int unit, size_t n) {
  e.gather(unit);
  const float* p = static_cast<const float*>(e.param_data(param));
  std::vector<float> out(p, p + n);
  e.release(unit);
  return out;
}

void micro_step(Engine& e, int n_params, float grad) {
  for (int p = 0; p < n_params; ++p) {
    float* g = static_cast<float*>(e.grad_data(p));
    g[0] += grad;
    e.grad_ready(p);
  }
  e.backward_end();
}

TEST(Engine, CallsInTheWrongOrder) {
  for (int stage = 0; stage <= 3; ++stage) {
    auto e = make_engine(stage, R"(, "gradient_accumulation_steps": 2)");
    expect_status(ZERO_ERR_INVALID_STATE, "finalize first", [&] { (void)e->param_data(0); });
    expect_status(ZERO_ERR_INVALID_STATE, "finalize first", [&] { e->step(); });
    expect_status(ZERO_ERR_INVALID_STATE, "no params", [&] { e->finalize(); });
    e->add_param(ParamShape{"w", {3}, 0, 0}, ParamInit{});
    e->add_param(ParamShape{"b", {2}, 1, 0}, ParamInit{});
    expect_status(ZERO_ERR_INVALID_ARGUMENT, "already exists", [&] {
      e->add_param(ParamShape{"w", {3}, 0, 0}, ParamInit{});
    });
    expect_status(ZERO_ERR_INVALID_ARGUMENT, "no param group 5", [&] {
      e->add_param(ParamShape{"x", {3}, 0, 5}, ParamInit{});
    });
    expect_status(ZERO_ERR_INVALID_ARGUMENT, "positive", [&] {
      e->add_param(ParamShape{"x", {3, 0}, 0, 0}, ParamInit{});
    });
    e->finalize();
    expect_status(ZERO_ERR_INVALID_STATE, "already finalized", [&] { e->finalize(); });
    expect_status(ZERO_ERR_INVALID_STATE, "before zero_engine_finalize", [&] {
      e->add_param(ParamShape{"late", {1}, 0, 0}, ParamInit{});
    });
    expect_status(ZERO_ERR_INVALID_ARGUMENT, "no param with id 9", [&] { e->grad_data(9); });
    expect_status(ZERO_ERR_INVALID_ARGUMENT, "no unit 2", [&] { e->gather(2); });
    expect_status(ZERO_ERR_INVALID_STATE, "is not gathered", [&] { e->release(0); });
    e->gather(0);
    expect_status(ZERO_ERR_INVALID_STATE, "already gathered", [&] { e->gather(0); });
    // At every stage: code that works on one stage keeps working on another.
    expect_status(ZERO_ERR_INVALID_STATE, "not gathered", [&] { (void)e->param_data(1); });
    e->release(0);
    e->grad_ready(0);
    expect_status(ZERO_ERR_INVALID_STATE, "already declared ready", [&] { e->grad_ready(0); });
    expect_status(ZERO_ERR_INVALID_STATE, "already declared ready", [&] { (void)e->grad_data(0); });
    e->backward_end();
    expect_status(ZERO_ERR_INVALID_STATE, "got 1", [&] { e->step(); });
    micro_step(*e, 2, 0.5f);
    expect_status(ZERO_ERR_INVALID_STATE, "call zero_step first", [&] { e->backward_end(); });
    expect_status(ZERO_ERR_INVALID_STATE, "call zero_step first", [&] { (void)e->grad_data(0); });
    e->gather(1);
    expect_status(ZERO_ERR_INVALID_STATE, "unit 1 is still gathered", [&] { e->step(); });
    e->release(1);
    StepResult r = e->step();
    EXPECT_EQ(r.step, 1);
    EXPECT_FALSE(r.skipped);
  }
}

// One Adam/AdamW step against the textbook formula in double: the float path may differ by rounding only.
TEST(Engine, AdamMatchesADoublePrecisionReference) {
  for (bool decoupled : {true, false}) {
    auto e = make_engine(1, R"(, "gradient_clipping": 0.0)",
                         decoupled
                             ? R"({"type": "AdamW", "params": {"lr": 0.1, "weight_decay": 0.5}})"
                             : R"({"type": "Adam", "params": {"lr": 0.1, "weight_decay": 0.5, "adam_w_mode": false}})");
    const float init[4] = {1.0f, -2.0f, 0.5f, 3.0f};
    const float grads[2][4] = {{0.25f, -1.0f, 2.0f, 0.0f}, {-0.5f, 0.75f, 1.0f, 4.0f}};
    e->add_param(ParamShape{"w", {4}, 0, 0}, f32(init));
    e->finalize();
    double w[4], m[4] = {0}, v[4] = {0};
    for (int i = 0; i < 4; ++i) w[i] = init[i];
    for (int t = 1; t <= 2; ++t) {
      float* g = static_cast<float*>(e->grad_data(0));
      for (int i = 0; i < 4; ++i) g[i] += grads[t - 1][i];
      e->grad_ready(0);
      e->backward_end();
      e->step();
      for (int i = 0; i < 4; ++i) {
        double gi = grads[t - 1][i] + (decoupled ? 0.0 : 0.5 * w[i]);
        m[i] = 0.9 * m[i] + 0.1 * gi;
        v[i] = 0.999 * v[i] + 0.001 * gi * gi;
        double mhat = m[i] / (1 - std::pow(0.9, t)), vhat = v[i] / (1 - std::pow(0.999, t));
        if (decoupled) w[i] *= 1 - 0.1 * 0.5;
        w[i] -= 0.1 * mhat / (std::sqrt(vhat) + 1e-8);
      }
    }
    const std::vector<float> p = read_param(*e, 0, 0, 4);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(p[i], w[i], 1e-5 * std::fabs(w[i]) + 1e-6) << "elem " << i;
  }
}

TEST(Engine, ClippingScalesTheAveragedGradient) {
  auto e = make_engine(2, R"(, "gradient_clipping": 1.0)",
                       R"({"type": "AdamW", "params": {"lr": 1.0, "weight_decay": 0.0, "betas": [0.0, 0.0]}})");
  e->add_param(ParamShape{"w", {2}, 0, 0}, ParamInit{});
  e->finalize();
  float* g = static_cast<float*>(e->grad_data(0));
  g[0] += 3.0f;
  g[1] += 4.0f;
  e->grad_ready(0);
  e->backward_end();
  StepResult r = e->step();
  EXPECT_DOUBLE_EQ(r.grad_norm, 5.0);  // reported before clipping
  // With beta1 = beta2 = 0 Adam's update is g / (|g| + eps) whatever the clip factor: -1 per element.
  const std::vector<float> p = read_param(*e, 0, 0, 2);
  EXPECT_NEAR(p[0], -1.0f, 1e-6);
  EXPECT_NEAR(p[1], -1.0f, 1e-6);
}

TEST(Engine, NonFiniteGradientsSkipTheStepAndKeepTheWeights) {
  auto e = make_engine(3);
  const float init[3] = {1.0f, 2.0f, 3.0f};
  e->add_param(ParamShape{"w", {3}, 0, 0}, f32(init));
  e->finalize();
  float* g = static_cast<float*>(e->grad_data(0));
  g[1] += std::numeric_limits<float>::infinity();
  e->grad_ready(0);
  e->backward_end();
  StepResult r = e->step();
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.step, 0);
  const std::vector<float> p = read_param(*e, 0, 0, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p[i], init[i]);
  // The gradient was cleared: the next step is a normal one.
  micro_step(*e, 1, 0.5f);
  r = e->step();
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.step, 1);
}

TEST(Engine, SetLrChangesTheUpdate) {
  auto e = make_engine(0, "", R"({"type": "AdamW", "params": {"lr": 0.1, "weight_decay": 0.0}})");
  e->add_param(ParamShape{"w", {1}, 0, 0}, ParamInit{});
  e->finalize();
  e->set_lr(-1, 0.0);
  micro_step(*e, 1, 1.0f);
  e->step();
  EXPECT_EQ(read_param(*e, 0, 0, 1)[0], 0.0f);
  e->set_lr(0, 0.5);
  micro_step(*e, 1, 1.0f);
  e->step();
  EXPECT_NEAR(read_param(*e, 0, 0, 1)[0], -0.5f, 1e-6);
  expect_status(ZERO_ERR_INVALID_ARGUMENT, "no param group 3", [&] { e->set_lr(3, 0.1); });
  expect_status(ZERO_ERR_INVALID_ARGUMENT, "must be in [0, 1e6)", [&] { e->set_lr(0, -1.0); });
  expect_status(ZERO_ERR_INVALID_ARGUMENT, "must be in [0, 1e6)", [&] { e->set_lr(0, 1e300); });
}

TEST(Engine, ParamGroupsOverrideOnlyWhatTheySet) {
  auto e = make_engine(1);
  int g = e->add_param_group("no_decay", -1.0, 0.0, -1.0, -1.0, -1.0);
  EXPECT_EQ(g, 1);
  expect_status(ZERO_ERR_INVALID_ARGUMENT, "beta1", [&] { e->add_param_group("bad", -1.0, -1.0, 1.5, -1.0, -1.0); });
  const float one = 1.0f;
  e->add_param(ParamShape{"decayed", {1}, 0, 0}, f32(&one));
  e->add_param(ParamShape{"plain", {1}, 0, 1}, f32(&one));
  e->finalize();
  e->set_lr(-1, 0.0);  // lr 0: neither the gradient nor the weight decay moves a weight
  micro_step(*e, 2, 0.0f);
  e->step();
  EXPECT_EQ(read_param(*e, 0, 0, 1)[0], 1.0f);
  e->set_lr(-1, 0.1);
  micro_step(*e, 2, 0.0f);
  e->step();
  EXPECT_FLOAT_EQ(read_param(*e, 0, 0, 1)[0], 1.0f - 0.1f * 0.5f);  // decayed by lr x weight_decay
  EXPECT_EQ(read_param(*e, 1, 0, 1)[0], 1.0f);                      // group 1 has weight_decay 0
}

TEST(Engine, OneWarningNamesTheKnobsWithoutEffect) {
  testing::internal::CaptureStderr();
  auto e = make_engine(3, R"(, "steps_per_print": 5)");
  auto quiet = make_engine(3);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("no effect in libzero: steps_per_print"), std::string::npos) << err;
  EXPECT_EQ(err.find("warning", err.find("warning") + 1), std::string::npos) << "more than one warning: " << err;
}

// INFO messages (zero_set_log_callback at ZERO_LOG_INFO): what finalize allocated, and every loss-scale change.
TEST(Engine, InfoMessagesReportFinalizeAndLossScaleChanges) {
  std::vector<std::string> messages;
  set_log_callback(
      [](void* out, int32_t level, int32_t, const char* m) {
        if (level == ZERO_LOG_INFO) static_cast<std::vector<std::string>*>(out)->push_back(m);
      },
      &messages, ZERO_LOG_INFO);
  {
    auto e = make_engine(1, R"(, "fp16": {"enabled": true, "hysteresis": 1})");
    e->add_param(ParamShape{"w", {4}, 0, 0}, ParamInit{});
    e->finalize();
    static_cast<float*>(e->grad_data(0))[0] = std::numeric_limits<float>::infinity();
    e->grad_ready(0);
    e->backward_end();
    EXPECT_TRUE(e->step().skipped);
  }
  set_log_callback(nullptr, nullptr, ZERO_LOG_WARNING);
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_NE(messages[0].find("zero_engine_finalize: stage 1 on 1 ranks: params full, grads full fp32, optimizer state "
                             "sharded, fp32 master beside fp16 params (host); gradients reduce-scattered in "
                             "zero_step; 1 params in 1 units"),
            std::string::npos)
      << messages[0];
  EXPECT_NE(messages[1].find("loss scale 65536 -> 32768 (gradients overflowed; step skipped)"), std::string::npos)
      << messages[1];
}

// The gradient norm has the same bits whichever pass sums its squares: its own pass before the update (stages 0-1
// with clipping), the widening after a reduction in bf16 (stages 0-1 with clipping), the reductions of the window's
// last micro-step (stages 2-3 with clipping), or the optimizer pass (no clipping, no skip: every stage at one
// rank). Random gradients of every magnitude, so that a square in another
// lane or block, or a block summed out of order, changes the bits; params interleaved over two units, larger than two
// norm blocks (2^16), with padding between them; fp32 and bf16 accumulation, fp32 and bf16 communication.
TEST(Engine, TheNormHasTheSameBitsWhicheverPassSumsIt) {
  const std::vector<size_t> sizes = {3, 140001, 65537, 7, 131073};
  std::vector<std::string> log;
  set_log_callback(
      [](void* out, int32_t level, int32_t, const char* m) {
        if (level == ZERO_LOG_DEBUG) static_cast<std::vector<std::string>*>(out)->push_back(m);
      },
      &log, ZERO_LOG_DEBUG);
  struct Types {
    const char *accum, *comm;
    int gas;  // 1 where communicating narrower than accumulating: stage 1 narrows the sum, stages 2-3 each term
  };
  for (const Types& t : {Types{"fp32", "fp32", 2}, Types{"bf16", "bf16", 2}, Types{"fp32", "bf16", 1}}) {
    const std::string types = std::string(R"(, "gradient_accumulation_steps": )") + std::to_string(t.gas) +
                              R"(, "data_types": {"grad_accum_dtype": ")" + t.accum +
                              R"("}, "communication_data_type": ")" + t.comm + R"(", "bf16": {"enabled": true})";
    auto run = [&](int stage, bool clip, const char* expect_log, std::vector<double>& norms) {
      const std::string extra =
          clip ? R"(, "gradient_clipping": 1e30)" + types
               : R"(, "gradient_clipping": 0, "bf16": {"enabled": true, "check_grad_overflow": false})" +
                     types.substr(0, types.find(R"(, "bf16")"));
      auto e = make_engine(stage, extra);
      for (size_t p = 0; p < sizes.size(); ++p)
        e->add_param(ParamShape{"p" + std::to_string(p), {static_cast<int64_t>(sizes[p])}, static_cast<int>(p % 2), 0},
                     ParamInit{});
      log.clear();
      e->finalize();
      std::mt19937 rng(17);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int step = 0; step < 2; ++step) {
        for (int k = 0; k < t.gas; ++k) {
          for (int u = 1; u >= 0; --u) {
            e->gather(u);
            for (size_t p = 0; p < sizes.size(); ++p) {
              if (static_cast<int>(p % 2) != u) continue;
              char* g = static_cast<char*>(e->grad_data(static_cast<int>(p)));
              for (size_t i = 0; i < sizes[p]; ++i) {
                // bf16 values, so that every stage accumulates the same sums whatever dtype it narrows to first.
                const float v =
                    bf16_to_float(float_to_bf16_rne(normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 30) - 15)));
                if (std::string(t.accum) == "fp32") {
                  reinterpret_cast<float*>(g)[i] += v;
                } else {  // bf16 accumulation: the framework adds in bf16
                  uint16_t& h = reinterpret_cast<uint16_t*>(g)[i];
                  h = float_to_bf16_rne(bf16_to_float(h) + v);
                }
              }
              e->grad_ready(static_cast<int>(p));
            }
            e->release(u);
          }
          e->backward_end();
        }
        norms.push_back(e->step().grad_norm);
      }
      const bool seen = std::any_of(log.begin(), log.end(),
                                    [&](const std::string& m) { return m.find(expect_log) != std::string::npos; });
      EXPECT_TRUE(seen) << "stage " << stage << (clip ? " with" : " without") << " clipping: no '" << expect_log
                        << "' in the debug log";
      std::vector<float> w;
      for (size_t p = 0; p < sizes.size(); ++p) {
        e->gather(static_cast<int>(p % 2));
        const uint16_t* d = static_cast<const uint16_t*>(e->param_data(static_cast<int>(p)));
        for (size_t i = 0; i < sizes[p]; ++i) w.push_back(bf16_to_float(d[i]));
        e->release(static_cast<int>(p % 2));
      }
      return w;
    };
    SCOPED_TRACE(std::string("accumulation ") + t.accum + ", communication " + t.comm);
    std::vector<double> want;
    // Stages 0-1 widen what was reduced in a narrower dtype, and sum the squares there; otherwise the norm has its
    // own pass (the reference in two of the three dtype cases).
    const bool widened = std::string(t.accum) != t.comm;
    const char* reduced =
        widened ? "the squares of 2 of 2 units were summed" : "the squares of 0 of 2 units were summed";
    const std::vector<float> want_w = run(1, true, reduced, want);
    struct Case {
      int stage;
      bool clip;
      const char* log;
    };
    for (const Case& c :
         {Case{0, true, reduced}, Case{2, true, "the squares of 2 of 2 units were summed"},
          Case{3, true, "the squares of 2 of 2 units were summed"}, Case{0, false, "summed in the optimizer pass"},
          Case{1, false, "summed in the optimizer pass"}, Case{2, false, "summed in the optimizer pass"},
          Case{3, false, "summed in the optimizer pass"}}) {
      std::vector<double> got;
      const std::vector<float> got_w = run(c.stage, c.clip, c.log, got);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_TRUE(std::isfinite(want[i]) && want[i] > 0.0);
        EXPECT_EQ(std::memcmp(&got[i], &want[i], sizeof(double)), 0)
            << "stage " << c.stage << (c.clip ? " with" : " without") << " clipping, step " << i + 1 << ": norm "
            << got[i] << ", the norm pass's " << want[i];
      }
      EXPECT_TRUE(got_w == want_w) << "stage " << c.stage << ": the weights differ";
    }
  }
  set_log_callback(nullptr, nullptr, ZERO_LOG_WARNING);
}

}  // namespace
}  // namespace zero
