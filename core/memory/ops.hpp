// The operations on buffer memory, chosen by memory space: copies, zeroing and the element-wise conversions and
// accumulation of gradients. Engine code goes through these (never std::memcpy or a raw loop on a buffer), so
// that a buffer placed in device memory gets the device's implementation, and a space this build cannot operate
// on is a clear error rather than a crash. The host implementations are the exact ones of core/convert.hpp. On
// device memory they are ordered on the device's stream (memory/device_ops.hpp): what the host can see of them —
// a copy into host memory — is complete when it returns.
#pragma once

#include <cstddef>

#include "kernels/kernels.hpp"
#include "memory/space.hpp"
#include "numeric/dtype.hpp"

namespace zero {

// Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte.
inline bool ranges_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char *x = static_cast<const char*>(a), *y = static_cast<const char*>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

// Copies `bytes` from src to dst (they must not overlap).
void copy_bytes(MemorySpace dst_space, void* dst, MemorySpace src_space, const void* src, size_t bytes);
void fill_zero(MemorySpace space, void* p, size_t bytes);

// The element-wise kernels on gradients and params in one space (see core/numeric/convert.hpp for their exact
// semantics).
struct ElementOps {
  void (*convert)(void* dst, DType dst_type, const void* src, DType src_type, size_t n);
  void (*accumulate)(void* acc, DType acc_type, const void* src, DType src_type, size_t n);
  void (*accumulate_into_zero)(void* acc, DType acc_type, const void* src, DType src_type, size_t n);
  void (*round_from_f32)(void* dst, DType dst_type, const float* src, size_t n);
};
// Throws ZERO_ERR_UNSUPPORTED for a space this build has no kernels for.
const ElementOps& element_ops(MemorySpace space);

// A conversion between two spaces (ZeRO-Offload's host master and device params, say): where one side is device
// memory and the other host memory, it runs on the host, the device side's bytes copied through host memory a piece
// at a time, so the bits are the host kernels' (which equal the device's). Complete on return.
void convert_across(MemorySpace dst_space, void* dst, DType dst_type, MemorySpace src_space, const void* src,
                    DType src_type, size_t n);

// The optimizer and norm kernels for buffers in `space` on the `isa` path (host and pinned host memory: the CPU's;
// ZERO_ERR_UNSUPPORTED for a space this build has no kernels for).
const KernelTable& kernels(MemorySpace space, Isa isa);

}  // namespace zero
