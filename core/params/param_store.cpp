#include "params/param_store.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "memory/ops.hpp"
#include "util/error.hpp"
#include "util/log.hpp"
#include "util/test_hooks.hpp"

namespace zero {
namespace {

std::string unit_name(int unit) { return "unit " + std::to_string(unit); }

void allocate_placed(Buffer& b, const Placement& p, const Allocators& allocators, const char* what) {
  if (p.extent == Extent::kNone || p.space == MemorySpace::kNvme) return;  // in the NVMe state's file
  b.allocate(p.space, p.elems, p.dtype, allocators.get(p.space, what));
}

}  // namespace

ParameterStore::~ParameterStore() {
  // A collective given up after a timeout (or a failure while in flight) may still be written by the backend:
  // its buffers must outlive the engine. Leaking them is the price of never crashing.
  if (comm_.abandoned_requests()) {
    leak();
    return;
  }
  // So must the buffers of all-gathers fetched ahead and never completed (an engine destroyed between a step and
  // the next gathers): those, and only those.
  for (const Fetch& f : fetches_) {
    UnitBuffers& ub = units_[f.unit];
    if (ub.ahead != nullptr)
      gathered_pool_.leak_one(ub.ahead);
    else
      ub.params.leak();
  }
}

void ParameterStore::leak() {
  for (auto& ub : units_) {
    ub.params.leak();
    ub.grads.leak();
  }
  gathered_pool_.leak();
}

void ParameterStore::allocate(const std::vector<ParamShape>& params) {
  units_.clear();
  test_hooks::maybe_fail("finalize.alloc", comm_.rank());
  units_.resize(plan_.units.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitPlan& up = plan_.units[u];
    UnitBuffers& ub = units_[u];
    allocate_placed(ub.params, up.params, allocators_, "the params");
    allocate_placed(ub.grads, up.grads, allocators_, "the gradients");
    allocate_placed(ub.master, up.master, allocators_, "the fp32 master");
    for (int s = 0; s < 2; ++s) allocate_placed(ub.state[s], up.state[s], allocators_, "the optimizer state");
    ub.segments = layout_.segments(static_cast<int>(u), up.update_begin, up.update_elems, params);
    ub.norm_segments = layout_.segments(static_cast<int>(u), up.norm_begin, layout_.units[u].shard_elems, params);
  }
  // One gathered unit at a time is the documented footprint; it is allocated now, so that no collective allocates.
  const Placement& g = plan_.gathered;
  if (g.extent != Extent::kNone) {
    gathered_pool_.set_capacity(g.space, g.elems, g.dtype, allocators_.get(g.space, "a gathered unit"));
    gathered_pool_.reserve(1);
  }
  if (plan_.param_offload.enabled) {
    std::vector<size_t> elems;
    for (const UnitPlan& up : plan_.units) elems.push_back(up.params.space == MemorySpace::kNvme ? up.params.elems : 0);
    nvme_params_ = new_state_file(
        "params", param_nvme_dir_,
        io::NvmeState::geometry(elems, 1, plan_.param_offload.buffer_elems, 1, dtype_size(plan_.compute_dtype)),
        "zero_optimization.offload_param.nvme_path", "zero_engine_finalize");
    param_copy_.assign(plan_.param_offload.copy_bytes, 0);
    if (comm_.rank() == 0 && nvme_params_->in_memory_file_system())
      log_message(ZERO_LOG_WARNING, 0,
                  "offload_param to NVMe: nvme_path '" + param_nvme_dir_ +
                      "' is on a file system in memory (tmpfs): the offloaded params still take RAM");
  }
  if (plan_.offloaded()) {
    nvme_ = new_offload_state("zero_engine_finalize");
    warn_about_offload();
  }
}

// What makes an offload pointless is said once, by rank 0: a window that holds the whole state (a DeepSpeed-sized
// sub_group_size) saves no host memory, and a file system in RAM saves none either.
void ParameterStore::warn_about_offload() const {
  if (comm_.rank() != 0 || nvme_ == nullptr) return;
  const io::NvmeState::Geometry& g = nvme_->geometry();
  if (g.staging_bytes() >= g.file_bytes() && g.file_bytes() >= (uint64_t{64} << 20))
    log_message(ZERO_LOG_WARNING, 0,
                "offload_optimizer to NVMe: chunks of " + std::to_string(g.chunk_elems) +
                    " elements (zero_optimization.sub_group_size) make the window hold the whole state (" +
                    std::to_string(g.file_bytes()) +
                    " bytes): nothing is saved in host memory; a smaller sub_group_size bounds it");
  if (nvme_->in_memory_file_system())
    log_message(ZERO_LOG_WARNING, 0,
                "offload_optimizer to NVMe: nvme_path '" + nvme_dir_ +
                    "' is on a file system in memory (tmpfs): the offloaded state still takes RAM");
}

void ParameterStore::check_offload_files() {
  if (nvme_params_ != nullptr) nvme_params_->notice_deletion();
}

namespace {

// nvme_path and its parents, as DeepSpeed's swapper makes its folder (os.makedirs).
void make_directories(const std::string& dir) {
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    const std::string part = dir.substr(0, slash);
    if (!part.empty() && ::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
      fail(ZERO_ERR_IO, "cannot create the directory '" + part + "': " + std::strerror(errno));
    if (slash == std::string::npos) break;
  }
}

}  // namespace

// A name no other state of this job, or of another job sharing the directory (another node, another container
// whose process has the same id), uses: host name, process id, a counter and a random token, created with O_EXCL
// so that a collision is a retry, never a state file truncated under its engine.
std::unique_ptr<io::NvmeState> ParameterStore::new_offload_state(const char* call) const {
  std::vector<size_t> elems;
  for (const UnitPlan& up : plan_.units) elems.push_back(up.update_elems);
  const OffloadPlan& o = plan_.offload;
  return new_state_file("optimizer", nvme_dir_, io::NvmeState::geometry(elems, o.arrays, o.chunk_elems, o.buffers),
                        "zero_optimization.offload_optimizer.nvme_path", call);
}

std::unique_ptr<io::NvmeState> ParameterStore::new_state_file(const char* kind, const std::string& dir,
                                                              const io::NvmeState::Geometry& geometry, const char* key,
                                                              const char* call) const {
  static std::atomic<int> states{0};
  char host[64] = "host";
  ::gethostname(host, sizeof host - 1);
  std::random_device random;
  for (int attempt = 0;; ++attempt) {
    char token[16];
    std::snprintf(token, sizeof token, "%08x", static_cast<unsigned>(random()));
    const std::string name = std::string("libzero-") + kind + ".rank" + std::to_string(comm_.rank()) + "." + host +
                             "." + std::to_string(::getpid()) + "." + std::to_string(states.fetch_add(1)) + "." +
                             token + ".swap";
    try {
      make_directories(dir);
      // An absolute path, so that the file is removed where it is even if the program changes directory.
      char* resolved = ::realpath(dir.c_str(), nullptr);
      const std::string absolute = resolved != nullptr ? resolved : dir;
      std::free(resolved);
      return std::make_unique<io::NvmeState>(absolute, name, geometry, aio_, comm_.rank());
    } catch (const Error& e) {
      const bool exists = std::string(e.what()).find("(errno " + std::to_string(EEXIST) + ")") != std::string::npos;
      if (exists && attempt < 3) continue;
      bool full = false;  // no space, a quota, a file-size limit: a disk that is full as far as this rank can tell
      for (int err : {ENOSPC, EDQUOT, EFBIG})
        full = full || std::string(e.what()).find("(errno " + std::to_string(err) + ")") != std::string::npos;
      fail(e.status(), (call[0] != '\0' ? std::string(call) + ": " : std::string()) + "the " + kind + " file under " +
                           key + ": " + e.what() +
                           (full && nvme_ != nullptr && std::string(kind) == "optimizer"
                                ? " (a checkpoint's load writes a second copy of the state file, which replaces the "
                                  "first when the load completes: it needs room for both)"
                                : ""));
    }
  }
}

void ParameterStore::clear() {
  units_.clear();
  nvme_.reset();
  nvme_params_.reset();
  param_copy_.clear();
  gathered_pool_.clear();
  fetches_.clear();
  order_.clear(), recording_.clear();
  cursor_ = 0, order_lost_ = false, live_elements_ = 0;
}

// Rank 0's initial values reach every rank in fp32, in pieces of at most kInitialValuesChunk elements, so that no
// rank holds more than one extra piece however large a unit is, and the fp32 master starts exact even when the
// params train in bf16 or fp16.
void ParameterStore::load_initial_values(const Registration& registration, DType compute_dtype) {
  std::vector<float> staging;
  try {
    broadcast_initial_values(registration, compute_dtype, staging);
  } catch (...) {
    // A broadcast given up in flight may still write into the staging piece: it must never be freed.
    if (comm_.abandoned_requests()) static_cast<void>(new std::vector<float>(std::move(staging)));
    throw;
  }
}

void ParameterStore::broadcast_initial_values(const Registration& registration, DType compute_dtype,
                                              std::vector<float>& staging) {
  constexpr size_t kInitialValuesChunk = size_t{1} << 24;  // 64 MiB of fp32
  const int rank = comm_.rank();
  std::vector<char> rounded;  // a piece of this rank's shard on its way to the params file (offload_param)
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitLayout& ul = layout_.units[u];
    const UnitPlan& up = plan_.units[u];
    UnitBuffers& ub = units_[u];
    const bool on_nvme = params_offloaded(static_cast<int>(u));
    const ElementOps& ops = element_ops(on_nvme ? MemorySpace::kHost : up.params.space);
    const size_t own = up.sharded_params() ? rank * ul.shard_elems : 0, own_end = own + up.params.elems;
    for (size_t begin = 0; begin < ul.padded_elems; begin += kInitialValuesChunk) {
      const size_t end = std::min(ul.padded_elems, begin + kInitialValuesChunk);
      staging.assign(end - begin, 0.0f);
      if (rank == 0) {
        for (int p : ul.params) {
          const ParamPlacement& pl = layout_.params[p];
          const ParamInit& init = registration.init(p);
          const size_t lo = std::max(begin, pl.offset), hi = std::min(end, pl.offset + pl.numel);
          if (init.data == nullptr || lo >= hi) continue;
          const char* src = static_cast<const char*>(init.data) + (lo - pl.offset) * dtype_size(init.dtype);
          element_ops(MemorySpace::kHost).convert(staging.data() + (lo - begin), DType::kF32, src, init.dtype, hi - lo);
        }
      }
      comm_.broadcast(staging.data(), end - begin, ElemType::kF32, 0,
                      "zero_engine_finalize: rank 0's initial values of unit " + std::to_string(u) +
                          (end - begin < ul.padded_elems ? " from element " + std::to_string(begin) : ""));
      size_t lo = std::max(begin, own), hi = std::min(end, own_end);
      if (lo < hi && on_nvme) {  // this rank's shard goes to the params file
        rounded.resize((hi - lo) * dtype_size(compute_dtype));
        element_ops(MemorySpace::kHost)
            .round_from_f32(rounded.data(), compute_dtype, staging.data() + (lo - begin), hi - lo);
        nvme_params_->write(static_cast<int>(u), 0, lo - own, rounded.data(), hi - lo);
      } else if (lo < hi) {
        ops.round_from_f32(ub.params.at(lo - own), compute_dtype, staging.data() + (lo - begin), hi - lo);
      }
      lo = std::max(begin, up.update_begin), hi = std::min(end, up.update_begin + up.update_elems);
      if (lo < hi && offloaded_master())
        nvme_->write(static_cast<int>(u), master_array(), lo - up.update_begin, staging.data() + (lo - begin), hi - lo);
      else if (!ub.master.empty() && lo < hi)
        copy_bytes(ub.master.space(), ub.master.f32() + (lo - up.update_begin), MemorySpace::kHost,
                   staging.data() + (lo - begin), (hi - lo) * sizeof(float));
    }
  }
}

