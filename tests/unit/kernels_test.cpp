// The fused optimizer kernels: every optimizer x SIMD path x gradient dtype x copy mode.
//
// 1. Every SIMD path equals the scalar path bit for bit (master, state, copy), on lengths with tails.
// 2. The scalar path agrees with an fp64 reference of the same optimizer within a derived bound: each result
//    is a short chain of fp32 operations (at most 12 roundings of relative size 2^-24 each, plus the rounding of
//    the hyper-parameters to float, also 2^-24 relative), so |x - x_ref| <= 2^-20 x (sum of the magnitudes of the
//    terms that make up x) + 1 ulp(x_ref). The margin over 12 x 2^-24 covers error propagation between terms.
// 3. The compute-dtype copy is exactly the documented rounding (dtype.hpp) of the new master, and those rounding
//    functions agree with independent references (F16C hardware for fp16, exact arithmetic in double for bf16).
// 4. Stochastic rounding is unbiased.
#include <gtest/gtest.h>

#include <algorithm>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cmath>
#include <deque>
#include <random>
#include <vector>

#include "kernels/kernels.hpp"
#include "kernels/optimizer.hpp"
#include "memory/ops.hpp"
#include "numeric/convert.hpp"
#include "numeric/dtype.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Rounding functions against independent references.

// bf16 by exact arithmetic: the two bf16 neighbours of x, chosen by distance in double, ties to even.
uint16_t bf16_reference(float x) {
  if (std::isnan(x)) return float_to_bf16_rne(x);  // NaN payloads are a convention, checked separately
  uint32_t u = float_bits(x);
  uint16_t down = static_cast<uint16_t>(u >> 16), up = static_cast<uint16_t>(down + 1);
  if ((u & 0xffffu) == 0) return down;
  double dx = x, ddown = bf16_to_float(down);
  double dup = (up & 0x7fffu) == 0x7f80u ? std::copysign(std::ldexp(1.0, 128), dx) : double(bf16_to_float(up));
  double e_down = std::fabs(dx - ddown), e_up = std::fabs(dup - dx);
  if (e_down < e_up) return down;
  if (e_up < e_down) return up;
  return (down & 1u) ? up : down;
}

TEST(Rounding, Bf16IsRoundToNearestEvenIncludingDenormals) {
  std::mt19937 rng(7);
  std::vector<uint32_t> patterns = {0x00000001u, 0x00008000u, 0x00018000u, 0x007fffffu, 0x00800000u, 0x3f808000u,
                                    0x3f818000u, 0x7f7fffffu, 0x7f7f8000u, 0x80000001u, 0xff7fffffu, 0x7f800000u};
  for (uint32_t i = 0; i < 2000000; ++i) patterns.push_back(rng());
  for (uint32_t u = 0; u < 0x00800000u; u += 977) patterns.push_back(u);  // denormals
  for (uint32_t u : patterns) {
    float x = bits_float(u);
    ASSERT_EQ(float_to_bf16_rne(x), bf16_reference(x)) << std::hex << u;
  }
  uint16_t nan = float_to_bf16_rne(bits_float(0x7f800001u));
  EXPECT_TRUE(std::isnan(bf16_to_float(nan)));
  EXPECT_EQ(nan & 0x0040u, 0x0040u);  // quiet
}

#if defined(__x86_64__)
// The F16C instructions, in functions of their own: the rest of this file is compiled for baseline x86-64, so that
// the scalar-path tests run (rather than die on an illegal instruction) on a CPU without AVX.
__attribute__((target("f16c"))) uint16_t f16c_round(float x) {
  return static_cast<uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(x), _MM_FROUND_TO_NEAREST_INT), 0));
}
__attribute__((target("f16c"))) float f16c_widen(uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(static_cast<short>(h))));
}

TEST(Rounding, Fp16MatchesF16cHardwareEverywhere) {
  if (!isa_supported(Isa::kAvx2)) GTEST_SKIP() << "no F16C to compare with (checked with the AVX2 path's features)";
  // Every 97th float bit pattern (44 million values, all exponents), plus the boundaries.
  auto check = [](uint32_t u) {
    float x = bits_float(u);
    const uint16_t hw = f16c_round(x);
    ASSERT_EQ(float_to_fp16_rne(x), hw) << std::hex << u;
    ASSERT_EQ(float_bits(fp16_to_float(hw)), float_bits(f16c_widen(hw))) << std::hex << hw;
  };
  for (uint64_t u = 0; u <= 0xffffffffull; u += 97) check(static_cast<uint32_t>(u));
  for (uint32_t u : {0x477fefffu, 0x477ff000u, 0x477ff001u, 0x33000000u, 0x33000001u, 0x387fffffu, 0x38800000u})
    check(u), check(u | 0x80000000u);
  // Every fp16 value widens as F16C widens it: nans, signaling ones included, come out quiet.
  for (uint32_t h = 0; h <= 0xffffu; ++h)
    ASSERT_EQ(float_bits(fp16_to_float(static_cast<uint16_t>(h))), float_bits(f16c_widen(static_cast<uint16_t>(h))))
        << std::hex << h;
}
#endif

