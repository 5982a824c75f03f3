// A communicator over a table of callbacks (zero_comm_ops_t): a framework's own process group, or the MPI module
// (backends/mpi), which plugs in the same way.
#pragma once

#include <memory>

#include "comm/communicator.hpp"

namespace zero {

// Validates and copies `ops` (struct_size rules of zero.h). `user_data` is handed to every callback and to
// ops->destroy when the communicator goes. Throws zero::Error naming what is wrong with the table.
std::shared_ptr<Communicator> make_custom_communicator(const zero_comm_ops_t* ops, void* user_data);

}  // namespace zero
