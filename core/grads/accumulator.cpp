#include "grads/accumulator.hpp"

#include <algorithm>

#include "comm/rank_order_sum.hpp"
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

// A device's reduced block for host accumulators (ZeRO-Offload) is staged to the host first; otherwise the block is
// added as AccumulatorPieces adds a backend's pieces.
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
  AccumulatorPieces pieces;
  begin_reduction(pieces, last_micro_step, reduced);
  pieces.finish();
  return 0;
}

void UnitAccumulator::begin_reduction(AccumulatorPieces& pieces, bool last_micro_step, const char* reduced_block,
                                      bool from_sources) {
  const ElementOps& ops = element_ops(grads_.space);
  pieces.unit_ = this;
  pieces.block_ = reduced_block;
  pieces.add_ = written_ ? ops.accumulate : ops.accumulate_into_zero;
  pieces.squares_ = sums_squares_ && last_micro_step;
  pieces.stream_ = nullptr;
  pieces.squares_of_piece_ = false;
  pieces.squares_dtype_ = grads_.dtype;
  pieces.into_zero_ = !written_;
  pieces.reduce_into_ = nullptr;
  if (host_addressable(grads_.space)) {  // a device's accumulator is added by the device's own ops, unsquared
    const KernelTable& table = kernels(active_isa());
    if (!written_ && grads_.dtype == DType::kF32 && grads_.elems * 4 >= kStreamMinBytes)
      pieces.stream_ = table.stream_into_zero[static_cast<int>(comm_dtype_)];
    if (grads_.dtype == DType::kF32) pieces.reduce_into_ = table.reduce_into[static_cast<int>(comm_dtype_)];
    // The squares are of the accumulator's values: read from the piece where it holds them (fp32, streamed: the
    // accumulator's lines are not in cache), else from the accumulator just written.
    pieces.squares_of_piece_ = pieces.stream_ != nullptr && comm_dtype_ == DType::kF32;
    pieces.squares_dtype_ = grads_.dtype;
    pieces.squares_more_ = table.squares_more[static_cast<int>(pieces.squares_dtype_)];
    pieces.squares_end_ = table.squares_end[static_cast<int>(pieces.squares_dtype_)];
  } else if (pieces.squares_) {
    fail(ZERO_ERR_INTERNAL, "the norm's squares of a device's accumulator summed on the host");
  }
  pieces.carry_ = SquaresCarry();
  if (from_sources) pieces.scratch_.resize(AccumulatorPieces::kScratchElems * dtype_size(comm_dtype_));
  pieces.taken_ = pieces.segment_ = pieces.norm_block_ = 0;
  pieces.segment_sum_ = 0.0;
  pieces.arm();
  written_ = true;
  squares_final_ = false;
}

void AccumulatorPieces::consume(const void* piece, size_t offset, size_t count) noexcept {
  // Out of order or past the end (not from a backend that keeps the contract): finish() adds from the block.
  if (offset == taken_ && count <= unit_->grads_.elems - taken_) add(piece, count);
}

// Walks [begin, end) of the shard (consecutive calls, consecutive ranges) in the norm's pieces: run(from, to,
// squared) for each run within one of the norm's blocks (squared: its squares go into carry_, in order) or outside
// the segments (only added); each block is closed (squares_end, block order from zero, as parallel_sum_squares adds
// them) when it completes, and each segment's sum when its last block does. Without squares, one run.
template <class Run>
void AccumulatorPieces::walk(size_t begin, size_t end, Run&& run) {
  if (!squares_) {
    if (end > begin) run(begin, end, false);
    return;
  }
  UnitAccumulator& u = *unit_;
  const std::vector<ShardSegment>& segments = *u.norm_segments_;
  size_t at = begin;
  while (segment_ < segments.size()) {
    const ShardSegment& s = segments[segment_];
    if (norm_block_ * kSumBlockElems >= s.numel) {
      u.segment_squares_[segment_] = segment_sum_;
      segment_sum_ = 0.0;
      ++segment_, norm_block_ = 0;
      continue;
    }
    if (at >= end) return;
    const size_t block_begin = s.shard_offset + norm_block_ * kSumBlockElems;
    const size_t block_end = s.shard_offset + std::min(s.numel, (norm_block_ + 1) * kSumBlockElems);
    if (at < block_begin) {  // between segments
      const size_t to = std::min(end, block_begin);
      run(at, to, false);
      at = to;
      if (at >= end) return;
    }
    const size_t to = std::min(end, block_end);
    run(at, to, true);
    at = to;
    if (to < block_end) return;  // the block goes on in a later piece
    segment_sum_ += squares_end_(carry_);
    ++norm_block_;
  }
  if (at < end) run(at, end, false);  // after the last segment
}