void ParameterStore::check_unit(int unit, const char* call) const {
  if (unit < 0 || unit >= static_cast<int>(units_.size()))
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": no unit " + std::to_string(unit) + " (units are 0.." +
                                        std::to_string(units_.size()) + "-1)");
}

void ParameterStore::gather(int unit, const char* call) {
  // Units with full params are gathered locally. Where params are sharded, a call with a unit id this rank does
  // not know (or before finalize) is treated as the collective it was meant to be: its failure reaches the
  // others through the agreement.
  const bool known = guard_.ready() && unit >= 0 && unit < static_cast<int>(units_.size());
  if ((known && !plan_.units[unit].sharded_params()) || (!known && !plan_.params_sharded)) {
    guard_.require(CallGuard::State::kReady, call);
    check_unit(unit, call);
    UnitBuffers& ub = units_[unit];
    if (ub.gathered != nullptr)
      fail(ZERO_ERR_INVALID_STATE,
           std::string(call) + ": " + unit_name(unit) + " is already gathered; release it first");
    if (ub.fetching) guard_.moving_data([&] { complete_fetch(unit); });  // its new params, published after the step
    ub.gathered = ub.params.data();
    ub.generation += 1;
    return;
  }
  // Collective from here: every rank reaches the agreement, even one whose call is wrong.
  AheadPlan ahead;
  std::unique_ptr<Error> local = guard_.local_checks(call, [&] {
    guard_.require(CallGuard::State::kReady, call);
    check_unit(unit, call);
    if (units_[unit].gathered != nullptr)
      fail(ZERO_ERR_INVALID_STATE,
           std::string(call) + ": " + unit_name(unit) + " is already gathered; release it first");
    test_hooks::maybe_fail("gather", comm_.rank());
    ahead = plan_ahead(unit);
    // Every buffer this call takes, reserved before the agreement: a collective never allocates.
    const size_t buffers = (units_[unit].ahead == nullptr ? 1 : 0) + ahead.prefetch.size();
    try {
      if (!gathered_pool_.has_free()) test_hooks::maybe_fail("gather.alloc", comm_.rank());
      gathered_pool_.reserve(buffers);
    } catch (const std::bad_alloc&) {
      fail(ZERO_ERR_OUT_OF_MEMORY, std::string(call) + ": out of memory for the gathered " + unit_name(unit) +
                                       (ahead.prefetch.empty() ? std::string(" (more units gathered at once?)")
                                                               : " and " + std::to_string(ahead.prefetch.size()) +
                                                                     " units prefetched after it (lower "
                                                                     "stage3_prefetch_bucket_size?)"));
    }
  });
  const int64_t elems = local ? 0 : static_cast<int64_t>(layout_.units[unit].padded_elems);
  guard_.agree(call, CallTag{CallKind::kGather, unit, elems, 0}, local.get());
  UnitBuffers& ub = units_[unit];
  const size_t shard = layout_.units[unit].shard_elems;
  const DType dtype = plan_.compute_dtype;
  void* buffer = nullptr;
  guard_.moving_data([&] {
    if (ub.ahead != nullptr) {  // prefetched, or kept since its last release: no communication now
      if (ub.fetching) complete_fetch(unit);
      buffer = ub.ahead;
      ub.ahead = nullptr;
      if (ub.held) live_elements_ -= buffer_elems();
      ub.held = false;
    } else {
      buffer = gathered_pool_.acquire();
      put_own_shard(unit, buffer);
      comm_.all_gather(buffer, shard, elem_type(dtype), "zero_gather: all-gather of " + unit_name(unit));
    }
    // The next units of the recorded order start now and move while the framework computes with this one.
    cursor_ = ahead.cursor, order_lost_ = ahead.lost;
    if (recording_.size() < 64 * units_.size() + 64) recording_.push_back(unit);
    ub.keep = ahead.keep;
    if (ub.held) live_elements_ -= buffer_elems();  // a prefetch of it still held: the kept copy replaces it
    ub.held = ahead.keep;
    if (ahead.keep) live_elements_ += buffer_elems();
    for (int v : ahead.prefetch) start_prefetch(v);
  });
  ub.gathered = buffer;
  ub.generation += 1;
}

