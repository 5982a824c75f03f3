// The module's process-wide state, defined in mpi_backend.cpp with the hooks MPI_Finalize and the process's exit run.
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

namespace zero_mpi {

class Backend;
// Guards g_live and who finalizes MPI; a backend is created and destroyed under it, and the exit hook holds it while
// it tells the others.
extern std::timed_mutex g_mutex;
extern bool g_we_initialized_mpi;
extern bool g_finalize_claimed;        // some thread calls (or called) MPI_Finalize for libzero
extern std::vector<Backend*>& g_live;  // created, neither finalized nor destroyed; never freed (the exit
                                       // hook and a thread still in a call may use it during exit)
extern int g_provided;
// exit() has begun on some thread: no call enters MPI any more, and a call waiting returns; the exit hook then
// tells the others and finalizes MPI alone.
extern std::atomic<bool> g_exiting;
// libzero itself is in MPI_Finalize (the exit hook, or the last communicator's zero_comm_finalize): the others have
// been told, so the MPI_Finalize hook has nothing to say.
extern std::atomic<bool> g_libzero_finalizes;

}  // namespace zero_mpi
