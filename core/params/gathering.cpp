// Gather, release, prefetch and publish: where a unit's full params come from, and the all-gathers that bring them
// (docs/architecture.md, "Fetching ahead"). The unit's state changes only through its transitions (unit.hpp); what
// goes ahead is plan_ahead's decision (fetch_ahead.hpp).
#include <algorithm>
#include <chrono>
#include <csignal>
#include <optional>

#include "memory/ops.hpp"
#include "params/param_store.hpp"
#include "util/error.hpp"
#include "util/test_hooks.hpp"

namespace zero {
namespace {

std::string unit_name(int unit) { return "unit " + std::to_string(unit); }

// A unit's gathered-buffer decisions (and the recorded order) are kept to a bounded length: a micro-step that
// gathers far more often than it has units is not a forward and backward pass worth following.
bool recordable(size_t recorded, size_t units) { return recorded < 64 * units + 64; }

}  // namespace

uint64_t ParameterStore::live_elements() const {
  uint64_t buffers = 0;
  for (const Unit& unit : units_) buffers += unit.holds_ahead() ? 1 : 0;
  return buffers * plan_.gathered_elems;
}

AheadPlan ParameterStore::plan_ahead_of(int unit) const {
  FetchState state;
  state.unit_elems = &unit_elems_;
  state.buffer_elems = plan_.gathered_elems;
  state.live_elements = live_elements();
  state.holds_ahead = [this](int v) { return units_[static_cast<size_t>(v)].holds_ahead(); };
  state.next_in_window = window_.next_in_window();
  return plan_ahead(policy_, order_, unit, state);
}

// This rank's shard of a unit's params, and of its frozen bytes, into their places in a gathered buffer, before the
// all-gather: from memory, or read from the params file (offload_param).
void ParameterStore::put_own_shard(int unit, void* buffer) {
  const UnitLayout& ul = layout_.units[unit];
  const size_t shard = ul.shard_elems, esize = dtype_size(plan_.compute_dtype);
  char* own = static_cast<char*>(buffer) + comm_.rank() * shard * esize;
  const Unit& u = units_[unit];
  if (params_on_nvme(unit))
    nvme_params_->read(unit, 0, 0, own, shard);
  else
    copy_bytes(gathered_pool_.space(), own, u.params.space(), u.params.data(), shard * esize);
  if (ul.has_frozen())
    copy_bytes(
        gathered_pool_.space(),
        static_cast<char*>(buffer) + plan_.units[unit].gathered_frozen_offset + comm_.rank() * ul.frozen_shard_bytes,
        u.frozen.space(), u.frozen.data(), ul.frozen_shard_bytes);
}

// The all-gathers that fill a gathered buffer of `unit`: its params and its frozen bytes, as one group.
std::vector<EngineComm::Pending> ParameterStore::start_unit_all_gather(int unit, void* buffer,
                                                                       const std::string& label) {
  const UnitLayout& ul = layout_.units[unit];
  std::vector<EngineComm::Planned> group;
  if (ul.shard_elems > 0)
    group.push_back({CollKind::kAllGather, buffer, ul.shard_elems, elem_type(plan_.compute_dtype), label});
  if (ul.has_frozen())
    group.push_back({CollKind::kAllGather, static_cast<char*>(buffer) + plan_.units[unit].gathered_frozen_offset,
                     ul.frozen_shard_bytes, ElemType::kU8, label + " (frozen params)"});
  return comm_.start_group(std::move(group));
}

void ParameterStore::start_prefetch(int unit) {
  void* buffer = gathered_pool_.acquire();
  put_own_shard(unit, buffer);
  Fetch f;
  f.unit = unit;
  f.pending = start_unit_all_gather(unit, buffer, guard_.label("prefetch: all-gather of " + unit_name(unit)));
  fetches_.push_back(std::move(f));
  units_[unit].start_fetch(buffer);
}

void ParameterStore::complete_fetch(int unit) {
  while (units_[unit].fetch_in_flight()) {
    Fetch& f = fetches_.front();
    comm_.wait_all(f.pending);
    units_[f.unit].fetch_done();
    fetches_.pop_front();
  }
}

void ParameterStore::drain(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!fetches_.empty()) {
    for (EngineComm::Pending& pending : fetches_.front().pending) {
      if (!pending.active()) continue;
      const double left = std::chrono::duration<double>(end - std::chrono::steady_clock::now()).count();
      if (!comm_.try_wait(pending, std::max(0.0, left))) return;  // the rest: leaked at the end
    }
    units_[fetches_.front().unit].fetch_done();
    fetches_.pop_front();
  }
}

