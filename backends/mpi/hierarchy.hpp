// The hierarchical collectives (comm/hierarchy.hpp) over MPI: each node's window is an MPI shared-memory window,
// and the ranks with the same place on different nodes talk over a column communicator of their own. MPI calls:
// only the thread inside the backend's waits may step it (the backend runs no progress thread with it).
#pragma once

#include <mpi.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "comm/column_link.hpp"
#include "comm/hierarchy.hpp"
#include "node_window.hpp"

namespace zero_mpi {

using zero::Hierarchy;

// Point-to-point messages over the column communicator, on one tag: MPI keeps the order of one sender's messages
// and reports a message longer than its receive as MPI_ERR_TRUNCATE.
class MpiColumnLink final : public zero::ColumnLink {
 public:
  explicit MpiColumnLink(MPI_Comm column) : column_(column) { MPI_Comm_set_errhandler(column_, MPI_ERRORS_RETURN); }

  bool send(const void* buf, size_t bytes, int node, Request* request) override {
    return start(MPI_Isend(buf, static_cast<int>(bytes), MPI_BYTE, node, kTag, column_, slot(request)), "MPI_Isend");
  }
  bool receive(void* buf, size_t bytes, int node, Request* request) override {
    return start(MPI_Irecv(buf, static_cast<int>(bytes), MPI_BYTE, node, kTag, column_, slot(request)), "MPI_Irecv");
  }

  Test test(Request* request, size_t* received) override {
    *received = 0;
    if (*request == kNoRequest) return Test::kDone;
    MPI_Request& r = requests_[static_cast<size_t>(*request)];
    int flag = 0;
    MPI_Status status;
    const int rc = MPI_Test(&r, &flag, &status);
    if (rc != MPI_SUCCESS) {
      int cls = 0;
      const bool truncated = MPI_Error_class(rc, &cls) == MPI_SUCCESS && cls == MPI_ERR_TRUNCATE;
      error_ = "MPI_Test: " + describe(rc);
      return truncated ? Test::kTruncated : Test::kFailed;
    }
    if (flag == 0) return Test::kPending;
    int got = 0;
    if (MPI_Get_count(&status, MPI_BYTE, &got) == MPI_SUCCESS && got > 0) *received = static_cast<size_t>(got);
    free_.push_back(*request);
    *request = kNoRequest;
    return Test::kDone;
  }

  bool idle() const override {
    for (MPI_Request r : requests_)
      if (r != MPI_REQUEST_NULL) return false;
    return true;
  }

  std::string error() const override { return error_; }

  void free() override {
    if (column_ != MPI_COMM_NULL) MPI_Comm_free(&column_);
  }

 private:
  static constexpr int kTag = 1;

  // A free request slot for *request (whose handle it becomes). Slots are reused, never moved while in flight:
  // requests_ grows only when every slot is taken, and MPI holds no pointer to the vector's elements.
  MPI_Request* slot(Request* request) {
    if (free_.empty()) {
      free_.push_back(static_cast<Request>(requests_.size()));
      requests_.push_back(MPI_REQUEST_NULL);
    }
    *request = free_.back();
    free_.pop_back();
    return &requests_[static_cast<size_t>(*request)];
  }
  bool start(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return true;
    error_ = std::string(what) + ": " + describe(rc);
    return false;
  }
  static std::string describe(int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return std::string(text, static_cast<size_t>(len));
  }

  MPI_Comm column_;
  std::vector<MPI_Request> requests_;
  std::vector<Request> free_;
  std::string error_;
};

// Collective over `data`. `node`: this rank's node, whose ranks are the consecutive data ranks kL .. kL + L - 1
// (the caller checked, for every rank). Null, on every rank, where some node's window cannot be made or the chunk
// buffer is too small for N ranks (the caller then uses MPI's collectives).
inline std::unique_ptr<Hierarchy> make_hierarchy(MPI_Comm data, MPI_Comm node, size_t half_bytes) {
  int rank = 0, size = 0, local = 0, local_size = 0;
  MPI_Comm_rank(data, &rank);
  MPI_Comm_size(data, &size);
  MPI_Comm_rank(node, &local);
  MPI_Comm_size(node, &local_size);
  // Every rank cuts a collective into the same chunks (the nodes exchange them by number): one chunk buffer size
  // for the whole job, the smallest any rank asked for.
  unsigned long long agreed = half_bytes / 64 * 64;
  MPI_Allreduce(MPI_IN_PLACE, &agreed, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, data);
  // A reduce-scatter's chunk holds a piece of every block: each must hold at least a cache line.
  if (agreed < 64 * static_cast<unsigned long long>(size)) return nullptr;
  std::unique_ptr<zero::NodeWindow> window = make_node_window(node, static_cast<size_t>(agreed), false);
  int ok = window != nullptr ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, data);
  if (!ok) {
    if (window) window->free();  // every rank of this node made it: MPI_Win_free is collective over the node
    return nullptr;
  }
  MPI_Comm column = MPI_COMM_NULL;
  MPI_Comm_split(data, local, rank, &column);
  auto h = std::make_unique<Hierarchy>(std::move(window), std::make_unique<MpiColumnLink>(column), rank / local_size,
                                       size / local_size);
#ifdef ZERO_TEST_HOOKS
  if (const char* slow = std::getenv("ZERO_TEST_MPI_SLOW_LAST_NODE_US"); slow != nullptr)
    h->set_last_node_delay_us(std::atoi(slow));
#endif
  return h;
}

}  // namespace zero_mpi