TEST(Rounding, StochasticBf16IsUnbiased) {
  // x sits 0.3 of the way from one bf16 value to the next. Over n = 2^20 independent draws the mean of the
  // rounded values has standard error spacing x sqrt(p(1-p)/n) = 2^-7 x 0.458 / 1024. We require the mean within
  // 5 standard errors (two-sided confidence 1 - 6e-7; the seed is fixed, so the test is deterministic).
  const float spacing = std::ldexp(1.0f, -7);
  const float x = 1.0f + 0.3f * spacing;
  const int n = 1 << 20;
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += bf16_to_float(float_to_bf16_sr(x, mix32(static_cast<uint32_t>(i) ^ 12345u)));
  const double mean = sum / n, sigma = spacing * std::sqrt(0.3 * 0.7 / n);
  EXPECT_LT(std::fabs(mean - x), 5 * sigma) << "mean " << mean << " x " << x;
  // And it really is stochastic: both neighbours occur in about the right proportion.
  EXPECT_NEAR((mean - 1.0) / spacing, 0.3, 0.01);
}

// ---------------------------------------------------------------------------------------------------------------
// Kernels.

// SGD comes in three variants (each its own compiled loop): momentum with Nesterov, plain momentum, no momentum.
enum class SgdVariant { kNesterov, kMomentum, kPlain };

struct Case {
  OptimizerKind kind;
  DType grad;
  CopyMode copy;
  SgdVariant sgd = SgdVariant::kNesterov;
};

struct Streams {
  std::vector<float> master, s0, s1;
  std::vector<uint16_t> copy;
  std::vector<uint8_t> grad;
};

OptimizerHyper hyper_for(const Case& c) {
  const OptimizerKind kind = c.kind;
  OptimizerHyper h;
  h.kind = kind;
  h.lr = kind == OptimizerKind::kLion ? 1e-4 : 1e-2;
  h.beta1 = 0.9;
  h.beta2 = kind == OptimizerKind::kLion ? 0.99 : 0.999;
  h.eps = kind == OptimizerKind::kAdagrad ? 1e-10 : 1e-8;
  h.weight_decay = 0.01;
  h.momentum = c.sgd == SgdVariant::kPlain ? 0.0 : 0.9;
  h.dampening = 0.1;
  h.nesterov = c.sgd == SgdVariant::kNesterov;
  return h;
}

// The streams depend on the length, the seed, the gradient's type and whether the state must be non-negative, not
// on the rest of the case: the tests ask for the same ones for every optimizer and path, and drawing four normals
// per element, up to 200 000 elements, each time is most of their run time (four times as much under
// AddressSanitizer). The last few drawn are kept.
Streams draw_streams(const Case& c, size_t n, uint32_t seed);

Streams make_streams(const Case& c, size_t n, uint32_t seed) {
  struct Drawn {
    size_t n;
    uint32_t seed;
    DType grad;
    bool adagrad;
    Streams streams;
  };
  static std::deque<Drawn> recent;
  const bool adagrad = c.kind == OptimizerKind::kAdagrad;
  for (const Drawn& d : recent)
    if (d.n == n && d.seed == seed && d.grad == c.grad && d.adagrad == adagrad) return d.streams;
  recent.push_front({n, seed, c.grad, adagrad, draw_streams(c, n, seed)});
  if (recent.size() > 8) recent.pop_back();
  return recent.front().streams;
}

Streams draw_streams(const Case& c, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Streams s;
  s.master.resize(n);
  s.s0.resize(n);
  s.s1.resize(n);
  s.copy.assign(n, 0);
  s.grad.resize(n * dtype_size(c.grad));
  for (size_t i = 0; i < n; ++i) {
    s.master[i] = normal(rng);
    s.s0[i] = 0.1f * normal(rng);
    s.s1[i] = std::fabs(0.01f * normal(rng));
    if (c.kind == OptimizerKind::kAdagrad) s.s0[i] = std::fabs(s.s0[i]);
    float g = normal(rng);
    if (c.grad == DType::kF32) std::memcpy(&s.grad[4 * i], &g, 4);
    uint16_t h = c.grad == DType::kBF16 ? float_to_bf16_rne(g) : float_to_fp16_rne(g);
    if (c.grad != DType::kF32) std::memcpy(&s.grad[2 * i], &h, 2);
  }
  return s;
}

KernelArgs args_for(Streams& s, const Case& c, const OptimizerHyper& h, int64_t step) {
  KernelArgs a;
  a.master = s.master.data();
  a.grad = s.grad.data();
  a.grad_elem_size = dtype_size(c.grad);
  a.state0 = state_count(h) > 0 ? s.s0.data() : nullptr;
  a.state1 = state_count(h) > 1 ? s.s1.data() : nullptr;
  a.copy = c.copy == CopyMode::kNone ? nullptr : s.copy.data();
  a.n = s.master.size();
  a.first_index = 1000;
  a.s = make_step_scalars(h, step, 4.0, 2.0);  // the gradient / 4 x 2: the reference's factor 0.5
  a.s.seed = 99;
  return a;
}

double grad_value(const Streams& s, DType t, size_t i) {
  if (t == DType::kF32) {
    float g;
    std::memcpy(&g, &s.grad[4 * i], 4);
    return g;
  }
  uint16_t h;
  std::memcpy(&h, &s.grad[2 * i], 2);
  return t == DType::kBF16 ? bf16_to_float(h) : fp16_to_float(h);
}

