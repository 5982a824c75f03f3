#include "comm/communicator.hpp"

#include "util/error.hpp"

namespace zero {

size_t elem_size(ElemType type) {
  switch (type) {
    case ElemType::kF32:
      return 4;
    case ElemType::kF64:
    case ElemType::kI64:
      return 8;
    case ElemType::kBF16:
    case ElemType::kF16:
      return 2;
    case ElemType::kU8:
      return 1;
  }
  return 0;
}

ElemType elem_type(DType type) { return static_cast<ElemType>(static_cast<int>(type)); }

const char* elem_type_name(ElemType type) {
  switch (type) {
    case ElemType::kF32:
      return "fp32";
    case ElemType::kBF16:
      return "bf16";
    case ElemType::kF16:
      return "fp16";
    case ElemType::kF64:
      return "fp64";
    case ElemType::kI64:
      return "int64";
    case ElemType::kU8:
      return "uint8";
  }
  return "?";
}

const char* coll_kind_name(CollKind kind) {
  switch (kind) {
    case CollKind::kAllGather:
      return "all-gather";
    case CollKind::kReduceScatter:
      return "reduce-scatter";
    case CollKind::kAllReduce:
      return "all-reduce";
    case CollKind::kBroadcast:
      return "broadcast";
  }
  return "?";
}

Request Communicator::start(Collective& c) {
  if (finalized_) fail(ZERO_ERR_INVALID_STATE, "the communicator was finalized (zero_comm_finalize)");
  // abort_started_, not aborted_: no collective starts while the backend is being aborted (an ncclCommAbort).
  if (abort_started_.load()) fail(ZERO_ERR_ABORTED, "the communicator was aborted on this rank: " + abort_reason());
  c.sequence = next_sequence_++;
  return do_start(c);
}

void Communicator::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (abort_started_.load()) return;
    abort_reason_ = reason;  // first: should the copy throw, no abort is left half-started
    abort_started_.store(true);
  }
  struct MarkAborted {  // also when do_abort throws: every later call must fail
    std::atomic<bool>& flag;
    ~MarkAborted() { flag.store(true); }
  } mark{aborted_};
  do_abort(reason);
}

std::string Communicator::abort_reason() const {
  std::lock_guard<std::mutex> lock(abort_mutex_);
  return abort_reason_;
}

void Communicator::finalize() {
  if (finalized_) fail(ZERO_ERR_INVALID_STATE, "zero_comm_finalize: the communicator is already finalized");
  do_finalize();
  finalized_ = true;
}

}  // namespace zero
