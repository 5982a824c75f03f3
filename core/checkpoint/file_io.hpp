// POSIX file helpers for checkpoints: every failure is a zero::Error (ZERO_ERR_IO) naming the path and errno's text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace zero {
namespace ckpt {

// A file written front to back and made durable with close_and_sync(), hashing (XXH64) what it writes.
class FileWriter {
 public:
  explicit FileWriter(const std::string& path);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t n_bytes);
  // fsync and close; returns nothing but throws on failure.
  void close_and_sync();
  uint64_t bytes_written() const { return bytes_; }
  uint64_t xxh64() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
  void* hash_state_ = nullptr;  // XXH64_state_t
};

// Reads `n_bytes` at `offset` of an open file (pread, looping over short reads); throws on failure or EOF.
void read_at(int fd, uint64_t offset, void* out, size_t n_bytes, const std::string& path);

// The size and XXH64 of a whole file, streamed through a fixed buffer. Throws ZERO_ERR_IO if unreadable.
struct FileDigest {
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};
FileDigest digest_file(const std::string& path);

std::string read_text_file(const std::string& path);
// Writes `text` to `path` through a temporary file renamed into place, with fsync of the file and directory.
void write_text_file_atomically(const std::string& path, const std::string& text);
void make_directories(const std::string& path);
void remove_tree(const std::string& path);
void fsync_directory(const std::string& path);
void rename_path(const std::string& from, const std::string& to);
bool path_exists(const std::string& path);
std::string hex64(uint64_t v);

}  // namespace ckpt
}  // namespace zero
