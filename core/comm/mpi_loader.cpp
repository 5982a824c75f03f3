#include "comm/mpi_loader.hpp"

#include <string>

#include "../../backends/mpi/mpi_backend.h"
#include "comm/custom_communicator.hpp"
#include "util/error.hpp"
#include "util/module_loader.hpp"

namespace zero {
namespace {

// ZERO_MPI_BACKEND (a path), then the SONAME, then next to libzero.so (util/module_loader.hpp).
zero_mpi_backend_open_fn load_module() {
  static zero_mpi_backend_open_fn entry = nullptr;
  if (entry != nullptr) return entry;
  std::string tried;
  if (void* symbol = find_module_entry("ZERO_MPI_BACKEND", ZERO_MPI_BACKEND_SONAME, ZERO_MPI_BACKEND_ENTRY,
                                       "libzero's MPI module", tried)) {
    entry = reinterpret_cast<zero_mpi_backend_open_fn>(symbol);
    return entry;
  }
  fail(ZERO_ERR_UNSUPPORTED,
       std::string("zero_comm_create_mpi: libzero's MPI module could not be loaded; tried:") + tried +
           "\nInstall it (Debian: libzero-mpi1; from a build: it is built beside libzero.so when MPI is found), or "
           "set ZERO_MPI_BACKEND to the path of " +
           ZERO_MPI_BACKEND_SONAME);
}

}  // namespace

std::shared_ptr<Communicator> make_mpi_communicator(int64_t fortran_comm) {
  zero_mpi_backend_open_fn open = load_module();
  zero_comm_ops_t ops{};
  ops.struct_size = sizeof ops;
  void* user_data = nullptr;
  char error[1024] = {};
  const zero_status_t status = open(&ops, &user_data, fortran_comm, error, sizeof error);
  if (status != ZERO_OK) fail(status, std::string("zero_comm_create_mpi: ") + error);
  try {
    return make_custom_communicator(&ops, user_data);
  } catch (...) {
    if (ops.destroy != nullptr) ops.destroy(user_data);
    throw;
  }
}

}  // namespace zero
