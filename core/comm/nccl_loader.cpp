#include "comm/nccl_loader.hpp"

#include <string>
#include <vector>

#include "../../backends/nccl/nccl_backend.h"
#include "comm/custom_communicator.hpp"
#include "comm/engine_comm.hpp"
#include "comm/split_communicator.hpp"
#include "util/error.hpp"
#include "util/module_loader.hpp"

namespace zero {
namespace {

constexpr const char* kCall = "zero_comm_create_nccl";

struct Entries {
  zero_nccl_backend_prepare_fn prepare = nullptr;
  zero_nccl_backend_open_fn open = nullptr;
};

// ZERO_NCCL_MODULE (a path), then the SONAME, then next to libzero.so (util/module_loader.hpp).
Entries load_module() {
  std::string tried;
  Entries entries;
  entries.prepare = reinterpret_cast<zero_nccl_backend_prepare_fn>(find_module_entry(
      "ZERO_NCCL_MODULE", ZERO_NCCL_BACKEND_SONAME, ZERO_NCCL_BACKEND_PREPARE, "libzero's NCCL module", tried));
  if (entries.prepare != nullptr)
    entries.open = reinterpret_cast<zero_nccl_backend_open_fn>(find_module_entry(
        "ZERO_NCCL_MODULE", ZERO_NCCL_BACKEND_SONAME, ZERO_NCCL_BACKEND_OPEN, "libzero's NCCL module", tried));
  if (entries.open == nullptr)
    fail(ZERO_ERR_UNSUPPORTED,
         std::string(kCall) + ": libzero's NCCL module could not be loaded; tried:" + tried +
             "\nBuild libzero with -DZERO_CUDA=ON where nccl.h is found (it is built beside libzero.so), or set "
             "ZERO_NCCL_MODULE to the path of " ZERO_NCCL_BACKEND_SONAME);
  return entries;
}

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(const std::shared_ptr<Communicator>& control, int device,
                                                     double timeout_s) {
  if (&control->control_side() != control.get())
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(kCall) + ": the control communicator is itself a split communicator");
  if (control->capabilities().device_buffers)
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(kCall) +
                                        ": the control communicator takes device buffers; pass a "
                                        "host communicator (MPI, shared memory, gloo)");
  EngineComm ranks(control);
  // Longer than NCCL's own join (timeout_s): a rank whose NCCL gave up waiting still reaches the agreement in time,
  // so every rank learns what failed rather than that someone is late.
  ranks.set_timeout(2 * timeout_s + 5);
  // Every rank loads the module and NCCL and checks its device (rank 0 also makes the id); all agree before any
  // waits for rank 0's id, so a rank without a GPU or without NCCL is every rank's error, not a hang.
  std::vector<char> id(ZERO_NCCL_UNIQUE_ID_BYTES, 0);
  Entries entries;
  int32_t version = 0;
  std::unique_ptr<Error> local = capture_error(kCall, [&] {
    entries = load_module();
    char error[1024] = {};
    const zero_status_t s =
        entries.prepare(&version, control->rank() == 0 ? id.data() : nullptr, device, error, sizeof error);
    if (s != ZERO_OK) fail(s, std::string(kCall) + ": " + error);
  });
  ranks.agree(kCall, CallTag{CallKind::kCommCreate, 0, 0, 0}, local.get());
  ranks.control_broadcast(id.data(), id.size(), 0, std::string(kCall) + ": NCCL's unique id");

  zero_comm_ops_t ops{};
  ops.struct_size = sizeof ops;
  void* user_data = nullptr;
  local = capture_error(kCall, [&] {
    char error[1024] = {};
    const zero_status_t s = entries.open(&ops, &user_data, control->rank(), control->size(), device, id.data(),
                                         timeout_s, error, sizeof error);
    if (s != ZERO_OK) fail(s, std::string(kCall) + ": " + error);
  });
  try {
    // The same outcome everywhere: a rank whose NCCL failed to join is every rank's error.
    ranks.agree(kCall, CallTag{CallKind::kCommCreate, 1, 0, 0}, local.get());
  } catch (...) {
    if (user_data != nullptr && ops.destroy != nullptr) ops.destroy(user_data);
    throw;
  }
  std::shared_ptr<Communicator> data;
  try {
    data = make_custom_communicator(&ops, user_data);
  } catch (...) {
    if (ops.destroy != nullptr) ops.destroy(user_data);
    throw;
  }
  return make_split_communicator(control, std::move(data), true, kCall);
}

}  // namespace zero
