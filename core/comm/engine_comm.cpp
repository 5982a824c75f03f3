#include "comm/engine_comm.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "config/config.hpp"
#include "util/keep_forever.hpp"
#include "util/test_hooks.hpp"

namespace zero {
namespace {

std::string format_seconds(double s) {
  std::ostringstream os;
  os.precision(s < 10 ? 2 : 0);
  os << std::fixed << s;
  return os.str();
}

}  // namespace

EngineComm::EngineComm(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}

void EngineComm::count(Counter counter, uint64_t bytes, uint64_t wire_bytes) {
  CommKindStats* k = nullptr;
  switch (counter) {
    case Counter::kAllGather:
      k = &stats_.all_gather;
      break;
    case Counter::kReduceScatter:
      k = &stats_.reduce_scatter;
      break;
    case Counter::kAllReduce:
      k = &stats_.all_reduce;
      break;
    case Counter::kBroadcast:
      k = &stats_.broadcast;
      break;
    case Counter::kControl:
      k = &stats_.control;
      break;
    case Counter::kNone:
      return;
  }
  k->calls += 1;
  k->bytes += bytes;
  k->wire_bytes += wire_bytes;
}

std::string EngineComm::recent_json() const { return recorder_.json(); }

// Start, then wait (below). A failure to start leaves the sequences apart on this rank: the engine breaks.
EngineComm::Pending EngineComm::start(Collective c, Counter counter, uint64_t bytes, uint64_t wire_bytes) {
  // Control messages (run_small's) and host-memory broadcasts go to the control side; a split communicator carries
  // them apart from the data.
  const bool control = c.control || c.host_memory;
  const bool device_data = data_in_device_memory_ && !control;
  if (device_data) require_device_memory(c.kind, c.buf, c.count, c.type, c.label);
  stats_.sequence += 1;
  count(counter, bytes, wire_bytes);
  Pending p;
  p.begin_ = std::chrono::steady_clock::now();
  Communicator& via = control ? comm_->control_side() : comm_->data_side();
  p.via_ = &via;
  if (!control) {
    if (c.kind == CollKind::kReduceScatter) c.any_order = any_order_;
    if (device_data && via.capabilities().device_buffers) c.queue = data_queue_;
  }
  if (control || device_data) c.sink = nullptr;  // a sink takes host memory's sums (staging copies them back)
  if (device_data && host_staged()) p.staged_ = stage_in(c);
  try {
    const bool identity = device_data && size() == 1;
    if (!identity) p.request_ = via.start(c);
  } catch (const Error& e) {
    recorder_.end(recorder_.start(c), c.sequence, FlightRecorder::State::kFailed);
    failed_ = true;
    fail(e.status(), c.label + ": " + e.what());
  }
  // From here the collective runs in the backend: whatever fails in the bookkeeping, its buffer stays protected.
  try {
    p.slot_ = recorder_.start(c);
    p.c_ = std::move(c);
  } catch (...) {
    failed_ = true;
    if (p.staged_.host == nullptr) abandoned_ = true;
    throw;
  }
  p.owner_ = this;
  p.active_ = true;
  return p;
}

// Waits in slices until done or past the deadline. On a timeout the request stays in flight inside the backend
// (no backend can cancel a collective), so its buffer must outlive the engine: abandoned_.
void EngineComm::wait(Pending& p) {
  if (!p.active_) fail(ZERO_ERR_INTERNAL, "a collective was waited for twice");
  p.active_ = false;
  const Collective& c = p.c_;
  if (p.request_ == nullptr) {
    complete(p);
    return;
  }
  // A failed wait may leave the backend's request in flight, and with it the buffer it writes: the caller's, or the
  // staging's host copy (which the staging keeps).
  const bool staged = p.staged_.host != nullptr;
  const auto deadline = p.begin_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                       std::chrono::duration<double>(timeout_s_));
  bool done = false;
  try {
    for (;;) {
      const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) break;
      if (p.via_->wait(p.request_, std::min(left, 0.25))) {
        done = true;
        break;
      }
      // zero_engine_abort from another thread: return now even if the backend would keep waiting.
      if (comm_->aborted())
        fail(ZERO_ERR_ABORTED, "the communicator was aborted on this rank (" + comm_->abort_reason() + ")");
      if (p.via_->aborted())
        fail(ZERO_ERR_ABORTED, "the communicator was aborted on this rank (" + p.via_->abort_reason() + ")");
    }
  } catch (const Error& e) {
    recorder_.end(p.slot_, c.sequence, FlightRecorder::State::kFailed);
    failed_ = true;
    if (!staged) abandoned_ = true;
    fail(e.status(), c.label + ": " + e.what());
  } catch (...) {
    recorder_.end(p.slot_, c.sequence, FlightRecorder::State::kFailed);
    failed_ = true;
    if (!staged) abandoned_ = true;
    throw;
  }
  if (done) {
    complete(p);
    return;
  }
  recorder_.end(p.slot_, c.sequence, FlightRecorder::State::kFailed);
  failed_ = true;
  if (!staged) abandoned_ = true;
  std::string what = c.label + ": collective #" + std::to_string(c.sequence) + " (" + coll_kind_name(c.kind) + " of " +
                     std::to_string(c.count) + " " + elem_type_name(c.type) + ") did not complete within " +
                     format_seconds(timeout_s_) + " s (libzero.timeout_s / ZERO_TIMEOUT_S)";
  // The others get a few seconds to answer: a tenth of the timeout, between half a second and three.
  // The diagnosis is a courtesy: whatever it meets, the abort below must still tell the others.
  std::string diagnosis;
  try {
    diagnosis = p.via_->diagnose(c.sequence, std::min(3.0, std::max(0.5, timeout_s_ / 10)));
  } catch (...) {
    diagnosis.clear();
  }
  if (!diagnosis.empty()) what += ". " + diagnosis;
  comm_->abort("it timed out after " + format_seconds(timeout_s_) + " s waiting in collective #" +
               std::to_string(c.sequence) + " (" + c.label + ")");
  fail(ZERO_ERR_TIMEOUT, what);
}

