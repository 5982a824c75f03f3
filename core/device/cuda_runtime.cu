// The device runtime (device/runtime.hpp) on CUDA: a thin layer over streams, events, a stream-ordered memory pool
// and the kernels of cuda/device_kernels.hpp. Built into the libzero-cuda.so.1 module with the CUDA runtime linked
// statically, so the module needs only the driver (libcuda.so.1) where it runs.
#include <cuda_runtime.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "cuda/cuda_check.hpp"
#include "cuda/device_kernels.hpp"
#include "device/cuda_module.hpp"
#include "device/runtime.hpp"

namespace zero {
namespace cuda {
namespace {

class CudaStream final : public device::Stream {
 public:
  CudaStream() { check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  explicit CudaStream(cudaStream_t external) : stream(external), owned(false) {}
  // cudaStreamDestroy returns at once; the work already queued still runs to completion.
  ~CudaStream() override {
    if (owned) cudaStreamDestroy(stream);
  }
  cudaStream_t stream = nullptr;
  bool owned = true;
};

class CudaEvent final : public device::Event {
 public:
  CudaEvent() { check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags"); }
  ~CudaEvent() override { cudaEventDestroy(event); }
  cudaEvent_t event = nullptr;
};

cudaStream_t stream_of(device::Stream& s) { return static_cast<CudaStream&>(s).stream; }
cudaEvent_t event_of(const device::Event& e) { return static_cast<const CudaEvent&>(e).event; }

// The runtime's device is the calling thread's current device for one call, and the caller's again after it: a
// framework whose current device is another (torch on cuda:0 while the engine runs on cuda:1) keeps it.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
    changed_ = previous_ != device;
  }
  ~DeviceScope() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

class CudaRuntime final : public device::Runtime {
 public:
  CudaRuntime() {
    check(cudaGetDevice(&device_), "cudaGetDevice");
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    check(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate");
    // Freed memory stays reserved for the next allocation instead of going back to the driver at every
    // synchronization (the default pool's threshold of 0).
    uint64_t keep = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
  }
  ~CudaRuntime() override { cudaMemPoolDestroy(pool_); }

  std::string describe() const override {
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, device_);
    auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
    return "CUDA " + version(runtime) + ", driver " + version(driver) + ", " + prop.name + " (device " +
           std::to_string(device_) + ")";
  }
  bool emulated() const override { return false; }
  int ordinal() const override { return device_; }

  // Streams, events and pinned memory belong to the current device of the calling thread: the runtime's.
  std::unique_ptr<device::Stream> create_stream(const std::string&) override {
    const DeviceScope on(device_);
    return std::make_unique<CudaStream>();
  }
  std::unique_ptr<device::Stream> external_stream(void* native) override {
    return std::make_unique<CudaStream>(static_cast<cudaStream_t>(native));
  }
  void* native(device::Stream& stream) override { return stream_of(stream); }
  std::unique_ptr<device::Event> create_event() override {
    const DeviceScope on(device_);
    return std::make_unique<CudaEvent>();
  }
  void record(device::Event& event, device::Stream& stream) override {
    const DeviceScope on(device_);
    check(cudaEventRecord(event_of(event), stream_of(stream)), "cudaEventRecord");
  }
  void wait(device::Stream& stream, const device::Event& event) override {
    const DeviceScope on(device_);
    check(cudaStreamWaitEvent(stream_of(stream), event_of(event), 0), "cudaStreamWaitEvent");
  }
  bool done(const device::Event& event) override {
    const cudaError_t err = cudaEventQuery(event_of(event));
    if (err == cudaErrorNotReady) return false;
    check(err, "cudaEventQuery");
    return true;
  }
  // Polled rather than cudaEventSynchronize, which never returns on a device that stopped.
  void synchronize(const device::Event& event, double timeout_s, const std::string& what) override {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (int polls = 0; !done(event); ++polls) {
      if (std::chrono::steady_clock::now() > deadline)
        fail(ZERO_ERR_TIMEOUT, what + " did not complete within " + exact_decimal(timeout_s) +
                                   " s (libzero.timeout_s); the device may have stopped");
      if (polls < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

  void* allocate(size_t bytes, device::Stream& stream) override {
    const DeviceScope on(device_);
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    const cudaError_t err = cudaMallocFromPoolAsync(&p, bytes, pool_, stream_of(stream));
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw std::bad_alloc();
    }
    check(err, "cudaMallocFromPoolAsync");
    return p;
  }
  void release(void* p, device::Stream& stream) override {
    if (p != nullptr) check(cudaFreeAsync(p, stream_of(stream)), "cudaFreeAsync");
  }
  void* allocate_pinned(size_t bytes) override {
    const DeviceScope on(device_);
    void* p = nullptr;
    const cudaError_t err = cudaMallocHost(&p, bytes == 0 ? 1 : bytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw std::bad_alloc();
    }
    check(err, "cudaMallocHost");
    return p;
  }
  // No copy still uses it (the caller's contract): freed without waiting for the device.
  void release_pinned(void* p) override {
    if (p == nullptr) return;
    const DeviceScope on(device_);
    check(cudaFreeHost(p), "cudaFreeHost");
  }

  // Device (or managed) memory of this runtime's device: what NCCL, bound to it, may be given. Pageable host memory
  // is cudaMemoryTypeUnregistered; an error other than an invalid value is the device's, and thrown.
  bool device_memory(const void* p, size_t bytes) override {
    const DeviceScope on(device_);
    auto on_device = [this](const void* q) {
      cudaPointerAttributes attributes{};
      const cudaError_t err = cudaPointerGetAttributes(&attributes, q);
      if (err == cudaErrorInvalidValue) {
        cudaGetLastError();  // clears exactly this call's error
        return false;
      }
      check(err, "cudaPointerGetAttributes");
      return (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) &&
             attributes.device == device_;
    };
    return on_device(p) && (bytes == 0 || on_device(static_cast<const char*>(p) + bytes - 1));
  }

  // Work is queued by whatever thread calls (a framework's thread may have another device current): each call makes
  // the runtime's device current first.
  void copy(void* dst, const void* src, size_t bytes, device::Stream& stream) override {
    if (bytes == 0) return;
    const DeviceScope on(device_);
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_of(stream)), "cudaMemcpyAsync");
  }
  void fill_zero(void* p, size_t bytes, device::Stream& stream) override {
    if (bytes == 0) return;
    const DeviceScope on(device_);
    check(cudaMemsetAsync(p, 0, bytes, stream_of(stream)), "cudaMemsetAsync");
  }

