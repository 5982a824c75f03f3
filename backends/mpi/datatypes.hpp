// zero.h's element types as MPI datatypes and counts.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace zero_mpi {

// MPI counts are int. A larger count is sent as count / block elements of a contiguous type of `block` elements
// (message_blocks.hpp); the type lives as long as the collective (Op) that uses it, on every path. The test build
// of this module (ZERO_TEST_HOOKS) takes a lower limit for unit data (float elements) from the environment variable
// ZERO_TEST_MPI_MAX_COUNT, so that the tests run the blocked path on small messages.
class Count {
 public:
  Count() = default;
  Count(const Count&) = delete;
  Count& operator=(const Count&) = delete;
  Count(Count&& o) noexcept { *this = std::move(o); }
  Count& operator=(Count&& o) noexcept {
    std::swap(n, o.n), std::swap(type, o.type), std::swap(derived, o.derived);
    return *this;
  }
  // MPI allows freeing a type while a request still uses it; after MPI_Finalize nothing may be called.
  ~Count() {
    int finalized = 0;
    if (derived && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Type_free(&type);
  }
  int n = 0;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  bool derived = false;
};

Count mpi_count(uint64_t count, int32_t dtype);

size_t dtype_bytes(int32_t dtype);

}  // namespace zero_mpi