bool EngineComm::try_wait(Pending& p, double seconds) {
  if (!p.active_) return true;
  const Collective& c = p.c_;
  // The engine is going away: a staged result is not copied back (its device buffer is about to be freed).
  if (p.request_ == nullptr) {
    p.active_ = false;
    complete(p, false);
    return true;
  }
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  try {
    for (;;) {
      const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0 || comm_->aborted() || p.via_->aborted()) return false;
      if (p.via_->wait(p.request_, std::min(left, 0.25))) {
        p.active_ = false;
        complete(p, false);
        return true;
      }
    }
  } catch (...) {
    // Given up: its buffer is the caller's to keep (ParameterStore leaks exactly those); the engine's other
    // buffers are not in flight and may be freed.
    p.active_ = false;
    recorder_.end(p.slot_, c.sequence, FlightRecorder::State::kFailed);
    failed_ = true;
    return false;
  }
}

// A device engine's data collective takes device memory whichever communicator carries it: a device communicator
// (NCCL) would read host memory as device memory, an illegal access on the device. Checked on every path, so that
// the host-staged runs (the emulator's in CI) vouch for what a device communicator is given.
// A group's members are all checked before the group opens, so that a refusal leaves no group open on the data
// side (NCCL's group is per thread) and nothing of it started.
void EngineComm::require_device_memory(CollKind kind, const void* buf, size_t count, ElemType type,
                                       const std::string& label) {
  if (staging_ == nullptr) return;
  size_t bytes = count * elem_size(type);
  if (kind == CollKind::kAllGather || kind == CollKind::kReduceScatter) bytes *= static_cast<size_t>(size());
  if (bytes == 0 || staging_->device_memory(buf, bytes)) return;
  failed_ = true;
  comm_->abort("collective #" + std::to_string(comm_->data_side().issued() + 1) + " (" + label +
               ") was given host memory on a device engine");
  fail(ZERO_ERR_INTERNAL, label + ": the device engine's data collective was given " + std::to_string(bytes) +
                              " bytes that are not this engine's device memory");
}

