// Where every parameter element lives: flat per-unit buffers, their partition into equal rank shards, and the
// gradient buckets. Pure arithmetic on the registration, shared by every stage (stages differ only in which
// buffers they keep resident), and unit-tested on its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "numeric/dtype.hpp"

namespace zero {

// Each param starts at a multiple of this many elements inside its unit (Megatron's 64-element alignment).
constexpr size_t kParamAlignElems = 64;
// Each rank's shard is a multiple of this many elements (a 64-byte cache line of fp32, one AVX-512 vector).
constexpr size_t kShardAlignElems = 16;
// Every unit message is one shard per rank. A shard above this many elements (MPI's int count) is padded to a
// multiple of a power of two B small enough that shard / B fits, so that such backends can send it as shard / B
// blocks of B elements (backends/mpi). The padding is below B elements per rank: under 2^-30 of the shard.
constexpr size_t kMaxMessageElems = 2147483647;
// The most elements of one param, one unit and the whole model: byte counts (up to 8 bytes per element) and index
// arithmetic stay far from 2^64.
constexpr uint64_t kMaxModelElems = uint64_t{1} << 56;

// A frozen param's bytes start at a multiple of this inside its unit's frozen bytes, and each rank's shard of them is
// a multiple of it (a cache line).
constexpr size_t kFrozenAlignBytes = 64;

struct ParamShape {
  std::string name;
  std::vector<int64_t> dims;
  int unit = 0;
  int group = 0;
  // ZERO_PARAM_FROZEN: stored as bytes of `stored` elements beside the unit's trained params, never converted.
  bool frozen = false;
  StoredType stored = StoredType::kF32;
  // ZERO_PARAM_MODEL_PARALLEL_DUPLICATE: another model-parallel rank's copy counts in the norm, not this one.
  bool model_parallel_duplicate = false;
  size_t numel() const;  // SIZE_MAX when the product overflows (or an extent is negative)
};

struct ParamPlacement {
  int unit = 0;
  bool frozen = false;
  size_t offset = 0;  // trained: the first element inside the unit's flat buffer; frozen: the first byte inside the
                      // unit's frozen bytes
  size_t numel = 0;
  size_t bytes = 0;  // frozen: numel x the size of its element type
};

// A contiguous run of one param inside one rank's shard: what the optimizer walks.
struct ShardSegment {
  size_t shard_offset = 0;  // relative to the start of the shard
  size_t numel = 0;
  int param = 0;
  int group = 0;
};

struct UnitLayout {
  std::vector<int> params;  // the trained params, in registration order
  size_t used_elems = 0;    // end of the last param (before padding)
  size_t padded_elems = 0;  // shard_elems x world_size
  size_t shard_elems = 0;   // a multiple of kShardAlignElems (and of a larger power of two for huge shards)
  // The frozen params: bytes laid out and split into equal shards as the elements are (0 without frozen params).
  std::vector<int> frozen_params;  // in registration order
  size_t frozen_used_bytes = 0, frozen_padded_bytes = 0, frozen_shard_bytes = 0;
  uint64_t frozen_elems = 0;  // the frozen params' elements
  bool has_frozen() const { return frozen_padded_bytes > 0; }
};

struct Layout {
  int world_size = 1;
  std::vector<ParamPlacement> params;
  std::vector<UnitLayout> units;

  size_t total_padded_elems() const;
  // Segments of the element range [begin, begin + length) of `unit`, in order, padding excluded.
  std::vector<ShardSegment> segments(int unit, size_t begin, size_t length,
                                     const std::vector<ParamShape>& shapes) const;
};

// The shard of a unit of `used` elements over `world_size` ranks (see kMaxMessageElems).
size_t shard_elems_for(size_t used, int world_size);
// The same for a unit's frozen bytes: a multiple of kFrozenAlignBytes.
size_t frozen_shard_bytes_for(size_t used, int world_size);

// Throws zero::Error if a unit is empty, ids are out of range, or a unit or the model exceeds kMaxModelElems.
Layout build_layout(const std::vector<ParamShape>& params, int world_size);

// Gradient buckets for stages 2-3: consecutive units in backward order (last unit first), each bucket holding at
// most `bucket_elems` padded elements unless a single unit is larger (then it is a bucket of its own). Units
// without trained params have no gradients and are in no bucket.
struct BucketLayout {
  std::vector<int> units;            // in backward order
  std::vector<size_t> unit_offsets;  // where each unit's full gradient starts inside the bucket buffer
  size_t elems = 0;
};
std::vector<BucketLayout> build_buckets(const Layout& layout, int64_t bucket_elems);

}  // namespace zero
