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
  // A side finalized by its owner under a live engine: refused here, before any collective, so nothing breaks
  // (the other side, the caller's too, stays usable).
  if (state_ != State::kRegistering && comm_.finalized())
    fail(ZERO_ERR_INVALID_STATE,
         "the engine's communicator was finalized (zero_comm_finalize; on a split communicator, either side)");
  if (model_parallel_ != nullptr && model_parallel_->backend().aborted())
    fail(ZERO_ERR_ABORTED, "the engine's model-parallel communicator was aborted on this rank (" +
                               model_parallel_->backend().abort_reason() + ")");
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
  if (model_parallel_ != nullptr) model_parallel_->abort("it failed: " + broken_reason_);
  throw;
}

namespace {

// The calls whose agreement spans the model-parallel group too: those that decide for the whole job (the norm, the
// skip, the settings, the checkpoint). Gathers and gradient buckets stay inside the data-parallel group.
bool spans_model_parallel(CallKind kind) {
  return kind == CallKind::kFinalize || kind == CallKind::kStep || kind == CallKind::kSaveCheckpoint ||
         kind == CallKind::kLoadCheckpoint;
}

// What model-parallel ranks must agree on: the call, its phase or step, for zero_step its micro-steps, and its
// inputs. Sizes of the rank's part of the model (finalize's element count) differ across the group by design, and a
// load's manifests (one per part) do: for a load the parts compare what comes from the one save (shared_check).
CallTag model_parallel_tag(const CallTag& tag) {
  CallTag out{tag.kind, tag.id, 0, tag.check, 0};
  if (tag.kind == CallKind::kStep) out.count = tag.count;
  if (tag.kind == CallKind::kLoadCheckpoint) out.check = tag.shared_check;
  return out;
}

}  // namespace

// Over two groups that form a grid, an agreement in one and then the other reaches every rank of the job: a failure
// on any rank is known to its data-parallel group after the first, and each rank of that group carries it into its
// own model-parallel group in the second, which has a rank of every data-parallel group.
void CallGuard::agree(const CallTag& tag, const Error* local, const EngineComm::ExplainCheck& explain,
                      bool share_status) {
  const bool both = model_parallel_ != nullptr && spans_model_parallel(tag.kind);
  std::unique_ptr<Error> data_parallel_error;
  try {
    comm_.agree(call(), tag, local, explain, share_status);
  } catch (const Divergence& e) {
    broken(e);
  } catch (const Error& e) {
    // Any other error out of the agreement reached every rank before data moved (a rank's failed checks, inputs
    // that differ between ranks): the engine stays usable, unless the exchange itself failed.
    if (comm_.failed()) broken(e);
    if (!both) throw;
    data_parallel_error = std::make_unique<Error>(e);
  }
  if (!both) return;
  try {
    model_parallel_->agree(call(), model_parallel_tag(tag), data_parallel_error.get(), explain, share_status);
  } catch (const Divergence& e) {
    broken(e);
  } catch (const Error& e) {
    if (model_parallel_->failed()) broken(e);
    throw;
  }
}

void CallGuard::abort() {
  // Calls fail from now on, before the backend has heard (as Communicator::start refuses once an abort began); the
  // waits, which must not give up before the backend knows, check the communicator's aborted().
  aborted_.store(true);
  comm_.abort("zero_engine_abort was called on rank " + std::to_string(comm_.rank()));  // the rank, for the others
  if (model_parallel_ != nullptr)
    model_parallel_->abort("zero_engine_abort was called on model-parallel rank " +
                           std::to_string(model_parallel_->rank()));
}

}  // namespace zero
