#include "grads/accumulator.hpp"

#include <algorithm>

#include "memory/ops.hpp"
#include "util/error.hpp"

namespace zero {

UnitAccumulator::UnitAccumulator(GradientView grads, const std::vector<ShardSegment>& norm_segments, size_t norm_begin,
                                 bool sums_squares, DType comm_dtype)
    : grads_(grads),
      norm_segments_(&norm_segments),
      norm_begin_(norm_begin),
      sums_squares_(sums_squares),
      comm_dtype_(comm_dtype) {
  if (sums_squares_) segment_squares_.assign(norm_segments.size(), 0.0);
}

// The shard is walked in the order of its norm segments (params, ascending offsets): the gaps between them
// (alignment, padding) are accumulated only, each segment block by block (kSumBlockElems from its start, the norm
// pass's blocks) and each block's squares summed right after it is written, from cache. The accumulation itself is
// element-wise, so cutting it into pieces changes no bit.
TransferQueue::Ticket UnitAccumulator::accumulate(const char* reduced, MemorySpace reduced_space,
                                                  bool last_micro_step) {
  if (host_addressable(reduced_space) != host_addressable(grads_.space)) {
    // ZeRO-Offload: the reduced block crosses to host memory beside the device's work, and is added there once it
    // has arrived (in the order the blocks were staged: the same adds as without offload).
    if (grads_.elems == 0) return 0;
    if (offload_ == nullptr)
      fail(ZERO_ERR_INTERNAL, "a device's reduced block for host accumulators without ZeRO-Offload");
    return offload_->stage_gradients(
        reduced, grads_.elems * dtype_size(comm_dtype_),
        [this, last_micro_step](const char* host) { accumulate(host, MemorySpace::kHost, last_micro_step); },
        "the reduced gradients of unit " + std::to_string(unit_) + " to the host");
  }
  const DType accum = grads_.dtype;
  const ElementOps& ops = element_ops(grads_.space);
  const auto add = written_ ? ops.accumulate : ops.accumulate_into_zero;
  char* acc = grads_.at(0);
  written_ = true;
  squares_final_ = false;
  if (!sums_squares_ || !last_micro_step) {
    add(acc, accum, reduced, comm_dtype_, grads_.elems);
    return 0;
  }
  const size_t acc_size = dtype_size(accum), red_size = dtype_size(comm_dtype_);
  auto run = [&](size_t begin, size_t end) {
    if (end > begin) add(acc + begin * acc_size, accum, reduced + begin * red_size, comm_dtype_, end - begin);
  };
  const SumSquaresKernel squares = kernels(grads_.space, active_isa()).sum_squares[static_cast<int>(accum)];
  size_t pos = 0;
  for (size_t i = 0; i < norm_segments_->size(); ++i) {
    const ShardSegment& s = (*norm_segments_)[i];
    run(pos, s.shard_offset);
    double sum = 0.0;  // block order from zero, as parallel_sum_squares adds them
    for (size_t begin = 0; begin < s.numel; begin += kSumBlockElems) {
      const size_t n = std::min(kSumBlockElems, s.numel - begin), at = s.shard_offset + begin;
      run(at, at + n);
      sum += squares(acc + at * acc_size, n);
    }
    segment_squares_[i] = sum;
    pos = s.shard_offset + s.numel;
  }
  run(pos, grads_.elems);
  squares_final_ = true;
  return 0;
}

// Widening in place runs back to front (a wider element overwrites the narrower ones after it), so the range is
// cut into pieces — the gaps around the norm's segments, each segment's blocks — converted last piece first; each
// block's squares are summed right after it is widened, from cache, and the blocks' sums added front to back.
void UnitAccumulator::widen(size_t begin, size_t n, std::vector<double>& block_scratch) {
  const DType accum = grads_.dtype;
  const ElementOps& ops = element_ops(grads_.space);
  char* g = grads_.at(0);
  const size_t acc_size = dtype_size(accum), red_size = dtype_size(comm_dtype_);
  // Elements [a, b) of the unit: from the reduced buffer's layout (element e at byte e x the communication dtype's
  // size) into the accumulation dtype's (at byte e x its size: the same byte or after, never before).
  auto widen_range = [&](size_t a, size_t b) {
    if (b > a) ops.convert(g + a * acc_size, accum, g + a * red_size, comm_dtype_, b - a);
  };
  squares_final_ = false;
  if (!sums_squares_) return widen_range(begin, begin + n);
  const SumSquaresKernel squares = kernels(grads_.space, active_isa()).sum_squares[static_cast<int>(accum)];
  const std::vector<ShardSegment>& segments = *norm_segments_;
  size_t first_block = 0;
  for (const ShardSegment& s : segments) first_block += sum_squares_blocks(s.numel);
  size_t end = begin + n;  // what is still narrow: [begin, end)
  for (size_t i = segments.size(); i-- > 0;) {
    const ShardSegment& s = segments[i];
    const size_t from = norm_begin_ + s.shard_offset, blocks = sum_squares_blocks(s.numel);
    first_block -= blocks;
    widen_range(from + s.numel, end);
    for (size_t b = blocks; b-- > 0;) {
      const size_t a = from + b * kSumBlockElems, len = std::min(kSumBlockElems, s.numel - b * kSumBlockElems);
      widen_range(a, a + len);
      block_scratch[first_block + b] = squares(g + a * acc_size, len);
    }
    end = from;
  }
  widen_range(begin, end);
  size_t at = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    double sum = 0.0;  // block order from zero, as parallel_sum_squares adds them
    for (size_t b = 0; b < sum_squares_blocks(segments[i].numel); ++b) sum += block_scratch[at++];
    segment_squares_[i] = sum;
  }
  squares_final_ = true;
}

}  // namespace zero
