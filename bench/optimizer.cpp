// Optimizer kernels against their own memory roofline.
//
// For each kernel, dtype combination, SIMD path, thread count and size, the roofline is a memory-only loop with
// exactly the kernel's access pattern (the same streams read and written, in place, with the same element sizes)
// on the same buffers. Twelve such loops are tried (two widths, two shapes, no software prefetch or the kernels'
// prefetch into L2 or into L1; see kRoofVariants) and the fastest is the limit. STREAM triad is not the limit:
// in-place read-modify-write streams at a different rate than triad on this machine.
//
// Method, per configuration: calibration runs every memory-only loop twice and keeps the fastest; then that loop
// and the kernel alternate --reps times, each run starting with cold caches. The kernel's best time is compared
// with the best time of any memory-only run (calibration included, so the limit gets more chances than the
// kernel). The table prints the kernel's params/s, both best bandwidths, the kernel's fraction of the roofline as
// the median over the alternating pairs of (loop time / kernel time) ("of roof"), the same as best / best, and
// which loop set the limit.
//
//   bench_optimizer [--sizes 16,64] [--reps 8] [--threads 1,2] [--paths scalar,avx2,avx512]
//                   [--kernels AdamW,Adam-L2,Adagrad,Lion,SGD-mom] [--modes fp32,bf16,bf16g] [--warm 0|1]
//
// Cold caches (see CacheFlusher) because an optimizer step follows forward and backward, which have streamed
// everything else through the caches; --warm 1 skips the flush, so that working sets that fit the last-level
// cache are measured against the cache's bandwidth instead. Sizes below a few Mi with --warm 1 (e.g. 0.0625 =
// 64 Ki params, in L2) repeat the pass inside each timing and show the kernel's compute ceiling.
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu_loops.hpp"
#include "kernels/kernels.hpp"
#include "kernels/optimizer.hpp"

