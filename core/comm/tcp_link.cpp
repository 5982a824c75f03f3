#include "comm/tcp_link.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "util/error.hpp"

namespace zero {
namespace {

using tcp::Clock;
using tcp::dial;
using tcp::errno_text;
using tcp::read_all;
using tcp::seconds_left;
using tcp::set_options;
using tcp::write_all;

constexpr uint64_t kHelloMagic = 0x6c69627a65726f32ull;  // "libzero2": two connections per peer
constexpr size_t kMaxToken = 256;
constexpr size_t kMaxNotice = 4096;
// A connection that closed or was reset without a notice: its rank ended (killed, or exited without a word).
const char* const kClosed = "its process ended without a word (its connection closed: killed by a signal?)";

void put64(unsigned char* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint64_t get64(const unsigned char* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace

TcpColumnLink::TcpColumnLink(TcpListener& listener, int node, int nodes, const std::vector<std::string>& addresses,
                             const std::string& token, double timeout_s)
    : node_(node), peers_(static_cast<size_t>(nodes)) {
  if (static_cast<int>(addresses.size()) != nodes)
    fail(ZERO_ERR_INVALID_ARGUMENT, "the column link needs one address per node");
  if (token.size() > kMaxToken) fail(ZERO_ERR_INVALID_ARGUMENT, "the column link's token is too long");
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(std::max(0.0, timeout_s)));
  // hello: magic, the dialling node (and, in the high word, which connection: 0 data, 1 control), the token's
  // length, then the token; the answer: magic, once taken.
  const auto hello = [&](int from, uint64_t connection) {
    std::vector<unsigned char> h(24 + token.size());
    put64(h.data(), kHelloMagic);
    put64(h.data() + 8, static_cast<uint64_t>(from) | connection << 32);
    put64(h.data() + 16, token.size());
    std::memcpy(h.data() + 24, token.data(), token.size());
    return h;
  };
  try {
    // Dial every lower node; accept every higher one.
    for (int n = 0; n < node; ++n)
      for (uint64_t connection = 0; connection < 2; ++connection) {
        std::string why;
        const int fd = dial(addresses[static_cast<size_t>(n)], deadline, &why);
        if (fd < 0)
          fail(ZERO_ERR_TIMEOUT, "node " + std::to_string(n) + "'s rank of this column (" +
                                     addresses[static_cast<size_t>(n)] + ") could not be reached: " + why);
        if (connection == 0)
          peers_[static_cast<size_t>(n)].fd = fd;
        else
          peers_[static_cast<size_t>(n)].control = FrameConnection(fd);
        const std::vector<unsigned char> h = hello(node, connection);
        unsigned char ack[8] = {};
        if (!write_all(fd, h.data(), h.size(), deadline) || !read_all(fd, ack, sizeof ack, deadline) ||
            get64(ack) != kHelloMagic)
          fail(ZERO_ERR_COMM, "node " + std::to_string(n) + "'s rank of this column (" +
                                  addresses[static_cast<size_t>(n)] +
                                  ") did not take this rank's connection: another job listens there, or this node "
                                  "connected twice, or it gave up");
      }
    int waiting = 2 * (nodes - 1 - node);
    while (waiting > 0) {
      pollfd pfd{listener.fd(), POLLIN, 0};
      const double left = seconds_left(deadline);
      if (left <= 0) {
        std::string missing;
        for (int n = node + 1; n < nodes; ++n)
          if (peers_[static_cast<size_t>(n)].fd < 0 || !peers_[static_cast<size_t>(n)].control.open())
            missing += (missing.empty() ? "" : ", ") + std::to_string(n) +
                       (peers_[static_cast<size_t>(n)].fd >= 0 || peers_[static_cast<size_t>(n)].control.open()
                            ? " (only one of its two connections came)"
                            : "");
        fail(ZERO_ERR_TIMEOUT, "the column link: node(s) " + missing + " did not connect to this rank (" +
                                   listener.address() + ") within " + std::to_string(timeout_s) + " s");
      }
      if (poll(&pfd, 1, static_cast<int>(std::min(left * 1000, 100.0)) + 1) <= 0) continue;
      const int fd = accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)  // out of descriptors: not a busy loop
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      set_options(fd);
      // A connection that is not one of this column's peers (a port scan, another job's rank, a stale attempt)
      // is closed and forgotten.
      unsigned char h[24] = {};
      const auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(2));
      const uint64_t said = read_all(fd, h, sizeof h, hello_deadline) ? get64(h + 8) : UINT64_MAX;
      const uint64_t from = said & 0xffffffffu, connection = said >> 32;
      const uint64_t length = get64(h + 16);
      std::string theirs(length <= kMaxToken ? length : 0, '\0');
      const bool ok = get64(h) == kHelloMagic && from > static_cast<uint64_t>(node) &&
                      from < static_cast<uint64_t>(nodes) && connection < 2 && length <= kMaxToken &&
                      read_all(fd, theirs.data(), theirs.size(), hello_deadline) && theirs == token &&
                      (connection == 0 ? peers_[static_cast<size_t>(from)].fd < 0
                                       : !peers_[static_cast<size_t>(from)].control.open());
      unsigned char ack[8];
      put64(ack, kHelloMagic);
      if (!ok || !write_all(fd, ack, sizeof ack, hello_deadline)) {
        close(fd);
        continue;
      }
      if (connection == 0)
        peers_[static_cast<size_t>(from)].fd = fd;
      else
        peers_[static_cast<size_t>(from)].control = FrameConnection(fd);
      --waiting;
    }
  } catch (...) {
    for (Peer& p : peers_) {
      if (p.fd >= 0) close(p.fd);
      p.control.close(false);
    }
    throw;
  }
}

TcpColumnLink::~TcpColumnLink() {
  // What this rank sent whole is delivered (a peer may still be reading the last collective's data, which this
  // rank completed); a connection with a frame only partly sent is reset instead, so that its peer hears of the end
  // at once rather than behind bytes it may not be reading.
  for (Peer& p : peers_) {
    p.control.close(true);
    if (p.fd < 0) continue;
    if (p.sends.empty()) {
      const linger graceful{0, 0};
      setsockopt(p.fd, SOL_SOCKET, SO_LINGER, &graceful, sizeof graceful);
    }
    close(p.fd);
  }
}

void TcpColumnLink::free() {
  std::lock_guard<std::mutex> lock(mutex_);
  // A goodbye first, so that a peer still finishing its own part of the last collective with another node does not
  // take this close for a failure.
  unsigned char bye[16];
  put64(bye, 0);
  put64(bye + 8, kGoodbye);
  const auto deadline = Clock::now() + std::chrono::milliseconds(100);
  for (Peer& p : peers_)
    if (p.fd >= 0) {
      if (!p.closed) write_all(p.fd, bye, sizeof bye, deadline);
      const linger graceful{0, 0};
      setsockopt(p.fd, SOL_SOCKET, SO_LINGER, &graceful, sizeof graceful);
      close(p.fd);
      p.fd = -1;
      p.closed = true;
      p.control.close(true);
    }
}

ColumnLink::Request TcpColumnLink::new_request(int node) {
  if (free_.empty()) {
    free_.push_back(static_cast<Request>(requests_.size()));
    requests_.emplace_back();
  }
  const Request r = free_.back();
  free_.pop_back();
  requests_[static_cast<size_t>(r)] = State{true, false, 0, node};
  return r;
}

bool TcpColumnLink::send(const void* buf, size_t bytes, int node, Request* request) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (node < 0 || node >= static_cast<int>(peers_.size()) || node == node_) {
    error_ = "no peer on node " + std::to_string(node);
    return false;
  }
  if (peers_[static_cast<size_t>(node)].failed) {
    error_ = peers_[static_cast<size_t>(node)].error;
    return false;
  }
  Pending p;
  p.buf = static_cast<const char*>(buf);
  p.bytes = bytes;
  put64(p.header, bytes);
  put64(p.header + 8, kData);
  p.request = *request = new_request(node);
  peers_[static_cast<size_t>(node)].sends.push_back(std::move(p));
  pump_sends(node);  // a failure shows in test(), as MPI reports one in the request's completion
  return true;
}

