// Where a reduce-scatter's sum goes as it is made: a backend that sums this rank's block piece by piece (the shared
// window's single-copy path) hands each piece to the collective's sink instead of leaving it only in the buffer, so
// that the engine's accumulator takes it while it is in cache — or hands the piece's sources, in rank order, for the
// sink to sum itself straight into its accumulator, the buffer's block then never written. Pieces come in ascending
// order, each element once; a backend that cannot ignores the sink, and whatever a sink was not handed it takes from
// the buffer after the wait. A sink is armed while its reduction runs: the engine disarms it when the reduction ends
// or is given up, after which the backend's calls do nothing and it sums the pieces still to come into the buffer as
// without a sink (a given-up reduction's buffer, part of it summed and part not, is never read again).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

namespace zero {

class ReducedSink {
 public:
  virtual ~ReducedSink() = default;

  // Elements [offset, offset + count) of this rank's block, summed, in the collective's dtype.
  void take(const void* piece, size_t offset, size_t count) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    if (armed_) consume(piece, offset, count);
  }
  // The same elements' `n` sources in rank order (`dtype`: zero.h's): true when the sink summed them itself (as
  // sum_in_rank_order would, the same bits) and the backend must store nothing; false when the backend sums them
  // into the buffer as usual (and then hands the sum to take()).
  bool take_sources(const void* const* sources, int n, int32_t dtype, size_t offset, size_t count) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return armed_ && consume_sources(sources, n, dtype, offset, count);
  }

  void arm() {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = true;
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = false;
  }

 protected:
  virtual void consume(const void* piece, size_t offset, size_t count) noexcept = 0;
  virtual bool consume_sources(const void* const* sources, int n, int32_t dtype, size_t offset, size_t count) noexcept {
    (void)sources, (void)n, (void)dtype, (void)offset, (void)count;
    return false;
  }

 private:
  std::mutex mutex_;
  bool armed_ = false;
};

}  // namespace zero
