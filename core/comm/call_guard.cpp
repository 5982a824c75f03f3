#include "comm/call_guard.hpp"

#include <cstring>

namespace zero {

void CallGuard::require(State wanted) const {
  if (aborted_.load()) fail(ZERO_ERR_ABORTED, "zero_engine_abort was called on this engine");
  if (state_ == State::kBroken)
    fail(ZERO_ERR_INVALID_STATE,
         "the engine is unusable after an earlier failure (" + broken_reason_ + "); destroy it");
  if (comm_.backend().aborted())
    fail(ZERO_ERR_ABORTED,
         "the engine's communicator was aborted on this rank (" + comm_.backend().abort_reason() + ")");
  if (state_ == wanted) return;
  if (wanted == State::kRegistering) {
    if (std::strcmp(call(), "zero_engine_finalize") == 0)
      fail(ZERO_ERR_INVALID_STATE, "the engine is already finalized");
    zero::fail(ZERO_ERR_INVALID_STATE, std::string(call()) + " must come before zero_engine_finalize");
  }
  zero::fail(ZERO_ERR_INVALID_STATE, std::string(call()) + " needs zero_engine_finalize first");
}

void CallGuard::broken(const std::exception& e) {
  state_ = State::kBroken;
  broken_reason_ = e.what();
  comm_.abort("it failed: " + broken_reason_);
  throw;
}

void CallGuard::agree(const CallTag& tag, const Error* local, const EngineComm::ExplainCheck& explain,
                      bool share_status) {
  try {
    comm_.agree(call(), tag, local, explain, share_status);
  } catch (const Divergence& e) {
    broken(e);
  } catch (const Error& e) {
    // Any other error out of the agreement reached every rank before data moved (a rank's failed checks, inputs
    // that differ between ranks): the engine stays usable, unless the exchange itself failed.
    if (comm_.failed()) broken(e);
    throw;
  }
}

void CallGuard::abort() {
  // Calls fail from now on, before the backend has heard (as Communicator::start refuses once an abort began); the
  // waits, which must not give up before the backend knows, check the communicator's aborted().
  aborted_.store(true);
  comm_.abort("zero_engine_abort was called on rank " + std::to_string(comm_.rank()));  // the rank, for the others
}

}  // namespace zero
