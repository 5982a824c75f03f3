#include "comm/mpi_loader.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "../../backends/mpi/mpi_backend.h"
#include "comm/custom_communicator.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

// The directory this library was loaded from (to find the module installed beside it, as a wheel does).
std::string own_directory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&make_mpi_communicator), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// ZERO_MPI_BACKEND (a path), then the SONAME (the dynamic linker's search, or a copy already loaded because the
// program linked it), then next to libzero.so. The module is never unloaded: MPI cannot be unloaded either.
zero_mpi_backend_open_fn load_module() {
  static zero_mpi_backend_open_fn entry = nullptr;
  if (entry != nullptr) return entry;
  std::string tried;
  std::vector<std::string> candidates;
  const char* forced = std::getenv("ZERO_MPI_BACKEND");
  if (forced != nullptr && forced[0] != '\0') {
    candidates.push_back(forced);
  } else {
    candidates.push_back(ZERO_MPI_BACKEND_SONAME);
    const std::string dir = own_directory();
    if (!dir.empty()) candidates.push_back(dir + "/" + ZERO_MPI_BACKEND_SONAME);
  }
  for (const std::string& c : candidates) {
    void* handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried += "\n  " + c + ": " + (why != nullptr ? why : "not found");
      continue;
    }
    void* symbol = dlsym(handle, ZERO_MPI_BACKEND_ENTRY);
    if (symbol == nullptr) {
      tried += "\n  " + c + ": has no " + ZERO_MPI_BACKEND_ENTRY + " (not libzero's MPI module?)";
      continue;
    }
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
