// The sockets under the TCP column link (tcp_link.hpp): a listening socket, dialling a peer, and blocking I/O
// with a deadline on nonblocking sockets (what setting the link up needs; the link's own traffic never blocks).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace zero {

// A listening TCP socket on `host` (an address or a name to bind to; "" or "0.0.0.0": every interface, advertised
// under the machine's name) and a port the kernel chooses. address() is "host:port" as the peers should dial it.
// Throws zero::Error.
class TcpListener {
 public:
  explicit TcpListener(const std::string& host);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;
  const std::string& address() const { return address_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  std::string address_;
};

namespace tcp {

using Clock = std::chrono::steady_clock;

double seconds_left(Clock::time_point deadline);
std::string errno_text(int e);
void set_nonblocking(int fd);
// No delay for small frames, and a reset rather than a lingering close when the kernel closes the socket.
void set_options(int fd);
// A nonblocking connection to "host:port" (an IPv6 host in brackets), retried until the deadline. -1 and *why on
// failure.
int dial(const std::string& address, Clock::time_point deadline, std::string* why);
// Exactly `bytes`, until the deadline. False on end of stream, error or timeout.
bool write_all(int fd, const void* buf, size_t bytes, Clock::time_point deadline);
bool read_all(int fd, void* buf, size_t bytes, Clock::time_point deadline);

}  // namespace tcp
}  // namespace zero
