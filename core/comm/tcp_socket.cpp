#include "comm/tcp_socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "util/error.hpp"

namespace zero {
namespace tcp {

std::string errno_text(int e) { return std::strerror(e); }

double seconds_left(Clock::time_point deadline) {
  return std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count());
}

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

// No delay for the small frames; and a close by the kernel (a rank killed, or ended without destroying its
// communicator) resets the connection at once, dropping what it had not sent: otherwise its end would wait behind
// that data, which a peer that has not asked for it yet never reads, until the peer's timeout.
void set_options(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const linger reset{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
}

namespace {

// Splits "host:port" (an IPv6 host in brackets).
bool split_address(const std::string& address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  return !host->empty();
}

}  // namespace

// Blocking I/O of exactly `bytes` on a nonblocking socket, until the deadline. False on EOF, error or timeout.
bool write_all(int fd, const void* buf, size_t bytes, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(buf);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    pollfd pfd{fd, POLLOUT, 0};
    if (seconds_left(deadline) <= 0 || poll(&pfd, 1, 10) < 0) return false;
  }
  return true;
}
bool read_all(int fd, void* buf, size_t bytes, Clock::time_point deadline) {
  char* p = static_cast<char*>(buf);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
    pollfd pfd{fd, POLLIN, 0};
    if (seconds_left(deadline) <= 0 || poll(&pfd, 1, 10) < 0) return false;
  }
  return true;
}

// A nonblocking connection to `address`, retried until the deadline (the peer's listener exists before the
// bootstrap hands out its address, but a refused or lost attempt is retried all the same). -1 and *why on failure.
int dial(const std::string& address, Clock::time_point deadline, std::string* why) {
  std::string host, port;
  if (!split_address(address, &host, &port)) {
    *why = "\"" + address + "\" is not host:port";
    return -1;
  }
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
    if (rc != 0) {
      *why = "cannot resolve " + address + ": " + gai_strerror(rc);
    } else {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        // Nonblocking, so that a host that drops the attempt silently costs the time left, not the kernel's
        // minutes of retries.
        const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) continue;
        int err = connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
        if (err == EINPROGRESS) {
          pollfd pfd{fd, POLLOUT, 0};
          const int ready = poll(&pfd, 1, static_cast<int>(std::min(seconds_left(deadline), 5.0) * 1000) + 1);
          socklen_t len = sizeof err;
          err = ready <= 0 ? ETIMEDOUT : getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 ? err : errno;
        }
        if (err == 0) {
          freeaddrinfo(found);
          set_options(fd);
          return fd;
        }
        *why = "cannot connect to " + address + ": " + errno_text(err);
        close(fd);
      }
      freeaddrinfo(found);
    }
    if (seconds_left(deadline) <= 0) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace tcp

using tcp::errno_text;
using tcp::set_nonblocking;

TcpListener::TcpListener(const std::string& bound_host) {
  // An IPv6 address may come in brackets, as in an address to dial.
  const bool bracketed = bound_host.size() >= 2 && bound_host.front() == '[' && bound_host.back() == ']';
  const std::string host = bracketed ? bound_host.substr(1, bound_host.size() - 2) : bound_host;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const bool any = host.empty() || host == "0.0.0.0" || host == "::";
  const int rc = getaddrinfo(any ? (host == "::" ? "::" : nullptr) : host.c_str(), "0", &hints, &found);
  if (rc != 0) fail(ZERO_ERR_COMM, "cannot resolve \"" + host + "\" to listen on: " + gai_strerror(rc));
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      fd_ = fd;
    } else {
      why = errno_text(errno);
      close(fd);
    }
  }
  freeaddrinfo(found);
  if (fd_ < 0) fail(ZERO_ERR_COMM, "cannot listen on \"" + host + "\": " + why);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  const int port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                               : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  // Bound to every interface: the peers dial this machine's name (a cluster's nodes resolve each other's); the
  // bootstrap passes an address instead where they do not.
  std::string advertised = host;
  if (any) {
    char name[256] = {};
    if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') {
      close(fd_);
      fail(ZERO_ERR_COMM, "listening on every interface, but this machine has no name to give the peers");
    }
    advertised = name;
  }
  const bool v6 = advertised.find(':') != std::string::npos;
  address_ = (v6 ? "[" + advertised + "]" : advertised) + ":" + std::to_string(port);
  set_nonblocking(fd_);
}

TcpListener::~TcpListener() {
  if (fd_ >= 0) close(fd_);
}

}  // namespace zero
