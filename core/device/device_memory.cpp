#include "device/device_memory.hpp"

#include <new>
#include <unordered_map>

#include "memory/device_ops.hpp"
#include "memory/ops.hpp"
#include "util/error.hpp"

namespace zero {
namespace device {
namespace {

// Alignments above what a runtime's allocations give are met by over-allocating: the aligned pointer is handed out,
// the base kept to free.
class AlignedBases {
 public:
  void* place(void* base, size_t alignment) {
    const uintptr_t a = (reinterpret_cast<uintptr_t>(base) + (alignment - 1)) & ~(uintptr_t{alignment} - 1);
    void* p = reinterpret_cast<void*>(a);
    std::lock_guard<std::mutex> lock(mu_);
    base_of_[p] = base;
    return p;
  }
  void* take(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = base_of_.find(p);
    if (it == base_of_.end()) return p;
    void* base = it->second;
    base_of_.erase(it);
    return base;
  }

 private:
  std::mutex mu_;
  std::unordered_map<void*, void*> base_of_;
};

class DeviceAllocator final : public Allocator {
 public:
  explicit DeviceAllocator(std::shared_ptr<DeviceContext> context) : context_(std::move(context)) {}
  ~DeviceAllocator() override {
    // Every buffer keeps its allocator alive, so none is left; the releases queued are waited for before the
    // stream (and the context) may go.
    try {
      context_->finish("releasing device memory");
    } catch (...) {
    }
  }

  void* allocate(size_t bytes, size_t alignment) override {
    const size_t extra = alignment > kDeviceAlignment ? alignment : 0;
    void* base = context_->runtime().allocate(bytes + extra, context_->stream());
    if (extra == 0 && reinterpret_cast<uintptr_t>(base) % alignment != 0) {
      context_->runtime().release(base, context_->stream());
      fail(ZERO_ERR_INTERNAL, "the device pool returned memory not aligned to " + std::to_string(alignment));
    }
    return bases_.place(base, alignment);
  }
  void deallocate(void* p, size_t /*bytes*/) noexcept override {
    void* base = bases_.take(p);
    // Stream-ordered: the memory returns to the pool after the work queued on the stream so far, which is the work
    // that used it (other streams' uses are ordered before by their owners); nothing waits for the device.
    try {
      context_->runtime().release(base, context_->stream());
    } catch (...) {  // a device that failed keeps the memory; there is nothing better to do in a destructor
    }
  }
  std::string name() const override { return "libzero's device pool (" + context_->runtime().describe() + ")"; }

 private:
  std::shared_ptr<DeviceContext> context_;
  AlignedBases bases_;
};

class PinnedAllocator final : public Allocator {
 public:
  explicit PinnedAllocator(std::shared_ptr<DeviceContext> context) : context_(std::move(context)) {}
  void* allocate(size_t bytes, size_t alignment) override {
    // The runtime's pinned memory is page-aligned (4 KiB); larger alignments by over-allocating.
    const size_t extra = alignment > 4096 ? alignment : 0;
    return bases_.place(context_->runtime().allocate_pinned(bytes + extra), alignment);
  }
  void deallocate(void* p, size_t /*bytes*/) noexcept override {
    void* base = bases_.take(p);
    try {
      context_->runtime().release_pinned(base);
    } catch (...) {
    }
  }
  std::string name() const override {
    return "libzero's pinned host allocator (" + context_->runtime().describe() + ")";
  }