ParameterStore::AheadPlan ParameterStore::plan_ahead(int unit) const {
  AheadPlan a;
  a.cursor = cursor_;
  a.lost = order_lost_;
  if (policy_.prefetch_elements <= 0 && policy_.max_reuse_distance <= 0) return a;
  // Follow the recorded order: the gathered unit is the next one, or one a little further on (a unit skipped
  // this time); a unit the order does not have ahead means the model took another path: nothing is fetched
  // ahead until the micro-step ends.
  if (!a.lost) {
    auto it =
        std::find(order_.begin() + static_cast<std::ptrdiff_t>(std::min(a.cursor, order_.size())), order_.end(), unit);
    if (it == order_.end())
      a.lost = true;
    else
      a.cursor = static_cast<size_t>(it - order_.begin()) + 1;
  }
  if (a.lost) return a;
  // The budget counts pooled buffers (each holds the largest sharded unit), so that it bounds the memory.
  const uint64_t max_live = static_cast<uint64_t>(policy_.max_live_elements), buffer = buffer_elems();
  uint64_t live = live_elements_ - (units_[unit].held ? buffer : 0);  // taken now: not held any more
  // Reuse: kept at its release when the order gathers it again with fewer than max_reuse_distance elements
  // gathered in between (so 0 keeps nothing and 1 keeps a unit gathered again next, as backward does with the
  // last unit of forward).
  // Ahead of the cursor: the rest of this micro-step's order and, when the next micro-step belongs to the same
  // accumulation window (the params do not change in between), the next one's beginning, up to one whole cycle.
  const size_t n = order_.size(), end = wrap_ ? a.cursor + n : n;
  if (policy_.max_reuse_distance > 0) {
    uint64_t distance = 0;
    for (size_t j = a.cursor; j < end; ++j) {
      const int v = order_[j % n];
      if (v == unit) {
        a.keep = live + buffer <= max_live;
        break;
      }
      distance += unit_elems(v);
      if (distance >= static_cast<uint64_t>(policy_.max_reuse_distance)) break;
    }
    if (a.keep) live += buffer;
  }
  // Prefetch: the units the order gathers next, up to prefetch_bucket_size elements ahead (what is already in
  // flight or held counts), within max_live_parameters.
  if (policy_.prefetch_elements > 0) {
    uint64_t window = 0;
    for (size_t j = a.cursor; j < end && window < static_cast<uint64_t>(policy_.prefetch_elements); ++j) {
      const int v = order_[j % n];
      if (v == unit) continue;  // gathered now: reuse decides
      const UnitBuffers& vb = units_[v];
      window += unit_elems(v);
      if (vb.ahead != nullptr || vb.keep || std::find(a.prefetch.begin(), a.prefetch.end(), v) != a.prefetch.end())
        continue;
      if (live + buffer > max_live) break;
      a.prefetch.push_back(v);
      live += buffer;
    }
  }
  return a;
}

