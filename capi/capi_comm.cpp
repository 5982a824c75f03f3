// Communicator calls: argument checks, then the core factories.
#include "comm/mpi_communicator.hpp"
#include "comm/single_communicator.hpp"
#include "guard.hpp"
#include "handles.hpp"

using zero::capi::guard;
using zero::capi::require_arg;

extern "C" {

ZERO_API zero_status_t zero_comm_create_mpi(zero_comm_t** out_comm, int64_t mpi_comm) {
  return guard("zero_comm_create_mpi", [&] {
    require_arg(out_comm != nullptr, "zero_comm_create_mpi", "out_comm is NULL");
    auto handle = std::make_unique<zero_comm>();
    handle->impl = zero::make_mpi_communicator(mpi_comm);
    *out_comm = handle.release();
  });
}

ZERO_API zero_status_t zero_comm_create_single(zero_comm_t** out_comm) {
  return guard("zero_comm_create_single", [&] {
    require_arg(out_comm != nullptr, "zero_comm_create_single", "out_comm is NULL");
    auto handle = std::make_unique<zero_comm>();
    handle->impl = zero::make_single_communicator();
    *out_comm = handle.release();
  });
}

ZERO_API void zero_comm_destroy(zero_comm_t* comm) { delete comm; }

ZERO_API zero_status_t zero_comm_rank(int* out_rank, const zero_comm_t* comm) {
  return guard("zero_comm_rank", [&] {
    require_arg(out_rank != nullptr, "zero_comm_rank", "out_rank is NULL");
    require_arg(comm != nullptr, "zero_comm_rank", "comm is NULL");
    *out_rank = comm->impl->rank();
  });
}

ZERO_API zero_status_t zero_comm_size(int* out_size, const zero_comm_t* comm) {
  return guard("zero_comm_size", [&] {
    require_arg(out_size != nullptr, "zero_comm_size", "out_size is NULL");
    require_arg(comm != nullptr, "zero_comm_size", "comm is NULL");
    *out_size = comm->impl->size();
  });
}

}  // extern "C"