namespace {

using namespace zero;
using kernel_detail::kPrefetchAhead;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

void* big_alloc(size_t bytes) {
  void* p = std::aligned_alloc(2 << 20, (bytes + (2 << 20) - 1) / (2 << 20) * (2 << 20));
  if (p == nullptr) std::abort();
  madvise(p, bytes, MADV_HUGEPAGE);
  std::memset(p, 0, bytes);
  return p;
}

// The memory-only twin of a kernel: reads the same streams, writes the same streams, one add per stream.
struct Pattern {
  size_t grad_bytes;  // 4 or 2
  int states;         // 0, 1, 2 fp32 state streams
  bool copy;          // writes a 2-byte copy
};

// Software prefetch as in the kernels (core/kernels/cpu_loops.hpp): per block of 32 elements, one prefetch per
// 64-byte line of every stream, kPrefetchAhead elements ahead. kLocality 2 is the kernels' (prefetcht1, into L2);
// the memory-only loops also try 3 (prefetcht0, into L1) and no software prefetch at all.
constexpr size_t kBlock = 32;
template <int kLocality>
inline __attribute__((always_inline)) void prefetch_block(const Pattern& pat, float* p, const void* g, float* s0,
                                                          float* s1, uint16_t* copy, size_t j) {
  __builtin_prefetch(p + j, 1, kLocality), __builtin_prefetch(p + j + 16, 1, kLocality);
  const char* gj = static_cast<const char*>(g) + j * pat.grad_bytes;
  __builtin_prefetch(gj, 0, kLocality);
  if (pat.grad_bytes == 4) __builtin_prefetch(gj + 64, 0, kLocality);
  if (pat.states > 0) __builtin_prefetch(s0 + j, 1, kLocality), __builtin_prefetch(s0 + j + 16, 1, kLocality);
  if (pat.states > 1) __builtin_prefetch(s1 + j, 1, kLocality), __builtin_prefetch(s1 + j + 16, 1, kLocality);
  if (pat.copy) __builtin_prefetch(copy + j, 1, kLocality);
}

// kPrefetch: 0 none, else the __builtin_prefetch locality (2 = L2 as in the kernels, 3 = L1).
template <bool kPairs, int kPrefetch>
__attribute__((target("avx512f,avx512bw"))) void roofline_avx512(const Pattern& pattern, float* p, const void* g,
                                                                 float* s0, float* s1, uint16_t* copy, size_t n) {
  const Pattern pat = pattern;  // a local copy: stores through p cannot alias it, so its tests leave the loop
  const __m512 zero = _mm512_setzero_ps();
  for (size_t block = 0; block < n; block += kBlock) {
    if constexpr (kPrefetch != 0) prefetch_block<kPrefetch>(pat, p, g, s0, s1, copy, block + kPrefetchAhead);
    for (size_t i = block; i < block + kBlock; i += kPairs ? 32 : 16) {
      if (kPairs) {
        __m512 g0, g1;
        if (pat.grad_bytes == 4) {
          g0 = _mm512_loadu_ps(static_cast<const float*>(g) + i);
          g1 = _mm512_loadu_ps(static_cast<const float*>(g) + i + 16);
        } else {
          __m512i raw = _mm512_loadu_si512(static_cast<const uint16_t*>(g) + i);
          g0 = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
          g1 = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
        }
        __m512 p0 = _mm512_loadu_ps(p + i), p1 = _mm512_loadu_ps(p + i + 16);
        __m512 a0 = pat.states > 0 ? _mm512_loadu_ps(s0 + i) : zero,
               a1 = pat.states > 0 ? _mm512_loadu_ps(s0 + i + 16) : zero;
        __m512 b0 = pat.states > 1 ? _mm512_loadu_ps(s1 + i) : zero,
               b1 = pat.states > 1 ? _mm512_loadu_ps(s1 + i + 16) : zero;
        p0 = _mm512_add_ps(p0, g0), p1 = _mm512_add_ps(p1, g1);
        if (pat.states > 1) {
          _mm512_storeu_ps(s1 + i, _mm512_add_ps(b0, g0));
          _mm512_storeu_ps(s1 + i + 16, _mm512_add_ps(b1, g1));
        }
        if (pat.states > 0) {
          _mm512_storeu_ps(s0 + i, _mm512_add_ps(a0, g0));
          _mm512_storeu_ps(s0 + i + 16, _mm512_add_ps(a1, g1));
        }
        _mm512_storeu_ps(p + i, p0);
        _mm512_storeu_ps(p + i + 16, p1);
        // The copy stream: the same bytes written, with no conversion (this is the memory limit, not a kernel).
        if (pat.copy) _mm512_storeu_ps(reinterpret_cast<float*>(copy + i), _mm512_add_ps(p0, p1));
      } else {
        __m512 g0;
        if (pat.grad_bytes == 4)
          g0 = _mm512_loadu_ps(static_cast<const float*>(g) + i);
        else
          g0 = _mm512_castsi512_ps(_mm512_slli_epi32(
              _mm512_cvtepu16_epi32(
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(g) + i))),
              16));
        __m512 p0 = _mm512_loadu_ps(p + i);
        __m512 a0 = pat.states > 0 ? _mm512_loadu_ps(s0 + i) : zero;
        __m512 b0 = pat.states > 1 ? _mm512_loadu_ps(s1 + i) : zero;
        p0 = _mm512_add_ps(p0, g0);
        if (pat.states > 1) _mm512_storeu_ps(s1 + i, _mm512_add_ps(b0, g0));
        if (pat.states > 0) _mm512_storeu_ps(s0 + i, _mm512_add_ps(a0, g0));
        _mm512_storeu_ps(p + i, p0);
        if (pat.copy) _mm256_storeu_ps(reinterpret_cast<float*>(copy + i), _mm512_castps512_ps256(p0));
      }
    }
  }
}

