// One communicator over two backends: control messages (the agreement before every collective call, divergence
// tags, checks, the step's small sums: host memory, a few bytes, latency-bound) over a host communicator (MPI,
// shared memory, a framework's gloo group), and data collectives (the gradients' reduce-scatters, the parameters'
// all-gathers: device memory, bandwidth-bound) over a device communicator (NCCL). A device engine then never drains
// its stream for an agreement, and the host communicator keeps the failure-safety protocol's messages flowing when
// the device side stops (a hung NCCL kernel is a timeout on its rank, and the abort reaches the others through both).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.hpp"

namespace zero {

// `control` and `data` must span the same ranks in the same order (checked: equal rank and size on every rank). With
// `owns_data` the data side is this communicator's own (created with it: zero_comm_create_nccl), finalized by its
// zero_comm_finalize; otherwise both sides are the caller's, to finalize themselves. An abort aborts both sides.
std::shared_ptr<Communicator> make_split_communicator(std::shared_ptr<Communicator> control,
                                                      std::shared_ptr<Communicator> data, bool owns_data,
                                                      const char* call);

}  // namespace zero
