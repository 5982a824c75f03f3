// A column link (column_link.hpp) over TCP: one connection to the column's rank on each other node, for jobs that
// span machines without MPI (torchrun's). Nonblocking sockets, moved forward by every test(), so that the caller's
// wait loop keeps its timeout, its abort and its notices.
//
// Two connections to each peer. The data connection carries data frames (a 16-byte header, the payload's length
// and kind, then the payload): a data frame goes straight from the sender's buffer into the receive it matches,
// which is the oldest receive posted for that node (one sender's frames arrive in order); a data frame longer than
// that receive is kTruncated. The control connection (tcp_frames.hpp) carries what must never wait behind data,
// read whenever it comes: a notice (a few words a rank says before it stops: an abort's reason, an exit; a data
// connection that then closes fails with those words instead of "closed"), and questions and their answers (a rank
// that timed out asks what the other machines' ranks are doing).
//
// Setting up: every rank opens a listening socket first (TcpListener) and the job's bootstrap gives every rank the
// column peers' addresses (torch.distributed's store under torchrun). Node j connects twice to every node i < j; the
// first bytes on a connection say who connects, which of its two it is, and for which job (a token the bootstrap
// drew), answered once taken, so a stray or stale connection is refused rather than taken for a peer.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/column_link.hpp"
#include "comm/tcp_frames.hpp"
#include "comm/tcp_socket.hpp"

namespace zero {

class TcpColumnLink final : public ColumnLink {
 public:
  // Collective over the column: node `node` of `nodes`, `addresses[n]` the listener of node n's rank (this rank's
  // own is `listener`'s). `token` names the job and the column (the same on every rank of the column). Throws
  // zero::Error (ZERO_ERR_TIMEOUT naming the nodes that did not connect) after `timeout_s`.
  TcpColumnLink(TcpListener& listener, int node, int nodes, const std::vector<std::string>& addresses,
                const std::string& token, double timeout_s);
  ~TcpColumnLink() override;

  bool send(const void* buf, size_t bytes, int node, Request* request) override;
  bool receive(void* buf, size_t bytes, int node, Request* request) override;
  Test test(Request* request, size_t* received) override;
  bool idle() const override;
  std::string error() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }
  void free() override;

  // Sends `words` to every connected peer ahead of any data not yet begun, and pushes them out for at most
  // `flush_s` (a rank about to stop says why; any thread may call it). Best effort: a peer that cannot be reached
  // learns it from the closed connection.
  void tell_peers(const std::string& words, double flush_s);

  // How errors name each node's peer ("rank 5"; by default "node n's rank of this column").
  void name_peers(std::vector<std::string> names) {
    std::lock_guard<std::mutex> lock(mutex_);
    names_ = std::move(names);
  }

  // The words node n said before it stopped, or "" (read as they arrive; call progress() to read them).
  std::string notice(int node) const;

  // Questions and answers between the column's ranks. A link given an answerer replies to every question with
  // what it returns, from whichever thread moves the link (the answerer runs with the link's lock held: it must
  // not call the link). ask_peers sends `question` to every connected peer; answer(n) is node n's latest reply,
  // or "" (call progress() to read them).
  void answer_questions_with(std::function<std::string(const std::string& question)> answerer) {
    std::lock_guard<std::mutex> lock(mutex_);
    answerer_ = std::move(answerer);
  }
  void ask_peers(const std::string& question);
  std::string answer(int node) const;
  // Moves every connection as far as the kernel allows. False once a connection failed (error() says the first).
  bool progress() override;

 private:
  struct Pending {
    const char* buf = nullptr;
    size_t bytes = 0;
    size_t done = 0;           // bytes of header + payload written
    unsigned char header[16];  // length, kind
    Request request = kNoRequest;
  };
  struct Posted {
    char* buf = nullptr;
    size_t capacity = 0;
    Request request = kNoRequest;
  };
  struct Peer {
    int fd = -1;  // the data connection
    FrameConnection control;
    std::deque<Pending> sends;
    std::deque<Posted> receives;
    unsigned char header[16];
    size_t header_got = 0;   // of the frame being read
    uint64_t length = 0;     // its payload
    uint64_t kind = 0;       // kData (or kGoodbye)
    size_t payload_got = 0;  // of its payload
    std::string notice;      // the first it sent
    std::string answer;      // the latest it sent
    bool closed = false;
    bool said_goodbye = false;  // it finalized: its close is no failure unless a receive still waits on it
    bool hung_up = false;       // frames nobody has asked for yet are read into `early`, to reach its notice and close
    bool failed = false, truncated = false;  // its connection failed: its requests fail with `error`
    std::string failure;                     // what failed
    std::string error;                       // that, and who, in words
    bool buffering = false;                  // the frame being read goes into `scratch`
    std::vector<char> scratch;
    std::deque<std::vector<char>> early;  // whole frames read before their receives, in order
  };
  struct State {
    bool in_use = false;
    bool done = false;
    size_t received = 0;
    int node = 0;  // the peer it is with
  };
  static constexpr uint64_t kData = 0, kNotice = 1, kGoodbye = 2, kQuestion = 3, kAnswer = 4;

  Request new_request(int node);
  void pump_control(int node);
  bool pump_sends(int node);
  bool pump_receives(int node);
  void match_early(int node);
  bool fail_link(int node, const std::string& what, bool truncated = false);
  void describe_failure(int node);

  mutable std::mutex mutex_;
  int node_ = 0;
  std::vector<Peer> peers_;  // by node; this node's entry unused
  std::vector<std::string> names_;
  std::function<std::string(const std::string&)> answerer_;
  std::vector<State> requests_;
  std::vector<Request> free_;
  std::string error_;
  bool failed_ = false;  // some connection failed (error_ says the first)
};

}  // namespace zero
