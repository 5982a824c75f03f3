// Device memory for the engine's buffers: the allocators of the device and pinned host spaces,
// and the device's copies, zeroing and element kernels behind memory/ops.hpp. Declared without CUDA's headers.
#pragma once

#include <cstdint>
#include <memory>

#include "memory/allocator.hpp"

namespace zero {
namespace cuda {

// Device memory from a stream-ordered pool: cudaMallocFromPoolAsync on a pool of the current device whose release
// threshold keeps freed memory reserved, so a buffer freed and allocated again (a gathered unit, a bucket, an
// engine rebuilt at a checkpoint load) is served from the pool instead of the driver. Each call completes before
// it returns (the engine allocates at finalize, never per step). Alignments above the pool's 256 bytes are met by
// over-allocating.
std::shared_ptr<Allocator> make_device_allocator();
// Page-locked host memory: the host allocator's alignment (and huge pages from 2 MiB up), registered with
// cudaHostRegister, so that the copy engines move it without staging and asynchronously.
std::shared_ptr<Allocator> make_pinned_allocator();
// Gives `allocators` the two above.
void install_allocators(Allocators& allocators);

// Makes copy_bytes, fill_zero and element_ops work on device memory (memory/device_ops.hpp), on the legacy default
// stream and complete on return: the kernels of cuda/device_kernels.hpp, with the CPU's bits. Idempotent.
void register_device_memory();

// Bytes the device pool currently holds from the driver (cudaMemPoolAttrReservedMemCurrent), and the high-water
// mark of what it handed out.
uint64_t device_pool_reserved_bytes();
uint64_t device_pool_used_high_bytes();

}  // namespace cuda
}  // namespace zero
