// The collectives the engine uses, behind one interface with an MPI and a single-process backend.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dtype.hpp"

namespace zero {

enum class ElemType { kF32, kF64, kI64, kBF16, kF16 };
enum class ReduceOp { kSum, kMin, kMax };

size_t elem_size(ElemType type);
ElemType elem_type(DType type);

class Communicator {
 public:
  virtual ~Communicator() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Ranks of this communicator on this node (they share its cores).
  virtual int local_size() const { return 1; }

  // `buf` holds size() blocks of `block_elems` elements; this rank's block is the input. Afterwards every block
  // holds its owner's data.
  virtual void all_gather_inplace(void* buf, size_t block_elems, ElemType type) = 0;
  // `buf` holds size() blocks of `block_elems` elements (kF32, kBF16 or kF16). Afterwards buf[0, block_elems) holds
  // the element-wise sum over ranks of block rank(), added in rank order 0..N-1 (deterministic whatever the
  // collective; 16-bit values summed in fp32, rounded once); the rest of `buf` is unspecified.
  virtual void reduce_scatter_sum_inplace(void* buf, size_t block_elems, ElemType type) = 0;
  virtual void all_reduce_inplace(void* buf, size_t n_elems, ElemType type, ReduceOp op) = 0;
  virtual void broadcast(void* buf, size_t n_bytes, int root) = 0;

 protected:
  Communicator(int rank, int size) : rank_(rank), size_(size) {}

 private:
  int rank_;
  int size_;
};

}  // namespace zero
