#include "grads/bucket.hpp"

#include "memory/ops.hpp"
#include "util/error.hpp"
#include "util/keep_forever.hpp"

namespace zero {

BucketTurn turn_in_backward(const BucketCount& count) {
  if (count.ready != count.expected) return BucketTurn::kWait;
  return count.expected > 0 ? BucketTurn::kReduce : BucketTurn::kPass;
}

BucketTurn turn_at_backward_end(const BucketCount& count) {
  return count.expected > 0 ? BucketTurn::kReduce : BucketTurn::kPass;
}

size_t micro_step_words(size_t params, size_t buckets) { return (params + buckets + 63) / 64; }

std::vector<uint64_t> micro_step_bits(const std::vector<char>& param_touched, const std::vector<char>& bucket_holding) {
  const size_t params = param_touched.size();
  std::vector<uint64_t> bits(micro_step_words(params, bucket_holding.size()), 0);
  for (size_t p = 0; p < params; ++p)
    if (param_touched[p]) bits[p / 64] |= uint64_t{1} << (p % 64);
  for (size_t b = 0; b < bucket_holding.size(); ++b)
    if (bucket_holding[b]) bits[(params + b) / 64] |= uint64_t{1} << ((params + b) % 64);
  return bits;
}

MicroStepOutcome after_micro_step(const std::vector<uint64_t>& all, int ranks, size_t params,
                                  const std::vector<int>& bucket_of_param, size_t buckets) {
  const size_t words = micro_step_words(params, buckets);
  std::vector<uint64_t> any(words, 0);
  for (int r = 0; r < ranks; ++r)
    for (size_t w = 0; w < words; ++w) any[w] |= all[words * static_cast<size_t>(r) + w];
  auto bit = [&](size_t i) { return (any[i / 64] >> (i % 64)) & 1u; };
  MicroStepOutcome out;
  for (size_t b = 0; b < buckets; ++b)
    if (bit(params + b)) out.reduce_again.push_back(static_cast<int>(b));
  out.param_expected.assign(params, 0);
  out.bucket_expected.assign(buckets, 0);
  for (size_t p = 0; p < params; ++p) {
    out.param_expected[p] = static_cast<char>(bit(p));
    if (out.param_expected[p]) out.bucket_expected[static_cast<size_t>(bucket_of_param[p])] += 1;
  }
  return out;
}

Bucket::Bucket(int index, size_t elems, std::vector<UnitSlot> units, DType accum_dtype, DType comm_dtype)
    : index_(index), elems_(elems), units_(std::move(units)), accum_dtype_(accum_dtype), comm_dtype_(comm_dtype) {
  pieces_.resize(units_.size());
}

Bucket::~Bucket() {
  if (reducing_ == nullptr) return;
  for (std::unique_ptr<AccumulatorPieces>& p : pieces_)
    if (p != nullptr) p->disarm(), keep_forever(std::move(p));
}

char* Bucket::gradients(BufferPool& pool, const UnitSlot& slot, size_t offset_in_unit) {
  if (buffer_ == nullptr) {
    buffer_ = pool.acquire();
    fill_zero(pool.space(), buffer_, elems_ * grad_size());
  }
  return static_cast<char*>(buffer_) + (slot.offset + offset_in_unit) * grad_size();
}

void Bucket::start(EngineComm& comm, BufferPool& pool, const std::string& label, bool last_micro_step) {
  if (in_flight()) fail(ZERO_ERR_INTERNAL, label + ": the bucket's previous reduction is still in flight");
  if (buffer_ == nullptr) {  // no gradient was asked for here: this rank contributes zeros
    buffer_ = pool.acquire();
    fill_zero(pool.space(), buffer_, elems_ * grad_size());
  }
  const ElementOps& ops = element_ops(pool.space());
  std::vector<EngineComm::Planned> group;
  for (size_t i = 0; i < units_.size(); ++i) {
    const UnitSlot& slot = units_[i];
    char* full = static_cast<char*>(buffer_) + slot.offset * grad_size();
    ops.convert(full, comm_dtype_, full, accum_dtype_, slot.padded_elems);
    ReducedSink* sink = nullptr;
    if (slot.accumulator->takes_pieces(pool.space()) && slot.accumulator->elems() == slot.shard_elems) {
      if (pieces_[i] == nullptr) pieces_[i] = std::make_unique<AccumulatorPieces>();
      slot.accumulator->begin_reduction(*pieces_[i], last_micro_step,
                                        full + comm.rank() * slot.shard_elems * dtype_size(comm_dtype_), true);
      sink = pieces_[i].get();
    } else {
      pieces_[i].reset();
    }
    group.push_back({CollKind::kReduceScatter, full, slot.shard_elems, elem_type(comm_dtype_),
                     label + ", unit " + std::to_string(slot.unit), sink});
  }
  reducing_ = buffer_;
  buffer_ = nullptr;  // a gradient that comes later gets a fresh buffer (reduced again at zero_backward_end)
  try {
    pending_ = comm.start_group(std::move(group));
  } catch (...) {
    disarm();
    throw;
  }
}

// The engine gives the reduction up: what the backend still runs sums into the buffer, never into the accumulators.
void Bucket::disarm() {
  for (std::unique_ptr<AccumulatorPieces>& p : pieces_)
    if (p != nullptr) p->disarm();
}

void Bucket::finish(EngineComm& comm, BufferPool& pool, bool last_micro_step) {
  try {
    comm.wait_all(pending_);
  } catch (...) {
    disarm();
    throw;
  }
  const int rank = comm.rank();
  OffloadPipeline* offload = nullptr;  // ZeRO-Offload's copies still reading the buffer, the last one's ticket
  TransferQueue::Ticket copy = 0;
  for (size_t i = 0; i < units_.size(); ++i) {
    const UnitSlot& slot = units_[i];
    const char* block = static_cast<const char*>(reducing_) + slot.offset * grad_size() +
                        rank * slot.shard_elems * dtype_size(comm_dtype_);
    if (pieces_[i] != nullptr) {
      pieces_[i]->finish();
      continue;
    }
    const TransferQueue::Ticket t = slot.accumulator->accumulate(block, pool.space(), last_micro_step);
    if (t != 0) offload = slot.accumulator->offload(), copy = t;
  }
  if (offload != nullptr) {
    pool.give_back(reducing_, [offload, copy] { offload->reuse_after(copy); });
  } else {
    pool.give_back(reducing_);
  }
  reducing_ = nullptr;
  pending_.clear();
}

}  // namespace zero