void ParameterStore::settle() {
  while (!fetches_.empty()) complete_fetch(fetches_.front().unit);
  for (Unit& unit : units_)
    if (void* buffer = unit.settle()) gathered_pool_.give_back(buffer);
  // Gathers since the last zero_backward_end (an evaluation, a checkpoint's consolidated weights) are no micro-step:
  // the next one starts the recorded order from its beginning, and does not record them.
  recording_.clear();
  order_.cursor = 0;
  order_.lost = false;
}

void ParameterStore::end_micro_step() {
  if (recordable(recording_.size(), units_.size()) && recording_ != order_.order) order_.order.swap(recording_);
  recording_.clear();
  order_.cursor = 0;
  order_.lost = false;
}

void ParameterStore::gather(int unit) {
  // Units with full params are gathered locally. Where params are sharded, a call with a unit id this rank does
  // not know (or before finalize) is treated as the collective it was meant to be: its failure reaches the
  // others through the agreement.
  const bool known = guard_.ready() && unit >= 0 && unit < static_cast<int>(units_.size());
  if ((known && !units_[unit].sharded()) || (!known && !plan_.params_sharded)) {
    guard_.require(CallGuard::State::kReady);
    check_unit(unit);
    Unit& u = units_[unit];
    if (u.gathered()) guard_.fail(ZERO_ERR_INVALID_STATE, unit_name(unit) + " is already gathered; release it first");
    if (u.fetch_in_flight()) guard_.moving_data([&] { complete_fetch(unit); });  // its new params, after the step
    u.gather_resident();
    return;
  }
  // Collective from here: every rank reaches the agreement, even one whose call is wrong.
  AheadPlan ahead;
  CollectiveCall call(guard_, CallKind::kGather);
  call.check([&] {
    guard_.require(CallGuard::State::kReady);
    check_unit(unit);
    if (units_[unit].gathered())
      guard_.fail(ZERO_ERR_INVALID_STATE, unit_name(unit) + " is already gathered; release it first");
    test_hooks::maybe_fail("gather", comm_.rank());
    ahead = plan_ahead_of(unit);
    // Every buffer this call takes, reserved before the agreement: a collective never allocates.
    const Unit::GatherState state = units_[unit].gather_state();
    const bool has_buffer = state == Unit::GatherState::kFetching || state == Unit::GatherState::kFetched;
    const size_t buffers = (has_buffer ? 0 : 1) + ahead.prefetch.size();
    try {
      if (!gathered_pool_.has_free()) test_hooks::maybe_fail("gather.alloc", comm_.rank());
      gathered_pool_.reserve(buffers);
    } catch (const std::bad_alloc&) {
      guard_.fail(ZERO_ERR_OUT_OF_MEMORY,
                  "out of memory for the gathered " + unit_name(unit) +
                      (ahead.prefetch.empty() ? std::string(" (more units gathered at once?)")
                                              : " and " + std::to_string(ahead.prefetch.size()) +
                                                    " units prefetched after it (lower "
                                                    "stage3_prefetch_bucket_size?)"));
    }
  });
  call.agree(unit, call.failed() ? 0
                                 : static_cast<int64_t>(layout_.units[unit].padded_elems +
                                                        layout_.units[unit].frozen_padded_bytes));
  Unit& u = units_[unit];
  call.move([&] {
    // Prefetched, or kept since its last release: no communication now.
    if (u.fetch_in_flight()) complete_fetch(unit);
    void* buffer = u.take_fetched();
    if (buffer == nullptr) {
      buffer = gathered_pool_.acquire();
      put_own_shard(unit, buffer);
      std::vector<EngineComm::Pending> pending =
          start_unit_all_gather(unit, buffer, guard_.label("all-gather of " + unit_name(unit)));
      comm_.wait_all(pending);
    }
    u.gathered_into(buffer, ahead.keep);
    // The next units of the recorded order start now and move while the framework computes with this one.
    order_.cursor = ahead.cursor, order_.lost = ahead.lost;
    if (recordable(recording_.size(), units_.size())) recording_.push_back(unit);
    for (int v : ahead.prefetch) start_prefetch(v);
  });
}