// The textbook optimizers in double. Returns the magnitude scale of the terms for the error bound.
struct RefResult {
  double p, s0, s1, p_scale, s0_scale, s1_scale;
};

RefResult reference(const OptimizerHyper& h, int64_t t, double p, double s0, double s1, double g) {
  g *= 0.5;  // the grad factor
  RefResult r{};
  switch (h.kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdamL2: {
      if (h.kind == OptimizerKind::kAdamL2) g += h.weight_decay * p;
      double m = h.beta1 * s0 + (1 - h.beta1) * g, v = h.beta2 * s1 + (1 - h.beta2) * g * g;
      double bc1 = 1 - std::pow(h.beta1, t), bc2 = 1 - std::pow(h.beta2, t);
      double decay = h.kind == OptimizerKind::kAdamW ? 1 - h.lr * h.weight_decay : 1.0;
      double update = h.lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + h.eps);
      r = {p * decay - update,
           m,
           v,
           std::fabs(p) + std::fabs(update) * 4,
           std::fabs(h.beta1 * s0) + std::fabs((1 - h.beta1) * g),
           h.beta2 * s1 + (1 - h.beta2) * g * g};
      if (h.kind == OptimizerKind::kAdamL2) r.s0_scale += std::fabs(h.weight_decay * p);
      break;
    }
    case OptimizerKind::kAdagrad: {
      g += h.weight_decay * p;
      double sum = s0 + g * g, update = h.lr * g / (std::sqrt(sum) + h.eps);
      r = {p - update, sum, s1, std::fabs(p) + std::fabs(update) * 4, sum, 0};
      break;
    }
    case OptimizerKind::kLion: {
      double c = h.beta1 * s0 + (1 - h.beta1) * g;
      double sign = c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0);
      double m = h.beta2 * s0 + (1 - h.beta2) * g;
      r = {p * (1 - h.lr * h.weight_decay) - h.lr * sign,          m, s1, std::fabs(p) + h.lr,
           std::fabs(h.beta2 * s0) + std::fabs((1 - h.beta2) * g), 0};
      break;
    }
    case OptimizerKind::kSgd: {
      g += h.weight_decay * p;
      if (h.momentum == 0) {  // no momentum buffer: the step is the gradient
        r = {p - h.lr * g, s0, s1, std::fabs(p) + h.lr * std::fabs(g) * 4, 0, 0};
        break;
      }
      double buf = t == 1 ? g : h.momentum * s0 + (1 - h.dampening) * g;
      double d = h.nesterov ? g + h.momentum * buf : buf;
      r = {p - h.lr * d,
           buf,
           s1,
           std::fabs(p) + h.lr * (std::fabs(g) + std::fabs(buf)) * 4,
           std::fabs(h.momentum * s0) + std::fabs(g) * 2,
           0};
      break;
    }
  }
  return r;
}

double ulp(double x) { return std::ldexp(1.0, std::ilogb(std::max(std::fabs(x), 1e-30)) - 23); }

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (auto k : {OptimizerKind::kAdamW, OptimizerKind::kAdamL2, OptimizerKind::kAdagrad, OptimizerKind::kLion,
                 OptimizerKind::kSgd})
    for (auto g : {DType::kF32, DType::kBF16, DType::kF16})
      for (auto c : {CopyMode::kNone, CopyMode::kBf16Rne, CopyMode::kBf16Stochastic, CopyMode::kFp16Rne}) {
        cases.push_back({k, g, c});
        if (k == OptimizerKind::kSgd) {
          cases.push_back({k, g, c, SgdVariant::kMomentum});
          cases.push_back({k, g, c, SgdVariant::kPlain});
        }
      }
  return cases;
}

std::string describe(const Case& c) {
  const char* kinds[] = {"AdamW", "AdamL2", "Adagrad", "Lion", "SGD"};
  const char* copies[] = {"none", "bf16", "bf16-sr", "fp16"};
  const char* sgd[] = {" (nesterov)", " (momentum)", " (no momentum)"};
  return std::string(kinds[static_cast<int>(c.kind)]) +
         (c.kind == OptimizerKind::kSgd ? sgd[static_cast<int>(c.sgd)] : "") + " grad " + dtype_name(c.grad) +
         " copy " + copies[static_cast<int>(c.copy)];
}