// This rank's shard of a unit's params into its place in a gathered buffer, before the all-gather: from memory, or
// read from the params file (offload_param).
void ParameterStore::put_own_shard(int unit, void* buffer) {
  const size_t shard = layout_.units[unit].shard_elems, esize = dtype_size(plan_.compute_dtype);
  char* own = static_cast<char*>(buffer) + comm_.rank() * shard * esize;
  if (params_offloaded(unit))
    nvme_params_->read(unit, 0, 0, own, shard);
  else
    copy_bytes(gathered_pool_.space(), own, units_[unit].params.space(), units_[unit].params.data(), shard * esize);
}

void ParameterStore::start_prefetch(int unit) {
  UnitBuffers& ub = units_[unit];
  const size_t shard = layout_.units[unit].shard_elems;
  const DType dtype = plan_.compute_dtype;
  void* buffer = gathered_pool_.acquire();
  put_own_shard(unit, buffer);
  Fetch f;
  f.unit = unit;
  f.pending = comm_.start_all_gather(buffer, shard, elem_type(dtype), "prefetch: all-gather of " + unit_name(unit));
  fetches_.push_back(std::move(f));
  ub.ahead = buffer;
  ub.fetching = true;
  if (!ub.held) ub.held = true, live_elements_ += buffer_elems();
}

