// One unit as one rank keeps it: the buffers its UnitPlan places, the runs of params the optimizer and the norm walk
// in them, and where the unit's full params are now. The gather state is one enum whose transitions are the
// methods below (unit.cpp); the store (param_store.hpp) decides when they happen and moves the data.
#pragma once

#include <cstdint>
#include <vector>

#include "memory/buffer.hpp"
#include "plan/layout.hpp"

namespace zero {

class Unit {
 public:
  // Where the unit's full params are.
  //   Full params (stages 0-2, and units that persist at stage 3) are always in `params`:
  //     kResident    not gathered;
  //     kPublishing  the all-gather of the new values after a step is in flight (overlap_comm);
  //     kGathered    the framework holds them (zero_gather .. zero_release).
  //   Sharded params (stage 3) keep this rank's shard in `params`; the full params are in a pooled buffer or nowhere:
  //     kSharded     nowhere;
  //     kFetching    an all-gather into a buffer is in flight ahead of zero_gather (a prefetch);
  //     kFetched     a buffer holds them ahead of zero_gather (prefetched, or kept at the last release);
  //     kGathered    the framework holds them; zero_release gives the buffer back;
  //     kKept        the framework holds them; zero_release keeps the buffer (kFetched), as the order needs it
  //                  again soon (stage3_max_reuse_distance).
  // A gathered unit may also have its next use fetched into a second buffer: zero_release is local, so a prefetch
  // decided by every rank alike cannot wait for it (next_use_fetch()).
  enum class GatherState { kResident, kPublishing, kSharded, kFetching, kFetched, kGathered, kKept };

  Buffer params;    // compute dtype: the full unit, or this rank's shard (UnitPlan::params)
  Buffer frozen;    // the frozen params' bytes: the full unit's, or this rank's shard (UnitPlan::frozen)
  Buffer master;    // fp32 master of what this rank updates; empty when params are fp32 (they are the master)
  Buffer grads;     // accumulation dtype: the full unit, or the reduced shard (UnitPlan::grads)
  Buffer state[2];  // fp32 optimizer state of what this rank updates
  std::vector<ShardSegment> update_segments;  // what the optimizer updates, relative to UnitPlan::update_begin
  std::vector<ShardSegment> norm_segments;    // what this rank adds to the norm, relative to UnitPlan::norm_begin
  // Runs of params another model-parallel rank counts in the norm (ZERO_PARAM_MODEL_PARALLEL_DUPLICATE, with a
  // model-parallel group): left out of norm_segments here, checked for non-finite values; relative to
  // UnitPlan::norm_begin.
  std::vector<ShardSegment> uncounted_segments;

  // At finalize: full params are resident, sharded ones start as this rank's shard. A gathered buffer of a sharded
  // unit holds its frozen bytes from `gathered_frozen_offset` on.
  void start(bool sharded_params, size_t gathered_frozen_offset = 0);

  GatherState gather_state() const { return state_; }
  bool sharded() const { return sharded_; }
  // Bumped by every gather and release (the bindings' views check it).
  uint64_t generation() const { return generation_; }
  bool gathered() const { return state_ == GatherState::kGathered || state_ == GatherState::kKept; }
  // The full params while gathered (null also for a unit of frozen params only, whose full params are empty).
  void* view() const { return gathered() ? view_ : nullptr; }
  // The full frozen bytes while gathered.
  void* frozen_view() const {
    if (!gathered()) return nullptr;
    return sharded_ ? static_cast<char*>(view_) + gathered_frozen_offset_ : const_cast<void*>(frozen.data());
  }
  // An all-gather into this unit is in flight: its new values (kPublishing), a prefetch (kFetching), or its next
  // use's while the framework holds it.
  bool fetch_in_flight() const {
    return state_ == GatherState::kPublishing || state_ == GatherState::kFetching || next_in_flight_;
  }
  // The unit holds a pooled buffer by the store's own choice (stage3_max_live_parameters counts these): fetched
  // or fetching ahead, kept, or its next use fetched.
  bool holds_ahead() const {
    return state_ == GatherState::kFetching || state_ == GatherState::kFetched || state_ == GatherState::kKept ||
           next_ != nullptr;
  }
  // The buffer an all-gather in flight writes: a fetch's or the next use's (null for a publish, which writes
  // `params`).
  void* fetch_buffer() const { return next_ != nullptr ? next_ : state_ == GatherState::kFetching ? ahead_ : nullptr; }

  // ---- transitions (each fails with ZERO_ERR_INTERNAL from a state it does not start from)
  // zero_step with overlap_comm: kResident -> kPublishing.
  void start_publish();
  // A prefetch into `buffer`: kSharded -> kFetching; kGathered -> kGathered with its next use fetching.
  void start_fetch(void* buffer);
  // The all-gather in flight completed: kPublishing -> kResident, kFetching -> kFetched, or the next use's.
  void fetch_done();
  // zero_gather of a unit with full params (no fetch in flight): kResident -> kGathered.
  void gather_resident();
  // zero_gather of a sharded unit: the buffer fetched ahead, if there is one (kFetched -> taken, no fetch in
  // flight), else null.
  void* take_fetched();
  // zero_gather of a sharded unit, its full params now in `buffer` (taken, or all-gathered just now): -> kGathered,
  // or kKept when `keep`.
  void gathered_into(void* buffer, bool keep);
  // zero_release: returns the buffer to give back to the pool (null when there is none: full params, or kept).
  void* release();
  // zero_step and checkpoints, with no fetch in flight: what is fetched ahead goes back (returned, null if none),
  // and a kept unit will be given back at its release.
  void* settle();

 private:
  [[noreturn]] void wrong(const char* transition) const;

  GatherState state_ = GatherState::kResident;
  bool sharded_ = false;
  size_t gathered_frozen_offset_ = 0;
  void* view_ = nullptr;   // gathered: the full params (`params`, or a pooled buffer)
  void* ahead_ = nullptr;  // kFetching, kFetched: the pooled buffer
  void* next_ = nullptr;   // gathered: the buffer of the next use's fetch
  bool next_in_flight_ = false;
  uint64_t generation_ = 0;
};

const char* gather_state_name(Unit::GatherState state);

}  // namespace zero
