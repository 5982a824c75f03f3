#include "device/emulator.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/device_kernels.hpp"
#include "device/access_checker.hpp"
#include "device/emulated_kernels.hpp"
#include "device/emulated_memory.hpp"
#include "device/emulated_stream.hpp"
#include "memory/ops.hpp"
#include "util/error.hpp"

namespace zero {
namespace device {
namespace {

using emulation::as_emulated;
using emulation::Clock;
using emulation::EmulatedEvent;
using emulation::EmulatedStream;
using emulation::LentStream;
using emulation::Progress;

class HostEmulator final : public Emulator {
 public:
  explicit HostEmulator(const EmulatorOptions& options)
      : options_(options), memory_(options.arena_bytes), checker_(options.throw_on_race) {}
  // Queued work uses the emulator's memory and checker: a stream left behind would run it after they are gone.
  ~HostEmulator() override {
    if (live_streams_->load() != 0) {
      std::fprintf(stderr,
                   "libzero: the device emulator was destroyed while %d of its streams still exist "
                   "(destroy every stream, and what holds one, first)\n",
                   live_streams_->load());
      std::abort();
    }
    for (auto& [p, bytes] : pinned_) std::free(p);
  }

  std::string describe() const override { return "the host emulator (a test tool, not a device)"; }
  bool emulated() const override { return true; }
  int ordinal() const override { return 0; }
  std::vector<std::string> races() const override { return checker_.races(); }
  size_t live_device_bytes() const override { return memory_.live_bytes(); }

  std::unique_ptr<Stream> create_stream(const std::string& name) override {
    const size_t actor = checker_.add_actor("stream '" + name + "'");
    auto stream = std::make_unique<EmulatedStream>(
        actor, options_.seed * 0x9e3779b97f4a7c15ull + actor, options_.max_delay_us,
        [this](const std::string& what) { device_failed(what); }, failed_, live_streams_);
    std::lock_guard<std::mutex> lock(mu_);
    if (progress_.size() <= actor) progress_.resize(actor + 1);
    progress_[actor] = stream->progress();
    return stream;
  }

  std::unique_ptr<Stream> external_stream(void* native) override {
    if (native == nullptr)
      fail(ZERO_ERR_INVALID_ARGUMENT, "device emulator: it has no default stream (lend one of the streams it made)");
    return std::make_unique<LentStream>(as_emulated(*static_cast<Stream*>(native)));
  }

  void* native(Stream& stream) override { return &as_emulated(stream); }

  std::unique_ptr<Event> create_event() override { return std::make_unique<EmulatedEvent>(); }

  void record(Event& event, Stream& stream) override {
    check_device();
    EmulatedStream& s = as_emulated(stream);
    auto& e = static_cast<EmulatedEvent&>(event);
    std::lock_guard<std::mutex> issue(s.issue_mutex());
    const uint64_t op = checker_.issue(s.actor());
    e.set({s.progress(), op, checker_.clock(s.actor())});
    s.push(op, [] {});
  }

  void wait(Stream& stream, const Event& event) override {
    check_device();
    const EmulatedEvent::Point e = as_emulated(event).point();
    if (!e.progress) return;
    EmulatedStream& s = as_emulated(stream);
    std::lock_guard<std::mutex> issue(s.issue_mutex());
    const uint64_t op = checker_.issue(s.actor());
    checker_.merge(s.actor(), e.clock);
    s.push(op, [progress = e.progress, target = e.op] { progress->wait(target); });
  }

  bool done(const Event& event) override {
    check_device();
    const EmulatedEvent::Point e = as_emulated(event).point();
    if (!e.progress) return true;
    if (!e.progress->reached(e.op)) return false;
    checker_.merge(AccessChecker::kHost, e.clock);  // the host saw it complete
    return true;
  }

  void synchronize(const Event& event, double timeout_s, const std::string& what) override {
    const EmulatedEvent::Point e = as_emulated(event).point();
    if (e.progress) {
      const auto deadline =
          Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
      if (!e.progress->wait_until(e.op, deadline))
        fail(ZERO_ERR_TIMEOUT, what + " did not complete within " + exact_decimal(timeout_s) +
                                   " s (libzero.timeout_s); the device may have stopped");
      checker_.merge(AccessChecker::kHost, e.clock);
    }
    check_device();
  }