// The input's and the result's ranges in the collective's buffer (zero.h's in-place conventions): an all-gather
// sends this rank's block and receives all; a reduce-scatter sends all and keeps this rank's block; an all-reduce
// both all; a broadcast sends the root's all to the others.
EngineComm::Pending::Staged EngineComm::stage_in(Collective& c) {
  const size_t elem = elem_size(c.type), ranks = static_cast<size_t>(size()), me = static_cast<size_t>(rank());
  size_t total = c.count * elem, in_offset = 0, in_bytes = total;
  Pending::Staged staged;
  staged.result_bytes = total;
  switch (c.kind) {
    case CollKind::kAllGather:
      total *= ranks, in_offset = me * c.count * elem, staged.result_bytes = total;
      break;
    case CollKind::kReduceScatter:
      total *= ranks, in_bytes = total, staged.result_offset = me * c.count * elem;
      break;
    case CollKind::kAllReduce:
      break;
    case CollKind::kBroadcast:
      if (c.root == rank())
        staged.result_bytes = 0;
      else
        in_bytes = 0;
      break;
  }
  try {
    test_hooks::maybe_fail(("staging." + std::string(coll_kind_name(c.kind))).c_str(), rank());
    staged.host = static_cast<char*>(staging_->acquire(total));
    if (in_bytes != 0)
      staging_->to_host(staged.host + in_offset, static_cast<const char*>(c.buf) + in_offset, in_bytes,
                        "its input, copied out of the device");
  } catch (const Error& e) {
    // This rank cannot take part: the others, already in this collective or on their way, learn it now instead
    // of at their timeout. The host buffer, if any, is not in flight yet: it goes back.
    if (staged.host != nullptr) staging_->give_back(staged.host);
    failed_ = true;
    comm_->abort("its device failed to stage collective #" + std::to_string(comm_->data_side().issued() + 1) + " (" +
                 c.label + "): " + e.what());
    fail(e.status(), c.label + ": " + e.what());
  } catch (const std::bad_alloc&) {  // no pinned memory left
    failed_ = true;
    comm_->abort("it ran out of pinned host memory staging collective #" +
                 std::to_string(comm_->data_side().issued() + 1) + " (" + c.label + ")");
    fail(ZERO_ERR_OUT_OF_MEMORY, c.label + ": out of pinned host memory for the host-staged copy");
  }
  staged.device = c.buf;
  c.buf = staged.host;
  return staged;
}

void EngineComm::stage_out(Pending& p, bool copy_back) {
  Pending::Staged& staged = p.staged_;
  if (staged.host == nullptr) return;
  if (copy_back && staged.result_bytes != 0) {
    // A copy that fails (or stops) may still be reading the host copy: it is not given back.
    test_hooks::maybe_fail(("unstaging." + std::string(coll_kind_name(p.c_.kind))).c_str(), rank());
    staging_->to_device(static_cast<char*>(staged.device) + staged.result_offset, staged.host + staged.result_offset,
                        staged.result_bytes, "its result, copied into the device");
  }
  staging_->give_back(staged.host);
  staged.host = nullptr;
}

void EngineComm::complete(Pending& p, bool copy_back) {
  const Collective& c = p.c_;
  try {
    stage_out(p, copy_back);
  } catch (const Error& e) {
    recorder_.end(p.slot_, c.sequence, FlightRecorder::State::kFailed);
    failed_ = true;  // this rank's data are no longer the others'
    comm_->abort("its device failed to take the result of collective #" + std::to_string(c.sequence) + " (" + c.label +
                 "): " + e.what());
    fail(e.status(), c.label + ": " + e.what());
  }
  recorder_.end(p.slot_, c.sequence, FlightRecorder::State::kDone);
}

void EngineComm::run(Collective c, Counter counter, uint64_t bytes, uint64_t wire_bytes) {
  Pending p = start(std::move(c), counter, bytes, wire_bytes);
  wait(p);
}

