// The host-staged path's device side (comm/data_staging.hpp): pinned host buffers from the runtime, kept for reuse,
// and the copies between them and device memory on the engine's stream, the host waiting for each (a collective's
// input must be on the host before the backend reads it, and its result back before the buffer is reused).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "comm/data_staging.hpp"
#include "device/device_memory.hpp"

namespace zero {
namespace device {

class PinnedStaging final : public DataStaging {
 public:
  explicit PinnedStaging(std::shared_ptr<DeviceContext> context) : context_(std::move(context)) {}
  ~PinnedStaging() override;
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  void* acquire(size_t bytes) override;
  void give_back(void* host) override;
  bool device_memory(const void* p, size_t bytes) override { return context_->runtime().device_memory(p, bytes); }
  void to_host(void* host, const void* device, size_t bytes, const std::string& what) override;
  void to_device(void* device, const void* host, size_t bytes, const std::string& what) override;

 private:
  struct Buffer {
    void* host;
    size_t bytes;
    bool in_use;
  };
  std::shared_ptr<DeviceContext> context_;
  std::mutex mu_;
  std::vector<Buffer> buffers_;
};

}  // namespace device
}  // namespace zero