 private:
  std::shared_ptr<DeviceContext> context_;
  AlignedBases bases_;
};

// ---- The memory layer's device operations: queued on the context's stream, complete when they return.

std::weak_ptr<DeviceContext> g_context;  // set by install_device_memory before any use, as the ops table
std::mutex g_context_mu;

std::shared_ptr<DeviceContext> context() {
  std::lock_guard<std::mutex> lock(g_context_mu);
  std::shared_ptr<DeviceContext> c = g_context.lock();
  if (!c) fail(ZERO_ERR_UNSUPPORTED, "device memory: no device runtime is installed (its engine is gone)");
  return c;
}

void device_copy(void* dst, const void* src, size_t bytes, bool host_side) {
  auto c = context();
  c->runtime().copy(dst, src, bytes, c->stream());
  if (host_side) c->finish("a copy between device and host memory");
}

void device_fill_zero(void* p, size_t bytes) {
  auto c = context();
  c->runtime().fill_zero(p, bytes, c->stream());
}

[[noreturn]] void unsupported(const std::string& what) {
  fail(ZERO_ERR_UNSUPPORTED, what +
                                 " on device memory is refused: the device runs fp32 <-> bf16/fp16 conversions and "
                                 "accumulation into fp32 (of a separate source), which is all the engine asks of it");
}

// The kernels convert every element at once, so source and destination must not overlap: a conversion in place
// (the reductions' narrowing into the communication dtype and widening back) goes through a scratch buffer of the
// destination's size from the stream-ordered pool, then a copy into place.
void device_convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n) {
  if (n == 0) return;
  if (dst_type == src_type) return dst == src ? void() : device_copy(dst, src, n * dtype_size(dst_type), false);
  if (src_type != DType::kF32 && dst_type != DType::kF32)
    unsupported(std::string("a conversion from ") + dtype_name(src_type) + " to " + dtype_name(dst_type));
  auto c = context();
  Runtime& rt = c->runtime();
  const size_t dst_bytes = n * dtype_size(dst_type);
  const bool in_place = ranges_overlap(dst, dst_bytes, src, n * dtype_size(src_type));
  void* out = in_place ? rt.allocate(dst_bytes, c->stream()) : dst;
  if (src_type == DType::kF32) {
    rt.narrow(dst_type, out, static_cast<const float*>(src), n, c->stream());
  } else {
    rt.widen(src_type, static_cast<float*>(out), src, n, c->stream());
  }
  if (in_place) {
    rt.copy(dst, out, dst_bytes, c->stream());
    rt.release(out, c->stream());
  }
}

void device_accumulate_impl(void* acc, DType acc_type, const void* src, DType src_type, size_t n, bool into_zero) {
  if (n == 0) return;
  if (acc_type != DType::kF32) unsupported(std::string("accumulation into ") + dtype_name(acc_type));
  if (ranges_overlap(acc, n * 4, src, n * dtype_size(src_type))) unsupported("an accumulation into its own source");
  auto c = context();
  c->runtime().accumulate(src_type, static_cast<float*>(acc), src, n, into_zero, c->stream());
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

DeviceContext::DeviceContext(std::shared_ptr<Runtime> runtime, double timeout_s)
    : runtime_(std::move(runtime)),
      stream_(runtime_->create_stream("memory")),
      timeout_s_(timeout_s),
      finished_(runtime_->create_event()) {}

DeviceContext::~DeviceContext() {
  try {
    finish("the device's last work");
  } catch (...) {
  }
  finished_.reset();
  stream_.reset();  // before the runtime
}

void DeviceContext::finish(const std::string& what) {
  std::lock_guard<std::mutex> lock(finish_mu_);
  runtime_->record(*finished_, *stream_);
  runtime_->synchronize(*finished_, timeout_s_, what);
}

std::shared_ptr<Allocator> make_device_allocator(std::shared_ptr<DeviceContext> context) {
  return std::make_shared<DeviceAllocator>(std::move(context));
}

std::shared_ptr<Allocator> make_pinned_allocator(std::shared_ptr<DeviceContext> context) {
  return std::make_shared<PinnedAllocator>(std::move(context));
}

void install_allocators(Allocators& allocators, const std::shared_ptr<DeviceContext>& context) {
  allocators.set(MemorySpace::kDevice, make_device_allocator(context));
  allocators.set(MemorySpace::kPinnedHost, make_pinned_allocator(context));
}

std::shared_ptr<DeviceContext> installed_device_memory() {
  std::lock_guard<std::mutex> lock(g_context_mu);
  return g_context.lock();
}

void install_device_memory(const std::shared_ptr<DeviceContext>& context) {
  {
    std::lock_guard<std::mutex> lock(g_context_mu);
    g_context = context;
  }
  set_device_memory_ops(context ? &kDeviceOps : nullptr);
}

}  // namespace device
}  // namespace zero
