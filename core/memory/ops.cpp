#include "memory/ops.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "memory/device_ops.hpp"
#include "numeric/convert.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

void require_host(MemorySpace space, const char* what) {
  if (!host_addressable(space))
    fail(ZERO_ERR_UNSUPPORTED, std::string(what) + " on " + space_name(space) +
                                   " memory: this build of libzero has no implementation for that space");
}

// Host memory: the SIMD conversion kernels where the dtypes and the overlap allow them (fp32 <-> bf16/fp16, the
// gradient paths of mixed precision), core/numeric/convert.hpp otherwise; the same bits either way.
void host_convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n) {
  const size_t dst_bytes = n * dtype_size(dst_type), src_bytes = n * dtype_size(src_type);
  const bool apart = !ranges_overlap(dst, dst_bytes, src, src_bytes);
  const KernelTable& k = kernels(active_isa());
  if (src_type == DType::kF32 && dst_type != DType::kF32 && (apart || dst <= src))
    return k.narrow[static_cast<int>(dst_type)](dst, src, n);
  if (dst_type == DType::kF32 && src_type != DType::kF32 && (apart || dst >= src))
    return k.widen[static_cast<int>(src_type)](dst, src, n);
  convert(dst, dst_type, src, src_type, n);
}

void host_accumulate(void* acc, DType acc_type, const void* src, DType src_type, size_t n) {
  if (acc_type == DType::kF32 && !ranges_overlap(acc, n * 4, src, n * dtype_size(src_type)))
    return kernels(active_isa()).accumulate[static_cast<int>(src_type)](acc, src, n);
  accumulate(acc, acc_type, src, src_type, n);
}

void host_accumulate_into_zero(void* acc, DType acc_type, const void* src, DType src_type, size_t n) {
  if (acc_type == DType::kF32 && !ranges_overlap(acc, n * 4, src, n * dtype_size(src_type)))
    return kernels(active_isa()).accumulate_into_zero[static_cast<int>(src_type)](acc, src, n);
  accumulate_into_zero(acc, acc_type, src, src_type, n);
}

std::atomic<const DeviceMemoryOps*> g_device_ops{nullptr};

// The device's operations for a space the CPU cannot address, or ZERO_ERR_UNSUPPORTED.
const DeviceMemoryOps& device_ops_for(MemorySpace space, const char* what) {
  const DeviceMemoryOps* ops = space == MemorySpace::kDevice ? g_device_ops.load() : nullptr;
  if (ops == nullptr) require_host(space, what);  // throws: not host memory, and no device operations for it
  return *ops;
}

}  // namespace

void set_device_memory_ops(const DeviceMemoryOps* ops) { g_device_ops.store(ops); }
const DeviceMemoryOps* device_memory_ops() { return g_device_ops.load(); }

void copy_bytes(MemorySpace dst_space, void* dst, MemorySpace src_space, const void* src, size_t bytes) {
  if (host_addressable(dst_space) && host_addressable(src_space)) {
    if (bytes != 0) std::memcpy(dst, src, bytes);
    return;
  }
  // Device memory on either side (an NVMe space on either is an error: the file's state has its own streams).
  if (!host_addressable(dst_space)) device_ops_for(dst_space, "a copy");
  const DeviceMemoryOps& ops = device_ops_for(host_addressable(src_space) ? dst_space : src_space, "a copy");
  if (bytes != 0) ops.copy(dst, src, bytes, host_addressable(dst_space) || host_addressable(src_space));
}

void fill_zero(MemorySpace space, void* p, size_t bytes) {
  if (host_addressable(space)) {
    if (bytes != 0) std::memset(p, 0, bytes);
    return;
  }
  const DeviceMemoryOps& ops = device_ops_for(space, "zeroing");
  if (bytes != 0) ops.fill_zero(p, bytes);
}

const ElementOps& element_ops(MemorySpace space) {
  static const ElementOps host{host_convert, host_accumulate, host_accumulate_into_zero, round_from_f32};
  if (host_addressable(space)) return host;
  return device_ops_for(space, "element conversions").element;
}

void convert_across(MemorySpace dst_space, void* dst, DType dst_type, MemorySpace src_space, const void* src,
                    DType src_type, size_t n) {
  if (n == 0) return;
  const bool dst_host = host_addressable(dst_space), src_host = host_addressable(src_space);
  if (dst_host == src_host) return element_ops(dst_space).convert(dst, dst_type, src, src_type, n);
  // Through host memory a piece at a time, so that a large unit needs no host copy of its whole size.
  constexpr size_t kPieceElems = size_t{1} << 22;
  const size_t dst_size = dtype_size(dst_type), src_size = dtype_size(src_type);
  std::vector<char> staged(std::min(n, kPieceElems) * (dst_host ? src_size : dst_size));
  for (size_t done = 0; done < n; done += kPieceElems) {
    const size_t m = std::min(kPieceElems, n - done);
    const char* from = static_cast<const char*>(src) + done * src_size;
    char* to = static_cast<char*>(dst) + done * dst_size;
    if (dst_host) {  // the device's bytes to the host, converted there
      copy_bytes(MemorySpace::kHost, staged.data(), src_space, from, m * src_size);
      element_ops(MemorySpace::kHost).convert(to, dst_type, staged.data(), src_type, m);
    } else {  // converted on the host, then to the device
      element_ops(MemorySpace::kHost).convert(staged.data(), dst_type, from, src_type, m);
      copy_bytes(dst_space, to, MemorySpace::kHost, staged.data(), m * dst_size);
    }
  }
}

const KernelTable& kernels(MemorySpace space, Isa isa) {
  if (!host_addressable(space))
    fail(ZERO_ERR_UNSUPPORTED, std::string("optimizer kernels on ") + space_name(space) +
                                   " memory: this build of libzero has none (the CUDA build adds device kernels)");
  return kernels(isa);
}

}  // namespace zero