void ParameterStore::prefetch(int unit, const char* call) {
  const bool known = guard_.ready() && unit >= 0 && unit < static_cast<int>(units_.size());
  if ((known && !plan_.units[unit].sharded_params()) || (!known && !plan_.params_sharded)) {
    guard_.require(CallGuard::State::kReady, call);
    check_unit(unit, call);
    return;  // full params: nothing to fetch
  }
  bool start = false;
  std::unique_ptr<Error> local = guard_.local_checks(call, [&] {
    guard_.require(CallGuard::State::kReady, call);
    check_unit(unit, call);
    test_hooks::maybe_fail("prefetch", comm_.rank());
    // Whether the framework holds the unit gathered now is this rank's own business (zero_release is local), so
    // it does not enter the decision: every rank starts the same collective.
    start = units_[unit].ahead == nullptr && !units_[unit].keep;
    try {
      if (start) gathered_pool_.reserve(1);
    } catch (const std::bad_alloc&) {
      fail(ZERO_ERR_OUT_OF_MEMORY, std::string(call) + ": out of memory for the prefetched " + unit_name(unit));
    }
  });
  guard_.agree(call, CallTag{CallKind::kPrefetch, unit, local ? 0 : static_cast<int64_t>(start), 0}, local.get());
  if (start) guard_.moving_data([&] { start_prefetch(unit); });
}