TEST(Kernels, ScalarMatchesFp64ReferenceWithinTheDerivedBound) {
  const size_t n = 1037;  // not a multiple of any vector width
  for (const Case& c : all_cases()) {
    const OptimizerHyper h = hyper_for(c);
    for (int64_t step : {1, 2, 10}) {
      Streams s = make_streams(c, n, 1), before = s;
      KernelArgs a = args_for(s, c, h, step);
      kernel_table_scalar().step[static_cast<int>(c.kind)][static_cast<int>(c.grad)][static_cast<int>(c.copy)](a);
      for (size_t i = 0; i < n; ++i) {
        RefResult r = reference(h, step, before.master[i], before.s0[i], before.s1[i], grad_value(before, c.grad, i));
        ASSERT_LE(std::fabs(s.master[i] - r.p), std::ldexp(r.p_scale, -20) + ulp(r.p))
            << describe(c) << " step " << step << " elem " << i;
        if (state_count(h) > 0) {
          ASSERT_LE(std::fabs(s.s0[i] - r.s0), std::ldexp(r.s0_scale, -20) + ulp(r.s0)) << describe(c) << " " << i;
        }
        if (state_count(h) > 1) {
          ASSERT_LE(std::fabs(s.s1[i] - r.s1), std::ldexp(r.s1_scale, -20) + ulp(r.s1)) << describe(c) << " " << i;
        }
        // The copy is exactly the promised rounding of the new master.
        if (c.copy == CopyMode::kBf16Rne) {
          ASSERT_EQ(s.copy[i], float_to_bf16_rne(s.master[i])) << describe(c);
        }
        if (c.copy == CopyMode::kFp16Rne) {
          ASSERT_EQ(s.copy[i], float_to_fp16_rne(s.master[i])) << describe(c);
        }
        if (c.copy == CopyMode::kBf16Stochastic) {
          uint16_t down = static_cast<uint16_t>(float_bits(s.master[i]) >> 16);
          ASSERT_TRUE(s.copy[i] == down || s.copy[i] == down + 1) << describe(c);
          ASSERT_EQ(s.copy[i], float_to_bf16_sr(s.master[i], mix32(static_cast<uint32_t>(1000 + i) ^ 99u)));
        }
      }
    }
  }
}

TEST(Kernels, EverySimdPathEqualsTheScalarPathBitForBit) {
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) {
      std::printf("skipping %s: not supported by this CPU\n", isa_name(isa));
      continue;
    }
    // Sizes around the 32-element prefetch blocks, the vector widths and the tails.
    for (size_t n :
         {size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{32}, size_t{64}, size_t{1037}, size_t{1061}}) {
      for (const Case& c : all_cases()) {
        const OptimizerHyper h = hyper_for(c);
        Streams want = make_streams(c, n, 3), got = want;
        KernelArgs wa = args_for(want, c, h, 2), ga = args_for(got, c, h, 2);
        const int k = static_cast<int>(c.kind), g = static_cast<int>(c.grad), m = static_cast<int>(c.copy);
        kernel_table_scalar().step[k][g][m](wa);
        kernels(isa).step[k][g][m](ga);
        ASSERT_EQ(0, std::memcmp(want.master.data(), got.master.data(), n * 4)) << isa_name(isa) << " " << describe(c);
        ASSERT_EQ(0, std::memcmp(want.s0.data(), got.s0.data(), n * 4)) << isa_name(isa) << " " << describe(c);
        ASSERT_EQ(0, std::memcmp(want.s1.data(), got.s1.data(), n * 4)) << isa_name(isa) << " " << describe(c);
        ASSERT_EQ(0, std::memcmp(want.copy.data(), got.copy.data(), n * 2)) << isa_name(isa) << " " << describe(c);
      }
    }
  }
}

// clear_grad zeroes exactly the gradients the pass read — body, blocks and tail — and changes nothing else.
TEST(Kernels, ClearingTheGradientsInThePassChangesNothingElse) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    // 2^17 + 37: parallel_step splits it between two threads (on one path: the split does not depend on it);
    // 2^17 + 1: half of it rounds down to whole lines, so a split that rounded down first lost the last element.
    for (size_t n : {size_t{1}, size_t{17}, size_t{64}, size_t{1061}, (size_t{1} << 17) + 37, (size_t{1} << 17) + 1}) {
      if (n > 2000 && isa != Isa::kScalar) continue;
      for (const Case& c : all_cases()) {
        const OptimizerHyper h = hyper_for(c);
        Streams want = make_streams(c, n, 5), got = want;
        // Guard bytes before and after the run must survive.
        const size_t gsize = dtype_size(c.grad);
        std::vector<uint8_t> guarded(got.grad.size() + 128, 0x5a);
        std::memcpy(guarded.data() + 64, got.grad.data(), got.grad.size());
        KernelArgs wa = args_for(want, c, h, 3), ga = args_for(got, c, h, 3);
        ga.grad = guarded.data() + 64;
        ga.clear_grad = true;
        const int k = static_cast<int>(c.kind), g = static_cast<int>(c.grad), m = static_cast<int>(c.copy);
        kernels(isa).step[k][g][m](wa);
        // Through parallel_step with threads, so that each thread's part clears its own range only.
        parallel_step(kernels(isa).step[k][g][m], ga, 2);
        ASSERT_EQ(0, std::memcmp(want.master.data(), got.master.data(), n * 4)) << isa_name(isa) << " " << describe(c);
        ASSERT_EQ(0, std::memcmp(want.s0.data(), got.s0.data(), n * 4)) << describe(c);
        ASSERT_EQ(0, std::memcmp(want.s1.data(), got.s1.data(), n * 4)) << describe(c);
        ASSERT_EQ(0, std::memcmp(want.copy.data(), got.copy.data(), n * 2)) << describe(c);
        const unsigned char* gb = guarded.data() + 64;
        ASSERT_TRUE(std::all_of(gb, gb + n * gsize, [](unsigned char b) { return b == 0; })) << describe(c) << " " << n;
        for (size_t b = 0; b < 64; ++b) {
          ASSERT_EQ(guarded[b], 0x5a) << describe(c) << ": a byte before the run was cleared";
          ASSERT_EQ(gb[n * gsize + b], 0x5a) << describe(c) << ": a byte past the run was cleared";
        }
      }
    }
  }
}

