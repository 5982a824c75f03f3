// A TransferQueue (offload/transfer_queue.hpp) on a CUDA stream of its own, for ZeRO-Offload's copies between
// device and pinned host memory. Declared without CUDA's headers, like cuda/device_kernels.hpp.
#pragma once

#include <memory>

#include "cpu_offload/transfer_queue.hpp"

namespace zero {
namespace cuda {

// Each copy is a cudaMemcpyAsync (cudaMemcpyDefault: with unified addressing the runtime knows which side is the
// device) on a non-blocking stream, followed by an event; done() queries the event and wait() polls it until
// `timeout_s`, so a copy engine that stopped becomes ZERO_ERR_TIMEOUT naming the copy instead of a
// cudaEventSynchronize that never returns. Page-locked host memory lets the copies run asynchronously beside the
// CPU's work; pageable memory is still correct (the runtime stages it), but the copy call then blocks.
std::unique_ptr<TransferQueue> make_transfer_queue(double timeout_s);

}  // namespace cuda
}  // namespace zero