void ParameterStore::complete_fetch(int unit) {
  while (units_[unit].fetching) {
    Fetch& f = fetches_.front();
    comm_.wait(f.pending);
    units_[f.unit].fetching = false;
    fetches_.pop_front();
  }
}

void ParameterStore::drain(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!fetches_.empty()) {
    const double left = std::chrono::duration<double>(end - std::chrono::steady_clock::now()).count();
    if (!comm_.try_wait(fetches_.front().pending, std::max(0.0, left))) return;  // the rest: leaked at the end
    units_[fetches_.front().unit].fetching = false;
    fetches_.pop_front();
  }
}

void ParameterStore::settle() {
  while (!fetches_.empty()) complete_fetch(fetches_.front().unit);
  for (UnitBuffers& ub : units_) {
    if (ub.ahead != nullptr) gathered_pool_.give_back(ub.ahead);
    ub.ahead = nullptr;
    ub.held = ub.keep = false;
  }
  live_elements_ = 0;
  // Gathers since the last zero_backward_end (an evaluation, a checkpoint's consolidated weights) are no micro-step:
  // the next one starts the recorded order from its beginning, and does not record them.
  recording_.clear();
  cursor_ = 0;
  order_lost_ = false;
}

void ParameterStore::end_micro_step() {
  if (recording_.size() < 64 * units_.size() + 64 && recording_ != order_) order_.swap(recording_);
  recording_.clear();
  cursor_ = 0;
  order_lost_ = false;
}

void ParameterStore::release(int unit, const char* call) {
  guard_.require(CallGuard::State::kReady, call);
  check_unit(unit, call);
  UnitBuffers& ub = units_[unit];
  if (ub.gathered == nullptr)
    fail(ZERO_ERR_INVALID_STATE, std::string(call) + ": " + unit_name(unit) + " is not gathered");
  if (plan_.units[unit].sharded_params()) {
    // Kept for its reuse (decided at its gather), unless a prefetch of it already holds another copy.
    if (ub.keep && ub.ahead == nullptr)
      ub.ahead = ub.gathered;
    else
      gathered_pool_.give_back(ub.gathered);
    ub.keep = false;
  }
  ub.gathered = nullptr;
  ub.generation += 1;
}

int ParameterStore::first_gathered() const {
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].gathered != nullptr) return static_cast<int>(u);
  return -1;
}

UnitInfo ParameterStore::unit_info(int unit) const {
  UnitInfo info;
  const UnitBuffers& ub = units_[unit];
  info.gathered = ub.gathered != nullptr;
  info.generation = ub.generation;
  info.num_params = static_cast<int>(layout_.units[unit].params.size());
  for (int p : layout_.units[unit].params) info.numel += layout_.params[p].numel;
  return info;
}

float* ParameterStore::master(int u) {
  UnitBuffers& ub = units_[u];
  if (offloaded_master()) return nullptr;
  if (plan_.separate_master()) return ub.master.f32();
  return ub.params.f32() + plan_.units[u].update_in_params;
}

void* ParameterStore::copy(int u) {
  if (!plan_.separate_master()) return nullptr;
  if (params_offloaded(u)) return param_copy_.data();  // between begin_copy(u) and end_copy(u)
  return units_[u].params.at(plan_.units[u].update_in_params);
}