void ParameterStore::prefetch(int unit) {
  const bool known = guard_.ready() && unit >= 0 && unit < static_cast<int>(units_.size());
  if ((known && !units_[unit].sharded()) || (!known && !plan_.params_sharded)) {
    guard_.require(CallGuard::State::kReady);
    check_unit(unit);
    return;  // full params: nothing to fetch
  }
  bool start = false;
  CollectiveCall call(guard_, CallKind::kPrefetch);
  call.check([&] {
    guard_.require(CallGuard::State::kReady);
    check_unit(unit);
    test_hooks::maybe_fail("prefetch", comm_.rank());
    // Whether the framework holds the unit gathered now is this rank's own business (zero_release is local), so
    // it does not enter the decision: every rank starts the same collective.
    start = !units_[unit].holds_ahead();
    try {
      if (start) gathered_pool_.reserve(1);
    } catch (const std::bad_alloc&) {
      guard_.fail(ZERO_ERR_OUT_OF_MEMORY, "out of memory for the prefetched " + unit_name(unit));
    }
  });
  call.agree(unit, call.failed() ? 0 : static_cast<int64_t>(start));
  if (start) call.move([&] { start_prefetch(unit); });
}

void ParameterStore::release(int unit) {
  guard_.require(CallGuard::State::kReady);
  check_unit(unit);
  if (!units_[unit].gathered()) guard_.fail(ZERO_ERR_INVALID_STATE, unit_name(unit) + " is not gathered");
  // Kept for its reuse (decided at its gather), unless a prefetch of it already holds another copy.
  if (void* buffer = units_[unit].release()) gathered_pool_.give_back(buffer);
}

