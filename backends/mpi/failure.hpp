// The MPI backend's errors: thrown as a Failure (a status and its message) and caught where a call returns to
// libzero (Backend::guarded, zero_mpi_backend_open).
#pragma once

#include <mpi.h>

#include <string>

#include "zero/zero.h"

namespace zero_mpi {

struct Failure {
  zero_status_t status;
  std::string message;
};

[[noreturn]] inline void fail(zero_status_t status, const std::string& message) { throw Failure{status, message}; }

inline void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(ZERO_ERR_COMM, std::string(what) + " failed: " + std::string(text, static_cast<size_t>(len)));
}

}  // namespace zero_mpi
