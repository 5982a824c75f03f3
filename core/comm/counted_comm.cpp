#include "comm/counted_comm.hpp"

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
  }
  return 0;
}

ElemType elem_type(DType type) {
  return type == DType::kF32 ? ElemType::kF32 : type == DType::kBF16 ? ElemType::kBF16 : ElemType::kF16;
}

void CountedComm::count(CommKindStats& kind, uint64_t bytes, uint64_t wire_bytes) {
  kind.calls += 1;
  kind.bytes += bytes;
  kind.wire_bytes += wire_bytes;
  stats_.sequence += 1;
}

void CountedComm::all_gather_inplace(void* buf, size_t block_elems, ElemType type) {
  const uint64_t block_bytes = block_elems * elem_size(type), n = size();
  count(stats_.all_gather, block_bytes * n, block_bytes * (n - 1));
  comm_->all_gather_inplace(buf, block_elems, type);
}

void CountedComm::reduce_scatter_sum_inplace(void* buf, size_t block_elems, ElemType type) {
  const uint64_t block_bytes = block_elems * elem_size(type), n = size();
  count(stats_.reduce_scatter, block_bytes * n, block_bytes * (n - 1));
  comm_->reduce_scatter_sum_inplace(buf, block_elems, type);
}

void CountedComm::all_reduce_inplace(void* buf, size_t n_elems, ElemType type, ReduceOp op) {
  const uint64_t bytes = n_elems * elem_size(type), n = size();
  // Ring all-reduce: a reduce-scatter and an all-gather, each sending (N-1)/N of the buffer. Rounded down.
  count(stats_.all_reduce, bytes, 2 * bytes * (n - 1) / n);
  comm_->all_reduce_inplace(buf, n_elems, type, op);
}

void CountedComm::broadcast(void* buf, size_t n_bytes, int root) {
  const uint64_t n = size();
  count(stats_.broadcast, n_bytes, n_bytes * (n - 1) / n);
  comm_->broadcast(buf, n_bytes, root);
}

std::string CountedComm::broadcast_text(const std::string& text, int root) {
  int64_t length = static_cast<int64_t>(text.size());
  broadcast(&length, sizeof(length), root);
  std::string out = rank() == root ? text : std::string(static_cast<size_t>(length), '\0');
  if (length > 0) broadcast(&out[0], static_cast<size_t>(length), root);
  return out;
}

}  // namespace zero
