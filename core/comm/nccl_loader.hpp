// zero_comm_create_nccl: finds and loads the NCCL module (libzero-nccl.so.1, backends/nccl), bootstraps its NCCL
// communicator over a host communicator, and returns both as one split communicator (comm/split_communicator.hpp):
// control messages over the host one, data over NCCL. libzero.so itself links neither CUDA nor NCCL.
#pragma once

#include <memory>

#include "comm/communicator.hpp"

namespace zero {

// Collective over `control`: every rank gets the communicator or the same error (the lowest failed rank's, named).
std::shared_ptr<Communicator> make_nccl_communicator(const std::shared_ptr<Communicator>& control, int device,
                                                     double timeout_s);

}  // namespace zero
