#include "nvme/aio.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#ifdef ZERO_HAVE_LIBURING
#include <liburing.h>
#endif

#include "util/error.hpp"
#include "util/log.hpp"

namespace zero {
namespace io {
namespace {

std::string reason(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

[[noreturn]] void io_fail(const std::string& what, const std::string& path, int err) {
  std::string hint;
  if (err == ENOSPC || err == EFBIG || err == EDQUOT)
    hint = "; free space on that file system or point nvme_path elsewhere";
  if (err == EINVAL) hint = "; the file system may not support O_DIRECT (tmpfs before Linux 6.6 does not): use a disk";
  fail(ZERO_ERR_IO, what + " '" + path + "': " + reason(err) + hint);
}

uint64_t round_up(uint64_t v) { return (v + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment; }

// One request of a batch: a piece of at most block_size bytes.
struct Piece {
  bool write;
  int fd;
  char* data;
  size_t bytes;
  uint64_t offset;
  const std::string* path;
};

void split(std::vector<Piece>& out, bool write, const DirectFile& file, char* data, size_t bytes, uint64_t offset,
           size_t block) {
  for (size_t done = 0; done < bytes; done += block) {
    const size_t n = std::min(block, bytes - done);
    out.push_back(Piece{write, file.fd(), data + done, n, offset + done, &file.path()});
  }
}

[[noreturn]] void piece_fail(const Piece& p, long result) {
  if (result < 0)
    io_fail(std::string(p.write ? "writing " : "reading ") + std::to_string(p.bytes) + " bytes at offset " +
                std::to_string(p.offset) + " of",
            *p.path, static_cast<int>(-result));
  fail(ZERO_ERR_IO, std::string(p.write ? "writing" : "reading") + " '" + *p.path + "' at offset " +
                        std::to_string(p.offset) + ": " + std::to_string(result) + " of " + std::to_string(p.bytes) +
                        " bytes moved (the file is shorter than expected: truncated, or deleted and recreated?)");
}

// Positioned reads and writes, one piece at a time: the fallback where io_uring is unavailable.
class PosixEngine final : public IoEngine {
 public:
  explicit PosixEngine(const AioSettings& s) : settings_(s) {}
  const char* name() const override { return "pread/pwrite"; }
  void start_read(const DirectFile& f, void* data, size_t bytes, uint64_t offset) override {
    check_transfer(f, data, bytes, offset, "read");
    split(pending_, false, f, static_cast<char*>(data), bytes, offset, settings_.block_size);
  }
  void start_write(const DirectFile& f, const void* data, size_t bytes, uint64_t offset) override {
    check_transfer(f, data, bytes, offset, "write");
    split(pending_, true, f, const_cast<char*>(static_cast<const char*>(data)), bytes, offset, settings_.block_size);
  }
  void finish() override {
    std::vector<Piece> pieces;
    pieces.swap(pending_);
    for (const Piece& p : pieces) {
      size_t done = 0;
      while (done < p.bytes) {  // a positioned call may move fewer bytes than asked: continue where it stopped
        const ssize_t r = p.write ? ::pwrite(p.fd, p.data + done, p.bytes - done, static_cast<off_t>(p.offset + done))
                                  : ::pread(p.fd, p.data + done, p.bytes - done, static_cast<off_t>(p.offset + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) piece_fail(p, r < 0 ? -errno : static_cast<long>(done));
        done += static_cast<size_t>(r);
      }
    }
  }

 private:
  AioSettings settings_;
  std::vector<Piece> pending_;
};

#ifdef ZERO_HAVE_LIBURING
// io_uring: up to queue_depth pieces in flight; a completion frees a slot for the next piece.
class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(const AioSettings& s) : settings_(s) {
    const int r = io_uring_queue_init(static_cast<unsigned>(s.queue_depth), &ring_, 0);
    if (r < 0) fail(ZERO_ERR_UNSUPPORTED, "io_uring is not usable here: io_uring_queue_init: " + reason(-r));
  }
  ~UringEngine() override {
    try {
      if (!pending_.empty() || in_flight_ > 0) finish();
    } catch (...) {
      // a destructor cannot report: the owner's finish() did (or the engine is being torn down after an error)
    }
    if (registered_ != nullptr) io_uring_unregister_buffers(&ring_);
    io_uring_queue_exit(&ring_);
  }
  const char* name() const override { return "io_uring"; }
  bool register_buffer(void* data, size_t bytes) override {
    if (registered_ != nullptr || bytes == 0) return false;  // one buffer (index 0) per ring
    iovec v{data, bytes};
    if (io_uring_register_buffers(&ring_, &v, 1) != 0) return false;  // e.g. RLIMIT_MEMLOCK: plain transfers
    registered_ = static_cast<char*>(data);
    registered_end_ = registered_ + bytes;
    return true;
  }
  void start_read(const DirectFile& f, void* data, size_t bytes, uint64_t offset) override {
    check_transfer(f, data, bytes, offset, "read");
    split(pending_, false, f, static_cast<char*>(data), bytes, offset, settings_.block_size);
    pump();
  }
  void start_write(const DirectFile& f, const void* data, size_t bytes, uint64_t offset) override {
    check_transfer(f, data, bytes, offset, "write");
    split(pending_, true, f, const_cast<char*>(static_cast<const char*>(data)), bytes, offset, settings_.block_size);
    pump();
  }
  void finish() override {
    while (next_ < pending_.size() || in_flight_ > 0) {
      pump();
      reap(true);
      while (in_flight_ > 0 && reap(false)) {
        // every completion already there, so that the next pump() submits them as one batch (one system call)
      }
    }
    pending_.clear();
    next_ = 0;
    if (!first_error_.empty()) {
      std::string message;
      message.swap(first_error_);
      fail(ZERO_ERR_IO, message);
    }
  }

 private:
  // Submits pieces while slots are free.
  void pump() {
    unsigned queued = 0;
    while (next_ < pending_.size() && in_flight_ + queued < static_cast<size_t>(settings_.queue_depth)) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      Piece& p = pending_[next_];
      const bool fixed = registered_ != nullptr && p.data >= registered_ && p.data + p.bytes <= registered_end_;
      if (p.write && fixed)
        io_uring_prep_write_fixed(sqe, p.fd, p.data, static_cast<unsigned>(p.bytes), p.offset, 0);
      else if (p.write)
        io_uring_prep_write(sqe, p.fd, p.data, static_cast<unsigned>(p.bytes), p.offset);
      else if (fixed)
        io_uring_prep_read_fixed(sqe, p.fd, p.data, static_cast<unsigned>(p.bytes), p.offset, 0);
      else
        io_uring_prep_read(sqe, p.fd, p.data, static_cast<unsigned>(p.bytes), p.offset);
      sqe->user_data = next_;  // the field itself: liburing before 2.2 (Debian 11's 0.7) has no set_data64
      ++next_;
      ++queued;
    }
    if (queued == 0) return;
    int r;
    do r = io_uring_submit(&ring_);
    while (r == -EINTR);
    if (r < 0) fail(ZERO_ERR_IO, "io_uring_submit: " + reason(-r));
    in_flight_ += queued;
  }

  // Takes one completion (waiting for it if `block`; false when there is none and `block` is not set); a short
  // transfer is resubmitted for its remainder.
  bool reap(bool block) {
    io_uring_cqe* cqe = nullptr;
    int r = block ? io_uring_wait_cqe(&ring_, &cqe) : io_uring_peek_cqe(&ring_, &cqe);
    while (r == -EINTR) r = io_uring_wait_cqe(&ring_, &cqe);
    if (r == -EAGAIN) return false;
    if (r < 0) fail(ZERO_ERR_IO, "io_uring_wait_cqe: " + reason(-r));
    const size_t index = static_cast<size_t>(cqe->user_data);
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    --in_flight_;
    Piece& p = pending_[index];
    if (res < 0 || (res == 0 && p.bytes > 0)) {
      if (first_error_.empty()) {
        try {
          piece_fail(p, res);
        } catch (const Error& e) {
          first_error_ = e.what();  // reported by finish(), once every piece in flight is back
        }
      }
      return true;
    }
    if (static_cast<size_t>(res) < p.bytes) {  // continue where the device stopped, as the fallback does
      Piece rest{p.write, p.fd, p.data + res, p.bytes - static_cast<size_t>(res), p.offset + static_cast<uint64_t>(res),
                 p.path};
      pending_.push_back(rest);
    }
    return true;
  }

  AioSettings settings_;
  io_uring ring_{};
  std::vector<Piece> pending_;
  size_t next_ = 0;
  size_t in_flight_ = 0;
  std::string first_error_;
  char* registered_ = nullptr;  // register_buffer's memory (fixed buffer 0), or null
  char* registered_end_ = nullptr;
};
#endif

}  // namespace

void check_transfer(const DirectFile& file, const void* data, size_t bytes, uint64_t offset, const char* what) {
  const auto address = reinterpret_cast<uintptr_t>(data);
  if (address % kDirectAlignment != 0 || bytes % kDirectAlignment != 0 || offset % kDirectAlignment != 0)
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string("direct I/O ") + what + " of '" + file.path() + "': buffer, size (" +
                                        std::to_string(bytes) + ") and offset (" + std::to_string(offset) +
                                        ") must be multiples of " + std::to_string(kDirectAlignment) + " bytes");
  if (offset + bytes > file.size())
    fail(ZERO_ERR_IO, std::string("direct I/O ") + what + " of '" + file.path() + "' past its end: bytes " +
                          std::to_string(offset) + ".." + std::to_string(offset + bytes) + " of a " +
                          std::to_string(file.size()) + "-byte file");
}

DirectFile DirectFile::create(const std::string& path, uint64_t bytes, bool exclusive) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | (exclusive ? O_EXCL : O_TRUNC) | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) io_fail("creating", path, errno);
  const uint64_t size = round_up(bytes);
  if (size > 0) {
    const int r = ::posix_fallocate(fd, 0, static_cast<off_t>(size));  // returns the error; does not set errno
    if (r != 0) {
      ::close(fd);
      ::unlink(path.c_str());
      io_fail("reserving " + std::to_string(size) + " bytes for", path, r);
    }
  }
  return DirectFile(fd, path, size);
}