template <bool kPairs, int kPrefetch>
__attribute__((target("avx2"))) void roofline_avx2(const Pattern& pattern, float* p, const void* g, float* s0,
                                                   float* s1, uint16_t* copy, size_t n) {
  const Pattern pat = pattern;
  const __m256 zero = _mm256_setzero_ps();
  for (size_t block = 0; block < n; block += kBlock) {
    if constexpr (kPrefetch != 0) prefetch_block<kPrefetch>(pat, p, g, s0, s1, copy, block + kPrefetchAhead);
    for (size_t i = block; i < block + kBlock; i += kPairs ? 16 : 8) {
      if (kPairs) {
        __m256 g0, g1;
        if (pat.grad_bytes == 4) {
          g0 = _mm256_loadu_ps(static_cast<const float*>(g) + i);
          g1 = _mm256_loadu_ps(static_cast<const float*>(g) + i + 8);
        } else {
          __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(g) + i));
          g0 = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
          g1 = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
        }
        __m256 p0 = _mm256_loadu_ps(p + i), p1 = _mm256_loadu_ps(p + i + 8);
        __m256 a0 = pat.states > 0 ? _mm256_loadu_ps(s0 + i) : zero,
               a1 = pat.states > 0 ? _mm256_loadu_ps(s0 + i + 8) : zero;
        __m256 b0 = pat.states > 1 ? _mm256_loadu_ps(s1 + i) : zero,
               b1 = pat.states > 1 ? _mm256_loadu_ps(s1 + i + 8) : zero;
        p0 = _mm256_add_ps(p0, g0), p1 = _mm256_add_ps(p1, g1);
        if (pat.states > 1) {
          _mm256_storeu_ps(s1 + i, _mm256_add_ps(b0, g0));
          _mm256_storeu_ps(s1 + i + 8, _mm256_add_ps(b1, g1));
        }
        if (pat.states > 0) {
          _mm256_storeu_ps(s0 + i, _mm256_add_ps(a0, g0));
          _mm256_storeu_ps(s0 + i + 8, _mm256_add_ps(a1, g1));
        }
        _mm256_storeu_ps(p + i, p0);
        _mm256_storeu_ps(p + i + 8, p1);
        if (pat.copy) _mm256_storeu_ps(reinterpret_cast<float*>(copy + i), _mm256_add_ps(p0, p1));
      } else {
        __m256 g0;
        if (pat.grad_bytes == 4)
          g0 = _mm256_loadu_ps(static_cast<const float*>(g) + i);
        else
          g0 = _mm256_castsi256_ps(_mm256_slli_epi32(
              _mm256_cvtepu16_epi32(
                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(g) + i))),
              16));
        __m256 p0 = _mm256_loadu_ps(p + i);
        __m256 a0 = pat.states > 0 ? _mm256_loadu_ps(s0 + i) : zero;
        __m256 b0 = pat.states > 1 ? _mm256_loadu_ps(s1 + i) : zero;
        p0 = _mm256_add_ps(p0, g0);
        if (pat.states > 1) _mm256_storeu_ps(s1 + i, _mm256_add_ps(b0, g0));
        if (pat.states > 0) _mm256_storeu_ps(s0 + i, _mm256_add_ps(a0, g0));
        _mm256_storeu_ps(p + i, p0);
        if (pat.copy) _mm_storeu_ps(reinterpret_cast<float*>(copy + i), _mm256_castps256_ps128(p0));
      }
    }
  }
}

using RoofLoop = void (*)(const Pattern&, float*, const void*, float*, float*, uint16_t*, size_t);
struct RoofVariant {
  const char* name;
  bool wide;  // needs AVX-512
  RoofLoop loop;
};
// The limit is the fastest of these for each access pattern: on this machine none is fastest for every pattern.
const RoofVariant kRoofVariants[] = {
    {"avx2-pairs", false, roofline_avx2<true, 0>},         {"avx2-single", false, roofline_avx2<false, 0>},
    {"avx2-pairs-pfL2", false, roofline_avx2<true, 2>},    {"avx2-single-pfL2", false, roofline_avx2<false, 2>},
    {"avx2-pairs-pfL1", false, roofline_avx2<true, 3>},    {"avx2-single-pfL1", false, roofline_avx2<false, 3>},
    {"avx512-pairs", true, roofline_avx512<true, 0>},      {"avx512-single", true, roofline_avx512<false, 0>},
    {"avx512-pairs-pfL2", true, roofline_avx512<true, 2>}, {"avx512-single-pfL2", true, roofline_avx512<false, 2>},
    {"avx512-pairs-pfL1", true, roofline_avx512<true, 3>}, {"avx512-single-pfL1", true, roofline_avx512<false, 3>},
};

// One memory-only loop, split across the threads like the kernels (chunks of whole 64-element blocks).
void roofline(const RoofVariant& variant, const Pattern& pat, float* p, const void* g, float* s0, float* s1,
              uint16_t* copy, size_t n) {
#pragma omp parallel
  {
    const size_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const size_t chunk = ((n + nt - 1) / nt + 63) / 64 * 64, begin = std::min(n, t * chunk),
                 end = std::min(n, begin + chunk);
    if (begin < end) {
      const void* gt = static_cast<const char*>(g) + begin * pat.grad_bytes;
      variant.loop(pat, p + begin, gt, s0 ? s0 + begin : nullptr, s1 ? s1 + begin : nullptr,
                   copy ? copy + begin : nullptr, end - begin);
    }
  }
}

