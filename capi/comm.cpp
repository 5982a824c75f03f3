// Communicators: creation (MPI module, shared memory, single process, custom callbacks), rank and size, finalize,
// destroy.
#define ZERO_EXPERIMENTAL_API
#include "comm/custom_communicator.hpp"
#include "comm/engine_comm.hpp"
#include "comm/mpi_loader.hpp"
#include "comm/nccl_loader.hpp"
#include "comm/shm_communicator.hpp"
#include "comm/single_communicator.hpp"
#include "comm/split_communicator.hpp"
#include "guard.hpp"

using zero::capi::CommHandle;
using zero::capi::guard;
using zero::capi::handle;
using zero::capi::opaque;
using zero::capi::require_arg;

struct zero_listener {
  std::unique_ptr<zero::TcpListener> impl;
};

namespace {

zero_status_t create(const char* call, zero_comm_t** out_comm, const std::function<void(CommHandle&)>& make) {
  return guard(call, [&] {
    require_arg(out_comm != nullptr, call, "out_comm is NULL");
    auto h = std::make_unique<CommHandle>();
    make(*h);
    *out_comm = opaque(h.release());
  });
}

}  // namespace

extern "C" {

ZERO_API zero_status_t zero_comm_create_mpi(zero_comm_t** out_comm, int64_t mpi_comm) {
  return create("zero_comm_create_mpi", out_comm,
                [&](CommHandle& h) { h.impl = zero::make_mpi_communicator(mpi_comm); });
}

ZERO_API zero_status_t zero_comm_create_single(zero_comm_t** out_comm) {
  return create("zero_comm_create_single", out_comm, [](CommHandle& h) { h.impl = zero::make_single_communicator(); });
}

ZERO_API zero_status_t zero_comm_create_shm(zero_comm_t** out_comm, const char* name, int32_t rank, int32_t size,
                                            double join_timeout_s) {
  const char* call = "zero_comm_create_shm";
  return create(call, out_comm, [&](CommHandle& h) {
    require_arg(name != nullptr, call, "name is NULL");
    require_arg(size >= 1 && rank >= 0 && rank < size, call,
                ("rank " + std::to_string(rank) + " of " + std::to_string(size) + " ranks").c_str());
    require_arg(join_timeout_s > 0 && join_timeout_s < 1e9, call, "join_timeout_s must be positive");
    h.impl = zero::make_shm_communicator(name, rank, size, join_timeout_s);
  });
}

ZERO_API zero_status_t zero_listener_create(zero_listener_t** out_listener, const char** out_address,
                                            const char* host) {
  const char* call = "zero_listener_create";
  return guard(call, [&] {
    require_arg(out_listener != nullptr, call, "out_listener is NULL");
    require_arg(out_address != nullptr, call, "out_address is NULL");
    require_arg(host != nullptr, call, "host is NULL");
    auto listener = std::make_unique<zero_listener>();
    listener->impl = std::make_unique<zero::TcpListener>(host);
    *out_address = listener->impl->address().c_str();
    *out_listener = listener.release();
  });
}

ZERO_API void zero_listener_destroy(zero_listener_t* listener) { delete listener; }

ZERO_API zero_status_t zero_comm_create_shm_nodes(zero_comm_t** out_comm, zero_listener_t* listener, const char* name,
                                                  int32_t rank, int32_t size, int32_t ranks_per_node,
                                                  const char* const* addresses, double join_timeout_s) {
  const char* call = "zero_comm_create_shm_nodes";
  return create(call, out_comm, [&](CommHandle& h) {
    require_arg(name != nullptr, call, "name is NULL");
    require_arg(listener != nullptr, call, "listener is NULL");
    require_arg(addresses != nullptr, call, "addresses is NULL");
    require_arg(size >= 1 && rank >= 0 && rank < size, call,
                ("rank " + std::to_string(rank) + " of " + std::to_string(size) + " ranks").c_str());
    require_arg(
        ranks_per_node >= 1 && size % ranks_per_node == 0, call,
        ("ranks_per_node " + std::to_string(ranks_per_node) + " does not divide " + std::to_string(size) + " ranks")
            .c_str());
    require_arg(join_timeout_s > 0 && join_timeout_s < 1e9, call, "join_timeout_s must be positive");
    zero::ShmNodes nodes;
    nodes.ranks_per_node = ranks_per_node;
    nodes.listener = listener->impl.get();
    for (int32_t r = 0; r < size; ++r) {
      require_arg(addresses[r] != nullptr, call, ("addresses[" + std::to_string(r) + "] is NULL").c_str());
      nodes.addresses.emplace_back(addresses[r]);
    }
    h.impl = zero::make_shm_communicator(name, rank, size, join_timeout_s, &nodes);
  });
}

ZERO_API zero_status_t zero_comm_create_custom(zero_comm_t** out_comm, const zero_comm_ops_t* ops, void* user_data) {
  return create("zero_comm_create_custom", out_comm,
                [&](CommHandle& h) { h.impl = zero::make_custom_communicator(ops, user_data); });
}

ZERO_API zero_status_t zero_comm_create_split(zero_comm_t** out_comm, zero_comm_t* control, zero_comm_t* data) {
  const char* call = "zero_comm_create_split";
  return create(call, out_comm, [&](CommHandle& h) {
    require_arg(control != nullptr, call, "control is NULL");
    require_arg(data != nullptr, call, "data is NULL");
    h.impl = zero::make_split_communicator(handle(control)->impl, handle(data)->impl, false, call);
  });
}

ZERO_API zero_status_t zero_comm_create_nccl(zero_comm_t** out_comm, zero_comm_t* control, int32_t device,
                                             double timeout_s) {
  const char* call = "zero_comm_create_nccl";
  return create(call, out_comm, [&](CommHandle& h) {
    require_arg(control != nullptr, call, "control is NULL");
    require_arg(timeout_s > 0 && timeout_s < 1e9, call, "timeout_s must be positive");
    h.impl = zero::make_nccl_communicator(handle(control)->impl, device, timeout_s);
  });
}

ZERO_API zero_status_t zero_comm_finalize(zero_comm_t* comm) {
  const char* call = "zero_comm_finalize";
  return guard(call, [&] {
    require_arg(comm != nullptr, call, "comm is NULL");
    zero::finalize_communicator(handle(comm)->impl);
  });
}

ZERO_API void zero_comm_destroy(zero_comm_t* comm) { delete handle(comm); }

ZERO_API zero_status_t zero_comm_rank(int32_t* out_rank, const zero_comm_t* comm) {
  return guard("zero_comm_rank", [&] {
    require_arg(out_rank != nullptr, "zero_comm_rank", "out_rank is NULL");
    require_arg(comm != nullptr, "zero_comm_rank", "comm is NULL");
    *out_rank = handle(comm)->impl->rank();
  });
}

ZERO_API zero_status_t zero_comm_size(int32_t* out_size, const zero_comm_t* comm) {
  return guard("zero_comm_size", [&] {
    require_arg(out_size != nullptr, "zero_comm_size", "out_size is NULL");
    require_arg(comm != nullptr, "zero_comm_size", "comm is NULL");
    *out_size = handle(comm)->impl->size();
  });
}

}  // extern "C"