bool TcpColumnLink::receive(void* buf, size_t bytes, int node, Request* request) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (node < 0 || node >= static_cast<int>(peers_.size()) || node == node_) {
    error_ = "no peer on node " + std::to_string(node);
    return false;
  }
  Peer& peer = peers_[static_cast<size_t>(node)];
  // A peer that ended may have sent this message before it did (kept in `early`).
  if (peer.failed && peer.early.empty()) {
    error_ = peer.error;
    return false;
  }
  *request = new_request(node);
  peer.receives.push_back({static_cast<char*>(buf), bytes, *request});
  match_early(node);
  pump_receives(node);
  return true;
}

// Receives posted for frames read before them (from a peer that hung up), in order. With mutex_ held.
void TcpColumnLink::match_early(int node) {
  Peer& peer = peers_[static_cast<size_t>(node)];
  while (!peer.early.empty() && !peer.receives.empty()) {
    const Posted r = peer.receives.front();
    std::vector<char>& frame = peer.early.front();
    if (frame.size() > r.capacity) {
      peer.failed = false;  // a truncation is the cause now, not the close that followed
      fail_link(node,
                "it sent a message of " + std::to_string(frame.size()) + " bytes where this rank expected at most " +
                    std::to_string(r.capacity),
                true);
      return;
    }
    std::memcpy(r.buf, frame.data(), frame.size());
    State& st = requests_[static_cast<size_t>(r.request)];
    st.done = true;
    st.received = frame.size();
    peer.receives.pop_front();
    peer.early.pop_front();
  }
}