DirectFile DirectFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (fd < 0) io_fail("opening", path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    io_fail("inspecting", path, err);
  }
  return DirectFile(fd, path, static_cast<uint64_t>(st.st_size));
}

DirectFile::DirectFile(DirectFile&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)), size_(other.size_) {
  other.fd_ = -1;
}

DirectFile& DirectFile::operator=(DirectFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    size_ = other.size_;
    other.fd_ = -1;
  }
  return *this;
}

DirectFile::~DirectFile() {
  if (fd_ >= 0) ::close(fd_);
}

AlignedBuffer::AlignedBuffer(size_t bytes) : bytes_(round_up(bytes)) {
  data_ = std::aligned_alloc(kDirectAlignment, bytes_ ? bytes_ : kDirectAlignment);
  if (data_ == nullptr) throw std::bad_alloc();
  std::memset(data_, 0, bytes_);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

std::unique_ptr<IoEngine> make_engine(const AioSettings& settings, EngineKind kind) {
  if (settings.block_size == 0 || settings.block_size % kDirectAlignment != 0 || settings.queue_depth < 1)
    fail(ZERO_ERR_CONFIG, "aio: block_size must be a positive multiple of " + std::to_string(kDirectAlignment) +
                              " and queue_depth at least 1 (got " + std::to_string(settings.block_size) + " and " +
                              std::to_string(settings.queue_depth) + ")");
  if (const char* forced = std::getenv("ZERO_AIO_ENGINE")) {
    if (std::strcmp(forced, "posix") == 0) kind = EngineKind::kPosix;
    if (std::strcmp(forced, "io_uring") == 0) kind = EngineKind::kIoUring;
  }
  if (kind == EngineKind::kPosix) return std::make_unique<PosixEngine>(settings);
#ifdef ZERO_HAVE_LIBURING
  try {
    return std::make_unique<UringEngine>(settings);
  } catch (const Error& e) {
    if (kind == EngineKind::kIoUring) throw;
    static std::once_flag logged;
    std::call_once(logged, [&] {
      log_message(ZERO_LOG_INFO, -1, std::string(e.what()) + "; NVMe offload uses positioned reads and writes");
    });
  }
#else
  if (kind == EngineKind::kIoUring)
    fail(ZERO_ERR_UNSUPPORTED, "this libzero was built without liburing (Debian: liburing-dev): no io_uring engine");
#endif
  return std::make_unique<PosixEngine>(settings);
}

}  // namespace io
}  // namespace zero
