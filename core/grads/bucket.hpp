// One gradient bucket (stages 2-3): consecutive units in backward order whose gradients share one pooled buffer
// during backward and are reduce-scattered together (Megatron-LM's bucket). It owns its geometry, its readiness
// (how many of the params it waits for are ready), the buffer collecting this micro-step's gradients, the
// reduction in flight with its buffer, and the accumulators its units' reduced shards are added into. start()
// narrows each unit in place to the communication dtype and starts the group of reduce-scatters (asynchronous);
// finish() waits for it, adds this rank's blocks into the accumulators and gives the buffer back.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/engine_comm.hpp"
#include "grads/accumulator.hpp"
#include "memory/pool.hpp"
#include "plan/layout.hpp"

namespace zero {

// ---- When buckets reduce: pure functions of the counts every rank shares, so that every rank issues the same
// reductions in the same order whatever order its backward declares gradients ready in. A bucket is reduced once every
// param it expects is ready, strictly in bucket order. It expects the params that had a gradient on any rank in the
// previous micro-step — all of them in the first one — so that an unused or frozen param does not hold its bucket, and
// every later one, back until zero_backward_end. A gradient that arrives after its bucket was reduced (a param unused
// last time) goes into a fresh buffer that zero_backward_end reduces again.

struct BucketCount {
  size_t expected = 0;  // params the bucket waits for
  size_t ready = 0;     // of those, declared ready
};

// What bucket `next` (the first not yet reduced, in bucket order) does now.
enum class BucketTurn {
  kWait,    // it still expects params: nothing after it reduces either
  kReduce,  // reduce it, then look at the next
  kPass,    // it expects nothing: passed over without a reduction (zero_backward_end reduces it if a rank wrote into
            // it after all)
};
// In backward, at each zero_grad_ready.
BucketTurn turn_in_backward(const BucketCount& count);
// At zero_backward_end, before its agreement: every bucket not reduced yet that expects something.
BucketTurn turn_at_backward_end(const BucketCount& count);

// zero_backward_end's exchange: one bitmap per rank of which params had a gradient (bits 0..params-1) and which
// buckets hold gradients no reduction covered (bits params..params+buckets-1).
std::vector<uint64_t> micro_step_bits(const std::vector<char>& param_touched, const std::vector<char>& bucket_holding);
size_t micro_step_words(size_t params, size_t buckets);

// From every rank's bitmap (`all`: `ranks` bitmaps back to back): the buckets every rank reduces again now, in
// order, and which params (hence how many per bucket) the next micro-step expects.
struct MicroStepOutcome {
  std::vector<int> reduce_again;
  std::vector<char> param_expected;
  std::vector<size_t> bucket_expected;
};
MicroStepOutcome after_micro_step(const std::vector<uint64_t>& all, int ranks, size_t params,
                                  const std::vector<int>& bucket_of_param, size_t buckets);

// ---- The bucket

class Bucket {
 public:
  struct UnitSlot {
    int unit = 0;
    size_t offset = 0;  // where the unit's full gradient starts in the buffer (elements)
    size_t padded_elems = 0, shard_elems = 0;
    UnitAccumulator* accumulator = nullptr;
  };

  Bucket(int index, size_t elems, std::vector<UnitSlot> units, DType accum_dtype, DType comm_dtype);
  Bucket(Bucket&&) = default;
  Bucket& operator=(Bucket&&) = delete;
  // A reduction still in flight (the engine gave up on it, or is going away in the middle of it) may still hand
  // pieces to its sinks: they are disarmed, and kept, never freed.
  ~Bucket();

  int index() const { return index_; }
  size_t elems() const { return elems_; }
  const std::vector<UnitSlot>& units() const { return units_; }

  // ---- readiness: the bucket reduces once every param it expects is declared ready
  const BucketCount& count() const { return count_; }
  void expect(size_t params) { count_.expected = params; }
  void param_ready() { count_.ready += 1; }
  void restart_micro_step() { count_.ready = 0; }

  // ---- the buffer of this micro-step's gradients
  bool collecting() const { return buffer_ != nullptr; }
  // Where unit slot's param at `offset_in_unit` adds its gradient: the buffer, taken from the pool and zeroed the
  // first time (the caller reserved it).
  char* gradients(BufferPool& pool, const UnitSlot& slot, size_t offset_in_unit);

  // ---- the reduction
  // Narrows each unit in place, starts the reduce-scatters as one group (labelled `label` + ", unit u") and puts
  // the buffer in flight; a gradient that comes later gets a fresh buffer. Without a buffer (no gradient was asked
  // for on this rank) it takes one of zeros from the pool, reserved by the caller. The accumulators' adds begin
  // here: a backend that can hands each unit's summed block to them as it goes (comm/reduced_sink.hpp);
  // `last_micro_step` as for finish().
  void start(EngineComm& comm, BufferPool& pool, const std::string& label, bool last_micro_step);
  bool in_flight() const { return !pending_.empty(); }
  // Waits for the reduction in flight, adds this rank's block of each unit into its accumulator (what the backend
  // did not hand it already; with the norm's squares on the window's last micro-step) and gives the buffer back.
  void finish(EngineComm& comm, BufferPool& pool, bool last_micro_step);
  // The engine gives up on the reduction in flight: its sinks take nothing more (finish and start do it on failure).
  void disarm();
  // The buffers a backend may still write after the engine gave up on it.
  void* in_flight_buffer() const { return reducing_; }

 private:
  size_t grad_size() const { return dtype_size(accum_dtype_); }

  int index_;
  size_t elems_;
  std::vector<UnitSlot> units_;
  DType accum_dtype_, comm_dtype_;
  BucketCount count_;
  void* buffer_ = nullptr;    // collecting this micro-step's gradients
  void* reducing_ = nullptr;  // in flight
  std::vector<EngineComm::Pending> pending_;
  // Per unit, the reduction's adds into its accumulator, begun in start(): host buffers (null for device ones, whose
  // reduced blocks are added in finish()).
  std::vector<std::unique_ptr<AccumulatorPieces>> pieces_;
};

}  // namespace zero