ColumnLink::Test TcpColumnLink::test(Request* request, size_t* received) {
  *received = 0;
  if (*request == kNoRequest) return Test::kDone;
  std::lock_guard<std::mutex> lock(mutex_);
  State& s = requests_[static_cast<size_t>(*request)];
  // Every data connection moves, whichever this request waits on; one that failed stops only its own requests (a
  // node that ended after the last collective it took part in must not fail what the others still deliver). The
  // control connections move in progress(), which a waiting rank calls every few milliseconds, not here, where a
  // collective's spin would pay a system call per peer each time.
  if (!s.done)
    for (int n = 0; n < static_cast<int>(peers_.size()); ++n)
      if (n != node_) pump_sends(n) && pump_receives(n);
  if (s.done) {
    *received = s.received;
    s.in_use = false;
    free_.push_back(*request);
    *request = kNoRequest;
    return Test::kDone;
  }
  const Peer& peer = peers_[static_cast<size_t>(s.node)];
  if (!peer.failed) return Test::kPending;
  error_ = peer.error;
  return peer.truncated ? Test::kTruncated : Test::kFailed;
}

bool TcpColumnLink::progress() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int n = 0; n < static_cast<int>(peers_.size()); ++n)
    if (n != node_) {
      pump_control(n);
      pump_sends(n) && pump_receives(n);
    }
  return !failed_;
}

bool TcpColumnLink::idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const State& s : requests_)
    if (s.in_use && !s.done) return false;
  return true;
}

std::string TcpColumnLink::notice(int node) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (node < 0 || node >= static_cast<int>(peers_.size())) return "";
  return peers_[static_cast<size_t>(node)].notice;
}

std::string TcpColumnLink::answer(int node) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (node < 0 || node >= static_cast<int>(peers_.size())) return "";
  return peers_[static_cast<size_t>(node)].answer;
}

// Writes and reads the control connection: notices (the first is kept), questions (answered at once), answers.
// With mutex_ held.
void TcpColumnLink::pump_control(int node) {
  Peer& peer = peers_[static_cast<size_t>(node)];
  bool told = false;
  peer.control.pump([&](uint64_t kind, const std::string& payload) {
    if (kind == kNotice && peer.notice.empty()) {
      peer.notice = payload;
      told = true;
    }
    if (kind == kAnswer) peer.answer = payload;
    if (kind == kQuestion && answerer_) {
      try {
        peer.control.queue(kAnswer, answerer_(payload));
      } catch (...) {  // out of memory describing this machine: the asker hears nothing, as from a busy rank
      }
    }
  });
  if (told && peer.failed && !peer.truncated) describe_failure(node);
}

