// libzero's MPI backend (libzero-mpi.so.1): zero.h's communicator callbacks over MPI, in a module of its own so
// that libzero.so links no MPI (a Python wheel cannot carry one MPI ABI; a Java program must not need mpirun to
// load libzero).
//
// This file: the callback table zero_mpi_backend_open fills (backend.hpp is the backend behind it), and the
// process-wide state with the hooks that tell the other ranks when this process finalizes MPI or exits.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "backend.hpp"
#include "mpi_backend.h"
#include "process_state.hpp"

namespace zero_mpi {

// ---- Process-wide state --------------------------------------------------------------------------------------
std::timed_mutex g_mutex;
bool g_we_initialized_mpi = false;
bool g_finalize_claimed = false;
std::vector<Backend*>& g_live = *new std::vector<Backend*>();
int g_provided = MPI_THREAD_SINGLE;
std::atomic<bool> g_exiting{false};
std::atomic<bool> g_libzero_finalizes{false};

}  // namespace zero_mpi

namespace {

using zero_mpi::Backend;
using zero_mpi::check;
using zero_mpi::fail;
using zero_mpi::Failure;
using zero_mpi::g_exiting;
using zero_mpi::g_finalize_claimed;
using zero_mpi::g_libzero_finalizes;
using zero_mpi::g_live;
using zero_mpi::g_mutex;
using zero_mpi::g_provided;
using zero_mpi::g_we_initialized_mpi;
using zero_mpi::Op;

bool g_hooks_installed = false;
void say_goodbye_all(const std::string& reason) {
  std::vector<Backend*> live;
  {
    std::lock_guard<std::timed_mutex> lock(g_mutex);
    live = g_live;
  }
  for (Backend* b : live) b->last_goodbye(reason);
}

int finalize_hook(MPI_Comm, int, void*, void*) {
  if (!g_libzero_finalizes.load()) say_goodbye_all("it called MPI_Finalize");
  return MPI_SUCCESS;
}

// The process is exiting, from any thread. Another thread may be inside a libzero call, in MPI: it is told to leave
// (g_exiting: its wait returns, no call enters MPI again) and waited for (up to 3 s); only then does this thread tell
// the other ranks and finalize MPI, so that MPI is never torn down under a call. A call that does not leave in time (or
// a thread level that forbids this thread MPI) leaves MPI as it is: the process ends without telling the others, who
// learn it from their launcher or their timeout.
void exit_hook() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  g_exiting.store(true);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  std::unique_lock<std::timed_mutex> live(g_mutex, std::defer_lock);
  if (!live.try_lock_until(deadline)) return;
  std::vector<std::unique_lock<std::recursive_timed_mutex>> calls;
  for (Backend* b : g_live) {
    calls.emplace_back(b->call_mutex(), std::defer_lock);
    if (!calls.back().try_lock_until(deadline)) return;
  }
  if (g_provided == MPI_THREAD_FUNNELED) {
    int main_thread = 0;
    MPI_Is_thread_main(&main_thread);
    if (!main_thread) return;
  }
  for (Backend* b : g_live) b->last_goodbye("its process is exiting");
  // libzero started MPI for this program, so libzero ends it (MPI_Finalize is collective over the world: every
  // rank reaches this as its process exits).
  const bool ours = g_we_initialized_mpi && !g_finalize_claimed;
  g_finalize_claimed = g_finalize_claimed || ours;
  calls.clear();
  live.unlock();
  if (ours) {
    g_libzero_finalizes.store(true);
    MPI_Finalize();
  }
}

void install_hooks() {
  if (g_hooks_installed) return;
  g_hooks_installed = true;
  int key = MPI_KEYVAL_INVALID;
  if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, finalize_hook, &key, nullptr) == MPI_SUCCESS)
    MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr);
  std::atexit(exit_hook);
}

Backend* as_backend(void* user_data) { return static_cast<Backend*>(user_data); }

extern "C" {

zero_status_t op_run(void* ud, const zero_collective_t* coll) {
  Backend* b = as_backend(ud);
  return b->guarded([&] {
    Op* op = b->start(*coll);
    while (!b->wait(op, 3600.0)) {
    }
  });
}

zero_status_t op_start(void** out_request, void* ud, const zero_collective_t* coll) {
  Backend* b = as_backend(ud);
  return b->guarded([&] { *out_request = b->start(*coll); });
}

zero_status_t op_wait(int32_t* out_done, void* ud, void* request, double timeout_s) {
  Backend* b = as_backend(ud);
  return b->guarded([&] { *out_done = b->wait(static_cast<Op*>(request), timeout_s) ? 1 : 0; });
}

const char* op_error(void* ud) { return as_backend(ud)->error(); }

void op_abort(void* ud, const char* reason) {
  try {
    as_backend(ud)->abort(reason != nullptr ? reason : "aborted");
  } catch (...) {
  }
}

zero_status_t op_diagnose(char* out, size_t capacity, void* ud, uint64_t sequence, double grace_s) {
  Backend* b = as_backend(ud);
  return b->guarded([&] {
    const std::string text = b->diagnose(sequence, grace_s);
    if (capacity == 0) return;
    const size_t n = std::min(text.size(), capacity - 1);
    std::memcpy(out, text.data(), n);
    out[n] = '\0';
  });
}

zero_status_t op_finalize(void* ud) {
  Backend* b = as_backend(ud);
  const zero_status_t status = b->guarded([&] { b->finalize(); });
  if (status == ZERO_OK) b->leave_process();  // outside the call's lock: the exit hook takes the two the other way
  return status;
}

void op_destroy(void* ud) {
  try {
    delete as_backend(ud);
  } catch (...) {
  }
}

}  // extern "C"

}  // namespace

