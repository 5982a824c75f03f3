// The engine's buffers on a device runtime (device/runtime.hpp): the allocators of the device and pinned host
// spaces, and the device's copies, zeroing and element kernels behind memory/ops.hpp — the same code over CUDA and
// over the host emulator.
//
// Device memory is stream-ordered on the context's stream: a buffer is allocated and released in that stream's
// order (the pool keeps freed memory for the next allocation, and nothing waits for the whole device). The memory
// operations of memory/ops.hpp are queued on the same stream, so each runs after the ones before; the host waits
// only for a copy into or out of host memory (with the engine's timeout), the one result it may then touch.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "device/runtime.hpp"
#include "memory/allocator.hpp"

namespace zero {
namespace device {

// A runtime and the stream the memory layer queues on.
class DeviceContext {
 public:
  DeviceContext(std::shared_ptr<Runtime> runtime, double timeout_s);
  ~DeviceContext();
  Runtime& runtime() { return *runtime_; }
  Stream& stream() { return *stream_; }
  double timeout_s() const { return timeout_s_; }
  // The host waits for everything queued on the stream so far (`what` names it in a timeout).
  void finish(const std::string& what);

 private:
  std::shared_ptr<Runtime> runtime_;
  std::unique_ptr<Stream> stream_;
  double timeout_s_;
  std::mutex finish_mu_;  // one event, recorded and waited for by one caller at a time
  std::unique_ptr<Event> finished_;
};

// Device memory ordered on the context's stream; alignments above the runtime's are met by over-allocating.
std::shared_ptr<Allocator> make_device_allocator(std::shared_ptr<DeviceContext> context);
// Page-locked host memory from the runtime (copies to and from it are asynchronous).
std::shared_ptr<Allocator> make_pinned_allocator(std::shared_ptr<DeviceContext> context);
// Gives `allocators` the two above.
void install_allocators(Allocators& allocators, const std::shared_ptr<DeviceContext>& context);

// Makes copy_bytes, fill_zero and element_ops work on device memory through `context` (memory/device_ops.hpp), for
// the whole process (one device per process, as CUDA's current device). Null removes them.
// The process keeps a weak reference: once the context's owners (an engine, its buffers) are gone, device memory's
// operations fail clearly until another context is installed.
void install_device_memory(const std::shared_ptr<DeviceContext>& context);
// The context installed, while its owners keep it (null otherwise).
std::shared_ptr<DeviceContext> installed_device_memory();

}  // namespace device
}  // namespace zero