  void* allocate(size_t bytes, Stream& stream) override {
    check_device();
    if (bytes == 0) return nullptr;  // as cudaMallocAsync
    EmulatedStream& s = as_emulated(stream);
    std::lock_guard<std::mutex> issue(s.issue_mutex());
    EmulatedMemory::Block block = memory_.allocate(bytes);
    const size_t size = memory_.allocation_bytes(block.device);
    const uint64_t op = checker_.issue(s.actor());
    // Reused bytes: the stream's work waits for their release, as CUDA's pools order a reuse after the free. The
    // checker does not count that wait as an order the program made (CUDA's pool may as well hand out other
    // memory), so work of the releasing stream stays unordered with this one's unless an event orders it.
    checker_.track(block.device, size,
                   "device allocation #" + std::to_string(++allocations_) + " (" + std::to_string(size) + " bytes)");
    checker_.access(s.actor(), block.device, size, true, "the allocation");
    s.push(op, [this, released = block.released] { wait_for(released); });
    return block.device;
  }

  void release(void* p, Stream& stream) override {
    check_device();
    if (p == nullptr) return;
    const size_t bytes = memory_.allocation_bytes(p);
    if (bytes == 0)
      fail(ZERO_ERR_INVALID_ARGUMENT, "device emulator: release of a pointer that is not a live device allocation");
    EmulatedStream& s = as_emulated(stream);
    std::lock_guard<std::mutex> issue(s.issue_mutex());
    const uint64_t op = checker_.issue(s.actor());
    try {
      checker_.access(s.actor(), p, bytes, true, "the release");
    } catch (...) {
      s.push(op, [] {});
      throw;
    }
    checker_.untrack(p);
    // Poisoned: a float read from released memory is NaN, in every format.
    s.push(op, [shadow = memory_.shadow(p), bytes] { std::memset(shadow, 0xff, bytes); });
    memory_.release(p, checker_.clock(s.actor()));
  }

  void* allocate_pinned(size_t bytes) override {
    check_device();
    const size_t size = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, size);
    if (p == nullptr) throw std::bad_alloc();
    std::lock_guard<std::mutex> lock(mu_);
    pinned_[p] = size;
    checker_.track(
        p, size, "pinned host allocation #" + std::to_string(++allocations_) + " (" + std::to_string(size) + " bytes)");
    return p;
  }

  // The caller orders every use of the memory before the release (an event it waited for): checked as a host write
  // of the whole allocation, so a queued copy still using it is a race, not a use after free.
  void release_pinned(void* p) override {
    if (p == nullptr) return;
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pinned_.find(p);
      if (it == pinned_.end())
        fail(ZERO_ERR_INVALID_ARGUMENT, "device emulator: release_pinned of memory it did not allocate");
      bytes = it->second;
    }
    checker_.issue_host();
    checker_.access(AccessChecker::kHost, p, bytes, true, "releasing pinned memory");
    std::lock_guard<std::mutex> lock(mu_);
    checker_.untrack(p);
    std::free(p);
    pinned_.erase(p);
  }

  void copy(void* dst, const void* src, size_t bytes, Stream& stream) override {
    check_device();
    if (bytes == 0) return;
    if (ranges_overlap(dst, bytes, src, bytes))
      fail(ZERO_ERR_INVALID_ARGUMENT, "device emulator: a copy between overlapping ranges");
    const Side to = side(dst, bytes, "a copy's destination"), from = side(src, bytes, "a copy's source");
    enqueue(
        stream, "a copy of " + std::to_string(bytes) + " bytes", {{src, bytes, false}, {dst, bytes, true}},
        [d = address(to, dst), s = address(from, src), bytes] { std::memcpy(d, s, bytes); },
        to == Side::kPageable     ? HostWait::kOperation
        : from == Side::kPageable ? HostWait::kStreamBefore
                                  : HostWait::kNone);
  }

  void fill_zero(void* p, size_t bytes, Stream& stream) override {
    check_device();
    if (bytes == 0) return;
    const Side where = side(p, bytes, "zeroing");
    if (where == Side::kPageable)  // cudaMemsetAsync refuses it (without unified memory)
      fail(ZERO_ERR_INVALID_ARGUMENT, "device emulator: zeroing pageable host memory on a stream");
    enqueue(stream, "zeroing " + std::to_string(bytes) + " bytes", {{p, bytes, true}},
            [d = address(where, p), bytes] { std::memset(d, 0, bytes); });
  }

