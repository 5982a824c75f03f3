// Direct I/O for NVMe offload: one file per rank and kind, opened with O_DIRECT and pre-allocated, read
// and written in blocks of DeepSpeed's aio.block_size with up to aio.queue_depth requests in flight. Two engines
// behind one interface: io_uring (liburing, when the build found it and the kernel allows it) and positioned
// reads/writes (pread/pwrite) everywhere else, chosen at run time with one log line.
//
// Every transfer is checked to the byte: a failed or short request is ZERO_ERR_IO naming the file, the offset and
// the system's reason. Buffers, offsets and sizes must be multiples of kDirectAlignment (O_DIRECT's rule).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace zero {
namespace io {

// O_DIRECT needs buffers, offsets and lengths aligned to the device's logical block; 4 KiB covers every NVMe
// format in use (512 B and 4 KiB sectors).
constexpr size_t kDirectAlignment = 4096;

// DeepSpeed's "aio" block, with its defaults.
struct AioSettings {
  size_t block_size = 1 << 20;  // bytes per request
  int queue_depth = 8;          // requests in flight
};

// A file for direct I/O, pre-allocated with fallocate so that a full disk fails here, not in the middle of a step.
class DirectFile {
 public:
  // Creates (or truncates) `path` and reserves `bytes` (rounded up to kDirectAlignment). ZERO_ERR_IO on failure,
  // saying which (no space, permissions, a file system without O_DIRECT). With `exclusive`, a file that exists
  // already is an error (EEXIST) instead of being truncated: no state file ever overwrites another's.
  static DirectFile create(const std::string& path, uint64_t bytes, bool exclusive = false);
  // Opens an existing file for reading and writing (no truncation).
  static DirectFile open(const std::string& path);

  DirectFile(DirectFile&& other) noexcept;
  DirectFile& operator=(DirectFile&& other) noexcept;
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;
  ~DirectFile();

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }

 private:
  DirectFile(int fd, std::string path, uint64_t size) : fd_(fd), path_(std::move(path)), size_(size) {}
  int fd_ = -1;
  std::string path_;
  uint64_t size_ = 0;
};

// Memory for direct I/O: aligned to kDirectAlignment, zeroed, owned.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes);
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();
  void* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Moves whole buffers between memory and a DirectFile, split into block_size requests with up to queue_depth in
// flight. read/write return once every byte arrived (or throw ZERO_ERR_IO): the pipelining of a step (read chunk
// i+1 while chunk i is updated) is the caller's, over start/finish.
class IoEngine {
 public:
  virtual ~IoEngine() = default;
  virtual const char* name() const = 0;

  // Starts moving `bytes` at file `offset` (all multiples of kDirectAlignment, `data` aligned too); finish()
  // waits for everything started so far and throws the first failure. One batch in flight at a time.
  virtual void start_read(const DirectFile& file, void* data, size_t bytes, uint64_t offset) = 0;
  virtual void start_write(const DirectFile& file, const void* data, size_t bytes, uint64_t offset) = 0;
  virtual void finish() = 0;
  // Registers memory that most transfers will use (the window an NVMe state streams through), so that io_uring
  // maps it once instead of per request (fixed buffers); transfers inside it use it. Optional: false when the
  // engine has nothing to register or the kernel refuses (transfers then work as before).
  virtual bool register_buffer(void* /*data*/, size_t /*bytes*/) { return false; }

  void read(const DirectFile& file, void* data, size_t bytes, uint64_t offset) {
    start_read(file, data, bytes, offset);
    finish();
  }
  void write(const DirectFile& file, const void* data, size_t bytes, uint64_t offset) {
    start_write(file, data, bytes, offset);
    finish();
  }
};

// Which engine to make: kAuto tries io_uring and falls back (logging why once per process); the environment
// variable ZERO_AIO_ENGINE=posix|io_uring forces one (io_uring then fails with ZERO_ERR_UNSUPPORTED if unusable).
enum class EngineKind { kAuto, kIoUring, kPosix };
std::unique_ptr<IoEngine> make_engine(const AioSettings& settings, EngineKind kind = EngineKind::kAuto);

// Checks the alignment rule and the file's bounds for one transfer (ZERO_ERR_INVALID_ARGUMENT / ZERO_ERR_IO).
void check_transfer(const DirectFile& file, const void* data, size_t bytes, uint64_t offset, const char* what);

}  // namespace io
}  // namespace zero