// Elements [from, to) of the shard from `values` (theirs, in the communication dtype): added (or written), and
// squared into carry_ where `squared`.
void AccumulatorPieces::add_run(const char* values, size_t from, size_t to, bool squared) {
  UnitAccumulator& u = *unit_;
  // Streamed lines leave the cache: squares read from the accumulator (16-bit pieces) want them stored.
  if (stream_ != nullptr && (!squared || squares_of_piece_))
    stream_(u.grads_.at(from), values, to - from);
  else
    add_(u.grads_.at(from), u.grads_.dtype, values, u.comm_dtype_, to - from);
  if (squared) squares_more_(carry_, squares_of_piece_ ? values : u.grads_.at(from), to - from);
}

bool AccumulatorPieces::consume_sources(const void* const* sources, int n, int32_t dtype, size_t offset,
                                        size_t count) noexcept {
  UnitAccumulator& u = *unit_;
  if (scratch_.empty() || offset != taken_ || count > u.grads_.elems - taken_ ||
      dtype != static_cast<int32_t>(elem_type(u.comm_dtype_)) || n < 1 || n > kMaxSources)
    return false;
  const size_t esize = dtype_size(u.comm_dtype_);
  const void* at[kMaxSources];
  auto sources_at = [&](size_t element) {
    for (int r = 0; r < n; ++r) at[r] = static_cast<const char*>(sources[r]) + (element - offset) * esize;
    return at;
  };
  walk(offset, offset + count, [&](size_t from, size_t to, bool squared) {
    // Whole groups of the squares' lanes in one pass from the sources (the accumulator aligned where it is
    // streamed; a run that starts inside a group, which the window's pieces never do, takes the path below).
    size_t fused = 0;
    float* acc = reinterpret_cast<float*>(u.grads_.at(from));
    if (reduce_into_ != nullptr && (stream_ == nullptr || reinterpret_cast<uintptr_t>(acc) % 64 == 0) &&
        (!squared || carry_.pending_elems == 0))
      fused = (to - from) / kSquareGroup * kSquareGroup;
    if (fused != 0)
      reduce_into_(acc, sources_at(from), n, fused, into_zero_, stream_ != nullptr, squared ? &carry_ : nullptr);
    // The rest through the scratch: summed as the backend sums, then added.
    for (size_t begin = from + fused; begin < to; begin += kScratchElems) {
      const size_t m = std::min(kScratchElems, to - begin);
      sum_in_rank_order(scratch_.data(), sources_at(begin), n, m, dtype);
      add_run(scratch_.data(), begin, begin + m, squared);
    }
  });
  taken_ = offset + count;
  return true;
}

void AccumulatorPieces::add(const void* piece, size_t count) {
  const size_t begin = taken_, esize = dtype_size(unit_->comm_dtype_);
  walk(begin, begin + count, [&](size_t from, size_t to, bool squared) {
    add_run(static_cast<const char*>(piece) + (from - begin) * esize, from, to, squared);
  });
  taken_ = begin + count;
}

void AccumulatorPieces::finish() {
  UnitAccumulator& u = *unit_;
  const char* reduced_block = block_;
  const size_t red_size = dtype_size(u.comm_dtype_);
  disarm();  // the backend is done with it (the wait returned)
  // Left to add: in pieces of a norm block, so that each is squared while it is in cache.
  const size_t step = squares_ ? kSumBlockElems : u.grads_.elems;
  while (taken_ < u.grads_.elems) add(reduced_block + taken_ * red_size, std::min(step, u.grads_.elems - taken_));
  if (squares_) {
    walk(taken_, taken_, [](size_t, size_t, bool) {});  // segments that end at the shard's end, or hold no element
    u.squares_final_ = true;
  }
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
