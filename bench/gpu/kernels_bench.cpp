// The GPU kernels against the device's copy bandwidth, measured in the same run (bench/README.md "GPU kernels").
//
// For each case the bytes a kernel must move (its streams read and written once) are compared with a device-to-
// device copy of the same number of bytes (launch_copy, which reads and writes half each): "of copy" is the median
// over alternating pairs of (copy time / kernel time), the same fraction the CPU benchmark calls "of roof". The
// step runs over `--segments` param groups of equal size in one fused launch, as an engine's bucket would.
//
//   bench_gpu_kernels [--sizes 16,64,256] [--reps 20] [--segments 1,64]
//
// Sizes are in Mi elements. Without a CUDA device it says so and exits 0: it is not a test.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/device_kernels.hpp"
#include "cuda/launch_table.hpp"
#include "kernels/kernels.hpp"
#include "kernels/optimizer.hpp"
#include "util/error.hpp"

namespace {

using namespace zero;

void ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "bench_gpu_kernels: %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

std::vector<double> parse_list(const char* s) {
  std::vector<double> out;
  for (const char* p = s; *p != '\0';) {
    char* end = nullptr;
    out.push_back(std::strtod(p, &end));
    if (end == p) {
      std::fprintf(stderr, "bench_gpu_kernels: not a number list: %s\n", s);
      std::exit(2);
    }
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  ok(cudaMalloc(&p, bytes), "cudaMalloc");
  ok(cudaMemset(p, 0, bytes), "cudaMemset");
  return p;
}

// Milliseconds of one call of `run` on the default stream, by events.
template <class F>
float time_ms(F run) {
  cudaEvent_t start, stop;
  ok(cudaEventCreate(&start), "cudaEventCreate");
  ok(cudaEventCreate(&stop), "cudaEventCreate");
  ok(cudaEventRecord(start, nullptr), "cudaEventRecord");
  run();
  ok(cudaEventRecord(stop, nullptr), "cudaEventRecord");
  ok(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  ok(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct Result {
  double kernel_ms = 0;  // best
  double copy_ms = 0;    // best
  double of_copy = 0;    // median of paired ratios
};

// Alternates the kernel and a copy of `bytes` bytes, after one warm-up of each.
template <class F>
Result paired(F kernel, size_t bytes, void* copy_a, void* copy_b, int reps) {
  const size_t copy_bytes = bytes / 2 / 16 * 16;
  auto copy = [&] { cuda::launch_copy(copy_b, copy_a, copy_bytes, nullptr); };
  kernel();
  copy();
  ok(cudaDeviceSynchronize(), "warm-up");
  Result r{1e30, 1e30, 0};
  std::vector<double> ratios;
  for (int i = 0; i < reps; ++i) {
    const double k = time_ms(kernel), c = time_ms(copy);
    r.kernel_ms = std::min(r.kernel_ms, k);
    r.copy_ms = std::min(r.copy_ms, c);
    ratios.push_back(c / k);
  }
  r.of_copy = median(ratios);
  return r;
}

void print_row(const char* what, double mi, size_t segments, size_t bytes, const Result& r) {
  const double gbs = static_cast<double>(bytes) / (r.kernel_ms * 1e6);
  const double copy_gbs = static_cast<double>(bytes) / (r.copy_ms * 1e6);
  std::printf("%-28s %7.0f Mi %5zu  %8.3f ms  %7.0f GB/s  copy %7.0f GB/s  of copy %.2f\n", what, mi, segments,
              r.kernel_ms, gbs, copy_gbs, r.of_copy);
}

struct StepCase {
  const char* name;
  OptimizerKind kind;
  DType grad;
  CopyMode copy;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<double> sizes = {16, 64, 256};
  std::vector<double> segment_counts = {1, 64};
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--sizes") {
      sizes = parse_list(argv[i + 1]);
    } else if (flag == "--segments") {
      segment_counts = parse_list(argv[i + 1]);
    } else if (flag == "--reps") {
      reps = std::max(1, std::atoi(argv[i + 1]));
    } else {
      std::fprintf(stderr, "bench_gpu_kernels: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  std::string why;
  if (!cuda::device_available(&why)) {
    std::printf("bench_gpu_kernels: no CUDA device (%s); nothing measured\n", why.c_str());
    return 0;
  }
  try {
    std::printf("device: %s; each kernel against a device copy of the same bytes, median of %d pairs\n",
                cuda::device_name().c_str(), reps);
    std::printf("%-28s %10s %5s  %11s  %12s  %17s  %s\n", "kernel", "elements", "segs", "best", "bandwidth", "copy",
                "");
    const StepCase cases[] = {
        {"AdamW fp32", OptimizerKind::kAdamW, DType::kF32, CopyMode::kNone},
        {"AdamW bf16 grad, bf16 copy", OptimizerKind::kAdamW, DType::kBF16, CopyMode::kBf16Rne},
        {"AdamW bf16 grad, bf16 sr", OptimizerKind::kAdamW, DType::kBF16, CopyMode::kBf16Stochastic},
        {"Lion bf16 grad, bf16 copy", OptimizerKind::kLion, DType::kBF16, CopyMode::kBf16Rne},
    };
    for (double mi : sizes) {
      const size_t n = static_cast<size_t>(mi * 1048576.0);
      // Every stream a case can touch, plus the copy's two halves (as large as the biggest case's bytes).
      float* master = static_cast<float*>(device_alloc(4 * n));
      float* s0 = static_cast<float*>(device_alloc(4 * n));
      float* s1 = static_cast<float*>(device_alloc(4 * n));
      void* grad = device_alloc(4 * n);
      void* copy16 = device_alloc(2 * n);
      void* copy_a = device_alloc(16 * n);
      void* copy_b = device_alloc(16 * n);
      for (const StepCase& c : cases) {
        OptimizerHyper h;
        h.kind = c.kind;
        h.lr = 1e-4;
        h.weight_decay = 0.01;
        const size_t states = state_count(h);
        const size_t gsize = dtype_size(c.grad);
        // master read+write, states read+write, gradient read, 16-bit copy written.
        const size_t bytes = n * (8 + 8 * states + gsize + (c.copy == CopyMode::kNone ? 0 : 2));
        for (double segs : segment_counts) {
          const size_t count = std::max<size_t>(1, static_cast<size_t>(segs));
          std::vector<KernelArgs> args(count);
          for (size_t i = 0; i < count; ++i) {
            const size_t begin = n * i / count, end = n * (i + 1) / count;
            KernelArgs& a = args[i];
            a.master = master + begin;
            a.grad = static_cast<const char*>(grad) + begin * gsize;
            a.grad_elem_size = gsize;
            a.state0 = states > 0 ? s0 + begin : nullptr;
            a.state1 = states > 1 ? s1 + begin : nullptr;
            a.copy = c.copy == CopyMode::kNone ? nullptr : static_cast<uint16_t*>(copy16) + begin;
            a.n = end - begin;
            a.first_index = begin;
            a.s = make_step_scalars(h, 3, 1.0, 1.0);
          }
          const cuda::LaunchTable table = cuda::plan_step_launches(c.kind, args.data(), args.size());
          void* device_args = device_alloc(sizeof(KernelArgs) * args.size());
          void* device_chunks = device_alloc(sizeof(cuda::StepChunk) * std::max<size_t>(1, table.chunks.size()));
          ok(cudaMemcpy(device_args, args.data(), sizeof(KernelArgs) * args.size(), cudaMemcpyHostToDevice), "upload");
          ok(cudaMemcpy(device_chunks, table.chunks.data(), sizeof(cuda::StepChunk) * table.chunks.size(),
                        cudaMemcpyHostToDevice),
             "upload");
          const Result r = paired(
              [&] {
                cuda::launch_step(c.kind, c.grad, c.copy, table, static_cast<const KernelArgs*>(device_args),
                                  static_cast<const cuda::StepChunk*>(device_chunks), nullptr);
              },
              bytes, copy_a, copy_b, reps);
          print_row(c.name, mi, count, bytes, r);
          cudaFree(device_args);
          cudaFree(device_chunks);
        }
      }
      // The norm's sum of squares of bf16 gradients (reads 2 bytes per element) and the conversions.
      const size_t blocks = cuda::sum_squares_scratch_doubles(n);
      double* scratch = static_cast<double*>(device_alloc(8 * (blocks + 1)));
      print_row("sum of squares bf16", mi, 1, 2 * n,
                paired([&] { cuda::launch_sum_squares(DType::kBF16, grad, n, scratch, scratch + blocks, nullptr); },
                       2 * n, copy_a, copy_b, reps));
      print_row(
          "widen bf16 -> fp32", mi, 1, 6 * n,
          paired([&] { cuda::launch_widen(DType::kBF16, master, copy16, n, nullptr); }, 6 * n, copy_a, copy_b, reps));
      print_row("accumulate bf16 into fp32", mi, 1, 10 * n,
                paired([&] { cuda::launch_accumulate(DType::kBF16, master, copy16, n, false, nullptr); }, 10 * n,
                       copy_a, copy_b, reps));
      for (void* p : {static_cast<void*>(master), static_cast<void*>(s0), static_cast<void*>(s1), grad, copy16, copy_a,
                      copy_b, static_cast<void*>(scratch)})
        cudaFree(p);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_gpu_kernels: %s\n", e.what());
    return 1;
  }
  return 0;
}