void EngineComm::wait_all(std::vector<Pending>& pendings) {
  // After a failure the rest stay in flight in the backend: their buffers must never be freed.
  for (Pending& p : pendings)
    if (p.active_) wait(p);
}

std::vector<EngineComm::Pending> EngineComm::start_group(std::vector<Planned> group) {
  std::vector<Pending> pendings;
  pendings.reserve(group.size());
  // Data collectives: a group is the data side's (one NCCL launch). A group_end that fails leaves the started ones
  // in flight as far as this rank knows.
  Communicator& data = comm_->data_side();
  if (data_in_device_memory_)
    for (const Planned& g : group) require_device_memory(g.kind, g.buf, g.block, g.type, g.label);
  data.group_begin();
  try {
    for (Planned& g : group) pendings.push_back(start_data(g.kind, g.buf, g.block, g.type, g.label, g.sink));
  } catch (...) {
    try {
      data.group_end();
    } catch (...) {
    }
    // Started ones may still write into their buffers (host-staged: the staging's copies, which it keeps).
    if (!pendings.empty()) failed_ = true, abandoned_ = abandoned_ || !host_staged();
    throw;
  }
  try {
    data.group_end();
  } catch (...) {
    if (!pendings.empty()) failed_ = true, abandoned_ = abandoned_ || !host_staged();
    for (Pending& p : pendings) p.active_ = false;
    throw;
  }
  return pendings;
}

namespace {

Collective collective(CollKind kind, void* buf, size_t count, ElemType type, std::string label) {
  Collective c;
  c.kind = kind;
  c.type = type;
  c.buf = buf;
  c.count = count;
  c.label = std::move(label);
  return c;
}

}  // namespace

// All-gathers and reduce-scatters move (N-1)/N of the N blocks per rank, whichever algorithm runs them.
EngineComm::Pending EngineComm::start_data(CollKind kind, void* buf, size_t block, ElemType type,
                                           const std::string& label, ReducedSink* sink) {
  if (kind != CollKind::kAllGather && kind != CollKind::kReduceScatter)
    fail(ZERO_ERR_INTERNAL, label + ": only all-gathers and reduce-scatters start without waiting");
  const uint64_t block_bytes = block * elem_size(type), n = size();
  Collective c = collective(kind, buf, block, type, label);
  if (kind == CollKind::kReduceScatter) c.sink = sink;
  return start(std::move(c), kind == CollKind::kAllGather ? Counter::kAllGather : Counter::kReduceScatter,
               block_bytes * n, block_bytes * (n - 1));
}

EngineComm::Pending EngineComm::start_all_gather(void* buf, size_t block, ElemType type, const std::string& label) {
  return start_data(CollKind::kAllGather, buf, block, type, label);
}

EngineComm::Pending EngineComm::start_reduce_scatter_sum(void* buf, size_t block, ElemType type,
                                                         const std::string& label) {
  return start_data(CollKind::kReduceScatter, buf, block, type, label);
}

void EngineComm::all_gather(void* buf, size_t block, ElemType type, const std::string& label) {
  Pending p = start_all_gather(buf, block, type, label);
  wait(p);
}

void EngineComm::reduce_scatter_sum(void* buf, size_t block, ElemType type, const std::string& label) {
  Pending p = start_reduce_scatter_sum(buf, block, type, label);
  wait(p);
}

void EngineComm::all_reduce_sum(void* buf, size_t n_elems, ElemType type, const std::string& label) {
  const size_t n = static_cast<size_t>(size());
  if (n_elems % n != 0) fail(ZERO_ERR_INTERNAL, label + ": all_reduce_sum of a length not divisible by the ranks");
  const size_t block = n_elems / n;
  const uint64_t bytes = n_elems * elem_size(type);
  // Ring all-reduce: a reduce-scatter and an all-gather, each sending (N-1)/N of the buffer. Rounded down.
  count(Counter::kAllReduce, bytes, 2 * bytes * (n - 1) / n);
  run(collective(CollKind::kReduceScatter, buf, block, type, label + " (reduce-scatter half)"), Counter::kNone, 0, 0);
  run(collective(CollKind::kAllGather, buf, block, type, label + " (all-gather half)"), Counter::kNone, 0, 0);
}