// Evicts the benchmark's buffers from every cache level by reading a buffer twice the size of the last-level
// cache: an optimizer step runs after forward and backward have streamed activations through the caches, so its
// master weights and states come from memory, and the roofline must be measured in the same state.
struct CacheFlusher {
  size_t n = 0;
  float* buffer = nullptr;
  volatile float sink = 0;
  CacheFlusher() {
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    n = static_cast<size_t>(std::max(l3, 64L << 20)) * 2 / sizeof(float);
    buffer = static_cast<float*>(big_alloc(n * sizeof(float)));
  }
  ~CacheFlusher() { std::free(buffer); }
  void operator()() {
    float total = 0;
#pragma omp parallel for reduction(+ : total)
    for (size_t i = 0; i < n; i += 16) total += buffer[i];
    sink = total;
  }
};

// Seconds for one call of f, started with cold caches unless `warm`.
template <typename F>
double seconds(CacheFlusher& flush, bool warm, F&& f) {
  if (!warm) flush();
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

bool selected(const std::vector<std::string>& list, const char* name) {
  return list.empty() || std::find(list.begin(), list.end(), std::string(name)) != list.end();
}

int main(int argc, char** argv) {
  std::vector<std::string> sizes = {"16", "64"}, threads = {"1", std::to_string(omp_get_num_procs())},
                           paths = {"scalar", "avx2", "avx512"}, kernel_names, mode_names;
  int reps = 8;
  bool warm = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--sizes")
      sizes = split(argv[i + 1]);
    else if (a == "--threads")
      threads = split(argv[i + 1]);
    else if (a == "--paths")
      paths = split(argv[i + 1]);
    else if (a == "--kernels")
      kernel_names = split(argv[i + 1]);
    else if (a == "--modes")
      mode_names = split(argv[i + 1]);
    else if (a == "--warm")
      warm = std::string(argv[i + 1]) == "1";
    else if (a == "--reps")
      reps = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr,
                   "usage: %s [--sizes 16,64] [--reps 8] [--threads 1,2] [--paths scalar,avx2,avx512]\n"
                   "          [--kernels AdamW,Adam-L2,Adagrad,Lion,SGD-mom] [--modes fp32,bf16,bf16g] [--warm 0|1]\n",
                   argv[0]);
      return 2;
    }
  }
  struct Kind {
    const char* name;
    OptimizerKind kind;
  };
  const Kind kinds[] = {{"AdamW", OptimizerKind::kAdamW},
                        {"Adam-L2", OptimizerKind::kAdamL2},
                        {"Adagrad", OptimizerKind::kAdagrad},
                        {"Lion", OptimizerKind::kLion},
                        {"SGD-mom", OptimizerKind::kSgd}};
  struct Mode {
    const char* option;
    const char* name;
    DType grad;
    CopyMode copy;
  };
  const Mode modes[] = {{"fp32", "fp32", DType::kF32, CopyMode::kNone},
                        {"bf16", "bf16 (fp32 grads)", DType::kF32, CopyMode::kBf16Rne},
                        {"bf16g", "bf16 (bf16 grads)", DType::kBF16, CopyMode::kBf16Rne}};

  std::printf("%-8s %-18s %-7s %3s %6s %9s %6s %9s %9s %7s %7s  %s\n", "kernel", "dtypes", "path", "thr", "Mi",
              "Gparam/s", "B/par", "roof GB/s", "kern GB/s", "of roof", "best/bst", "limit set by");
  CacheFlusher flush;
  for (const std::string& size_text : sizes) {
    const size_t n = std::max<size_t>(64, static_cast<size_t>(std::atof(size_text.c_str()) * (1 << 20)) / 64 * 64);
    // Small sizes repeat the pass inside one timing so that each timing covers at least 16 Mi elements.
    const size_t passes = std::max<size_t>(1, (size_t{16} << 20) / n);
    float* p = static_cast<float*>(big_alloc(n * 4));
    float* s0 = static_cast<float*>(big_alloc(n * 4));
    float* s1 = static_cast<float*>(big_alloc(n * 4));
    void* g = big_alloc(n * 4);
    uint16_t* copy = static_cast<uint16_t*>(big_alloc(n * 2));
    for (const std::string& path : paths) {
      const Isa isa = path == "avx512" ? Isa::kAvx512 : path == "avx2" ? Isa::kAvx2 : Isa::kScalar;
      if (!isa_supported(isa)) continue;
      const KernelTable& table = kernels(isa);
      for (const std::string& thread_text : threads) {
        omp_set_num_threads(std::atoi(thread_text.c_str()));
        for (const Mode& mode : modes) {
          if (!selected(mode_names, mode.option)) continue;
          for (const Kind& kind : kinds) {
            if (!selected(kernel_names, kind.name)) continue;
            OptimizerHyper h;
            h.kind = kind.kind;
            h.momentum = 0.9;
            const int states = state_count(h);
            Pattern pat{dtype_size(mode.grad), states, mode.copy != CopyMode::kNone};
            const double bytes_per_param =
                2.0 * 4 + pat.grad_bytes + 2.0 * 4 * states + (pat.copy ? 2 : 0);  // p read+write, g, states r+w, copy
            KernelArgs a;
            a.master = p;
            a.grad = g;
            a.grad_elem_size = pat.grad_bytes;
            a.state0 = states > 0 ? s0 : nullptr;
            a.state1 = states > 1 ? s1 : nullptr;
            a.copy = pat.copy ? copy : nullptr;
            a.n = n;
            a.s = make_step_scalars(h, 2, 2.0, 1.0);  // a real step divides and multiplies
            // Realistic values in every stream (garbage could mean denormals, which cost microcode assists).
            for (size_t i = 0; i < n; ++i) {
              float gi = 1e-3f * static_cast<float>(i % 97 + 1);
              if (mode.grad == DType::kF32)
                static_cast<float*>(g)[i] = gi;
              else
                static_cast<uint16_t*>(g)[i] = float_to_bf16_rne(gi);
              p[i] = 1.0f, s0[i] = 0.01f, s1[i] = 1e-4f;
            }
            StepKernel k =
                table.step[static_cast<int>(kind.kind)][static_cast<int>(mode.grad)][static_cast<int>(mode.copy)];
            const auto run_roofline = [&](const RoofVariant& variant) {
              return seconds(flush, warm, [&] {
                for (size_t pass = 0; pass < passes; ++pass)
                  roofline(variant, pat, p, g, a.state0, a.state1, a.copy ? copy : nullptr, n);
              });
            };
            // Calibration: every memory-only loop twice; the fastest is this pattern's limit.
            const RoofVariant* limit = nullptr;
            double t_best = 1e30;
            for (int round = 0; round < 2; ++round)
              for (const RoofVariant& variant : kRoofVariants) {
                if (variant.wide && !isa_supported(Isa::kAvx512)) continue;
                const double t = run_roofline(variant);
                if (t < t_best) t_best = t, limit = &variant;
              }
            // Measurement: that loop and the kernel alternate under the same conditions, the loop right before each
            // kernel run. Two figures: the median over these pairs of (loop time / kernel time), robust to a lucky
            // or unlucky run on either side; and best / best, where the limit is the best time any memory-only loop
            // achieved, calibration included (more chances than the kernel gets, so it can only be lower).
            double t_roof = t_best, t_kern = 1e30;
            std::vector<double> pair_ratios;
            for (int r = 0; r < reps; ++r) {
              const double tr = run_roofline(*limit);
              const double tk = seconds(flush, warm, [&] {
                for (size_t pass = 0; pass < passes; ++pass) parallel_step(k, a);
              });
              t_roof = std::min(t_roof, tr), t_kern = std::min(t_kern, tk);
              pair_ratios.push_back(tr / tk);
            }
            std::sort(pair_ratios.begin(), pair_ratios.end());
            const size_t m = pair_ratios.size();
            const double median = m % 2 ? pair_ratios[m / 2] : (pair_ratios[m / 2 - 1] + pair_ratios[m / 2]) / 2;
            const double elems = static_cast<double>(n) * static_cast<double>(passes);
            std::printf("%-8s %-18s %-7s %3s %6s %9.3f %6.0f %9.1f %9.1f %6.1f%% %6.1f%%  %s\n", kind.name, mode.name,
                        path.c_str(), thread_text.c_str(), size_text.c_str(), elems / t_kern / 1e9, bytes_per_param,
                        elems * bytes_per_param / t_roof / 1e9, elems * bytes_per_param / t_kern / 1e9, 100.0 * median,
                        100.0 * t_roof / t_kern, limit->name);
            std::fflush(stdout);
          }
        }
      }
    }
    std::free(p), std::free(s0), std::free(s1), std::free(g), std::free(copy);
  }
  return 0;
}
