// ZeRO-Offload's pipeline (core/cpu_offload/offload_pipeline.hpp) against its two limits, measured in the same run
// (bench/README.md "ZeRO-Offload pipeline"): the bus alone (every piece's gradients to the host and new params
// back, both directions at once, nothing computed) and the CPU alone (every piece accumulated and stepped from the
// slots, nothing copied). The pipeline overlaps them; the goal is a step within 1.3x the larger limit.
// Every piece is made ready at once, so nothing hides behind a backward pass: the pipeline's worst case.
//
//   bench_offload_pipeline [--params 64] [--piece 4] [--reps 7] [--queue host|cuda|emulator] [--threads 0]
//
// Sizes in Mi elements: bf16 gradients over the bus, fp32 accumulators, bf16 params, AdamW. --queue cuda (the
// libzero-cuda module and a device): the gradients and params in device memory, pinned slots, the runtime's streams
// (device/transfer_stream.hpp); --queue emulator: the same over the host emulator (a test tool: it checks, it does
// not measure a device); --queue host:
// host memory everywhere and HostTransferQueue's thread as the "bus" (a memcpy beside the CPU's work: on a
// machine whose cores share one memory bus the two compete, so this shows the pipeline's overhead, not PCIe).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/offload_pipeline.hpp"
#include "cpu_offload/transfer_queue.hpp"
#include "device/select.hpp"
#include "device/transfer_stream.hpp"
#include "kernels/kernels.hpp"
#include "kernels/optimizer.hpp"
#include "memory/ops.hpp"
#include "numeric/dtype.hpp"
#include "util/error.hpp"

