// The agreement before every collective call moves data (docs/architecture.md, "Failure safety"), what it says of a
// call, and zero_comm_finalize's agreement.
#include <climits>
#include <cstring>
#include <sstream>

#include "comm/engine_comm.hpp"
#include "config/config.hpp"
#include "util/test_hooks.hpp"

namespace zero {
namespace {

const char* call_name(CallKind kind) {
  switch (kind) {
    case CallKind::kFinalize:
      return "zero_engine_finalize";
    case CallKind::kGather:
      return "zero_gather";
    case CallKind::kReduceBucket:
      return "a gradient bucket reduction (zero_grad_ready or zero_backward_end)";
    case CallKind::kBackwardEnd:
      return "zero_backward_end";
    case CallKind::kStep:
      return "zero_step";
    case CallKind::kSaveCheckpoint:
      return "zero_save_checkpoint";
    case CallKind::kLoadCheckpoint:
      return "zero_load_checkpoint";
    case CallKind::kCommFinalize:
      return "zero_comm_finalize";
    case CallKind::kPrefetch:
      return "zero_prefetch";
    case CallKind::kReleaseModified:
      return "zero_release_modified";
    case CallKind::kCommCreate:
      return "zero_comm_create_nccl";
  }
  return "an unknown call";
}

}  // namespace

std::string describe_call(const CallTag& tag) {
  std::ostringstream os;
  os << call_name(tag.kind);
  switch (tag.kind) {
    case CallKind::kGather:
      os << " of unit " << tag.id << " (" << tag.count << " elements)";
      break;
    case CallKind::kPrefetch:
      os << " of unit " << tag.id << (tag.count ? " (starts an all-gather)" : " (already fetched ahead)");
      break;
    case CallKind::kReleaseModified:
      os << " of unit " << tag.id << " (" << tag.count << " bytes)";
      break;
    case CallKind::kReduceBucket:
      if (tag.id < 0)
        os << ": bucket " << -tag.id - 1 << " again, for gradients that came after its reduction (" << tag.count
           << " elements)";
      else
        os << ": bucket " << tag.id << " (" << tag.count << " elements)";
      break;
    case CallKind::kBackwardEnd:
      os << " ending micro-step " << tag.id;
      break;
    case CallKind::kStep:
      os << " for optimizer step " << tag.id << " after " << tag.count << " micro-steps";
      break;
    case CallKind::kSaveCheckpoint:
    case CallKind::kLoadCheckpoint:
      os << " (phase " << tag.id << ")";
      break;
    default:
      break;
  }
  return os.str();
}

void finalize_communicator(const std::shared_ptr<Communicator>& comm) {
  const char* call = "zero_comm_finalize";
  if (comm->finalized()) fail(ZERO_ERR_INVALID_STATE, "zero_comm_finalize: the communicator is already finalized");
  if (comm->control_side().finalized())
    fail(ZERO_ERR_INVALID_STATE, "zero_comm_finalize: the split communicator's control side is already finalized");
  std::unique_ptr<Error> local = capture_error(call, [&] { test_hooks::maybe_fail("comm_finalize", comm->rank()); });
  EngineComm agreement(comm);
  agreement.set_timeout(timeout_from_environment(agreement.timeout()));
  try {
    agreement.agree(call, CallTag{CallKind::kCommFinalize, 0, 0, 0}, local.get());
  } catch (const Error& e) {
    // A failed exchange leaves the ranks' collective sequences apart: the communicator cannot be used again.
    if (agreement.failed()) comm->abort("zero_comm_finalize failed: " + std::string(e.what()));
    throw;
  }
  comm->finalize();
}

// The exchange: one all-reduce (MIN) of [failed rank, then each compared field and its negation], so one call
// yields the minimum and the maximum of every field. Equal minimum and maximum means every rank agrees.
void EngineComm::agree(const std::string& call, const CallTag& tag, const Error* local_error,
                       const ExplainCheck& explain_check, bool share_status) {
  enum {
    kFailed,
    kSeq,
    kSeqNeg,
    kDataSeq,
    kDataSeqNeg,
    kKind,
    kKindNeg,
    kId,
    kIdNeg,
    kCount,
    kCountNeg,
    kCheck,
    kCheckNeg,
    kN
  };
  // Both sides' positions: a rank that issued a data collective the others did not is caught here, not by a
  // mismatched NCCL operation (a split communicator numbers each side apart; a plain one is both, its data position
  // then 0 everywhere).
  Communicator& control = comm_->control_side();
  Communicator& data = comm_->data_side();
  const int64_t sequence = static_cast<int64_t>(control.issued() + 1);
  const int64_t data_sequence = &data == &control ? 0 : static_cast<int64_t>(data.issued());
  int64_t v[kN];
  v[kFailed] = local_error != nullptr ? rank() : INT64_MAX;
  v[kSeq] = sequence, v[kSeqNeg] = -sequence;
  v[kDataSeq] = data_sequence, v[kDataSeqNeg] = -data_sequence;
  v[kKind] = static_cast<int64_t>(tag.kind), v[kKindNeg] = -v[kKind];
  v[kId] = tag.id, v[kIdNeg] = -tag.id;
  v[kCount] = tag.count, v[kCountNeg] = -tag.count;
  v[kCheck] = tag.check, v[kCheckNeg] = -tag.check;
  control_min(v, kN, std::string(call) + ": agreement before moving data");

  if (v[kFailed] != INT64_MAX) {
    const int root = static_cast<int>(v[kFailed]);
    // Its status and which call it was in (the others may have reached this agreement from another call).
    int64_t status_and_kind[2] = {local_error != nullptr ? local_error->status() : 0, static_cast<int64_t>(tag.kind)};
    control_broadcast(status_and_kind, sizeof status_and_kind, root, std::string(call) + ": the failed rank's status");
    const std::string message =
        broadcast_text(local_error != nullptr ? local_error->what() : "", root, std::string(call) + ": its message");
    if (local_error != nullptr) throw *local_error;
    const zero_status_t status = static_cast<zero_status_t>(status_and_kind[0]);
    if (share_status) fail(status, rank_name_ + " " + std::to_string(root) + ": " + message);
    fail(ZERO_ERR_REMOTE, rank_name_ + " " + std::to_string(root) + " failed in " +
                              call_name(static_cast<CallKind>(status_and_kind[1])) + " (" + status_name(status) +
                              "): " + message);
  }
  const bool same_call = v[kSeq] == -v[kSeqNeg] && v[kDataSeq] == -v[kDataSeqNeg] && v[kKind] == -v[kKindNeg] &&
                         v[kId] == -v[kIdNeg] && v[kCount] == -v[kCountNeg];
  if (same_call && v[kCheck] == -v[kCheckNeg]) return;
  if (same_call && explain_check) fail(ZERO_ERR_MISMATCH, explain_check(*this));

  // Which rank calls what: everyone's tag, for one message that every rank prints alike.
  int64_t mine[6] = {sequence, static_cast<int64_t>(tag.kind), tag.id, tag.count, tag.check, data_sequence};
  std::vector<int64_t> all(6 * static_cast<size_t>(size()));
  std::memcpy(all.data() + 6 * rank(), mine, sizeof mine);
  control_all_gather(all.data(), sizeof mine, std::string(call) + ": the ranks' calls, to explain a divergence");
  std::ostringstream os;
  if (same_call)
    os << "the ranks passed different arguments to " << describe_call(tag) << ":";
  else
    os << "ranks diverged: they are not making the same collective call (the program runs different code on "
          "different ranks): ";
  for (int r = 0; r < size(); ++r) {
    const int64_t* t = all.data() + 6 * r;
    CallTag other{static_cast<CallKind>(t[1]), t[2], t[3], t[4]};
    if (same_call) {
      os << (r ? "; " : " ") << rank_name_ << " " << r << " has check value " << t[4];
      continue;
    }
    os << (r ? "; " : "") << rank_name_ << " " << r << " is in " << describe_call(other);
    if (t[0] != sequence) os << " as its collective #" << t[0];
    if (t[5] != data_sequence) os << " after " << t[5] << " data collectives";
  }
  // The same call with different inputs: every rank learns it here, before data moves, and may call again.
  if (same_call) fail(ZERO_ERR_MISMATCH, os.str() + ". Every rank must pass the same values");
  os << ". Every rank must make the same collective calls in the same order; this engine is unusable now";
  throw Divergence(os.str());
}

}  // namespace zero