TEST(Kernels, SpecialValuesRoundTheSameOnEveryPath) {
  // Denormals (which vcvtneps2bf16 would flush), NaN, infinities and values that round to infinity, written as
  // masters by an SGD step with lr 0 (finite masters pass through unchanged; infinities become NaN through
  // 0 x inf, which exercises NaN rounding too).
  const std::vector<uint32_t> bits = {0x00000001u, 0x00400000u, 0x807fffffu, 0x00800000u, 0x7fc00001u, 0xffa00000u,
                                      0x7f800000u, 0xff800000u, 0x7f7fffffu, 0x477ff000u, 0x33000000u, 0x38800001u,
                                      0x3f808000u, 0x3f818000u, 0x00000000u, 0x80000000u, 0x00018000u};
  OptimizerHyper h;
  h.kind = OptimizerKind::kSgd;
  h.lr = 0.0;
  for (CopyMode copy : {CopyMode::kBf16Rne, CopyMode::kBf16Stochastic, CopyMode::kFp16Rne}) {
    std::vector<std::vector<uint16_t>> results;
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (!isa_supported(isa)) continue;
      std::vector<float> master(bits.size()), grad(bits.size(), 0.0f);
      for (size_t i = 0; i < bits.size(); ++i) master[i] = bits_float(bits[i]);
      std::vector<uint16_t> out(bits.size());
      KernelArgs a;
      a.master = master.data();
      a.grad = grad.data();
      a.copy = out.data();
      a.n = bits.size();
      a.s = make_step_scalars(h, 1, 1.0, 1.0);
      kernels(isa).step[static_cast<int>(OptimizerKind::kSgd)][0][static_cast<int>(copy)](a);
      for (size_t i = 0; i < bits.size(); ++i) {
        if (copy == CopyMode::kBf16Rne) {
          ASSERT_EQ(out[i], float_to_bf16_rne(master[i])) << i;
        }
        if (copy == CopyMode::kFp16Rne) {
          ASSERT_EQ(out[i], float_to_fp16_rne(master[i])) << i;
        }
      }
      results.push_back(out);
    }
    for (const auto& r : results) EXPECT_EQ(r, results[0]);
  }
}

TEST(Kernels, SumOfSquaresDetectsNonFiniteGradients) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    std::vector<float> g(100, 0.5f);
    EXPECT_EQ(kernels(isa).sum_squares[0](g.data(), g.size()), 25.0);
    g[99] = std::numeric_limits<float>::infinity();
    EXPECT_FALSE(std::isfinite(kernels(isa).sum_squares[0](g.data(), g.size())));
    g[99] = std::nanf("");
    EXPECT_FALSE(std::isfinite(kernels(isa).sum_squares[0](g.data(), g.size())));
    std::vector<uint16_t> h(33, float_to_bf16_rne(2.0f));
    EXPECT_EQ(kernels(isa).sum_squares[1](h.data(), h.size()), 132.0);
    h.assign(33, float_to_fp16_rne(-3.0f));
    EXPECT_EQ(kernels(isa).sum_squares[2](h.data(), h.size()), 297.0);
  }
}

}  // namespace
}  // namespace zero

namespace zero {
namespace {

// The gradient norm must be the same bits on every rank whatever its SIMD path and thread count (stage 0 replicas,
// and the skip decision of every rank, depend on it): the 16-lane sum is identical across paths for any data and
// length, and the block sums are combined in block order whatever the threads.
TEST(Kernels, SumOfSquaresIsTheSameOnEveryPathAndThreadCount) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t n : {size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{1000003}, kSumBlockElems * 3 + 5}) {
    std::vector<float> g(n);
    for (auto& x : g) x = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = float_to_bf16_rne(g[i]);
    std::vector<double> scratch(sum_squares_blocks(n));
    const double want = parallel_sum_squares(kernel_table_scalar().sum_squares[0], g.data(), 4, n, 1, scratch.data());
    const double want16 = parallel_sum_squares(kernel_table_scalar().sum_squares[1], h.data(), 2, n, 1, scratch.data());
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (!isa_supported(isa)) continue;
      for (int threads : {1, 2, 3, 4}) {
        const double got = parallel_sum_squares(kernels(isa).sum_squares[0], g.data(), 4, n, threads, scratch.data());
        EXPECT_EQ(got, want) << isa_name(isa) << " n " << n << " threads " << threads;
        const double got16 = parallel_sum_squares(kernels(isa).sum_squares[1], h.data(), 2, n, threads, scratch.data());
        EXPECT_EQ(got16, want16) << isa_name(isa) << " bf16 n " << n << " threads " << threads;
      }
    }
  }
}