namespace {

using namespace zero;
using Clock = std::chrono::steady_clock;

void* must(void* p, const char* what) {
  if (p == nullptr) {
    std::fprintf(stderr, "bench_offload_pipeline: out of memory (%s)\n", what);
    std::exit(1);
  }
  return p;
}

// Memory on one side of the bus: host memory (touched, so no first-touch fault is timed), or with a device
// runtime device memory and pinned host memory, and the runtime's streams as the queues.
struct Memory {
  std::shared_ptr<device::Runtime> runtime;
  std::unique_ptr<device::Stream> stream;  // the "engine's": allocations, and what the queues are ordered with
  std::vector<void*> host, device, pinned;
  void* on_host(size_t bytes) {
    void* p = must(std::aligned_alloc(64, (bytes + 63) / 64 * 64), "host");
    std::memset(p, 0, bytes);
    host.push_back(p);
    return p;
  }
  void* on_device(size_t bytes) {
    if (!runtime) return on_host(bytes);
    void* p = runtime->allocate(bytes, *stream);
    runtime->fill_zero(p, bytes, *stream);
    device.push_back(p);
    return p;
  }
  void* staging(size_t bytes) {
    if (!runtime) return on_host(bytes);
    void* p = must(runtime->allocate_pinned(bytes), "pinned");
    std::memset(p, 0, bytes);
    pinned.push_back(p);
    return p;
  }
  std::unique_ptr<TransferQueue> queue(const char* name) {
    if (!runtime) return std::make_unique<HostTransferQueue>(600.0);
    return std::make_unique<device::DeviceTransferQueue>(*runtime, *stream, name, 600.0);
  }
  void finish() {
    if (!runtime) return;
    std::unique_ptr<device::Event> done = runtime->create_event();
    runtime->record(*done, *stream);
    runtime->synchronize(*done, 600.0, "the benchmark's device work");
  }
  ~Memory() {
    for (void* p : host) std::free(p);
    if (!runtime) return;
    for (void* p : device) runtime->release(p, *stream);
    finish();
    for (void* p : pinned) runtime->release_pinned(p);
  }
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  double params_mi = 64, piece_mi = 4;
  int reps = 7, threads = 0;
  std::string queue = "host";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--params")
      params_mi = std::atof(argv[i + 1]);
    else if (a == "--piece")
      piece_mi = std::atof(argv[i + 1]);
    else if (a == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (a == "--queue")
      queue = argv[i + 1];
    else if (a == "--threads")
      threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr,
                   "usage: bench_offload_pipeline [--params Mi] [--piece Mi] [--reps N] [--queue host|cuda|emulator] "
                   "[--threads T]\n");
      return 2;
    }
  }
  if (queue != "host" && queue != "cuda" && queue != "emulator") {
    std::fprintf(stderr, "bench_offload_pipeline: --queue is host, cuda or emulator\n");
    return 2;
  }
  Memory mem;
  if (queue != "host") {
    try {
      mem.runtime = device::runtime_named(queue);
    } catch (const Error& e) {
      std::printf("bench_offload_pipeline: no %s runtime (%s); nothing measured\n", queue.c_str(), e.what());
      return 0;
    }
    mem.stream = mem.runtime->create_stream("bench");
  }
  const size_t total = static_cast<size_t>(params_mi * (1 << 20)), piece = static_cast<size_t>(piece_mi * (1 << 20));
  if (total == 0 || piece == 0 || reps < 1) {
    std::fprintf(stderr, "bench_offload_pipeline: --params, --piece and --reps must be positive\n");
    return 2;
  }
  const DType transfer = DType::kBF16, grad = DType::kF32, compute = DType::kBF16;
  char* device_grads = static_cast<char*>(mem.on_device(total * 2));
  char* device_params = static_cast<char*>(mem.on_device(total * 2));
  float* host_grads = static_cast<float*>(mem.on_host(total * 4));
  float* master = static_cast<float*>(mem.on_host(total * 4));
  float* m = static_cast<float*>(mem.on_host(total * 4));
  float* v = static_cast<float*>(mem.on_host(total * 4));
  OffloadBuffers buffers;
  for (int s = 0; s < 2; ++s) {
    buffers.grad_slots[s] = mem.staging(piece * 2);
    buffers.param_slots[s] = mem.staging(piece * 2);
  }
  buffers.grad_slot_bytes = buffers.param_slot_bytes = piece * 2;
  std::vector<OffloadPiece> pieces;
  for (size_t begin = 0; begin < total; begin += piece) {
    OffloadSegment seg;
    const size_t n = std::min(piece, total - begin);
    seg.device_grad = device_grads + begin * 2;
    seg.host_grad = host_grads + begin;
    seg.device_params = device_params + begin * 2;
    seg.args.master = master + begin;
    seg.args.state0 = m + begin;
    seg.args.state1 = v + begin;
    seg.args.grad_elem_size = 4;
    seg.args.n = n;
    seg.args.first_index = begin;
    pieces.push_back(OffloadPiece{{seg}});
  }
  const StepKernel kernel =
      kernels(active_isa())
          .step[static_cast<int>(OptimizerKind::kAdamW)][static_cast<int>(grad)][static_cast<int>(CopyMode::kBf16Rne)];
  OptimizerHyper h;
  const std::vector<StepScalars> per_group = {make_step_scalars(h, 1, 1.0, 1.0)};
  mem.finish();  // the device buffers are zeroed before the queues' streams copy them
  auto to_host = mem.queue("to the host"), to_device = mem.queue("to the device");
  const ElementOps& ops = element_ops(MemorySpace::kHost);

  std::vector<double> bus, cpu, pipe;
  for (int r = 0; r < reps + 1; ++r) {  // the first round warms up and is not counted
    auto t0 = Clock::now();
    TransferQueue::Ticket up = 0, down = 0;
    for (size_t p = 0; p < pieces.size(); ++p) {
      const OffloadSegment& s = pieces[p].segments[0];
      up = to_host->copy(buffers.grad_slots[p % 2], s.device_grad, s.args.n * 2, "bus: gradients");
      down = to_device->copy(s.device_params, buffers.param_slots[p % 2], s.args.n * 2, "bus: params");
    }
    to_host->wait(up);
    to_device->wait(down);
    const double t_bus = seconds_since(t0);

    t0 = Clock::now();
    for (size_t p = 0; p < pieces.size(); ++p) {
      const OffloadSegment& s = pieces[p].segments[0];
      ops.accumulate_into_zero(s.host_grad, grad, buffers.grad_slots[p % 2], transfer, s.args.n);
      KernelArgs a = s.args;
      a.grad = s.host_grad;
      a.copy = buffers.param_slots[p % 2];
      a.s = per_group[0];
      parallel_step(kernel, a, threads);
    }
    const double t_cpu = seconds_since(t0);

    t0 = Clock::now();
    {
      OffloadPipeline pipeline(pieces, transfer, grad, compute, buffers, *to_host, *to_device);
      pipeline.begin_micro_step(true);
      for (size_t p = 0; p < pieces.size(); ++p) pipeline.gradients_ready(p);
      for (size_t p = 0; p < pieces.size(); ++p) pipeline.step(p, kernel, per_group, threads);
      pipeline.finish_params();
    }
    const double t_pipe = seconds_since(t0);
    if (r == 0) continue;
    bus.push_back(t_bus), cpu.push_back(t_cpu), pipe.push_back(t_pipe);
  }
  const double b = median(bus), c = median(cpu), p = median(pipe);
  const double bus_bytes = static_cast<double>(total) * 4, cpu_bytes = static_cast<double>(total) * 36;
  std::printf(
      "ZeRO-Offload pipeline, %s queue: %.0f Mi params in %zu pieces of %.0f Mi (bf16 over the bus, fp32 "
      "accumulators, AdamW), median of %d\n",
      mem.runtime ? mem.runtime->describe().c_str() : "host", params_mi, pieces.size(), piece_mi, reps);
  std::printf("%-28s %10s %12s\n", "", "ms", "GB/s");
  std::printf("%-28s %10.2f %12.2f\n", "bus alone (both ways)", b * 1e3, bus_bytes / b / 1e9);
  std::printf("%-28s %10.2f %12.2f\n", "CPU alone (36 B/param)", c * 1e3, cpu_bytes / c / 1e9);
  std::printf("%-28s %10.2f\n", "pipeline", p * 1e3);
  std::printf("pipeline / max(bus, CPU) = %.2f (goal <= 1.3); pipeline / (bus + CPU) = %.2f\n", p / std::max(b, c),
              p / (b + c));
  return 0;
}
