// One unit's gradient accumulator as the reductions write it: the reduced shard (stages 2-3, from the buckets) or
// the full buffer reduced in place (stages 0-1, in zero_step). It owns what depends on the window: whether a
// reduction wrote it yet (the window's first reduction writes, later ones add: the optimizer pass need not clear
// it), and the norm's squares summed as the window's last values are written (the "norm inside the reduction",
// params/norm_plan.hpp), in the norm pass's blocks, order and bits.
#pragma once

#include <cstddef>
#include <vector>

#include "cpu_offload/offload_pipeline.hpp"
#include "kernels/kernels.hpp"
#include "numeric/dtype.hpp"
#include "params/param_store.hpp"

namespace zero {

class UnitAccumulator {
 public:
  UnitAccumulator(GradientView grads, const std::vector<ShardSegment>& norm_segments, size_t norm_begin,
                  bool sums_squares, DType comm_dtype);

  // Adds a reduced block (this rank's shard, in the communication dtype) into the accumulator — or, the first time
  // in the window, writes it (0 + x: the bits an add into zeros gives, without reading). With `last_micro_step`
  // (and the unit's norm summed in the reduction), also sums the squares of the result.
  // `reduced` is in `reduced_space` (a bucket's). ZeRO-Offload accumulates a device's reductions in host memory:
  // the block is staged through `offload` (set_offload) and added once it has arrived; the returned ticket is the
  // copy that reads `reduced` (0 when nothing is on its way): offload->reuse_after(ticket) before it is rewritten.
  TransferQueue::Ticket accumulate(const char* reduced, MemorySpace reduced_space, bool last_micro_step);
  void set_offload(OffloadPipeline* offload, int unit) { offload_ = offload, unit_ = unit; }
  OffloadPipeline* offload() const { return offload_; }
  // Widens elements [begin, begin + n) of the full buffer in place, from the communication dtype into the
  // accumulation dtype's place, summing the norm's squares where the unit's norm is summed here.
  void widen(size_t begin, size_t n, std::vector<double>& block_scratch);

  // The window's first reduction into the unit has happened.
  bool written() const { return written_; }
  // The sums of the norm's segments over the accumulator's final values, when a pass above computed them (null
  // otherwise: the stepper reads the gradients).
  const double* folded_squares() const { return squares_final_ ? segment_squares_.data() : nullptr; }
  // A new window (after zero_step or a checkpoint's load): nothing written, nothing summed.
  void start_window() { written_ = squares_final_ = false; }

 private:
  GradientView grads_;
  const std::vector<ShardSegment>* norm_segments_;
  size_t norm_begin_;
  bool sums_squares_;
  DType comm_dtype_;
  bool written_ = false;
  bool squares_final_ = false;
  std::vector<double> segment_squares_;  // per norm segment
  OffloadPipeline* offload_ = nullptr;   // ZeRO-Offload's, for a device's reduced blocks
  int unit_ = -1;
};

}  // namespace zero
