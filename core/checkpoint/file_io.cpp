#include "checkpoint/file_io.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

// xxHash from its header alone (static inline functions): libzero needs no libxxhash at run time.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "util/error.hpp"

namespace zero {
namespace ckpt {
namespace {

[[noreturn]] void io_fail(const std::string& what, const std::string& path, int err) {
  fail(ZERO_ERR_IO, what + " '" + path + "': " + std::strerror(err));
}

}  // namespace

FileWriter::FileWriter(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) io_fail("cannot create", path, errno);
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  hash_state_ = st;
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
  XXH64_freeState(static_cast<XXH64_state_t*>(hash_state_));
}

void FileWriter::write(const void* data, size_t n_bytes) {
  XXH64_update(static_cast<XXH64_state_t*>(hash_state_), data, n_bytes);
  const char* p = static_cast<const char*>(data);
  size_t left = n_bytes;
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      io_fail("cannot write", path_, errno);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  bytes_ += n_bytes;
}

void FileWriter::close_and_sync() {
  if (::fsync(fd_) != 0) io_fail("cannot fsync", path_, errno);
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) io_fail("cannot close", path_, errno);
}

uint64_t FileWriter::xxh64() const { return XXH64_digest(static_cast<XXH64_state_t*>(hash_state_)); }

void read_at(int fd, uint64_t offset, void* out, size_t n_bytes, const std::string& path) {
  char* p = static_cast<char*>(out);
  while (n_bytes > 0) {
    ssize_t n = ::pread(fd, p, n_bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      io_fail("cannot read", path, errno);
    }
    if (n == 0) fail(ZERO_ERR_CHECKPOINT_CORRUPT, "checkpoint file '" + path + "' is shorter than its header says");
    p += n;
    offset += static_cast<uint64_t>(n);
    n_bytes -= static_cast<size_t>(n);
  }
}

FileDigest digest_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_fail("cannot open", path, errno);
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  std::vector<char> buffer(size_t{4} << 20);
  FileDigest d;
  for (;;) {
    ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      XXH64_freeState(st);
      io_fail("cannot read", path, err);
    }
    if (n == 0) break;
    XXH64_update(st, buffer.data(), static_cast<size_t>(n));
    d.bytes += static_cast<uint64_t>(n);
  }
  d.xxh64 = XXH64_digest(st);
  XXH64_freeState(st);
  ::close(fd);
  return d;
}

std::string read_text_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_fail("cannot open", path, errno);
  std::string text;
  char buffer[65536];
  for (;;) {
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      io_fail("cannot read", path, err);
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

void fsync_directory(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_fail("cannot open directory", path, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) io_fail("cannot fsync directory", path, err);
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) io_fail("cannot rename '" + from + "' to", to, errno);
}

void write_text_file_atomically(const std::string& path, const std::string& text) {
  // A name of our own: two jobs saving into one directory must not share the temporary file.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    FileWriter w(tmp);
    w.write(text.data(), text.size());
    w.close_and_sync();
    rename_path(tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());  // a full disk must not leave the temporary file behind
    throw;
  }
  const size_t slash = path.find_last_of('/');
  fsync_directory(slash == std::string::npos ? "." : path.substr(0, slash));
}

void make_directories(const std::string& path) {
  std::string partial;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    partial = path.substr(0, slash);
    start = slash + 1;
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) io_fail("cannot create directory", partial, errno);
  }
}

void remove_tree(const std::string& path) {
  // Never follow a symbolic link: removing a checkpoint's temporary directory must not remove what a link inside
  // it (or the directory itself, if it is one) points to.
  // O_NOFOLLOW | O_DIRECTORY opens a real directory only, in one step (no check-then-use race).
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOTDIR || errno == ELOOP) ::unlink(path.c_str());  // a file, or a link: remove the entry itself
    return;
  }
  DIR* dir = ::fdopendir(fd);
  if (dir == nullptr) {
    ::close(fd);
    return;
  }
  while (dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    remove_tree(path + "/" + name);
  }
  ::closedir(dir);
  ::rmdir(path.c_str());
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string hex64(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = digits[v & 15];
  return s;
}

}  // namespace ckpt
}  // namespace zero