void ParameterStore::begin_copy(int u) {
  if (!params_offloaded(u)) return;
  // Zeros where no param is (the padding between params and at the shard's end), as the file has there.
  std::memset(param_copy_.data(), 0, plan_.units[u].params.elems * dtype_size(plan_.compute_dtype));
}

void ParameterStore::end_copy(int u) {
  if (!params_offloaded(u)) return;
  if (test_hooks::active("params.write", comm_.rank()))
    fail(ZERO_ERR_IO, "writing '" + nvme_params_->path() + "': Input/output error (errno 5) (test hook)");
  nvme_params_->write(u, 0, 0, param_copy_.data(), plan_.units[u].params.elems);
}

void ParameterStore::write_params_shard(int u, const void* values) {
  begin_copy(u);
  copy_bytes(params_offloaded(u) ? MemorySpace::kHost : units_[u].params.space(), copy(u), MemorySpace::kHost, values,
             plan_.units[u].update_elems * dtype_size(plan_.compute_dtype));
  end_copy(u);
}

namespace {
constexpr size_t kOffloadPieceElems = size_t{1} << 20;  // 4 MiB of fp32 per piece read from or written to NVMe
}

void ParameterStore::read_shard(int u, int kind, const std::function<void(const void*, size_t bytes)>& sink) {
  const UnitPlan& up = plan_.units[u];
  const size_t offset = up.norm_begin - up.update_begin, n = layout_.units[u].shard_elems;
  const int array = kind < 0 ? master_array() : state_array(kind);
  if (array < 0) {  // in memory
    const float* base = kind < 0 ? master(u) : units_[u].state[kind].f32();
    sink(base + offset, n * sizeof(float));
    return;
  }
  std::vector<float> piece(std::min(n, kOffloadPieceElems));
  for (size_t done = 0; done < n; done += piece.size()) {
    const size_t m = std::min(piece.size(), n - done);
    nvme_->read(u, array, offset + done, piece.data(), m);
    sink(piece.data(), m * sizeof(float));
  }
}

void ParameterStore::write_updated(int u, int kind, const float* values) {
  const size_t n = plan_.units[u].update_elems;
  const int array = kind < 0 ? master_array() : state_array(kind);
  if (array >= 0) {
    nvme_->write(u, array, 0, values, n);
    return;
  }
  UnitBuffers& ub = units_[u];
  if (kind < 0)
    copy_bytes(ub.master.empty() ? ub.params.space() : ub.master.space(), master(u), MemorySpace::kHost, values,
               n * sizeof(float));
  else
    copy_bytes(ub.state[kind].space(), ub.state[kind].f32(), MemorySpace::kHost, values, n * sizeof(float));
}

void ParameterStore::read_params_shard(int u, const std::function<void(const void*, size_t bytes)>& sink) {
  const UnitPlan& up = plan_.units[u];
  const size_t n = layout_.units[u].shard_elems, esize = dtype_size(plan_.compute_dtype);
  if (!params_offloaded(u)) {
    sink(units_[u].params.at(up.sharded_params() ? 0 : up.norm_begin), n * esize);
    return;
  }
  std::vector<char> piece(std::min(n, kOffloadPieceElems) * esize);
  for (size_t done = 0; done < n; done += piece.size() / esize) {
    const size_t m = std::min(piece.size() / esize, n - done);
    nvme_params_->read(u, 0, done, piece.data(), m);
    sink(piece.data(), m * esize);
  }
}

void ParameterStore::clear_grads() {
  for (auto& ub : units_) ub.grads.zero();
}

void ParameterStore::clear_grads_not_updated() {
  for (size_t u = 0; u < units_.size(); ++u) {
    Buffer& g = units_[u].grads;
    const UnitPlan& up = plan_.units[u];
    const size_t begin = up.update_in_grads, end = begin + up.update_elems, esize = dtype_size(g.dtype());
    fill_zero(g.space(), g.data(), begin * esize);
    fill_zero(g.space(), g.at(end), (g.size() - end) * esize);
  }
}

