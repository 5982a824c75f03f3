// Memory every rank of a node maps: each rank's share of the shared-memory communicator's segment (shm_segment.hpp)
// beyond the window's slots. The engine allocates its gradient buckets here when its communicator offers it
// (Communicator::shared_allocator), so that a reduce-scatter's peers read a rank's gradients where it wrote them
// and sum them straight into their own blocks (node_window.hpp), instead of first copying each peer's piece into
// private memory with process_vm_readv: one pass over the peers' data fewer.
//
// The shares are sparse: the object is sized for all of them, and a rank commits memory only for the extents it
// hands out (fallocate, so that a full /dev/shm is an allocation error here, not a SIGBUS in a collective later) and
// gives it back when they are freed (a hole punched). When this rank's share or /dev/shm is full, the allocator
// serves the request from libzero's host allocator instead: the collectives then read that buffer with
// process_vm_readv as before, with the same bits.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "memory/allocator.hpp"

namespace zero {

class SharedArena final : public Allocator {
 public:
  // Maps `ranks` shares of `share_bytes` each, back to back from `offset` of the shared-memory object open as `fd`
  // (duplicated: the arena keeps the mapping and the descriptor for as long as a buffer from it lives). `rank`'s
  // share is this process's to allocate from. Throws zero::Error when the mapping fails.
  SharedArena(int fd, size_t offset, size_t share_bytes, int rank, int ranks);
  ~SharedArena() override;
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  // From this rank's share (extents of 2 MiB on 2 MiB boundaries), else from the host allocator (also in a process
  // forked from the owner).
  void* allocate(size_t bytes, size_t alignment) override;
  void deallocate(void* p, size_t bytes) noexcept override;
  std::string name() const override;

  size_t share_bytes() const { return share_; }
  // Rank r's share, mapped in this process.
  const char* share(int r) const { return base_ + static_cast<size_t>(r) * share_; }
  // Where [p, p + bytes) lies in this rank's share (its offset from the share's start), or kNotShared. Inline: the
  // MPI module compiles the node window without the arena.
  static constexpr uint64_t kNotShared = ~uint64_t{0};
  uint64_t offset_of(const void* p, size_t bytes) const {
    const uintptr_t mine = reinterpret_cast<uintptr_t>(share(rank_)), q = reinterpret_cast<uintptr_t>(p);
    if (q < mine || q >= mine + share_ || bytes > mine + share_ - q) return kNotShared;
    return static_cast<uint64_t>(q - mine);
  }
  // Bytes of this rank's share handed out now (tests, diagnostics).
  size_t shared_bytes_in_use() const;

 private:
  int fd_ = -1;
  size_t offset_ = 0, share_ = 0;
  int rank_ = 0, ranks_ = 0;
  pid_t owner_ = 0;           // the process that allocates; a forked child only reads
  char* reserved_ = nullptr;  // the address space reserved for the shares (base_ is its first 2 MiB boundary)
  size_t reserved_bytes_ = 0;
  char* base_ = nullptr;
  mutable std::mutex mutex_;
  std::map<size_t, size_t> free_;  // this rank's free extents: offset in its share -> bytes
  size_t in_use_ = 0;
};

}  // namespace zero
