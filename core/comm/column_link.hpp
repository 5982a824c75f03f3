// Messages between the ranks of one column: the ranks with the same place on every node (hierarchy.hpp). This is
// all the hierarchical collectives need of the network between nodes, so that they run over MPI (the MPI module's
// column communicator) and over TCP (tcp_link.hpp) alike.
//
// MPI's point-to-point semantics, reduced to what the collectives use: one tag; the messages a node sends arrive in
// the order it sent them and match its receives in the order they were posted; a message longer than the receive
// it matches is an error (kTruncated), which the caller reports as ranks in different collectives.
#pragma once

#include <cstddef>
#include <string>

namespace zero {

class ColumnLink {
 public:
  // A send or receive in flight: a handle of the link's, kNoRequest once it completed (or never started).
  using Request = int;
  static constexpr Request kNoRequest = -1;
  enum class Test { kPending, kDone, kFailed, kTruncated };

  virtual ~ColumnLink() = default;

  // Start sending `bytes` from `buf` to the column's rank on `node`, or receiving at most `bytes` from it into
  // `buf`; the buffer is the link's until the request completes. False (error() says why) if it cannot start.
  virtual bool send(const void* buf, size_t bytes, int node, Request* request) = 0;
  virtual bool receive(void* buf, size_t bytes, int node, Request* request) = 0;

  // kDone: *request becomes kNoRequest and, for a receive, *received is the size of the message that arrived.
  // Testing kNoRequest is kDone with nothing received, as MPI_Test of MPI_REQUEST_NULL. kFailed and kTruncated:
  // error() says why; nothing more moves to or from that node (the caller gives the collective up).
  virtual Test test(Request* request, size_t* received) = 0;

  // Whether no request is in flight: the buffers of requests given up may be written until then.
  virtual bool idle() const = 0;

  virtual std::string error() const = 0;

  // Moves what is in flight without waiting for anything (a link whose transfers move only when tested, as TCP's
  // do). False once the link failed.
  virtual bool progress() { return true; }

  // Collective over the column (zero_comm_finalize): gives the link's resources back.
  virtual void free() = 0;
};

}  // namespace zero