  void step(OptimizerKind kind, DType grad, CopyMode copy_mode, const LaunchTable& table, const KernelArgs*, size_t,
            const KernelArgs* segments, const StepChunk* chunks, device::Stream& stream) override {
    const DeviceScope on(device_);
    launch_step(kind, grad, copy_mode, table, segments, chunks, stream_of(stream));
  }
  void sum_squares(DType grad, const void* grads, size_t n, double* scratch, double* result,
                   device::Stream& stream) override {
    const DeviceScope on(device_);
    launch_sum_squares(grad, grads, n, scratch, result, stream_of(stream));
  }
  void narrow(DType to, void* dst, const float* src, size_t n, device::Stream& stream) override {
    const DeviceScope on(device_);
    launch_narrow(to, dst, src, n, stream_of(stream));
  }
  void widen(DType from, float* dst, const void* src, size_t n, device::Stream& stream) override {
    const DeviceScope on(device_);
    launch_widen(from, dst, src, n, stream_of(stream));
  }
  void accumulate(DType from, float* acc, const void* src, size_t n, bool into_zero, device::Stream& stream) override {
    const DeviceScope on(device_);
    launch_accumulate(from, acc, src, n, into_zero, stream_of(stream));
  }

 private:
  int device_ = 0;
  cudaMemPool_t pool_ = nullptr;
};

void copy_text(const std::string& text, char* out, size_t capacity) {
  if (out == nullptr || capacity == 0) return;
  const size_t n = text.size() < capacity - 1 ? text.size() : capacity - 1;
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

}  // namespace
}  // namespace cuda
}  // namespace zero

extern "C" __attribute__((visibility("default"))) zero_status_t zero_cuda_runtime_open(zero::device::Runtime** out,
                                                                                       uint32_t interface_version,
                                                                                       uint64_t interface_layout,
                                                                                       char* error, size_t capacity) {
  using zero::cuda::copy_text;
  if (out == nullptr) return ZERO_ERR_INVALID_ARGUMENT;
  if (interface_version != zero::device::kRuntimeInterfaceVersion ||
      interface_layout != zero::device::runtime_interface_layout()) {
    copy_text(
        "this libzero-cuda.so.1 was built from another version of libzero than the libzero.so loading it "
        "(install the two from the same build)",
        error, capacity);
    return ZERO_ERR_UNSUPPORTED;
  }
  try {
    std::string why;
    if (!zero::cuda::device_available(&why)) {
      copy_text("no CUDA device: " + why, error, capacity);
      return ZERO_ERR_UNSUPPORTED;
    }
    *out = new zero::cuda::CudaRuntime();
    return ZERO_OK;
  } catch (const zero::Error& e) {
    copy_text(e.what(), error, capacity);
    return e.status();
  } catch (const std::bad_alloc&) {
    copy_text("out of memory", error, capacity);
    return ZERO_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    copy_text(e.what(), error, capacity);
    return ZERO_ERR_INTERNAL;
  }
}
