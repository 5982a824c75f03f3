// The collectives the engine uses, behind one interface with an MPI and a single-process backend.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zero {

enum class ElemType { kF32, kF64, kI64 };
enum class ReduceOp { kSum, kMin, kMax };

size_t elem_size(ElemType type);

class Communicator {
 public:
  virtual ~Communicator() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }

  // `buf` holds size() blocks of `block_elems` floats; this rank's block is the input. Afterwards every block
  // holds its owner's data.
  virtual void all_gather_inplace(float* buf, size_t block_elems) = 0;
  // `buf` holds size() blocks of `block_elems` floats. Afterwards buf[0, block_elems) holds the element-wise sum
  // over ranks of block rank(); the rest of `buf` is unspecified.
  virtual void reduce_scatter_sum_inplace(float* buf, size_t block_elems) = 0;
  virtual void all_reduce_inplace(void* buf, size_t n_elems, ElemType type, ReduceOp op) = 0;
  virtual void broadcast(void* buf, size_t n_bytes, int root) = 0;

 protected:
  Communicator(int rank, int size) : rank_(rank), size_(size) {}

 private:
  int rank_;
  int size_;
};

}  // namespace zero