  void step(OptimizerKind kind, DType grad, CopyMode copy_mode, const cuda::LaunchTable& table,
            const KernelArgs* host_segments, size_t count, const KernelArgs* segments, const cuda::StepChunk* chunks,
            Stream& stream) override;
  void sum_squares(DType grad, const void* grads, size_t n, double* scratch, double* result, Stream& stream) override;
  void narrow(DType to, void* dst, const float* src, size_t n, Stream& stream) override;
  void widen(DType from, float* dst, const void* src, size_t n, Stream& stream) override;
  void accumulate(DType from, float* acc, const void* src, size_t n, bool into_zero, Stream& stream) override;

  void fail_here(Stream& stream, const std::string& what) override {
    enqueue(stream, "a planted fault", {}, [what] { fail(ZERO_ERR_INTERNAL, what); });
  }

  void stall_here(Stream& stream) override {
    {
      std::lock_guard<std::mutex> lock(stall_mu_);
      stalled_ = true;
    }
    enqueue(stream, "a planted stall", {}, [this] {
      std::unique_lock<std::mutex> lock(stall_mu_);
      stall_cv_.wait_for(lock, std::chrono::seconds(300), [&] { return !stalled_; });
    });
  }

  void resume() override {
    {
      std::lock_guard<std::mutex> lock(stall_mu_);
      stalled_ = false;
    }
    stall_cv_.notify_all();
  }

  bool device_memory(const void* p, size_t bytes) override {
    return memory_.in_arena(p) && (bytes == 0 || memory_.in_arena(static_cast<const char*>(p) + bytes - 1));
  }
  void host_access(const void* p, size_t bytes, bool write) override {
    checker_.issue_host();
    checker_.access(AccessChecker::kHost, p, bytes, write, write ? "a host write" : "a host read");
  }

 private:
  enum class Side { kDevice, kPinned, kPageable };
  struct Use {
    const void* p;
    size_t bytes;
    bool write;
  };