void TcpColumnLink::ask_peers(const std::string& question) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int n = 0; n < static_cast<int>(peers_.size()); ++n) {
    if (n == node_) continue;
    peers_[static_cast<size_t>(n)].control.queue(kQuestion, question);
    pump_control(n);
  }
}

void TcpColumnLink::tell_peers(const std::string& words, double flush_s) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (int n = 0; n < static_cast<int>(peers_.size()); ++n)
    if (n != node_) peers_[static_cast<size_t>(n)].control.queue(kNotice, words.substr(0, kMaxNotice));
  // A peer that stopped reading must not hold this rank back for long.
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(flush_s));
  for (;;) {
    bool pending = false;
    for (int n = 0; n < static_cast<int>(peers_.size()); ++n) {
      if (n == node_) continue;
      pump_control(n);
      pending |= peers_[static_cast<size_t>(n)].control.pending();
    }
    if (!pending || Clock::now() >= deadline) return;
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    lock.lock();
  }
}

bool TcpColumnLink::fail_link(int node, const std::string& what, bool truncated) {
  Peer& peer = peers_[static_cast<size_t>(node)];
  if (peer.failed) return false;
  peer.failed = true;
  peer.truncated = truncated;
  peer.failure = what;
  // Its notice travels on the other connection, with no order between the two: it may come a moment after this
  // one closed (a lost segment waits for its retransmission). A peer that ended has its control connection closed
  // by then too, which ends the wait at once.
  if (!truncated) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(250);
    for (pump_control(node); peer.notice.empty() && peer.control.open() && Clock::now() < deadline; pump_control(node))
      peer.control.wait_readable(seconds_left(deadline));
  }
  describe_failure(node);
  failed_ = true;
  return false;
}

// A peer that said why it stops is named with its words, one that closed without them as ended, as a rank that
// stopped on this node is; again when its words come after the failure. With mutex_ held.
void TcpColumnLink::describe_failure(int node) {
  Peer& peer = peers_[static_cast<size_t>(node)];
  const std::string name = node < static_cast<int>(names_.size())
                               ? names_[static_cast<size_t>(node)]
                               : "node " + std::to_string(node) + "'s rank of this column";
  const bool first = !failed_ || error_ == peer.error;
  peer.error = !peer.notice.empty()      ? name + " has stopped: " + peer.notice + " (then: " + peer.failure + ")"
               : peer.failure == kClosed ? name + " has stopped: " + peer.failure
                                         : name + ": " + peer.failure;
  if (first) error_ = peer.error;  // the first, for progress()'s callers
}

// Writes the front frames until the kernel's buffer is full. With mutex_ held.
bool TcpColumnLink::pump_sends(int node) {
  Peer& peer = peers_[static_cast<size_t>(node)];
  if (peer.failed) return false;
  while (!peer.sends.empty()) {
    if (peer.closed)
      return fail_link(node, peer.said_goodbye ? "it finalized its communicator while this rank was sending to it"
                                               : "the connection is closed");
    Pending& p = peer.sends.front();
    iovec parts[2];
    int count = 0;
    if (p.done < sizeof p.header) parts[count++] = {p.header + p.done, sizeof p.header - p.done};
    const size_t payload_done = p.done > sizeof p.header ? p.done - sizeof p.header : 0;
    if (p.bytes > payload_done) parts[count++] = {const_cast<char*>(p.buf) + payload_done, p.bytes - payload_done};
    ssize_t n = 0;
    if (count > 0) {
      msghdr m{};
      m.msg_iov = parts;
      m.msg_iovlen = static_cast<size_t>(count);
      n = sendmsg(peer.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return true;
        if (errno == ECONNRESET || errno == EPIPE) return fail_link(node, kClosed);
        return fail_link(node, "sending failed: " + errno_text(errno) + " (its process ended?)");
      }
    }
    p.done += static_cast<size_t>(n);
    if (p.done < sizeof p.header + p.bytes) return true;
    if (p.request != kNoRequest) requests_[static_cast<size_t>(p.request)].done = true;
    peer.sends.pop_front();
  }
  return true;
}

