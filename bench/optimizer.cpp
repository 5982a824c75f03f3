// Optimizer kernels against their own memory roofline.
//
// For each kernel, dtype combination, SIMD path, thread count and size, a memory-only kernel with exactly the same
// access pattern (the same streams read and written, in place, with the same element sizes) runs right before
// the optimizer kernel on the same buffers; both are timed (best of --reps), and the table prints the kernel's
// params/s and its fraction of the roofline's. STREAM triad is not the limit: in-place read-modify-write streams
// at a different rate than triad on this machine.
//
//   bench_optimizer [--sizes 16,64] [--reps 3] [--threads 1,2] [--paths scalar,avx2,avx512]
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "optim/hyper.hpp"
#include "optim/kernels.hpp"

namespace {

using namespace zero;

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

// Two vectors per iteration, so that every stream (the 2-byte ones too) moves whole 64-byte lines per iteration;
// all loads before all stores, as in the kernels (a store followed by a load 4 KiB apart stalls on 4K aliasing,
// and the buffers are 2 MiB-aligned).
__attribute__((target("avx512f,avx512bw"))) void roofline_avx512(const Pattern& pattern, float* p, const void* g,
                                                                 float* s0, float* s1, uint16_t* copy, size_t n) {
  const Pattern pat = pattern;  // a local copy: stores through p cannot alias it, so its tests leave the loop
  const __m512 zero = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 32) {
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
  }
}

__attribute__((target("avx2"))) void roofline_avx2(const Pattern& pattern, float* p, const void* g, float* s0,
                                                   float* s1, uint16_t* copy, size_t n) {
  const Pattern pat = pattern;
  const __m256 zero = _mm256_setzero_ps();
  for (size_t i = 0; i < n; i += 16) {
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
  }
}

// The memory-only twin, split across the threads like the kernels. `wide` picks the AVX-512 variant.
void roofline(bool wide, const Pattern& pat, float* p, const void* g, float* s0, float* s1, uint16_t* copy, size_t n) {
#pragma omp parallel
  {
    const size_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const size_t chunk = (n / nt + 63) / 64 * 64, begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
    if (begin < end) {
      const void* gt = static_cast<const char*>(g) + begin * pat.grad_bytes;
      float* s0t = s0 ? s0 + begin : nullptr;
      float* s1t = s1 ? s1 + begin : nullptr;
      uint16_t* ct = copy ? copy + begin : nullptr;
      if (wide)
        roofline_avx512(pat, p + begin, gt, s0t, s1t, ct, end - begin);
      else
        roofline_avx2(pat, p + begin, gt, s0t, s1t, ct, end - begin);
    }
  }
}

template <typename F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> sizes = {"16", "64"}, threads = {"1", std::to_string(omp_get_num_procs())},
                           paths = {"scalar", "avx2", "avx512"};
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--sizes")
      sizes = split(argv[i + 1]);
    else if (a == "--threads")
      threads = split(argv[i + 1]);
    else if (a == "--paths")
      paths = split(argv[i + 1]);
    else if (a == "--reps")
      reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--sizes 16,64] [--reps 3] [--threads 1,2] [--paths scalar,avx2,avx512]\n",
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
    const char* name;
    DType grad;
    CopyMode copy;
  };
  const Mode modes[] = {{"fp32", DType::kF32, CopyMode::kNone},
                        {"bf16 (fp32 grads)", DType::kF32, CopyMode::kBf16Rne},
                        {"bf16 (bf16 grads)", DType::kBF16, CopyMode::kBf16Rne}};

  std::printf("%-8s %-18s %-7s %3s %5s %9s %6s %9s %9s %7s\n", "kernel", "dtypes", "path", "thr", "Mi", "Gparam/s",
              "B/par", "roof GB/s", "kern GB/s", "of roof");
  for (const std::string& size_text : sizes) {
    const size_t n = static_cast<size_t>(std::atol(size_text.c_str())) << 20;
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
          for (const Kind& kind : kinds) {
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
            a.s = make_step_scalars(h, 2, 1.0);
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
            double t_roof = 1e30, t_kern = 1e30;
            for (int r = 0; r < reps; ++r) {  // the roofline right before each kernel run, on the same buffers
              // The limit is the faster of the two memory-only variants (AVX2 and, where present, AVX-512): on this
              // machine neither is fastest for every access pattern.
              for (bool wide : {false, true}) {
                if (wide && !isa_supported(Isa::kAvx512)) continue;
                t_roof = std::min(t_roof, best_seconds(1, [&] {
                                    roofline(wide, pat, p, g, a.state0, a.state1, pat.copy ? copy : nullptr, n);
                                  }));
              }
              t_kern = std::min(t_kern, best_seconds(1, [&] { parallel_step(k, a); }));
            }
            std::printf("%-8s %-18s %-7s %3s %5s %9.3f %6.0f %9.1f %9.1f %6.1f%%\n", kind.name, mode.name, path.c_str(),
                        thread_text.c_str(), size_text.c_str(), n / t_kern / 1e9, bytes_per_param,
                        n * bytes_per_param / t_roof / 1e9, n * bytes_per_param / t_kern / 1e9,
                        100.0 * t_roof / t_kern);
            std::fflush(stdout);
          }
        }
      }
    }
    std::free(p), std::free(s0), std::free(s1), std::free(g), std::free(copy);
  }
  return 0;
}