  Side side(const void* p, size_t bytes, const char* what) {
    if (memory_.in_arena(p)) {
      memory_.require_live(p, bytes, what);
      return Side::kDevice;
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pinned_.upper_bound(const_cast<void*>(p));
    if (it != pinned_.begin()) {
      --it;
      const auto a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(it->first);
      if (a < base + it->second) {
        if (a + bytes > base + it->second)
          fail(ZERO_ERR_INTERNAL, std::string("device emulator: ") + what + " runs past its pinned allocation");
        return Side::kPinned;
      }
    }
    return Side::kPageable;
  }
  void* address(Side where, const void* p) const {
    return where == Side::kDevice ? memory_.shadow(p) : const_cast<void*>(p);
  }
  // A kernel's pointer: device memory, live for `bytes`.
  void* kernel_address(const void* p, size_t bytes, const char* what) {
    if (bytes == 0) return nullptr;
    if (!memory_.in_arena(p))
      fail(ZERO_ERR_INVALID_ARGUMENT, std::string("device emulator: ") + what +
                                          " is not device memory (a kernel reads and writes device memory only)");
    memory_.require_live(p, bytes, what);
    return memory_.shadow(p);
  }

  // What the host learns when a copy with pageable host memory returns, as CUDA's: from pageable memory, the
  // stream's earlier work is done and the source was read (the copy into place may still be running); into
  // pageable memory, the copy itself is done.
  enum class HostWait { kNone, kStreamBefore, kOperation };

  // Numbers the operation on `stream`, checks its uses, queues `work`. A failed check still queues the number (as
  // nothing), so that the stream's count and its queue stay in step and nothing waits for an operation that never
  // runs.
  void enqueue(Stream& stream, const std::string& what, const std::vector<Use>& uses, std::function<void()> work,
               HostWait host_wait = HostWait::kNone) {
    EmulatedStream& s = as_emulated(stream);
    uint64_t op = 0;
    VectorClock before, after;
    {
      std::lock_guard<std::mutex> issue(s.issue_mutex());
      before = checker_.clock(s.actor());
      op = checker_.issue(s.actor());
      try {
        for (const Use& u : uses) checker_.access(s.actor(), u.p, u.bytes, u.write, what);
      } catch (...) {
        s.push(op, [] {});
        throw;
      }
      after = checker_.clock(s.actor());
      s.push(op, std::move(work));
    }
    if (host_wait == HostWait::kNone) return;
    s.progress()->wait(op);
    checker_.merge(AccessChecker::kHost, host_wait == HostWait::kOperation ? after : before);
    check_device();
  }

  // In a stream's worker: waits until every stream has run as far as `clock` says.
  void wait_for(const VectorClock& clock) {
    std::vector<std::shared_ptr<Progress>> progress;
    {
      std::lock_guard<std::mutex> lock(mu_);
      progress = progress_;
    }
    for (size_t actor = 1; actor < clock.size() && actor < progress.size(); ++actor)
      if (clock.at(actor) > 0 && progress[actor]) progress[actor]->wait(clock.at(actor));
  }
  // The host waits for everything queued so far on every stream.
  void drain() {
    std::vector<std::shared_ptr<Progress>> progress;
    {
      std::lock_guard<std::mutex> lock(mu_);
      progress = progress_;
    }
    for (size_t actor = 1; actor < progress.size(); ++actor) {
      if (!progress[actor]) continue;
      const VectorClock c = checker_.clock(actor);
      progress[actor]->wait(c.at(actor));
      checker_.merge(AccessChecker::kHost, c);
    }
  }

  void device_failed(const std::string& what) {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (error_.empty()) error_ = what;
    failed_->store(true);
  }
  // CUDA's errors are sticky: once a kernel failed, every later call reports it.
  void check_device() {
    if (!failed_->load()) return;
    std::lock_guard<std::mutex> lock(error_mu_);
    fail(ZERO_ERR_INTERNAL, "the device (emulated) failed earlier: " + error_);
  }

  const EmulatorOptions options_;
  EmulatedMemory memory_;
  AccessChecker checker_;
  std::mutex mu_;
  std::vector<std::shared_ptr<Progress>> progress_;  // by actor
  std::map<void*, size_t> pinned_;
  std::atomic<uint64_t> allocations_{0};
  std::mutex error_mu_;
  std::string error_;
  std::shared_ptr<std::atomic<bool>> failed_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<std::atomic<int>> live_streams_ = std::make_shared<std::atomic<int>>(0);
  std::mutex stall_mu_;
  std::condition_variable stall_cv_;
  bool stalled_ = false;
};

void require_16bit(DType d, const char* what) {
  if (d == DType::kF32) fail(ZERO_ERR_INVALID_ARGUMENT, std::string(what) + " takes a 16-bit dtype (bf16 or fp16)");
}

void HostEmulator::step(OptimizerKind kind, DType grad, CopyMode copy_mode, const cuda::LaunchTable& table,
                        const KernelArgs* host_segments, size_t count, const KernelArgs* segments,
                        const cuda::StepChunk* chunks, Stream& stream) {
  check_device();
  if (table.chunks.empty()) return;
  const size_t gsize = dtype_size(grad);
  kernel_address(segments, count * sizeof(KernelArgs), "the step's segment table");
  kernel_address(chunks, table.chunks.size() * sizeof(cuda::StepChunk), "the step's chunk table");
  std::vector<Use> uses{{segments, count * sizeof(KernelArgs), false},
                        {chunks, table.chunks.size() * sizeof(cuda::StepChunk), false}};
  for (size_t i = 0; i < count; ++i) {
    const KernelArgs& a = host_segments[i];
    if (a.n == 0) continue;
    if (a.block_sums != nullptr || a.clear_grad)
      fail(ZERO_ERR_INVALID_ARGUMENT,
           "a device step takes no block sums and no clearing (the norm and the zeroing "
           "are their own launches)");
    if (a.grad_elem_size != gsize) fail(ZERO_ERR_INVALID_ARGUMENT, "a device step segment's gradient size differs");
    kernel_address(a.master, a.n * 4, "a step segment's master");
    kernel_address(a.grad, a.n * gsize, "a step segment's gradients");
    uses.push_back({a.master, a.n * 4, true});
    uses.push_back({a.grad, a.n * gsize, false});
    if (a.state0)
      kernel_address(a.state0, a.n * 4, "a step segment's state"), uses.push_back({a.state0, a.n * 4, true});
    if (a.state1)
      kernel_address(a.state1, a.n * 4, "a step segment's state"), uses.push_back({a.state1, a.n * 4, true});
    if (copy_mode != CopyMode::kNone)
      kernel_address(a.copy, a.n * 2, "a step segment's params"), uses.push_back({a.copy, a.n * 2, true});
  }
  std::vector<KernelArgs> planned(host_segments, host_segments + count);
  enqueue(stream, "the optimizer step", uses,
          [this, kind, grad, copy_mode, table, planned = std::move(planned), segments, chunks] {
            const auto* on_device = static_cast<const KernelArgs*>(memory_.shadow(segments));
            for (size_t i = 0; i < planned.size(); ++i) {
              const KernelArgs &a = on_device[i], &b = planned[i];
              if (a.master != b.master || a.grad != b.grad || a.state0 != b.state0 || a.state1 != b.state1 ||
                  a.copy != b.copy || a.n != b.n || a.first_index != b.first_index)
                fail(ZERO_ERR_INTERNAL,
                     "the step's segment table on the device is not the one its launch table was "
                     "planned from (segment " +
                         std::to_string(i) + ")");
            }
            emulated::step(kind, grad, copy_mode, table, on_device,
                           static_cast<const cuda::StepChunk*>(memory_.shadow(chunks)),
                           [this](const void* p) { return memory_.shadow(p); });
          });
}

void HostEmulator::sum_squares(DType grad, const void* grads, size_t n, double* scratch, double* result,
                               Stream& stream) {
  check_device();
  const size_t gbytes = n * dtype_size(grad), sbytes = cuda::sum_squares_scratch_doubles(n) * sizeof(double);
  void* g = kernel_address(grads, gbytes, "the norm's gradients");
  void* sc = kernel_address(scratch, sbytes, "the norm's scratch");
  void* r = kernel_address(result, sizeof(double), "the norm's result");
  enqueue(
      stream, "the sum of squares", {{grads, gbytes, false}, {scratch, sbytes, true}, {result, sizeof(double), true}},
      [grad, g, n, sc, r] { emulated::sum_squares(grad, g, n, static_cast<double*>(sc), static_cast<double*>(r)); });
}

void HostEmulator::narrow(DType to, void* dst, const float* src, size_t n, Stream& stream) {
  check_device();
  require_16bit(to, "narrow");
  if (ranges_overlap(dst, 2 * n, src, 4 * n))
    fail(ZERO_ERR_INVALID_ARGUMENT, "narrow: on the device, source and destination must not overlap");
  if (n == 0) return;
  void* d = kernel_address(dst, 2 * n, "narrow's destination");
  void* s = kernel_address(src, 4 * n, "narrow's source");
  enqueue(stream, "narrowing to " + std::string(dtype_name(to)), {{src, 4 * n, false}, {dst, 2 * n, true}},
          [to, d, s, n] { emulated::narrow(to, d, static_cast<const float*>(s), n); });
}

void HostEmulator::widen(DType from, float* dst, const void* src, size_t n, Stream& stream) {
  check_device();
  require_16bit(from, "widen");
  if (ranges_overlap(dst, 4 * n, src, 2 * n))
    fail(ZERO_ERR_INVALID_ARGUMENT, "widen: on the device, source and destination must not overlap");
  if (n == 0) return;
  void* d = kernel_address(dst, 4 * n, "widen's destination");
  void* s = kernel_address(src, 2 * n, "widen's source");
  enqueue(stream, "widening from " + std::string(dtype_name(from)), {{src, 2 * n, false}, {dst, 4 * n, true}},
          [from, d, s, n] { emulated::widen(from, static_cast<float*>(d), s, n); });
}

void HostEmulator::accumulate(DType from, float* acc, const void* src, size_t n, bool into_zero, Stream& stream) {
  check_device();
  const size_t sbytes = n * dtype_size(from);
  if (ranges_overlap(acc, 4 * n, src, sbytes))
    fail(ZERO_ERR_INVALID_ARGUMENT, "accumulate: on the device, source and destination must not overlap");
  if (n == 0) return;
  void* a = kernel_address(acc, 4 * n, "an accumulation's destination");
  void* s = kernel_address(src, sbytes, "an accumulation's source");
  enqueue(stream, "an accumulation", {{src, sbytes, false}, {acc, 4 * n, true}},
          [from, a, s, n, into_zero] { emulated::accumulate(from, static_cast<float*>(a), s, n, into_zero); });
}

}  // namespace

std::unique_ptr<Emulator> make_emulator(const EmulatorOptions& options) {
  return std::make_unique<HostEmulator>(options);
}

}  // namespace device
}  // namespace zero
