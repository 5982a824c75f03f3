#include "comm/tcp_frames.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace zero {
namespace {

constexpr size_t kHeader = 16;  // the payload's length, the kind

uint64_t get64(const char* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace

FrameConnection& FrameConnection::operator=(FrameConnection&& other) noexcept {
  if (this != &other) {
    close(true);
    fd_ = std::exchange(other.fd_, -1);
    closed_ = std::exchange(other.closed_, false);
    sends_ = std::move(other.sends_);
    sent_ = std::exchange(other.sent_, 0);
    in_ = std::move(other.in_);
  }
  return *this;
}

void FrameConnection::queue(uint64_t kind, const std::string& payload) {
  if (!open()) return;
  const uint64_t length = payload.size() < kMaxPayload ? payload.size() : kMaxPayload;
  std::string frame(kHeader, '\0');
  std::memcpy(&frame[0], &length, 8);
  std::memcpy(&frame[8], &kind, 8);
  frame.append(payload, 0, length);
  sends_.push_back(std::move(frame));
}

void FrameConnection::pump(const std::function<void(uint64_t kind, const std::string& payload)>& on_frame) {
  for (bool again = true; open() && again;) {
    while (!sends_.empty()) {
      const std::string& front = sends_.front();
      const ssize_t n = ::send(fd_, front.data() + sent_, front.size() - sent_, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) closed_ = true;
        break;
      }
      sent_ += static_cast<size_t>(n);
      if (sent_ < front.size()) break;
      sends_.pop_front();
      sent_ = 0;
    }
    // At most a few frames' worth per call: a peer that keeps sending does not keep the caller here.
    char buf[16 << 10];
    for (size_t read = 0; read < 4 * kMaxPayload;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        in_.append(buf, static_cast<size_t>(n));
        read += static_cast<size_t>(n);
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) closed_ = true;
      break;
    }
    // Whole frames, in order; an answer they call for is written in the next round.
    const size_t queued = sends_.size();
    size_t at = 0;
    while (in_.size() - at >= kHeader) {
      const uint64_t length = get64(in_.data() + at);
      if (length > kMaxPayload) {
        closed_ = true;
        break;
      }
      if (in_.size() - at < kHeader + length) break;
      on_frame(get64(in_.data() + at + 8), in_.substr(at + kHeader, length));
      at += kHeader + length;
    }
    in_.erase(0, at);
    again = sends_.size() > queued;
  }
}

void FrameConnection::wait_readable(double seconds) const {
  if (!open()) return;
  pollfd pfd{fd_, POLLIN, 0};
  poll(&pfd, 1, static_cast<int>(seconds * 1000));
}

void FrameConnection::close(bool graceful) {
  if (fd_ < 0) return;
  if (graceful && sends_.empty()) {
    const linger keep{0, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &keep, sizeof keep);
  }
  ::close(fd_);
  fd_ = -1;
  closed_ = true;
}

}  // namespace zero