// Reads data frames while they match posted receives. With mutex_ held.
bool TcpColumnLink::pump_receives(int node) {
  Peer& peer = peers_[static_cast<size_t>(node)];
  if (peer.failed) return false;
  for (;;) {
    if (peer.closed) {
      if (peer.said_goodbye && peer.receives.empty()) return true;
      return fail_link(node, peer.said_goodbye ? "it finalized its communicator while this rank expected a message "
                                                 "from it"
                                               : "the connection is closed");
    }
    char* into = nullptr;
    size_t want = 0;
    bool into_receive = false;
    if (peer.header_got < sizeof peer.header) {
      into = reinterpret_cast<char*>(peer.header) + peer.header_got;
      want = sizeof peer.header - peer.header_got;
    } else {
      if (peer.receives.empty() && !peer.hung_up) {
        // The frame waits in the kernel's buffer for its receive, unless the peer has hung up: then nothing it
        // sent can complete a collective any more, and what follows (its notice, the close) is what matters.
        pollfd pfd{peer.fd, POLLRDHUP, 0};
        if (poll(&pfd, 1, 0) <= 0 || (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0) return true;
        peer.hung_up = true;
      }
      // After a hang-up, a frame nobody has asked for yet is read into memory of its own, to be matched when its
      // receive comes (its sender may have completed its part of the collective and gone).
      if (peer.buffering || (peer.hung_up && peer.receives.empty())) {
        if (!peer.buffering) peer.scratch.assign(peer.length, 0);
        peer.buffering = true;
        into = peer.scratch.data() + peer.payload_got;
        want = peer.length - peer.payload_got;
      } else {
        into_receive = true;
      }
    }
    if (into_receive) {
      const Posted& r = peer.receives.front();
      if (peer.length > r.capacity)
        return fail_link(node,
                         "it sent a message of " + std::to_string(peer.length) +
                             " bytes where this rank expected at "
                             "most " +
                             std::to_string(r.capacity),
                         true);
      into = r.buf + peer.payload_got;
      want = peer.length - peer.payload_got;
    }
    if (want > 0) {
      const ssize_t n = ::recv(peer.fd, into, want, MSG_DONTWAIT);
      if (n == 0) {
        peer.closed = true;
        // After its goodbye (it finalized) only what was still expected from it fails.
        if (peer.said_goodbye && peer.receives.empty() && peer.header_got == 0) return true;
        return fail_link(node, peer.said_goodbye ? "it finalized its communicator while this rank expected a message "
                                                   "from it"
                                                 : kClosed);
      }
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return true;
        peer.closed = true;
        if (errno == ECONNRESET) return fail_link(node, kClosed);
        return fail_link(node, "receiving failed: " + errno_text(errno) + " (its process ended?)");
      }
      if (peer.header_got < sizeof peer.header) {
        peer.header_got += static_cast<size_t>(n);
        if (peer.header_got < sizeof peer.header) continue;
        peer.length = get64(peer.header);
        peer.kind = get64(peer.header + 8);
        peer.payload_got = 0;
        if (peer.kind == kGoodbye && peer.length == 0) {
          peer.said_goodbye = true;
          peer.header_got = 0;
          continue;
        }
        if (peer.kind != kData)
          return fail_link(node, "it sent a frame this link does not know (kind " + std::to_string(peer.kind) + ")");
        continue;
      }
      peer.payload_got += static_cast<size_t>(n);
      if (peer.payload_got < peer.length) continue;
    } else if (peer.header_got < sizeof peer.header) {
      continue;
    }
    // A whole frame.
    peer.header_got = 0;
    peer.payload_got = 0;
    if (peer.buffering) {
      peer.early.push_back(std::move(peer.scratch));
      peer.scratch.clear();
      peer.buffering = false;
      match_early(node);
      continue;
    }
    const Posted r = peer.receives.front();
    peer.receives.pop_front();
    State& s = requests_[static_cast<size_t>(r.request)];
    s.done = true;
    s.received = peer.length;
  }
}

}  // namespace zero
