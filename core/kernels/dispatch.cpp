// Which SIMD path runs: the best one CPUID reports, or the one ZERO_SIMD forces (tests cover every path on one
// machine that way). And the OpenMP split of a run over threads.
#include "kernels/no_fp_contraction.hpp"  // before anything else: no FMA contraction in this file

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/kernels.hpp"
#include "util/error.hpp"

namespace zero {

#ifdef ZERO_X86_KERNELS
const KernelTable& kernel_table_avx512_bf16();
const KernelTable& kernel_table_avx512_plain();
#endif

namespace {

// What the CPU and the operating system support, from CPUID and XGETBV directly (GCC's and clang's
// __builtin_cpu_supports know different feature names, and neither knows every one used here).
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512bf16 = false;
};

#ifdef ZERO_X86_KERNELS
void cpuid(unsigned leaf, unsigned subleaf, unsigned r[4]) {
  __asm__("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(subleaf));
}

CpuFeatures detect_features() {
  CpuFeatures f;
  unsigned r[4];
  cpuid(0, 0, r);
  const unsigned max_leaf = r[0];
  if (max_leaf < 7) return f;
  cpuid(1, 0, r);
  const bool osxsave = (r[2] >> 27) & 1u, avx = (r[2] >> 28) & 1u;
  if (!osxsave || !avx) return f;
  unsigned lo = 0, hi = 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const bool ymm_state = (lo & 0x6u) == 0x6u;    // the OS saves SSE and AVX registers
  const bool zmm_state = (lo & 0xe6u) == 0xe6u;  // and the AVX-512 opmask and upper ZMM registers
  if (!ymm_state) return f;
  f.fma = (r[2] >> 12) & 1u;
  f.f16c = (r[2] >> 29) & 1u;
  cpuid(7, 0, r);
  const unsigned max_subleaf = r[0];
  f.avx2 = (r[1] >> 5) & 1u;
  if (zmm_state) {
    f.avx512f = (r[1] >> 16) & 1u;
    f.avx512dq = (r[1] >> 17) & 1u;
    f.avx512bw = (r[1] >> 30) & 1u;
    f.avx512vl = (r[1] >> 31) & 1u;
    if (max_subleaf >= 1) {
      cpuid(7, 1, r);
      f.avx512bf16 = (r[0] >> 5) & 1u;
    }
  }
  return f;
}
#else
CpuFeatures detect_features() { return CpuFeatures{}; }  // not x86-64: the portable path only
#endif

const CpuFeatures& cpu() {
  static const CpuFeatures features = detect_features();
  return features;
}

bool cpu_has_avx2() { return cpu().avx2 && cpu().fma && cpu().f16c; }
bool cpu_has_avx512() { return cpu().avx512f && cpu().avx512bw && cpu().avx512vl && cpu().avx512dq; }

Isa detect() {
  const char* forced = std::getenv("ZERO_SIMD");
  if (forced != nullptr && forced[0] != '\0') {
    std::string f = forced;
    Isa isa = f == "scalar" ? Isa::kScalar : f == "avx2" ? Isa::kAvx2 : f == "avx512" ? Isa::kAvx512 : Isa::kScalar;
    if (f != "scalar" && f != "avx2" && f != "avx512")
      fail(ZERO_ERR_CONFIG, "ZERO_SIMD is '" + f + "'; valid values: scalar, avx2, avx512 (or unset for the best)");
    if (!isa_supported(isa)) fail(ZERO_ERR_UNSUPPORTED, "ZERO_SIMD=" + f + " but this CPU does not support it");
    return isa;
  }
  if (cpu_has_avx512()) return Isa::kAvx512;
  if (cpu_has_avx2()) return Isa::kAvx2;
  return Isa::kScalar;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return cpu_has_avx2();
    case Isa::kAvx512:
      return cpu_has_avx512();
  }
  return false;
}

Isa active_isa() {
  // Read once: the path must not change in the middle of a run.
  static const Isa isa = detect();
  return isa;
}

#ifdef ZERO_X86_KERNELS
const KernelTable& kernel_table_avx512() {
  return cpu().avx512bf16 ? kernel_table_avx512_bf16() : kernel_table_avx512_plain();
}
#endif

const KernelTable& kernels(Isa isa) {
  if (!isa_supported(isa)) fail(ZERO_ERR_UNSUPPORTED, std::string("the ") + isa_name(isa) + " path is not supported");
  switch (isa) {
#ifdef ZERO_X86_KERNELS
    case Isa::kAvx2:
      return kernel_table_avx2();
    case Isa::kAvx512:
      return kernel_table_avx512();
#endif
    default:
      return kernel_table_scalar();
  }
}

namespace {

// Below this many elements per thread, starting threads costs more than it saves.
constexpr size_t kMinElemsPerThread = size_t{1} << 16;

int threads_for(size_t n, int limit) {
  const int max_threads = limit > 0 ? limit : omp_get_max_threads();
  size_t useful = n / kMinElemsPerThread;
  return static_cast<int>(std::max<size_t>(1, std::min<size_t>(useful, static_cast<size_t>(max_threads))));
}

void parallel_step_within_2p32(StepKernel kernel, const KernelArgs& args, int max_threads) {
  const int threads = threads_for(args.n, max_threads);
  if (threads == 1) return kernel(args);
  // Chunks are multiples of 64 elements so that every chunk starts on a cache line; whole blocks of the norm when
  // the pass sums squares.
  const size_t align = args.block_sums != nullptr ? kSumBlockElems : 64;
#pragma omp parallel num_threads(threads)
  {
    const size_t t = static_cast<size_t>(omp_get_thread_num()), nt = static_cast<size_t>(omp_get_num_threads());
    // n / nt rounded up, then to whole lines or blocks: rounding n / nt down first could leave the last
    // n mod nt elements to no thread when n / nt is already a multiple of `align`.
    const size_t chunk = ((args.n + nt - 1) / nt + align - 1) / align * align;
    const size_t begin = std::min(args.n, t * chunk), end = std::min(args.n, begin + chunk);
    if (begin < end) kernel(sub_run(args, begin, end - begin));
  }
}

}  // namespace

KernelArgs sub_run(const KernelArgs& args, size_t begin, size_t n) {
  KernelArgs a = args;
  a.n = n;
  a.master = args.master + begin;
  a.grad = static_cast<const char*>(args.grad) + begin * args.grad_elem_size;
  if (args.state0) a.state0 = args.state0 + begin;
  if (args.state1) a.state1 = args.state1 + begin;
  if (args.copy) a.copy = static_cast<uint16_t*>(args.copy) + begin;
  if (args.block_sums) a.block_sums = args.block_sums + begin / kSumBlockElems;
  a.first_index = args.first_index + begin;
  return a;
}

void parallel_step(StepKernel kernel, const KernelArgs& args, int max_threads) {
  // The kernels hash the 32 low bits of an element's index (stochastic rounding): a run that crosses a multiple of
  // 2^32 is split there, and each part gets the seed of its high bits (the stepper sums squares in the pass only
  // where every split falls on a block of the norm).
  if (args.block_sums != nullptr && splits_inside_a_norm_block(args.first_index, args.n))
    fail(ZERO_ERR_INTERNAL, "parallel_step: a run that sums squares crosses a multiple of 2^32 elements mid-block");
  size_t done = 0;
  do {
    const uint64_t first = args.first_index + done;
    const uint64_t to_boundary = (uint64_t{1} << 32) - (first & 0xffffffffu);
    const size_t n = static_cast<size_t>(std::min<uint64_t>(args.n - done, to_boundary));
    KernelArgs part = sub_run(args, done, n);
    part.s.seed = sr_index_seed(args.s.seed, first);
    parallel_step_within_2p32(kernel, part, max_threads);
    done += n;
  } while (done < args.n);
}

double parallel_sum_squares(SumSquaresKernel kernel, const void* grad, size_t elem_size, size_t n, int max_threads,
                            double* scratch) {
  const size_t blocks = sum_squares_blocks(n);
  const char* base = static_cast<const char*>(grad);
  auto block_sum = [&](size_t b) {
    const size_t begin = b * kSumBlockElems;
    return kernel(base + begin * elem_size, std::min(kSumBlockElems, n - begin));
  };
  const int threads = threads_for(n, max_threads);
  double sum = 0.0;
  if (threads == 1 || blocks == 1) {
    for (size_t b = 0; b < blocks; ++b) sum += block_sum(b);
    return sum;
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t b = 0; b < blocks; ++b) scratch[b] = block_sum(b);
  for (size_t b = 0; b < blocks; ++b) sum += scratch[b];  // block order, as the sequential loop above
  return sum;
}

}  // namespace zero
