// The device runtime: everything the engine asks of a GPU, behind one small interface with two implementations —
// CUDA (device/cuda_runtime.cu, built into the libzero-cuda.so.1 module so that libzero.so runs where no CUDA is
// installed) and the host emulator (device/emulator.hpp), a test tool that runs the same kernels on the CPU with a
// worker thread per stream and checks that every access to device memory is ordered after the last write to it.
//
// The model is CUDA's: work is queued on streams and runs in queue order on each; an event marks a point in a
// stream; a stream may wait for an event (ordering across streams without the host); the host waits for an event
// only where it must (with a timeout, so a stopped device is an error that names what it waited for). Memory is
// stream-ordered: an allocation may be used on its stream at once and on another only after an event recorded on
// it, and a free takes effect in its stream's order. Every call returns when the work is queued; none waits for the
// device, except a copy with pageable host memory (memory the runtime did not allocate) on one side, as CUDA's:
// from it, the call returns once the stream's earlier work is done and the source was read (the copy into place may
// still run); into it, once the copy is done.
//
// Pointers into device memory must not be touched by the host: the emulator hands out addresses of a region the
// host cannot read (an access faults), so code that forgets a copy fails at once on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "cuda/launch_table.hpp"
#include "kernels/kernels.hpp"
#include "numeric/dtype.hpp"

namespace zero {
namespace device {

// Opaque to the engine; each runtime derives its own.
class Stream {
 public:
  virtual ~Stream() = default;
};
class Event {
 public:
  virtual ~Event() = default;
};

// The CUDA module (libzero-cuda.so.1) is built from the same sources as libzero and hands back a Runtime object: the
// loader passes this version and the layout of the structs that cross (device/cuda_module.hpp), and the module
// refuses a mismatch rather than misread them.
constexpr uint32_t kRuntimeInterfaceVersion = 5;
constexpr uint64_t runtime_interface_layout() {
  return (uint64_t{sizeof(KernelArgs)} << 32) | (uint64_t{sizeof(cuda::StepChunk)} << 16) | sizeof(StepScalars);
}

// Device memory allocations are aligned to this (CUDA's pools give 256 bytes; the emulator the same).
constexpr size_t kDeviceAlignment = 256;

class Runtime {
 public:
  virtual ~Runtime() = default;
  // "CUDA 13.0, driver 13.0, NVIDIA H200" or "the host emulator (not a device)".
  virtual std::string describe() const = 0;
  virtual bool emulated() const = 0;
  // The device's number among the process's (CUDA's device ordinal; 0 on the emulator).
  virtual int ordinal() const = 0;

  // ---- Streams and events. A stream destroyed with work queued finishes that work first (its events stay valid).
  virtual std::unique_ptr<Stream> create_stream(const std::string& name) = 0;
  // A stream its caller owns and keeps alive while the wrapper is used (a framework's: a cudaStream_t on CUDA, where
  // null is the legacy default stream; on the emulator, a Stream it made), for use in these calls; destroying the
  // wrapper leaves the stream as it is.
  virtual std::unique_ptr<Stream> external_stream(void* native) = 0;
  // What external_stream takes for `stream` (its cudaStream_t; on the emulator, the Stream itself).
  virtual void* native(Stream& stream) = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  // The event marks everything queued on `stream` so far (re-recording moves it; waits already queued keep the old
  // point).
  virtual void record(Event& event, Stream& stream) = 0;
  // Work queued on `stream` after this runs after the event's point; the host does not wait.
  virtual void wait(Stream& stream, const Event& event) = 0;
  // Whether the event's point has been reached (an event never recorded has). Throws the device's error, if any.
  virtual bool done(const Event& event) = 0;
  // The host waits for the event: ZERO_ERR_TIMEOUT naming `what` after `timeout_s` (the device may have stopped).
  virtual void synchronize(const Event& event, double timeout_s, const std::string& what) = 0;

  // ---- Memory. allocate: kDeviceAlignment-aligned device memory, ordered on `stream` (throws std::bad_alloc when
  // the device has none left). release: the memory returns to the pool once the work queued on `stream` so far is
  // done; work on other streams that used it must be ordered before that by the caller (an event the stream
  // waited for). Pinned host memory is page-locked, so copies to and from it run asynchronously.
  virtual void* allocate(size_t bytes, Stream& stream) = 0;
  virtual void release(void* p, Stream& stream) = 0;
  virtual void* allocate_pinned(size_t bytes) = 0;
  // The caller has ordered every use of it before (an event the host waited for); nothing waits for the device.
  virtual void release_pinned(void* p) = 0;

  // Whether [p, p + bytes) is device memory (CUDA's device or managed memory; the emulator's arena): what a device
  // communicator's collective may be given.
  virtual bool device_memory(const void* p, size_t bytes) = 0;

  // ---- Work on a stream. A copy goes between any two of device, pinned and pageable host memory.
  virtual void copy(void* dst, const void* src, size_t bytes, Stream& stream) = 0;
  virtual void fill_zero(void* p, size_t bytes, Stream& stream) = 0;

  // The kernels of cuda/device_kernels.hpp, with the CPU's bits. step: one launch per entry of `table`, which was
  // planned from `host_segments` (count of them); `segments` and `chunks` are device copies of those arrays (the
  // emulator reads the host copy to know what the kernel touches when it is queued).
  virtual void step(OptimizerKind kind, DType grad, CopyMode copy_mode, const cuda::LaunchTable& table,
                    const KernelArgs* host_segments, size_t count, const KernelArgs* segments,
                    const cuda::StepChunk* chunks, Stream& stream) = 0;
  // The sum of squares of n gradients into *result (device memory); scratch holds
  // cuda::sum_squares_scratch_doubles(n) doubles of device memory.
  virtual void sum_squares(DType grad, const void* grads, size_t n, double* scratch, double* result,
                           Stream& stream) = 0;
  virtual void narrow(DType to, void* dst, const float* src, size_t n, Stream& stream) = 0;
  virtual void widen(DType from, float* dst, const void* src, size_t n, Stream& stream) = 0;
  virtual void accumulate(DType from, float* acc, const void* src, size_t n, bool into_zero, Stream& stream) = 0;

  // The host is about to read (or write) [p, p + bytes) of pinned memory that streams also use: the emulator checks
  // that an event the host waited for orders it after the streams' last write (or use); CUDA does nothing.
  virtual void host_access(const void* p, size_t bytes, bool write) { (void)p, (void)bytes, (void)write; }
};

}  // namespace device
}  // namespace zero
