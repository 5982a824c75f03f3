#include "memory/ops.hpp"

#include <cstring>
#include <string>

#include "convert.hpp"
#include "error.hpp"

namespace zero {
namespace {

void require_host(MemorySpace space, const char* what) {
  if (!host_addressable(space))
    fail(ZERO_ERR_UNSUPPORTED, std::string(what) + " on " + space_name(space) +
                                   " memory: this build of libzero has no implementation for that space");
}

}  // namespace

void copy_bytes(MemorySpace dst_space, void* dst, MemorySpace src_space, const void* src, size_t bytes) {
  require_host(dst_space, "a copy");
  require_host(src_space, "a copy");
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

void fill_zero(MemorySpace space, void* p, size_t bytes) {
  require_host(space, "zeroing");
  if (bytes != 0) std::memset(p, 0, bytes);
}

const ElementOps& element_ops(MemorySpace space) {
  static const ElementOps host{convert, accumulate, accumulate_into_zero, round_from_f32};
  require_host(space, "element conversions");
  return host;
}

}  // namespace zero
