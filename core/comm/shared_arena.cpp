#include "comm/shared_arena.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "util/error.hpp"

namespace zero {
namespace {

constexpr size_t kExtent = size_t{2} << 20;  // the host allocator's alignment for buffers of 2 MiB and more

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

SharedArena::SharedArena(int fd, size_t offset, size_t share_bytes, int rank, int ranks)
    : offset_(offset), share_(share_bytes / kExtent * kExtent), rank_(rank), ranks_(ranks), owner_(getpid()) {
  if (share_ == 0 || ranks < 1 || rank < 0 || rank >= ranks || offset % kExtent != 0)
    fail(ZERO_ERR_INTERNAL, "a shared arena of " + std::to_string(share_bytes) + " bytes per rank at offset " +
                                std::to_string(offset) + " for rank " + std::to_string(rank) + " of " +
                                std::to_string(ranks));
  free_[0] = share_;
  fd_ = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (fd_ < 0) fail(ZERO_ERR_COMM, std::string("duplicating the segment's descriptor: ") + std::strerror(errno));
  // Address space only (nothing is committed until an extent is handed out), placed on a 2 MiB boundary so that
  // every extent is aligned as the host allocator aligns large buffers: a reservation one extent larger, the file
  // mapped over its aligned part.
  const size_t bytes = share_ * static_cast<size_t>(ranks_);
  reserved_bytes_ = bytes + kExtent;
  void* reserved = mmap(nullptr, reserved_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void* base = MAP_FAILED;
  if (reserved != MAP_FAILED) {
    reserved_ = static_cast<char*>(reserved);
    char* aligned = reserved_ + (kExtent - reinterpret_cast<uintptr_t>(reserved_) % kExtent) % kExtent;
    base = mmap(aligned, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd_,
                static_cast<off_t>(offset_));
  }
  if (base == MAP_FAILED) {
    const int err = errno;
    if (reserved_ != nullptr) munmap(reserved_, reserved_bytes_);
    close(fd_);
    fail(ZERO_ERR_OUT_OF_MEMORY, "mapping the node's shared arena (" + std::to_string(ranks_) + " x " +
                                     std::to_string(share_) + " bytes): " + std::strerror(err) +
                                     " (ZERO_SHM_ARENA_BYTES sets each rank's share, 0 turns it off)");
  }
  base_ = static_cast<char*>(base);
}

SharedArena::~SharedArena() {
  // Buffers leaked after a failed collective (a peer may still read them) keep the mapping; so does a process
  // forked from the owner, whose copy of the mapping is its own to drop.
  if (in_use_ == 0 || getpid() != owner_) munmap(reserved_, reserved_bytes_);
  close(fd_);
}

void* SharedArena::allocate(size_t bytes, size_t alignment) {
  const size_t need = round_up(bytes == 0 ? 1 : bytes, kExtent);
  if (alignment <= kExtent && getpid() == owner_) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < need) continue;
      const size_t at = it->first, left = it->second - need;
      const off_t file_at = static_cast<off_t>(offset_ + static_cast<size_t>(rank_) * share_ + at);
      // Commits the pages now: ENOSPC (a full /dev/shm) falls back below instead of a SIGBUS at the first touch.
      if (posix_fallocate(fd_, file_at, static_cast<off_t>(need)) != 0) break;
      free_.erase(it);
      if (left > 0) free_[at + need] = left;
      in_use_ += need;
      return base_ + static_cast<size_t>(rank_) * share_ + at;
    }
  }
  return host_allocator().allocate(bytes, alignment);
}

void SharedArena::deallocate(void* p, size_t bytes) noexcept {
  const uint64_t at = offset_of(p, bytes);
  if (at == kNotShared) return host_allocator().deallocate(p, bytes);
  // A process forked from the owner shares these pages with it: punching them out would zero the owner's buffers.
  if (getpid() != owner_) return;
  const size_t n = round_up(bytes == 0 ? 1 : bytes, kExtent);
  std::lock_guard<std::mutex> lock(mutex_);
  // The memory goes back to /dev/shm; the address range stays this rank's.
  fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
            static_cast<off_t>(offset_ + static_cast<size_t>(rank_) * share_ + at), static_cast<off_t>(n));
  in_use_ -= n;
  size_t start = static_cast<size_t>(at), length = n;
  auto next = free_.lower_bound(start);
  if (next != free_.end() && start + length == next->first) {
    length += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto before = std::prev(next);
    if (before->first + before->second == start) {
      start = before->first;
      length += before->second;
      free_.erase(before);
    }
  }
  free_[start] = length;
}

std::string SharedArena::name() const {
  return "libzero's shared-memory arena (the node's ranks read its buffers in place; libzero's host allocator when "
         "it is full)";
}

size_t SharedArena::shared_bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_use_;
}

}  // namespace zero