extern "C" ZERO_API zero_status_t zero_mpi_backend_open(zero_comm_ops_t* out_ops, void** out_user_data,
                                                        int64_t mpi_comm, char* error_text, size_t capacity) {
  auto report = [&](const std::string& message) {
    if (error_text != nullptr && capacity > 0) {
      const size_t n = std::min(message.size(), capacity - 1);
      std::memcpy(error_text, message.data(), n);
      error_text[n] = '\0';
    }
  };
  if (out_ops == nullptr || out_user_data == nullptr || out_ops->struct_size < sizeof(zero_comm_ops_t)) {
    report("zero_mpi_backend_open: bad arguments (a libzero.so / libzero-mpi.so version mismatch?)");
    return ZERO_ERR_INVALID_ARGUMENT;
  }
  std::lock_guard<std::timed_mutex> lock(g_mutex);
  MPI_Comm dup_data = MPI_COMM_NULL, dup_ctl = MPI_COMM_NULL;
  try {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) fail(ZERO_ERR_INVALID_STATE, "MPI has already been finalised in this process; it cannot restart");
    if (g_exiting.load()) fail(ZERO_ERR_INVALID_STATE, "this process is exiting (exit() was called)");
    if (g_finalize_claimed) fail(ZERO_ERR_INVALID_STATE, "libzero has finalized the MPI it initialised");
    if (!initialized) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      g_we_initialized_mpi = true;
    }
    check(MPI_Query_thread(&g_provided), "MPI_Query_thread");
    if (g_provided < MPI_THREAD_FUNNELED)
      fail(ZERO_ERR_UNSUPPORTED,
           "MPI was initialised with MPI_THREAD_SINGLE (MPI_Init does that), but libzero runs OpenMP threads beside "
           "MPI and needs at least MPI_THREAD_FUNNELED: initialise MPI with MPI_Init_thread(&argc, &argv, "
           "MPI_THREAD_FUNNELED, &provided), or MPI_THREAD_SERIALIZED to call libzero from any one thread");
    if (g_provided == MPI_THREAD_FUNNELED) {
      int main_thread = 0;
      MPI_Is_thread_main(&main_thread);
      if (!main_thread)
        fail(ZERO_ERR_INVALID_STATE,
             "MPI was initialised with MPI_THREAD_FUNNELED and zero_comm_create_mpi is called from another thread "
             "than the one that initialised it; initialise MPI with MPI_THREAD_SERIALIZED");
    }
    MPI_Comm user = mpi_comm == ZERO_MPI_COMM_WORLD ? MPI_COMM_WORLD : MPI_Comm_f2c(static_cast<MPI_Fint>(mpi_comm));
    if (user == MPI_COMM_NULL) fail(ZERO_ERR_INVALID_ARGUMENT, "mpi_comm is MPI_COMM_NULL");
    check(MPI_Comm_dup(user, &dup_data), "MPI_Comm_dup");
    check(MPI_Comm_dup(user, &dup_ctl), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(dup_data, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(dup_ctl, MPI_ERRORS_RETURN);
    install_hooks();
    g_live.reserve(g_live.size() + 1);  // nothing may throw once the backend exists: its destructor takes g_mutex
    auto backend = std::make_unique<Backend>(dup_data, dup_ctl);
    zero_comm_ops_t ops;
    std::memset(&ops, 0, sizeof ops);
    ops.struct_size = sizeof ops;
    ops.rank = backend->rank();
    ops.size = backend->size();
    ops.local_size = backend->local_size();
    ops.flags = ZERO_COMM_DETERMINISTIC;
    ops.run = op_run;
    ops.start = op_start;
    ops.wait = op_wait;
    ops.error_message = op_error;
    ops.abort = op_abort;
    ops.diagnose = op_diagnose;
    ops.finalize = op_finalize;
    ops.destroy = op_destroy;
    std::memcpy(out_ops, &ops, sizeof ops);
    g_live.push_back(backend.get());
    *out_user_data = backend.release();
    return ZERO_OK;
  } catch (const Failure& f) {
    if (dup_data != MPI_COMM_NULL) MPI_Comm_free(&dup_data);
    if (dup_ctl != MPI_COMM_NULL) MPI_Comm_free(&dup_ctl);
    report(f.message);
    return f.status;
  } catch (const std::bad_alloc&) {
    report("out of memory");
    return ZERO_ERR_OUT_OF_MEMORY;
  }
}