// With block_sums the optimizer pass also returns the norm's block sums: exactly sum_squares's bits on each block
// of the run (so the norm of a step is the same whether it comes from its own pass or from the update), on every
// path and thread count, whatever else the pass does (clearing, copies, every optimizer and gradient dtype), and
// the update itself is unchanged by it.
TEST(Kernels, TheUpdatePassSumsTheNormsSquaresWithTheNormPassesBits) {
  // Tails that start on either half of a 16-lane group (1037: AVX2 tail in lanes 8-15, 1061: in lanes 0-7); runs
  // of whole blocks plus one element (split between 2 and 3 threads: each thread takes whole blocks, and the last
  // element must still belong to one).
  for (size_t n : {size_t{1}, size_t{17}, size_t{1037}, size_t{1061}, kSumBlockElems, kSumBlockElems * 3 + 45,
                   kSumBlockElems * 2 + 1, kSumBlockElems * 3 + 1}) {
    for (const Case& c : all_cases()) {
      if (n > 2000 && !(c.kind == OptimizerKind::kAdamW || c.copy == CopyMode::kBf16Stochastic)) continue;
      const OptimizerHyper h = hyper_for(c);
      const int k = static_cast<int>(c.kind), g = static_cast<int>(c.grad), m = static_cast<int>(c.copy);
      const Streams start = make_streams(c, n, 11);
      const size_t blocks = sum_squares_blocks(n);
      std::vector<double> want_sums(blocks);
      for (size_t b = 0; b < blocks; ++b)
        want_sums[b] = kernel_table_scalar().sum_squares[g](start.grad.data() + b * kSumBlockElems * dtype_size(c.grad),
                                                            std::min(kSumBlockElems, n - b * kSumBlockElems));
      Streams want = start;
      KernelArgs wa = args_for(want, c, h, 2);
      kernel_table_scalar().step[k][g][m](wa);
      const std::vector<uint8_t> zeros(start.grad.size(), 0);
      for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
        if (!isa_supported(isa)) continue;
        for (int threads : {1, 2, 3}) {
          for (bool clear : {false, true}) {
            Streams got = start;
            std::vector<double> sums(blocks + 1, -1.0);  // one past the end: must stay untouched
            KernelArgs ga = args_for(got, c, h, 2);
            ga.block_sums = sums.data();
            ga.clear_grad = clear;
            parallel_step(kernels(isa).step[k][g][m], ga, threads);
            const std::string what = std::string(isa_name(isa)) + " " + describe(c) + " n " + std::to_string(n) +
                                     " threads " + std::to_string(threads) + (clear ? " clearing" : "");
            for (size_t b = 0; b < blocks; ++b) ASSERT_EQ(sums[b], want_sums[b]) << what << " block " << b;
            ASSERT_EQ(sums[blocks], -1.0) << what;
            ASSERT_EQ(0, std::memcmp(want.master.data(), got.master.data(), n * 4)) << what;
            ASSERT_EQ(0, std::memcmp(want.s0.data(), got.s0.data(), n * 4)) << what;
            ASSERT_EQ(0, std::memcmp(want.s1.data(), got.s1.data(), n * 4)) << what;
            ASSERT_EQ(0, std::memcmp(want.copy.data(), got.copy.data(), n * 2)) << what;
            if (clear)  // a comparison with zeros rather than a loop: it runs unoptimized under the sanitizers
              ASSERT_EQ(0, std::memcmp(got.grad.data(), zeros.data(), got.grad.size())) << what;
            else
              ASSERT_EQ(got.grad, start.grad) << what;
          }
        }
      }
    }
  }
}

// Random data rarely rounds differently when a square goes to the wrong lane; these values do: lane 0 holds 1 and
// lane 8 two squares of 0.5625 ulp each, whose sum rounds to 1 ulp above 1 when added to lane 0 together, and to 2
// ulp when one of them is added to lane 0 alone. The second sits in the tail (element 1032 of 1037: AVX2's last
// partial vector, which starts on the second half of a 16-lane group).
TEST(Kernels, TheUpdatePassPutsEverySquareInTheNormPassesLane) {
  const Case c{OptimizerKind::kAdamW, DType::kF32, CopyMode::kNone};
  const OptimizerHyper h = hyper_for(c);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    Streams s = make_streams(c, 1037, 3);
    std::vector<float> g(1037, 0.0f);
    g[0] = 1.0f;
    g[8] = g[1032] = std::ldexp(3.0f, -28);
    std::memcpy(s.grad.data(), g.data(), g.size() * 4);
    const double want = kernel_table_scalar().sum_squares[0](g.data(), g.size());
    ASSERT_EQ(want, 1.0 + std::ldexp(1.0, -52));
    double sum = 0.0;
    KernelArgs a = args_for(s, c, h, 1);
    a.block_sums = &sum;
    kernels(isa).step[0][0][0](a);
    EXPECT_EQ(sum, want) << isa_name(isa);
  }
}

