#include "step/device_pass.hpp"

#include <algorithm>
#include <cstring>

#include "cuda/device_kernels.hpp"
#include "cuda/launch_table.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

size_t aligned(size_t bytes) {
  return (bytes + device::kDeviceAlignment - 1) / device::kDeviceAlignment * device::kDeviceAlignment;
}

}  // namespace

DevicePass::DevicePass(std::shared_ptr<device::DeviceContext> context)
    : context_(std::move(context)), staging_free_(context_->runtime().create_event()) {}

DevicePass::~DevicePass() {
  device::Runtime& rt = context_->runtime();
  try {
    for (void* p : {segments_, chunks_, scratch_})
      if (p != nullptr) rt.release(p, context_->stream());
    rt.synchronize(*staging_free_, context_->timeout_s(), "the step's last copy");
    if (staging_ != nullptr) rt.release_pinned(staging_);
  } catch (...) {  // a device that failed: what it holds stays with it
  }
}

void* DevicePass::device_buffer(void*& buffer, size_t& capacity, size_t bytes) {
  if (bytes <= capacity) return buffer;
  device::Runtime& rt = context_->runtime();
  const size_t size = std::max(aligned(bytes), capacity * 2);
  if (buffer != nullptr) rt.release(buffer, context_->stream());
  buffer = nullptr, capacity = 0;
  buffer = rt.allocate(size, context_->stream());
  capacity = size;
  return buffer;
}

void* DevicePass::staging(size_t bytes) {
  device::Runtime& rt = context_->runtime();
  rt.synchronize(*staging_free_, context_->timeout_s(), "the step's previous copy through its staging");
  if (bytes > staging_bytes_) {
    const size_t size = std::max(aligned(bytes), staging_bytes_ * 2);
    if (staging_ != nullptr) rt.release_pinned(staging_);
    staging_ = nullptr, staging_bytes_ = 0;
    staging_ = rt.allocate_pinned(size);
    staging_bytes_ = size;
  }
  rt.host_access(staging_, bytes, true);
  return staging_;
}

std::vector<double> DevicePass::sums_of_squares(DType grad, const std::vector<std::pair<const void*, size_t>>& runs) {
  std::vector<double> sums(runs.size(), 0.0);
  if (runs.empty()) return sums;
  device::Runtime& rt = context_->runtime();
  device::Stream& stream = context_->stream();
  size_t most = 0;
  for (const auto& run : runs) most = std::max(most, cuda::sum_squares_scratch_doubles(run.second));
  const size_t results_bytes = aligned(runs.size() * sizeof(double));
  auto* base = static_cast<char*>(device_buffer(scratch_, scratch_bytes_, results_bytes + most * sizeof(double)));
  auto* results = reinterpret_cast<double*>(base);
  auto* scratch = reinterpret_cast<double*>(base + results_bytes);
  // One stream: each run's kernels finish before the next run's reuse the scratch.
  for (size_t i = 0; i < runs.size(); ++i)
    rt.sum_squares(grad, runs[i].first, runs[i].second, scratch, results + i, stream);
  void* host = staging(runs.size() * sizeof(double));
  rt.copy(host, results, runs.size() * sizeof(double), stream);
  rt.record(*staging_free_, stream);
  rt.synchronize(*staging_free_, context_->timeout_s(), "the gradient norm's sums of squares");
  rt.host_access(host, runs.size() * sizeof(double), false);
  std::memcpy(sums.data(), host, runs.size() * sizeof(double));
  return sums;
}

void DevicePass::step(OptimizerKind kind, DType grad, CopyMode copy, const std::vector<KernelArgs>& segments,
                      bool clear_grads) {
  if (segments.empty()) return;
  device::Runtime& rt = context_->runtime();
  device::Stream& stream = context_->stream();
  const cuda::LaunchTable table = cuda::plan_step_launches(kind, segments.data(), segments.size());
  if (table.chunks.empty()) return;
  const size_t segment_bytes = segments.size() * sizeof(KernelArgs);
  const size_t chunk_bytes = table.chunks.size() * sizeof(cuda::StepChunk);
  void* on_device_segments = device_buffer(segments_, segments_bytes_, segment_bytes);
  void* on_device_chunks = device_buffer(chunks_, chunks_bytes_, chunk_bytes);
  auto* host = static_cast<char*>(staging(aligned(segment_bytes) + chunk_bytes));
  std::memcpy(host, segments.data(), segment_bytes);
  std::memcpy(host + aligned(segment_bytes), table.chunks.data(), chunk_bytes);
  rt.copy(on_device_segments, host, segment_bytes, stream);
  rt.copy(on_device_chunks, host + aligned(segment_bytes), chunk_bytes, stream);
  rt.record(*staging_free_, stream);
  rt.step(kind, grad, copy, table, segments.data(), segments.size(), static_cast<const KernelArgs*>(on_device_segments),
          static_cast<const cuda::StepChunk*>(on_device_chunks), stream);
  if (clear_grads)
    for (const KernelArgs& a : segments) rt.fill_zero(const_cast<void*>(a.grad), a.n * a.grad_elem_size, stream);
}

}  // namespace zero
