// The module's process-wide state, defined in mpi_backend.cpp with the hooks MPI_Finalize and the process's exit run.
#pragma once

#include <mutex>
#include <vector>

namespace zero_mpi {

class Backend;
extern std::mutex g_mutex;
extern bool g_we_initialized_mpi;
extern std::vector<Backend*> g_live;  // created, neither finalized nor destroyed
extern int g_provided;

}  // namespace zero_mpi