// parallel_step splits a run at a multiple of 2^32 elements (stochastic rounding keys): with block_sums the split
// must fall on a block of the norm, where it leaves the sums as they are; elsewhere it is refused (the stepper
// then keeps the norm's own pass), never summed across a block.
TEST(Kernels, TheUpdatePassSumsSquaresAcrossA2p32SplitOnlyOnABlock) {
  const Case c{OptimizerKind::kAdamW, DType::kF32, CopyMode::kBf16Stochastic};
  const OptimizerHyper h = hyper_for(c);
  const size_t n = kSumBlockElems * 3;
  const Streams start = make_streams(c, n, 21);
  std::vector<double> want(3);
  for (size_t b = 0; b < 3; ++b)
    want[b] = kernel_table_scalar().sum_squares[0](start.grad.data() + b * kSumBlockElems * 4, kSumBlockElems);
  Streams plain = start, summed = start;
  KernelArgs pa = args_for(plain, c, h, 2), sa = args_for(summed, c, h, 2);
  pa.first_index = sa.first_index = (uint64_t{1} << 32) - kSumBlockElems;  // the split falls after block 0
  std::vector<double> sums(3, -1.0);
  sa.block_sums = sums.data();
  parallel_step(kernels(active_isa()).step[0][0][2], pa, 2);
  parallel_step(kernels(active_isa()).step[0][0][2], sa, 2);
  EXPECT_EQ(sums, want);
  EXPECT_EQ(0, std::memcmp(plain.master.data(), summed.master.data(), n * 4));
  EXPECT_EQ(0, std::memcmp(plain.copy.data(), summed.copy.data(), n * 2));
  sa.first_index = (uint64_t{1} << 32) - 100;  // mid-block
  try {
    parallel_step(kernels(active_isa()).step[0][0][2], sa, 2);
    ADD_FAILURE() << "a split inside a block of the norm was not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ZERO_ERR_INTERNAL);
  }
}

// The conversion kernels equal core/numeric/convert.hpp bit for bit on every path, and so do the host ElementOps that
// dispatch to them: random values of every magnitude and the special ones (denormals, infinities, quiet and
// signaling nans with payloads, values that round to infinity or to zero), raw 16-bit patterns (not only narrowed
// ones), sizes around the vector widths, out of place and in place (narrowing with dst at or before src, widening
// with dst at or after src, by offsets that are not whole vectors).
TEST(Kernels, ConversionsEqualTheScalarConversionsBitForBit) {
  std::mt19937 rng(5);
  const uint32_t special32[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu,
                                0x477ff000u, 0x477fefffu, 0x33000001u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                0xffc12345u, 0x7f800001u, 0xff812345u, 0x3f808000u, 0x3f818000u};
  const uint16_t special16[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x7bff, 0x7c00, 0xfc00, 0x7c01,
                                0xfd55, 0x7e00, 0x7f80, 0xff80, 0x7f81, 0xffc1, 0x0080, 0x807f};
  const ElementOps& ops = element_ops(MemorySpace::kHost);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    const KernelTable& k = kernels(isa);
    // Nothing is read or written for n = 0 (the pointers of an empty range may be anything).
    k.narrow[1](nullptr, nullptr, 0), k.widen[2](nullptr, nullptr, 0), k.accumulate[1](nullptr, nullptr, 0);
    for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, size_t{1000}}) {
      std::vector<float> f(n), finite(n);
      std::vector<uint16_t> raw(n);
      for (size_t i = 0; i < n; ++i) {
        const uint32_t bits = static_cast<uint32_t>(rng());
        finite[i] = std::ldexp(static_cast<float>(bits % 20001) - 10000.0f, static_cast<int>(bits % 300) - 160);
        f[i] = i % 3 == 0 ? bits_float(special32[i / 3 % (sizeof special32 / 4)]) : finite[i];
        raw[i] = i % 3 == 1 ? special16[i / 3 % (sizeof special16 / 2)] : static_cast<uint16_t>(bits >> 7);
      }
      for (DType d : {DType::kBF16, DType::kF16}) {
        const int di = static_cast<int>(d);
        const std::string what = std::string(isa_name(isa)) + " " + dtype_name(d) + " n " + std::to_string(n);
        std::vector<uint16_t> want16(n), got16(n);
        convert(want16.data(), d, f.data(), DType::kF32, n);
        k.narrow[di](got16.data(), f.data(), n);
        ASSERT_EQ(got16, want16) << what << " narrow";
        for (size_t back : {size_t{0}, size_t{1}, size_t{6}}) {  // dst at src, and 2 / 12 bytes before it
          std::vector<float> buf(n + 8, 0.0f);
          char* src = reinterpret_cast<char*>(buf.data()) + 16;
          std::memcpy(src, f.data(), n * 4);
          k.narrow[di](src - 2 * back, src, n);
          ASSERT_EQ(0, std::memcmp(src - 2 * back, want16.data(), n * 2)) << what << " narrow in place, back " << back;
          std::memcpy(src, f.data(), n * 4);
          ops.convert(src - 2 * back, d, src, DType::kF32, n);
          ASSERT_EQ(0, std::memcmp(src - 2 * back, want16.data(), n * 2)) << what << " ops narrow, back " << back;
        }
        std::vector<float> want32(n), got32(n);
        convert(want32.data(), DType::kF32, raw.data(), d, n);
        k.widen[di](got32.data(), raw.data(), n);
        ASSERT_EQ(0, std::memcmp(got32.data(), want32.data(), n * 4)) << what << " widen";
        for (size_t shift : {size_t{0}, size_t{3}, size_t{64}}) {  // dst at src, and after it (stage 1's block)
          std::vector<float> buf(n + shift + 1, 0.0f);
          char* base = reinterpret_cast<char*>(buf.data());
          std::memcpy(base + shift * 2, raw.data(), n * 2);
          k.widen[di](base + shift * 4, base + shift * 2, n);
          ASSERT_EQ(0, std::memcmp(base + shift * 4, want32.data(), n * 4)) << what << " widen in place " << shift;
          std::memcpy(base + shift * 2, raw.data(), n * 2);
          ops.convert(base + shift * 4, DType::kF32, base + shift * 2, d, n);
          ASSERT_EQ(0, std::memcmp(base + shift * 4, want32.data(), n * 4)) << what << " ops widen " << shift;
        }
        // Accumulators hold finite values: with a nan on both sides, which payload survives is the compiler's
        // choice of operand order (a + b and b + a are the same operation to it).
        for (bool into_zero : {false, true}) {
          std::vector<float> want_acc = finite, acc = finite, via_ops = finite;
          (into_zero ? accumulate_into_zero : accumulate)(want_acc.data(), DType::kF32, raw.data(), d, n);
          (into_zero ? k.accumulate_into_zero : k.accumulate)[di](acc.data(), raw.data(), n);
          (into_zero ? ops.accumulate_into_zero : ops.accumulate)(via_ops.data(), DType::kF32, raw.data(), d, n);
          ASSERT_EQ(0, std::memcmp(acc.data(), want_acc.data(), n * 4)) << what << " accumulate " << into_zero;
          ASSERT_EQ(0, std::memcmp(via_ops.data(), want_acc.data(), n * 4)) << what << " ops accumulate " << into_zero;
        }
      }
      for (bool into_zero : {false, true}) {
        std::vector<float> want_acc = finite, acc = finite;
        (into_zero ? accumulate_into_zero : accumulate)(want_acc.data(), DType::kF32, f.data(), DType::kF32, n);
        (into_zero ? k.accumulate_into_zero : k.accumulate)[0](acc.data(), f.data(), n);
        ASSERT_EQ(0, std::memcmp(acc.data(), want_acc.data(), n * 4)) << isa_name(isa) << " fp32 " << into_zero;
      }
    }
  }
}

