#include "datatypes.hpp"

#include <climits>
#include <cstdlib>
#include <string>

#include "failure.hpp"
#include "message_blocks.hpp"
#include "zero/zero.h"

namespace zero_mpi {
namespace {

MPI_Datatype base_type(int32_t dtype) {
  switch (dtype) {
    case ZERO_DTYPE_FP32:
      return MPI_FLOAT;
    case ZERO_DTYPE_FP64:
      return MPI_DOUBLE;
    case ZERO_DTYPE_INT64:
      return MPI_INT64_T;
    case ZERO_DTYPE_BF16:
    case ZERO_DTYPE_FP16:
      return MPI_UINT16_T;  // moved as bits; sums happen in sum_blocks_in_rank_order
    case ZERO_DTYPE_UINT8:
      return MPI_BYTE;
    default:
      fail(ZERO_ERR_INVALID_ARGUMENT, "unknown dtype " + std::to_string(dtype));
  }
}

uint64_t max_count(int32_t dtype) {
#ifdef ZERO_TEST_HOOKS
  static const uint64_t limit = [] {
    const char* env = std::getenv("ZERO_TEST_MPI_MAX_COUNT");
    return env != nullptr && env[0] != '\0' ? std::strtoull(env, nullptr, 10) : uint64_t{INT_MAX};
  }();
  if (dtype == ZERO_DTYPE_FP32 || dtype == ZERO_DTYPE_BF16 || dtype == ZERO_DTYPE_FP16) return limit;
#endif
  (void)dtype;
  return INT_MAX;
}

}  // namespace

Count mpi_count(uint64_t count, int32_t dtype) {
  Count c;
  c.type = base_type(dtype);
  const uint64_t block = zero::message_block(count, max_count(dtype));
  if (block == 0 || block > uint64_t{INT_MAX})
    fail(ZERO_ERR_UNSUPPORTED, "a message of " + std::to_string(count) +
                                   " elements has no power-of-two factor that brings it under MPI's int count");
  c.n = static_cast<int>(count / block);
  if (block > 1) {
    MPI_Datatype t;
    check(MPI_Type_contiguous(static_cast<int>(block), c.type, &t), "MPI_Type_contiguous");
    if (MPI_Type_commit(&t) != MPI_SUCCESS) {
      MPI_Type_free(&t);
      fail(ZERO_ERR_COMM, "MPI_Type_commit failed for a block of " + std::to_string(block) + " elements");
    }
    c.type = t;
    c.derived = true;
  }
  return c;
}

size_t dtype_bytes(int32_t dtype) {
  switch (dtype) {
    case ZERO_DTYPE_FP32:
      return 4;
    case ZERO_DTYPE_FP64:
    case ZERO_DTYPE_INT64:
      return 8;
    case ZERO_DTYPE_BF16:
    case ZERO_DTYPE_FP16:
      return 2;
    default:
      return 1;
  }
}

}  // namespace zero_mpi
