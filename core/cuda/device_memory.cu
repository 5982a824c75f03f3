#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#include "cuda/cuda_check.hpp"
#include "cuda/device_kernels.hpp"
#include "cuda/device_memory.hpp"
#include "memory/device_ops.hpp"

namespace zero {
namespace cuda {
namespace {

constexpr size_t kPoolAlignment = 256;
constexpr size_t kHugePage = size_t{2} << 20;

// The current device's pool, created once: the default pool's release threshold is 0 (freed memory goes back to
// the driver at the next synchronization); this one keeps everything it has reserved.
cudaMemPool_t engine_pool() {
  static cudaMemPool_t pool = [] {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t p = nullptr;
    check(cudaMemPoolCreate(&p, &props), "cudaMemPoolCreate");
    uint64_t keep = UINT64_MAX;
    check(cudaMemPoolSetAttribute(p, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
    return p;
  }();
  return pool;
}

class DevicePoolAllocator final : public Allocator {
 public:
  DevicePoolAllocator() : pool_(engine_pool()) {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  ~DevicePoolAllocator() override { cudaStreamDestroy(stream_); }

  void* allocate(size_t bytes, size_t alignment) override {
    const size_t extra = alignment > kPoolAlignment ? alignment : 0;
    void* base = nullptr;
    const cudaError_t err = cudaMallocFromPoolAsync(&base, bytes + extra, pool_, stream_);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw std::bad_alloc();
    }
    check(err, "cudaMallocFromPoolAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (allocation)");
    const uintptr_t a = (reinterpret_cast<uintptr_t>(base) + (alignment - 1)) & ~(uintptr_t{alignment} - 1);
    void* p = reinterpret_cast<void*>(extra == 0 ? reinterpret_cast<uintptr_t>(base) : a);
    if (reinterpret_cast<uintptr_t>(p) % alignment != 0) {
      cudaFreeAsync(base, stream_);
      fail(ZERO_ERR_INTERNAL, "the device pool returned memory not aligned to " + std::to_string(alignment));
    }
    std::lock_guard<std::mutex> lock(mu_);
    base_of_[p] = base;
    return p;
  }
  void deallocate(void* p, size_t /*bytes*/) noexcept override {
    void* base = p;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = base_of_.find(p);
      if (it != base_of_.end()) base = it->second, base_of_.erase(it);
    }
    // Buffers are freed when an engine goes (or a plan is rebuilt), not per step: waiting for the whole device
    // first means no kernel or copy on any stream still uses the memory when the pool hands it out again.
    cudaDeviceSynchronize();
    cudaFreeAsync(base, stream_);
    cudaStreamSynchronize(stream_);
  }
  std::string name() const override { return "libzero's device pool"; }

 private:
  cudaMemPool_t pool_;
  cudaStream_t stream_ = nullptr;
  std::mutex mu_;
  std::unordered_map<void*, void*> base_of_;
};

class PinnedHostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, size_t alignment) override {
    void* p = std::aligned_alloc(alignment, bytes);
    if (p == nullptr) throw std::bad_alloc();
    if (alignment >= kHugePage) madvise(p, bytes, MADV_HUGEPAGE);
    const cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (err != cudaSuccess) {
      std::free(p);
      check(err, "cudaHostRegister (pinned host memory)");
    }
    return p;
  }
  void deallocate(void* p, size_t /*bytes*/) noexcept override {
    cudaHostUnregister(p);
    std::free(p);
  }
  std::string name() const override { return "libzero's pinned host allocator"; }
};

// ---- The device's memory operations, on the legacy default stream, complete on return.

void sync(const char* what) { check(cudaStreamSynchronize(nullptr), what); }

void device_copy(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, nullptr), "cudaMemcpyAsync");
  sync("a copy to or from device memory");
}

void device_fill_zero(void* p, size_t bytes) {
  check(cudaMemsetAsync(p, 0, bytes, nullptr), "cudaMemsetAsync");
  sync("zeroing device memory");
}

[[noreturn]] void unsupported(const std::string& what) {
  fail(ZERO_ERR_UNSUPPORTED, what +
                                 " on device memory is refused: the device runs fp32 <-> bf16/fp16 conversions "
                                 "and accumulation into fp32 between separate buffers, which is all the engine's "
                                 "device paths ask of it");
}

void device_convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n) {
  if (n == 0) return;
  if (dst_type == src_type) return dst == src ? void() : device_copy(dst, src, n * dtype_size(dst_type));
  if (ranges_overlap(dst, n * dtype_size(dst_type), src, n * dtype_size(src_type)))
    unsupported("an in-place conversion");
  if (src_type == DType::kF32) {
    launch_narrow(dst_type, dst, static_cast<const float*>(src), n, nullptr);
  } else if (dst_type == DType::kF32) {
    launch_widen(src_type, static_cast<float*>(dst), src, n, nullptr);
  } else {
    unsupported(std::string("a conversion from ") + dtype_name(src_type) + " to " + dtype_name(dst_type));
  }
  sync("a conversion on the device");
}

void device_accumulate_impl(void* acc, DType acc_type, const void* src, DType src_type, size_t n, bool into_zero) {
  if (n == 0) return;
  if (acc_type != DType::kF32) unsupported(std::string("accumulation into ") + dtype_name(acc_type));
  if (ranges_overlap(acc, n * 4, src, n * dtype_size(src_type))) unsupported("an accumulation into its own source");
  launch_accumulate(src_type, static_cast<float*>(acc), src, n, into_zero, nullptr);
  sync("an accumulation on the device");
}

void device_accumulate(void* acc, DType acc_type, const void* src, DType src_type, size_t n) {
  device_accumulate_impl(acc, acc_type, src, src_type, n, false);
}

void device_accumulate_into_zero(void* acc, DType acc_type, const void* src, DType src_type, size_t n) {
  device_accumulate_impl(acc, acc_type, src, src_type, n, true);
}

void device_round_from_f32(void* dst, DType dst_type, const float* src, size_t n) {
  device_convert(dst, dst_type, src, DType::kF32, n);
}

const DeviceMemoryOps kDeviceOps{
    device_copy, device_fill_zero,
    ElementOps{device_convert, device_accumulate, device_accumulate_into_zero, device_round_from_f32}};

}  // namespace

std::shared_ptr<Allocator> make_device_allocator() { return std::make_shared<DevicePoolAllocator>(); }
std::shared_ptr<Allocator> make_pinned_allocator() { return std::make_shared<PinnedHostAllocator>(); }

void install_allocators(Allocators& allocators) {
  allocators.set(MemorySpace::kDevice, make_device_allocator());
  allocators.set(MemorySpace::kPinnedHost, make_pinned_allocator());
}

void register_device_memory() { set_device_memory_ops(&kDeviceOps); }

uint64_t device_pool_reserved_bytes() {
  uint64_t v = 0;
  check(cudaMemPoolGetAttribute(engine_pool(), cudaMemPoolAttrReservedMemCurrent, &v), "cudaMemPoolGetAttribute");
  return v;
}

uint64_t device_pool_used_high_bytes() {
  uint64_t v = 0;
  check(cudaMemPoolGetAttribute(engine_pool(), cudaMemPoolAttrUsedMemHigh, &v), "cudaMemPoolGetAttribute");
  return v;
}

}  // namespace cuda
}  // namespace zero
