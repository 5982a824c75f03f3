// zero_comm_create_mpi: finds and loads the MPI module (libzero-mpi.so.1, backends/mpi) and wraps the callback
// table it fills as a custom communicator. libzero.so itself links no MPI.
#pragma once

#include <cstdint>
#include <memory>

#include "comm/communicator.hpp"

namespace zero {

// `fortran_comm` is MPI_Comm_c2f(comm), or ZERO_MPI_COMM_WORLD. Collective over it.
std::shared_ptr<Communicator> make_mpi_communicator(int64_t fortran_comm);

}  // namespace zero
