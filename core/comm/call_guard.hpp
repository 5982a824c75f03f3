// The engine's life cycle, the C API call it is running, and the rule every collective call follows
// (docs/architecture.md, "Failure safety"): local checks and allocation first, then the agreement (every rank
// learns of a failure anywhere; ranks about to run different collectives all get ZERO_ERR_MISMATCH), then the
// data; a failure after data started moving leaves the ranks' states apart, so it breaks the engine and aborts the
// communicator (the other ranks' collectives fail promptly, naming this rank).
//
// Three objects, one job each:
//   CallGuard       the engine's state (registering, ready, broken, aborted) and its current call;
//   CallScope       one C API call for as long as it runs: its name prefixes the errors and labels the collectives of
//               every part the call goes through, so no part is handed the call's name;
//   CollectiveCall  one collective call's sequence, checks -> agreement -> data, the only way the engine's parts
//               reach an agreement.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "comm/engine_comm.hpp"
#include "util/error.hpp"

namespace zero {

class CallGuard {
 public:
  enum class State { kRegistering, kReady, kBroken };

  explicit CallGuard(EngineComm& comm) : comm_(comm) {}
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;

  State state() const { return state_; }
  bool ready() const { return state_ == State::kReady; }
  void set_ready() { state_ = State::kReady; }

  // The C API call running now (the outermost CallScope), and what names its errors and collectives.
  const char* call() const { return call_ != nullptr ? call_ : "libzero"; }
  std::string label(const std::string& what) const { return std::string(call()) + ": " + what; }
  [[noreturn]] void fail(zero_status_t status, const std::string& detail) const { zero::fail(status, label(detail)); }

  // Throws the error a call in the wrong state gets (aborted, broken, before or after finalize).
  void require(State wanted) const;
  // Whether this rank can take part in an agreement at all: not after an abort, a failure after data moved, or
  // zero_comm_finalize (the other ranks learn of those through the communicator).
  bool can_agree() const {
    auto usable = [](const EngineComm* c) { return c == nullptr || (!c->backend().aborted() && !c->finalized()); };
    return !aborted_.load() && state_ != State::kBroken && usable(&comm_) && usable(model_parallel_);
  }
  // The model-parallel group beside the engine's data-parallel one (zero_engine_set_model_parallel), or null. The
  // agreements of the calls that span it (finalize, zero_step, checkpoints) run over both groups, and a failure
  // after data moved aborts both communicators.
  void set_model_parallel(EngineComm* group) { model_parallel_ = group; }
  EngineComm* model_parallel() const { return model_parallel_; }
  // A failure after data started moving: marks the engine broken, aborts the communicator, rethrows.
  [[noreturn]] void broken(const std::exception& e);
  // Runs `body` (data movement) and breaks the engine if it throws.
  template <typename Body>
  void moving_data(Body&& body) {
    try {
      body();
    } catch (const std::exception& e) {
      broken(e);
    }
  }
  // zero_engine_abort: any thread.
  void abort();
  bool aborted() const { return aborted_.load(); }

  EngineComm& comm() { return comm_; }

 private:
  friend class CallScope;
  friend class CollectiveCall;
  // The agreement (EngineComm::agree); a divergence (ranks in different calls) or a communication failure breaks
  // the engine, every other error leaves it usable.
  void agree(const CallTag& tag, const Error* local, const EngineComm::ExplainCheck& explain, bool share_status);

  EngineComm& comm_;
  EngineComm* model_parallel_ = nullptr;
  State state_ = State::kRegistering;
  std::atomic<bool> aborted_{false};
  std::string broken_reason_;
  mutable const char* call_ = nullptr;  // the outermost CallScope's name (const calls open scopes too)
};

// One C API call on an engine. A call made inside another (a save's gathers of the consolidated weights) keeps the
// outer call's name: the errors are the save's.
class CallScope {
 public:
  CallScope(const CallGuard& guard, const char* name) : guard_(guard), outer_(guard.call_) {
    if (outer_ == nullptr) guard_.call_ = name;
  }
  ~CallScope() { guard_.call_ = outer_; }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  const CallGuard& guard_;
  const char* outer_;
};

// One collective call: check(), as often as the call has local work, then agree(), then move(). A rank whose checks
// fail still takes part in the agreement, so the others return its error instead of waiting for it; a rank that
// cannot agree at all (aborted, broken, finalized) fails at its first check. The agreement throws on every rank if
// any rank failed or the ranks diverged; only then does data move.
class CollectiveCall {
 public:
  CollectiveCall(CallGuard& guard, CallKind kind) : guard_(guard), kind_(kind) {}
  CollectiveCall(const CollectiveCall&) = delete;
  CollectiveCall& operator=(const CollectiveCall&) = delete;

  // Local checks and allocation; what they throw is kept for the agreement (the first failure wins).
  template <typename Checks>
  void check(Checks&& checks) {
    if (!guard_.can_agree()) guard_.require(CallGuard::State::kReady);
    if (local_ != nullptr) return;
    local_ = capture_error(guard_.call(), checks);
  }
  // A failure found outside check() (a phase of a checkpoint that captured it), kept as check() keeps its own.
  void check_failed(std::unique_ptr<Error> error) {
    if (local_ == nullptr) local_ = std::move(error);
  }
  bool failed() const { return local_ != nullptr; }
  // The agreement on which call every rank makes: `id` and `count` as CallTag names them, `check` a digest of
  // inputs that must be equal on every rank (explained by `explain` when they are not). With `share_status` the
  // other ranks report the failed rank's own status (a checkpoint is the same news for every rank). `shared_check`:
  // CallTag's.
  void agree(int64_t id, int64_t count = 0, int64_t check = 0, const EngineComm::ExplainCheck& explain = {},
             bool share_status = false, int64_t shared_check = 0) {
    guard_.agree(CallTag{kind_, id, count, check, shared_check}, local_.get(), explain, share_status);
    agreed_ = true;
  }
  // The data; a failure breaks the engine.
  template <typename Data>
  void move(Data&& data) {
    if (!agreed_) fail(ZERO_ERR_INTERNAL, guard_.label("data would move before the agreement"));
    guard_.moving_data(data);
  }

 private:
  CallGuard& guard_;
  CallKind kind_;
  std::unique_ptr<Error> local_;
  bool agreed_ = false;
};

}  // namespace zero