// Non-finite gradients make the pass's block sum non-finite, as they do the norm pass's.
TEST(Kernels, TheUpdatePassesSquaresSeeNonFiniteGradients) {
  const Case c{OptimizerKind::kAdamW, DType::kF32, CopyMode::kNone};
  const OptimizerHyper h = hyper_for(c);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    for (size_t at : {size_t{0}, size_t{16}, size_t{1036}}) {  // first vector, a body vector, the tail
      for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
        Streams s = make_streams(c, 1037, 3);
        std::memcpy(&s.grad[4 * at], &bad, 4);
        double sum = 0.0;
        KernelArgs a = args_for(s, c, h, 1);
        a.block_sums = &sum;
        kernels(isa).step[0][0][0](a);
        EXPECT_FALSE(std::isfinite(sum)) << isa_name(isa) << " at " << at;
      }
    }
  }
}

// Stochastic rounding keys every element by its 64-bit index: parallel_step splits a run at a multiple of 2^32
// and gives the part above it the seed of the high bits, so the elements past the boundary round as the kernel
// rounds them when called on their own with that seed (and unlike a 32-bit key that wraps around).
TEST(Kernels, StochasticRoundingKeysTheFull64BitIndex) {
  const Case c{OptimizerKind::kSgd, DType::kF32, CopyMode::kBf16Stochastic, SgdVariant::kPlain};
  const OptimizerHyper h = hyper_for(c);
  // Long enough that parallel_step splits the parts across threads (2^16 elements per thread at least).
  const size_t n = 3 * 65536 + 77, below = 70000;  // elements below the boundary
  const uint64_t first = (uint64_t{1} << 32) - below;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    const StepKernel kernel = kernels(isa).step[static_cast<int>(c.kind)][0][static_cast<int>(c.copy)];
    for (int threads : {1, 2, 3}) {
      Streams whole = make_streams(c, n, 5);
      KernelArgs a = args_for(whole, c, h, 1);
      a.state0 = nullptr, a.state1 = nullptr;
      a.first_index = first;
      parallel_step(kernel, a, threads);
      // The two parts by hand: the seed of high bits 0 below the boundary, of high bits 1 above it.
      Streams parts = make_streams(c, n, 5);
      KernelArgs lo = args_for(parts, c, h, 1);
      lo.state0 = nullptr, lo.state1 = nullptr;
      lo.first_index = first;
      lo.n = below;
      kernel(lo);
      KernelArgs hi = lo;
      hi.master += below, hi.copy = parts.copy.data() + below;
      hi.grad = parts.grad.data() + below * 4;
      hi.first_index = uint64_t{1} << 32;
      hi.n = n - below;
      hi.s.seed = sr_index_seed(lo.s.seed, hi.first_index);
      kernel(hi);
      EXPECT_EQ(whole.copy, parts.copy) << isa_name(isa) << " threads " << threads;
      // A key that wrapped around to index 0 at the boundary would round differently.
      Streams wrapped = make_streams(c, n, 5);
      KernelArgs w = args_for(wrapped, c, h, 1);
      w.state0 = nullptr, w.state1 = nullptr;
      w.first_index = first;
      kernel(w);
      EXPECT_NE(whole.copy, wrapped.copy) << isa_name(isa);
    }
  }
}

}  // namespace
}  // namespace zero