void ParameterStore::write_params_from_master() {
  if (!plan_.separate_master()) return;
  std::vector<float> piece;
  for (size_t u = 0; u < units_.size(); ++u) {
    const int unit = static_cast<int>(u);
    UnitBuffers& ub = units_[u];
    const size_t n = plan_.units[u].update_elems;
    const ElementOps& ops = element_ops(params_offloaded(unit) ? MemorySpace::kHost : ub.params.space());
    begin_copy(unit);
    if (!offloaded_master()) {
      ops.round_from_f32(copy(unit), plan_.compute_dtype, ub.master.f32(), n);
    } else {
      piece.resize(std::min(n, kOffloadPieceElems));
      char* out = static_cast<char*>(copy(unit));
      for (size_t done = 0; done < n; done += piece.size()) {
        const size_t m = std::min(piece.size(), n - done);
        nvme_->read(unit, master_array(), done, piece.data(), m);
        ops.round_from_f32(out + done * dtype_size(plan_.compute_dtype), plan_.compute_dtype, piece.data(), m);
      }
    }
    end_copy(unit);
  }
}

void ParameterStore::publish(const std::string& what) {
  for (size_t u = 0; u < units_.size(); ++u) {
    if (plan_.units[u].publish != Publish::kAllGatherAfterStep) continue;
    if (!policy_.background_publish) {
      comm_.all_gather(units_[u].params.data(), layout_.units[u].shard_elems, elem_type(plan_.compute_dtype),
                       what + " of unit " + std::to_string(u));
      continue;
    }
    Fetch f;
    f.unit = static_cast<int>(u);
    f.pending = comm_.start_all_gather(units_[u].params.data(), layout_.units[u].shard_elems,
                                       elem_type(plan_.compute_dtype), what + " of unit " + std::to_string(u));
    fetches_.push_back(std::move(f));
    units_[u].fetching = true;
  }
}

MemoryStats ParameterStore::memory_stats(size_t buckets_held) const {
  return plan_.bytes(buckets_held, gathered_pool_.buffers());
}

MemoryStats ParameterStore::allocated_bytes(uint64_t bucket_bytes) const {
  MemoryStats s;
  uint64_t device = 0;  // what lives in device memory (a GPU engine's plan); the rest is host memory
  for (const auto& ub : units_) {
    s.param_bytes += ub.params.n_bytes();
    s.grad_bytes += ub.grads.n_bytes();
    s.master_param_bytes += ub.master.n_bytes();
    s.optimizer_state_bytes += ub.state[0].n_bytes() + ub.state[1].n_bytes();
    for (const Buffer* b : {&ub.params, &ub.grads, &ub.master, &ub.state[0], &ub.state[1]}) {
      if (b->space() == MemorySpace::kDevice) device += b->n_bytes();
      if (b->space() == MemorySpace::kPinnedHost) s.pinned_bytes += b->n_bytes();
    }
  }
  s.bucket_bytes = bucket_bytes;
  s.gathered_bytes = gathered_pool_.allocated_bytes();
  if (plan_.bucket.space == MemorySpace::kDevice) device += bucket_bytes;
  if (gathered_pool_.space() == MemorySpace::kDevice) device += s.gathered_bytes;
  s.device_bytes = device;
  s.host_bytes = s.total() - device + param_copy_.size();
  s.staging_bytes = param_copy_.size();
  if (nvme_params_ != nullptr) {  // the offloaded param shards, as the file holds them
    const io::NvmeState::Geometry& g = nvme_params_->geometry();
    for (size_t n : g.unit_elems) s.param_bytes += n * g.elem_size;
    s.staging_bytes += g.staging_bytes();
    s.host_bytes += g.staging_bytes();
    s.nvme_bytes += g.file_bytes();
  }
  if (nvme_ != nullptr) {  // the offloaded kinds, as the file holds them
    const io::NvmeState::Geometry& g = nvme_->geometry();
    uint64_t elems = 0;
    for (size_t n : g.unit_elems) elems += n;
    const int states = g.arrays - (plan_.offload.master ? 1 : 0);
    if (plan_.offload.master) s.master_param_bytes += elems * sizeof(float);
    s.optimizer_state_bytes += elems * sizeof(float) * static_cast<uint64_t>(states);
    s.staging_bytes += g.staging_bytes();
    s.host_bytes += g.staging_bytes();
    s.nvme_bytes += g.file_bytes();
  }
  return s;
}

}  // namespace zero
