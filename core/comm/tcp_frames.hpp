// A nonblocking TCP connection that carries small whole frames (a kind and a payload) both ways: the column link's
// control connection (tcp_link.hpp), beside its data connection, so that a notice, a question or an answer never
// waits behind data in one stream (data the peer has not asked for yet stays in the kernel's buffers until it does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>

namespace zero {

class FrameConnection {
 public:
  static constexpr size_t kMaxPayload = size_t{64} << 10;

  FrameConnection() = default;
  explicit FrameConnection(int fd) : fd_(fd) {}
  ~FrameConnection() { close(true); }
  FrameConnection(const FrameConnection&) = delete;
  FrameConnection& operator=(const FrameConnection&) = delete;
  FrameConnection(FrameConnection&& other) noexcept { *this = std::move(other); }
  FrameConnection& operator=(FrameConnection&& other) noexcept;

  bool open() const { return fd_ >= 0 && !closed_; }
  // Queues a frame; a payload over kMaxPayload is cut there (the link's notices and answers are a few lines);
  // nothing once the connection has closed.
  void queue(uint64_t kind, const std::string& payload);
  // Whether a queued frame is not yet written whole.
  bool pending() const { return open() && !sends_.empty(); }
  // Writes what the kernel takes and reads what has come, handing each whole frame to `on_frame` (which may queue
  // frames). A connection the peer closed or reset, or that broke the framing, turns closed.
  void pump(const std::function<void(uint64_t kind, const std::string& payload)>& on_frame);
  // Waits up to `seconds` for bytes to read (a notice that races a close on the other connection).
  void wait_readable(double seconds) const;
  // Graceful: what was queued and written is delivered; otherwise the connection is reset.
  void close(bool graceful);

 private:
  int fd_ = -1;
  bool closed_ = false;
  std::deque<std::string> sends_;  // whole frames
  size_t sent_ = 0;                // bytes of the front one
  std::string in_;                 // bytes read, short of a whole frame
};

}  // namespace zero
