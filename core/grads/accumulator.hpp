// One unit's gradient accumulator as the reductions write it: the reduced shard (stages 2-3, from the buckets) or
// the full buffer reduced in place (stages 0-1, in zero_step). It owns what depends on the window: whether a
// reduction wrote it yet (the window's first reduction writes, later ones add: the optimizer pass need not clear
// it), and the norm's squares summed as the window's last values are written (the "norm inside the reduction",
// params/norm_plan.hpp), in the norm pass's blocks, order and bits.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/reduced_sink.hpp"
#include "cpu_offload/offload_pipeline.hpp"
#include "kernels/kernels.hpp"
#include "numeric/dtype.hpp"
#include "params/param_store.hpp"

namespace zero {

class UnitAccumulator;

// One reduction's adds into a unit's accumulator (UnitAccumulator::begin_reduction), taken in ascending pieces: the
// pieces' sources from a backend that hands them (comm/reduced_sink.hpp), summed here straight into the accumulator
// in one pass (reduce_into: the sum, the add, the squares in registers; the reduced block is never written), or the
// pieces as a backend sums them, or, after the wait, whatever the backend did not hand, from the reduced block
// (finish). The norm's squares are summed as each piece is added, with the norm pass's lanes carried across pieces
// (SquaresCarry), each segment in kSumBlockElems blocks from its start. The adds are element-wise, the sum in rank
// order is the backend's, and the carried squares are the whole block's, so the cut into pieces changes no bit.
class AccumulatorPieces final : public ReducedSink {
 public:
  // After the wait: the elements the backend did not hand (a suffix of the block, or all of it), from this rank's
  // reduced block (the one begin_reduction was given).
  void finish();

 private:
  friend class UnitAccumulator;
  void consume(const void* piece, size_t offset, size_t count) noexcept override;
  bool consume_sources(const void* const* sources, int n, int32_t dtype, size_t offset, size_t count) noexcept override;
  void add(const void* piece, size_t count);  // the next `count` elements, in the communication dtype
  template <class Run>
  void walk(size_t begin, size_t end, Run&& run);
  void add_run(const char* values, size_t from, size_t to, bool squared);

  static constexpr size_t kScratchElems = 4096;  // a summed run from sources: 16 KiB of fp32, in L1
  static constexpr int kMaxSources = 256;        // ranks a node's window sums from (more: the backend sums)
  static constexpr size_t kSquareGroup = 16;     // the squares' lanes: reduce_into takes whole groups of them

  UnitAccumulator* unit_ = nullptr;
  void (*add_)(void*, DType, const void*, DType, size_t) = nullptr;
  ConvertKernel stream_ = nullptr;          // non-null: the window's first reduction into a large fp32 accumulator
  ReduceIntoKernel reduce_into_ = nullptr;  // non-null: an fp32 accumulator in host memory, summed from sources
  bool into_zero_ = false;                  // the window's first reduction: written, not added
  bool squares_ = false;                    // the norm is summed in this reduction
  SquaresMoreKernel squares_more_ = nullptr;
  SquaresEndKernel squares_end_ = nullptr;
  SquaresCarry carry_;
  // What the squares read: the accumulator just written, or (streamed from fp32 pieces: the accumulator's lines are
  // not in cache) the piece itself, which holds the same values (0 + x is x but for the sign of a zero, which
  // squaring drops).
  bool squares_of_piece_ = false;
  DType squares_dtype_ = DType::kF32;
  const char* block_ = nullptr;          // the reduced block
  std::vector<char> scratch_;            // kScratchElems of the communication dtype
  size_t taken_ = 0;                     // elements added (a prefix of the block)
  size_t segment_ = 0, norm_block_ = 0;  // the norm's block that elements at taken_ belong to (or precede)
  double segment_sum_ = 0.0;
};

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
  // The same adds, piece by piece (AccumulatorPieces): the window's first reduction writes, later ones add, in the
  // order their reductions begin. Host memory on both sides only (the reduced block's space is `reduced_space`).
  bool takes_pieces(MemorySpace reduced_space) const {
    return host_addressable(reduced_space) && host_addressable(grads_.space);
  }
  // `reduced_block` is where the backend stores this rank's reduced block, unless it hands the pieces' sources to
  // the sink (then the block is never written); `from_sources`: a backend may hand them (a bucket's sink).
  void begin_reduction(AccumulatorPieces& pieces, bool last_micro_step, const char* reduced_block,
                       bool from_sources = false);
  // The window's first reduction into an fp32 accumulator of at least this many bytes writes it with non-temporal
  // stores: it is read again only by the optimizer, after every other bucket has gone through the caches.
  static constexpr size_t kStreamMinBytes = size_t{512} << 10;
  size_t elems() const { return grads_.elems; }
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
  friend class AccumulatorPieces;
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