void ParameterStore::release_modified(int unit, int modifier_rank, bool micro_step_begun) {
  int64_t bytes = 0;
  CollectiveCall call(guard_, CallKind::kReleaseModified);
  call.check([&] {
    guard_.require(CallGuard::State::kReady);
    check_unit(unit);
    if (!units_[unit].gathered())
      guard_.fail(ZERO_ERR_INVALID_STATE, unit_name(unit) +
                                              " is not gathered (zero_gather it, let the modifier rank "
                                              "write, then zero_release_modified)");
    if (modifier_rank < 0 || modifier_rank >= comm_.size())
      guard_.fail(ZERO_ERR_INVALID_ARGUMENT, "modifier rank " + std::to_string(modifier_rank) + " is not a rank (0.." +
                                                 std::to_string(comm_.size() - 1) + ")");
    if (micro_step_begun)
      guard_.fail(ZERO_ERR_INVALID_STATE,
                  "a micro-step has begun (zero_grad_data or zero_grad_ready since the last zero_backward_end); "
                  "modify params between micro-steps");
    test_hooks::maybe_fail("release_modified", comm_.rank());
    const UnitLayout& ul = layout_.units[unit];
    bytes = static_cast<int64_t>(ul.padded_elems * dtype_size(plan_.compute_dtype) + ul.frozen_padded_bytes);
  });
  call.agree(unit, bytes, modifier_rank, [&](EngineComm& ranks) {
    std::string text = guard_.label("the ranks name different modifier ranks for " + unit_name(unit) + ":");
    for (int r = 0; r < ranks.size(); ++r)
      text += (r ? "; " : " ") + std::string("rank ") + std::to_string(r) + " names " +
              ranks.broadcast_text(std::to_string(modifier_rank), r, guard_.label("each rank's modifier rank"));
    return text + ". Every rank must name the same one.";
  });
  call.move([&] {
    // What was fetched ahead holds the old values.
    while (!fetches_.empty()) complete_fetch(fetches_.front().unit);
    for (size_t v = 0; v < units_.size(); ++v)
      if (void* buffer = units_[v].settle()) gathered_pool_.give_back(buffer);
    Unit& u = units_[unit];
    const UnitLayout& ul = layout_.units[unit];
    const UnitPlan& up = plan_.units[unit];
    const size_t esize = dtype_size(plan_.compute_dtype);
    constexpr size_t kPieceBytes = size_t{64} << 20;
    if (test_hooks::active("release_modified.kill", comm_.rank())) std::raise(SIGKILL);  // dies as the broadcasts begin
    auto broadcast = [&](void* data, size_t n, const char* what) {
      for (size_t at = 0; at < n; at += kPieceBytes)
        comm_.broadcast(static_cast<char*>(data) + at, std::min(kPieceBytes, n - at), ElemType::kU8, modifier_rank,
                        guard_.label(std::string("rank ") + std::to_string(modifier_rank) + "'s " + what + " of " +
                                     unit_name(unit)));
    };
    broadcast(u.view(), ul.padded_elems * esize, "params");
    broadcast(u.frozen_view(), ul.frozen_padded_bytes, "frozen params");
    if (u.sharded()) {  // this rank's shards from the gathered values
      const char* own = static_cast<const char*>(u.view()) + comm_.rank() * ul.shard_elems * esize;
      if (params_on_nvme(unit))
        nvme_params_->write(unit, 0, 0, own, ul.shard_elems);
      else
        copy_bytes(u.params.space(), u.params.data(), gathered_pool_.space(), own, ul.shard_elems * esize);
      copy_bytes(u.frozen.space(), u.frozen.data(), gathered_pool_.space(),
                 static_cast<const char*>(u.frozen_view()) + comm_.rank() * ul.frozen_shard_bytes,
                 ul.frozen_shard_bytes);
    }
    // The master of what this rank updates, widened from the new params (fp32 params are their own master).
    if (plan_.separate_master() && up.update_elems > 0) {
      const char* updated = static_cast<const char*>(u.view()) + up.update_begin * esize;
      const ElementOps& host = element_ops(MemorySpace::kHost);
      if (const std::optional<int> array = file_array(ShardKind::kMaster)) {
        std::vector<float> piece(std::min<size_t>(up.update_elems, size_t{1} << 20));
        for (size_t done = 0; done < up.update_elems; done += piece.size()) {
          const size_t m = std::min(piece.size(), up.update_elems - done);
          host.convert(piece.data(), DType::kF32, updated + done * esize, plan_.compute_dtype, m);
          nvme_->write(unit, *array, done, piece.data(), m);
        }
      } else {
        convert_across(u.master.space(), u.master.data(), DType::kF32, gathered_space(unit), updated,
                       plan_.compute_dtype, up.update_elems);
      }
    }
    if (void* buffer = u.release()) gathered_pool_.give_back(buffer);
  });
}

int ParameterStore::first_gathered() const {
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].gathered()) return static_cast<int>(u);
  return -1;
}

void ParameterStore::publish(const std::string& what) {
  for (size_t u = 0; u < units_.size(); ++u) {
    // Frozen params never change: only the trained ones are published.
    if (plan_.units[u].publish != Publish::kAllGatherAfterStep || layout_.units[u].shard_elems == 0) continue;
    const std::string label = guard_.label(what + " of unit " + std::to_string(u));
    if (!policy_.background_publish) {
      comm_.all_gather(units_[u].params.data(), layout_.units[u].shard_elems, elem_type(plan_.compute_dtype), label);
      continue;
    }
    Fetch f;
    f.unit = static_cast<int>(u);
    f.pending.push_back(comm_.start_all_gather(units_[u].params.data(), layout_.units[u].shard_elems,
                                               elem_type(plan_.compute_dtype), label));
    fetches_.push_back(std::move(f));
    units_[u].start_publish();
  }
}

}  // namespace zero
