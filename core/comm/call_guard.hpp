// The engine's life cycle and the rule every collective call of an engine follows (docs/architecture.md,
// "Failure safety"): local checks and allocation first, then the agreement (every rank learns of a failure
// anywhere; ranks about to run different collectives all get ZERO_ERR_MISMATCH), then the data; a failure after
// data started moving leaves the ranks' states apart, so it breaks the engine and aborts the communicator (the
// other ranks' collectives fail promptly, naming this rank). Every part of the engine that communicates goes
// through one CallGuard.
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
  // Throws the error a call in the wrong state gets (aborted, broken, before or after finalize).
  void require(State wanted, const char* call) const;

  // Whether this rank can take part in an agreement at all: not after an abort, a failure after data moved, or
  // zero_comm_finalize (the other ranks learn of those through the communicator).
  bool can_agree() const {
    return !aborted_.load() && state_ != State::kBroken && !comm_.backend().aborted() && !comm_.backend().finalized();
  }
  // The local checks of a collective call, argument and state checks included: a failure is returned, to be
  // shared through the agreement — so that a rank whose call is wrong still tells the others — unless this rank
  // cannot agree (can_agree()), which throws at once.
  template <typename Checks>
  std::unique_ptr<Error> local_checks(const char* call, Checks&& checks) {
    if (!can_agree()) require(State::kReady, call);
    try {
      checks();
    } catch (const Error& e) {
      return std::make_unique<Error>(e);
    } catch (const std::bad_alloc&) {
      return std::make_unique<Error>(ZERO_ERR_OUT_OF_MEMORY, std::string(call) + ": out of memory");
    }
    return nullptr;
  }
  // The agreement before a collective call moves data (EngineComm::agree); a divergence or a communication
  // failure breaks the engine.
  void agree(const char* call, const CallTag& tag, const Error* local, const EngineComm::ExplainCheck& explain = {},
             bool share_status = false);
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

 private:
  EngineComm& comm_;
  State state_ = State::kRegistering;
  std::atomic<bool> aborted_{false};
  std::string broken_reason_;
};

}  // namespace zero
