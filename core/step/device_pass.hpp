// The stepper's passes on a device: the norm's sums of squares and the fused optimizer step, queued on the device
// context's stream through the runtime's kernels, which compute every element with the CPU's operations in the
// CPU's order (cuda/launch_table.hpp, docs/architecture.md "GPU kernels"). The per-step tables (the segments with
// their step constants, the launch table's chunks) go up through pinned staging; the norm's sums come back through
// it, the one host wait of a step that needs the norm.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "device/device_memory.hpp"
#include "kernels/kernels.hpp"
#include "numeric/dtype.hpp"

namespace zero {

class DevicePass {
 public:
  explicit DevicePass(std::shared_ptr<device::DeviceContext> context);
  ~DevicePass();
  DevicePass(const DevicePass&) = delete;
  DevicePass& operator=(const DevicePass&) = delete;

  // The sum of squares of each run of `grad` elements (device memory), with the bits of parallel_sum_squares on
  // the CPU. The host waits for them.
  std::vector<double> sums_of_squares(DType grad, const std::vector<std::pair<const void*, size_t>>& runs);
  // One fused step over `segments` (device pointers; no block sums, no clearing in the pass), queued on the
  // context's stream; with `clear_grads` the gradients read are zeroed after it, on the same stream.
  void step(OptimizerKind kind, DType grad, CopyMode copy, const std::vector<KernelArgs>& segments, bool clear_grads);

 private:
  // A device buffer of at least `bytes`, grown in the stream's order.
  void* device_buffer(void*& buffer, size_t& capacity, size_t bytes);
  // Pinned staging of at least `bytes`, free of earlier copies (the host waits for the last one that used it).
  void* staging(size_t bytes);

  std::shared_ptr<device::DeviceContext> context_;
  std::unique_ptr<device::Event> staging_free_;  // recorded after the last copy that reads or writes the staging
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  void* segments_ = nullptr;
  size_t segments_bytes_ = 0;
  void* chunks_ = nullptr;
  size_t chunks_bytes_ = 0;
  void* scratch_ = nullptr;  // the norm's lanes and block sums, then one result per run
  size_t scratch_bytes_ = 0;
};

}  // namespace zero