void EngineComm::broadcast(void* buf, size_t n_elems, ElemType type, int root, const std::string& label,
                           bool host_memory) {
  const uint64_t n = size(), bytes = n_elems * elem_size(type);
  Collective c = collective(CollKind::kBroadcast, buf, n_elems, type, label);
  c.root = root;
  c.host_memory = host_memory;
  run(std::move(c), Counter::kBroadcast, bytes, bytes * (n - 1) / n);
}

void EngineComm::run_small(Collective c, size_t total_bytes, Counter counter, uint64_t bytes, uint64_t wire_bytes) {
  void* const caller = c.buf;
  if (control_staging_bytes_ < total_bytes || control_staging_ == nullptr) {
    control_staging_.reset(new char[std::max<size_t>(total_bytes, 64)]);
    control_staging_bytes_ = std::max<size_t>(total_bytes, 64);
  }
  if (total_bytes != 0) std::memcpy(control_staging_.get(), caller, total_bytes);
  c.buf = control_staging_.get();
  c.control = true;
  try {
    run(std::move(c), counter, bytes, wire_bytes);
  } catch (...) {
    if (abandoned_) keep_forever(std::move(control_staging_)), control_staging_bytes_ = 0;
    throw;
  }
  if (total_bytes != 0) std::memcpy(caller, control_staging_.get(), total_bytes);
}

void EngineComm::control_min(int64_t* values, size_t n, const std::string& label) {
  Collective c = collective(CollKind::kAllReduce, values, n, ElemType::kI64, label);
  c.op = ReduceOp::kMin;
  run_small(std::move(c), n * 8, Counter::kControl, n * 8,
            2 * n * 8 * static_cast<uint64_t>(size() - 1) / static_cast<uint64_t>(size()));
}

void EngineComm::control_all_gather(void* buf, size_t block_bytes, const std::string& label) {
  const uint64_t total = block_bytes * static_cast<uint64_t>(size());
  run_small(collective(CollKind::kAllGather, buf, block_bytes, ElemType::kU8, label), total, Counter::kControl, total,
            block_bytes * static_cast<uint64_t>(size() - 1));
}

void EngineComm::control_broadcast(void* buf, size_t n_bytes, int root, const std::string& label) {
  Collective c = collective(CollKind::kBroadcast, buf, n_bytes, ElemType::kU8, label);
  c.root = root;
  run_small(std::move(c), n_bytes, Counter::kControl, n_bytes,
            n_bytes * static_cast<uint64_t>(size() - 1) / static_cast<uint64_t>(size()));
}

std::string EngineComm::broadcast_text(const std::string& text, int root, const std::string& label) {
  int64_t length = static_cast<int64_t>(text.size());
  control_broadcast(&length, sizeof length, root, label + " (length)");
  std::string out = rank() == root ? text : std::string(static_cast<size_t>(length), '\0');
  if (length > 0) control_broadcast(&out[0], static_cast<size_t>(length), root, label);
  return out;
}

double EngineComm::sum_over_ranks(double local, const std::string& label) {
  // A small fixed buffer covers the common case without allocating; more ranks take the heap.
  double stack[64];
  std::vector<double> heap;
  const size_t n = static_cast<size_t>(size());
  double* all = stack;
  if (n > 64) heap.resize(n), all = heap.data();
  all[rank()] = local;
  // Counted as what it computes, an all-reduce of one fp64 (its bandwidth-optimal cost); it runs as an all-gather
  // of one value per rank so that every rank adds them in rank order.
  count(Counter::kAllReduce, sizeof(double), 2 * sizeof(double) * (n - 1) / n);
  run_small(collective(CollKind::kAllGather, all, sizeof(double), ElemType::kU8, label), n * sizeof(double),
            Counter::kNone, 0, 0);
  double sum = 0.0;
  for (size_t r = 0; r < n; ++r) sum += all[r];
  return sum;
}

}  // namespace zero
