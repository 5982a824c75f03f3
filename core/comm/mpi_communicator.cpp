#include "comm/mpi_communicator.hpp"

#include <mpi.h>

#include <cstring>
#include <mutex>
#include <string>

#include "error.hpp"

namespace zero {
namespace {

// buf holds `n` blocks of `block` elements (rank 0's contribution, rank 1's, ...); block 0 becomes their sum,
// added in rank order. 16-bit values are summed in fp32 and rounded once.
void sum_blocks_in_rank_order(void* buf, size_t block, int n, ElemType type) {
  if (type == ElemType::kF32) {
    float* f = static_cast<float*>(buf);
    for (int k = 1; k < n; ++k) {
      const float* src = f + static_cast<size_t>(k) * block;
      for (size_t i = 0; i < block; ++i) f[i] += src[i];
    }
    return;
  }
  uint16_t* h = static_cast<uint16_t*>(buf);
  const bool bf16 = type == ElemType::kBF16;
  for (size_t i = 0; i < block; ++i) {
    float sum = bf16 ? bf16_to_float(h[i]) : fp16_to_float(h[i]);
    for (int k = 1; k < n; ++k) {
      const uint16_t v = h[static_cast<size_t>(k) * block + i];
      sum += bf16 ? bf16_to_float(v) : fp16_to_float(v);
    }
    h[i] = bf16 ? float_to_bf16_rne(sum) : float_to_fp16_rne(sum);
  }
}

// MPI may be initialised by us or by the caller. When we did it, we finalise it once the last communicator we
// created is gone: MPI cannot be re-initialised, so finalising earlier would break a later zero_comm_create_mpi.
std::mutex g_mpi_mutex;
bool g_we_initialized_mpi = false;
int g_live_mpi_comms = 0;

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(ZERO_ERR_COMM, std::string(what) + " failed: " + std::string(text, len));
}

MPI_Datatype mpi_type(ElemType type) {
  switch (type) {
    case ElemType::kF32:
      return MPI_FLOAT;
    case ElemType::kF64:
      return MPI_DOUBLE;
    case ElemType::kI64:
      return MPI_INT64_T;
    case ElemType::kBF16:
    case ElemType::kF16:
      return MPI_UINT16_T;  // MPI has no 16-bit float types; sums use the ops below
  }
  return MPI_DATATYPE_NULL;
}

// Sums of 16-bit floats for MPI: each addition in fp32, rounded to nearest even.
void sum_bf16(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16_rne(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

void sum_fp16(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_fp16_rne(fp16_to_float(a[i]) + fp16_to_float(b[i]));
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
  }
  return MPI_OP_NULL;
}

int query_rank(MPI_Comm comm) {
  int rank = 0;
  check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  return rank;
}

int query_size(MPI_Comm comm) {
  int size = 0;
  check(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  return size;
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : Communicator(query_rank(comm), query_size(comm)), comm_(comm) {
    check(MPI_Op_create(sum_bf16, 1, &sum_bf16_), "MPI_Op_create");
    check(MPI_Op_create(sum_fp16, 1, &sum_fp16_), "MPI_Op_create");
    MPI_Comm node = MPI_COMM_NULL;
    check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    local_size_ = query_size(node);
    MPI_Comm_free(&node);
  }

  int local_size() const override { return local_size_; }

  ~MpiCommunicator() override {
    std::lock_guard<std::mutex> lock(g_mpi_mutex);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      MPI_Op_free(&sum_bf16_);
      MPI_Op_free(&sum_fp16_);
      MPI_Comm_free(&comm_);
    }
    g_live_mpi_comms -= 1;
    if (g_live_mpi_comms == 0 && g_we_initialized_mpi && !finalized) MPI_Finalize();
  }

 public:
  void all_gather_inplace(void* buf, size_t block_elems, ElemType type) override {
    check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, count(block_elems), mpi_type(type), comm_),
          "MPI_Allgather");
  }
  // Deterministic: every rank's contribution to each block is exchanged (an all-to-all moves the same bytes as a
  // ring reduce-scatter), then summed in rank order 0, 1, ..., N-1. MPI's own reductions pick their order by
  // algorithm and message size, so sums of floats would differ in the last bit between an all-reduce and a
  // reduce-scatter; this way every stage sums every element in the same order.
  void reduce_scatter_sum_inplace(void* buf, size_t block_elems, ElemType type) override {
    check(MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, count(block_elems), mpi_type(type), comm_),
          "MPI_Alltoall");
    sum_blocks_in_rank_order(buf, block_elems, size(), type);
  }
  // Sums of floats whose length divides into equal blocks: the deterministic reduce-scatter, then an all-gather.
  // Anything else (the fp64 norm, integer min/max) goes to MPI_Allreduce.
  void all_reduce_inplace(void* buf, size_t n_elems, ElemType type, ReduceOp op) override {
    const bool float_sum =
        op == ReduceOp::kSum && (type == ElemType::kF32 || type == ElemType::kBF16 || type == ElemType::kF16);
    if (float_sum && size() > 1 && n_elems % static_cast<size_t>(size()) == 0) {
      const size_t block = n_elems / static_cast<size_t>(size());
      reduce_scatter_sum_inplace(buf, block, type);
      const size_t bytes = block * elem_size(type);
      char* base = static_cast<char*>(buf);
      if (rank() != 0) std::memcpy(base + rank() * bytes, base, bytes);
      all_gather_inplace(buf, block, type);
      return;
    }
    MPI_Op mop = op == ReduceOp::kSum ? sum_op(type) : mpi_op(op);
    check(MPI_Allreduce(MPI_IN_PLACE, buf, count(n_elems), mpi_type(type), mop, comm_), "MPI_Allreduce");
  }
  void broadcast(void* buf, size_t n_bytes, int root) override {
    check(MPI_Bcast(buf, count(n_bytes), MPI_BYTE, root, comm_), "MPI_Bcast");
  }

 private:
  // MPI counts are int; the engine never sends more than 2^31-1 elements in one call (a unit that large is
  // rejected at finalize), so this only guards the invariant.
  static int count(size_t n) {
    if (n > static_cast<size_t>(INT32_MAX)) fail(ZERO_ERR_UNSUPPORTED, "message of more than 2^31-1 elements");
    return static_cast<int>(n);
  }
  MPI_Op sum_op(ElemType type) const {
    return type == ElemType::kBF16 ? sum_bf16_ : type == ElemType::kF16 ? sum_fp16_ : MPI_SUM;
  }
  MPI_Comm comm_;
  MPI_Op sum_bf16_ = MPI_OP_NULL, sum_fp16_ = MPI_OP_NULL;
  int local_size_ = 1;
};

}  // namespace

std::shared_ptr<Communicator> make_mpi_communicator(int64_t fortran_comm) {
  std::lock_guard<std::mutex> lock(g_mpi_mutex);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) fail(ZERO_ERR_INVALID_STATE, "MPI has already been finalised in this process; it cannot restart");
  if (!initialized) {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    g_we_initialized_mpi = true;
  }
  MPI_Comm user = fortran_comm == -1 ? MPI_COMM_WORLD : MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_comm));
  if (user == MPI_COMM_NULL) fail(ZERO_ERR_INVALID_ARGUMENT, "mpi_comm is MPI_COMM_NULL");
  MPI_Comm dup = MPI_COMM_NULL;
  check(MPI_Comm_dup(user, &dup), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  g_live_mpi_comms += 1;
  try {
    return std::make_shared<MpiCommunicator>(dup);
  } catch (...) {
    g_live_mpi_comms -= 1;
    MPI_Comm_free(&dup);
    throw;
  }
}

}  // namespace zero
