// The backend's setup (which path its collectives take) and its teardown.
#include "backend.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "process_state.hpp"
#include "topology.hpp"

namespace zero_mpi {

Backend::Backend(MPI_Comm data, MPI_Comm ctl) : data_(data), ctl_(ctl) {
  check(MPI_Comm_rank(data_, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(data_, &size_), "MPI_Comm_size");
  {  // the ranks that share this one's cores (OpenMP threads per rank), whatever the tests call a node
    MPI_Comm shared = MPI_COMM_NULL;
    check(MPI_Comm_split_type(data_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shared), "MPI_Comm_split_type");
    check(MPI_Comm_size(shared, &local_size_), "MPI_Comm_size");
    MPI_Comm_free(&shared);
  }
  Topology topology = find_topology(data_, rank_, size_);
  // Collective decision: every rank must agree to make the window (an environment that differs between ranks
  // must not leave some in MPI_Win_allocate_shared).
  const char* shm = std::getenv("ZERO_MPI_SHM");
  const bool shm_allowed = !(shm != nullptr && std::strcmp(shm, "0") == 0);
  int want = size_ > 1 && shm_allowed ? (topology.single_node ? 1 : topology.blocks ? 2 : 0) : 0;
  int agreed_min = want, agreed_max = want;
  check(MPI_Allreduce(MPI_IN_PLACE, &agreed_min, 1, MPI_INT, MPI_MIN, data_), "MPI_Allreduce");
  check(MPI_Allreduce(MPI_IN_PLACE, &agreed_max, 1, MPI_INT, MPI_MAX, data_), "MPI_Allreduce");
  want = agreed_min == agreed_max ? agreed_min : 0;  // the layout is the same everywhere: only the env may differ
  // Single copy (node_window.hpp) unless ZERO_MPI_SINGLE_COPY=0; the window agrees on it.
  const char* single = std::getenv("ZERO_MPI_SINGLE_COPY");
  const bool single_copy = !(single != nullptr && std::strcmp(single, "0") == 0);
  if (want == 1) window_ = make_node_window(data_, shm_half_bytes(), single_copy);
  if (want == 2) {
    hierarchy_ = make_hierarchy(data_, topology.node, shm_half_bytes());
    node_ = topology.node;  // the hierarchy's window lives on it
  } else {
    MPI_Comm_free(&topology.node);
  }
  // The hierarchy's collectives call MPI, which only the caller's thread may: no progress thread with it.
  use_progress_thread_ = window_ != nullptr && want_progress_thread(local_size_);
#ifdef ZERO_TEST_HOOKS
  // The tests of the window and hierarchy paths make sure they are the path they test.
  if (want == 1 && !window_ && std::getenv("ZERO_TEST_MPI_REQUIRE_SHM") != nullptr)
    fail(ZERO_ERR_INTERNAL, "ZERO_TEST_MPI_REQUIRE_SHM: the shared-memory window could not be made");
  if (window_ && single_copy && !window_->single_copy() && std::getenv("ZERO_TEST_MPI_REQUIRE_SINGLE_COPY") != nullptr)
    fail(ZERO_ERR_INTERNAL,
         "ZERO_TEST_MPI_REQUIRE_SINGLE_COPY: process_vm_readv between the ranks does not work here (a ptrace or "
         "seccomp restriction?)");
  if (shm_allowed && !hierarchy_ && std::getenv("ZERO_TEST_MPI_REQUIRE_HIERARCHY") != nullptr)
    fail(ZERO_ERR_INTERNAL,
         "ZERO_TEST_MPI_REQUIRE_HIERARCHY: the collectives are not hierarchical (want " + std::to_string(want) + ")");
#endif
  peers_.resize(static_cast<size_t>(size_));
  post_inbox();
}

void Backend::finalize() {
  enter();
  {
    InCall in(this);
    poll_control();
    tell_pending_abort();  // an abort from another thread since enter(): before the control channel closes
    close_control(1.0);
    stop_progress_thread();
    if (window_) window_->free();
    if (hierarchy_) hierarchy_->free();
    if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
    MPI_Comm_free(&data_);
    MPI_Comm_free(&ctl_);
    finalized_ = true;
  }
}

// MPI_Finalize runs under the process lock: an exit on another thread meanwhile waits for it (up to its deadline)
// instead of ending the process under it, and no backend opens while it runs.
void Backend::leave_process() {
  std::lock_guard<std::timed_mutex> lock(g_mutex);
  g_live.erase(std::remove(g_live.begin(), g_live.end(), this), g_live.end());
  const bool last_ours = g_we_initialized_mpi && g_live.empty() && !g_finalize_claimed && !g_exiting.load();
  if (!last_ours) return;
  g_finalize_claimed = true;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    g_libzero_finalizes.store(true);  // its hook must not take the process lock
    MPI_Finalize();
  }
}

// Local. The MPI communicators stay (freeing one is collective); MPI_Finalize reclaims them. Under g_mutex: the exit
// hook tells the others of every live backend, so it must not find this one half gone (nor run MPI under it).
Backend::~Backend() {
  std::lock_guard<std::timed_mutex> lock(g_mutex);
  g_live.erase(std::remove(g_live.begin(), g_live.end(), this), g_live.end());
  stop_progress_thread();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || finalized_ || mpi_gone_ || g_exiting.load()) return;
  if (may_call_mpi_now()) {
    say_goodbye("it destroyed its communicator");
    close_control(0.5);
  }
}

void Backend::last_goodbye(const std::string& reason) {
  stop_progress_thread();  // MPI_Finalize frees the window under it
  if (finalized_ || mpi_gone_) return;
  say_goodbye(reason);
  close_control(1.0);
  mpi_gone_ = true;
}

}  // namespace zero_mpi
