// Collectives over MPI (Open MPI or MPICH). The communicator is a duplicate of the caller's, with
// MPI_ERRORS_RETURN, so failures become ZERO_ERR_COMM instead of aborting the process.
#pragma once

#include <cstdint>
#include <memory>

#include "comm/communicator.hpp"

namespace zero {

// `fortran_comm` is MPI_Comm_c2f(comm), or -1 for MPI_COMM_WORLD. Initialises MPI if nobody has.
std::shared_ptr<Communicator> make_mpi_communicator(int64_t fortran_comm);

}  // namespace zero
