// The fp32 arrays a rank updates (the master, when it is separate from the params, and the optimizer state), kept
// in one file on NVMe instead of host memory: offload_optimizer with device "nvme". The optimizer pass
// streams them through a window of a few chunks of host memory — reading chunk i+1 ahead and writing chunk i-1
// behind while chunk i is updated — so host memory for the offloaded state is bounded by the window, not the model.
//
// The file, per array (array-major): every unit's updated range in unit order, each padded to a multiple of 1024
// elements (4 KiB, O_DIRECT's alignment). A unit's element e of array a is at byte
// a * array_bytes + (unit_pos[u] + e) * 4. Chunks are fixed ranges [k * C, (k + 1) * C) of those padded positions,
// so one chunk is one contiguous transfer per array, and a chunk's pieces (its intersections with units) always
// start on a 4 KiB boundary. The file is pre-allocated at creation (a full disk fails at finalize) and removed
// when the state goes away; its unwritten extents read as zeros, which is where the optimizer state starts.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nvme/aio.hpp"

namespace zero {
namespace io {

class NvmeState {
 public:
  // One unit's piece of a chunk: elements [begin, begin + n) of its updated range (begin is a multiple of 1024).
  struct Piece {
    int unit = 0;
    size_t begin = 0, n = 0;
  };

  // The geometry, without the file: what the plan predicts and the state allocates.
  struct Geometry {
    int arrays = 0;                  // arrays per element (fp32 master and state; or one of 16-bit params)
    size_t elem_size = 4;            // bytes per element
    std::vector<size_t> unit_elems;  // per unit, the elements this rank updates
    std::vector<uint64_t> unit_pos;  // per unit, its first padded position
    uint64_t positions = 0;          // padded positions of all units
    size_t chunk_elems = 0;          // C: a multiple of 1024, at most `positions`
    int slots = 0;                   // chunks held in host memory at once
    uint64_t file_bytes() const { return static_cast<uint64_t>(arrays) * positions * elem_size; }
    uint64_t staging_bytes() const { return static_cast<uint64_t>(slots) * chunk_elems * arrays * elem_size; }
    size_t align_elems() const { return kDirectAlignment / elem_size; }  // units are padded to 4 KiB
    size_t chunks() const { return chunk_elems == 0 ? 0 : (positions + chunk_elems - 1) / chunk_elems; }
  };
  // `update_elems`: per unit, the elements this rank updates; `chunk_elems` and `buffer_count`: the config's.
  static Geometry geometry(const std::vector<size_t>& update_elems, int arrays, int64_t chunk_elems, int buffer_count,
                           size_t elem_size = 4);

  // Creates and pre-allocates `<dir>/<file_name>` and the window (ZERO_ERR_IO naming the path on failure). `rank`
  // names the rank for the test hooks (core/util/test_hooks.hpp: nvme.stream, nvme.read).
  NvmeState(const std::string& dir, const std::string& file_name, Geometry geometry, const AioSettings& aio, int rank);
  ~NvmeState();  // removes the file
  NvmeState(const NvmeState&) = delete;
  NvmeState& operator=(const NvmeState&) = delete;

  const Geometry& geometry() const { return geometry_; }
  const std::string& path() const { return file_.path(); }
  const char* engine_name() const { return engine_->name(); }
  // Whether the file is on tmpfs (Linux >= 6.6 allows O_DIRECT there): the "NVMe" bytes are then in RAM.
  bool in_memory_file_system() const;
  // A warning, once, if the file was deleted under the engine (stream() checks by itself).
  void notice_deletion();

  // Elements [offset, offset + n) of one unit's array, to or from host memory, through the first window slot
  // (read-modify-write at unaligned ends), any alignment of `out`/`in`. Not during stream().
  void read(int unit, int array, size_t offset, void* out, size_t n);
  void write(int unit, int array, size_t offset, const void* in, size_t n);

  // The pipelined pass: `update` is called for every piece of every chunk in order, with one pointer per array to
  // the piece's elements in host memory; what it writes there goes back to the file. I/O runs on a thread of its
  // own while `update` computes. A failure (ZERO_ERR_IO) leaves the file partly updated. fp32 arrays only.
  void stream(const std::function<void(const Piece&, float* const* arrays)>& update);

 private:
  uint64_t array_offset(int array) const {
    return static_cast<uint64_t>(array) * geometry_.positions * geometry_.elem_size;
  }
  float* slot_array(size_t slot, int array) const;
  void start_chunk(size_t chunk, bool write);
  void transfer(int unit, int array, size_t offset, char* data, size_t n, bool write);

  // Declared so that the engine goes first: its destructor waits for requests still in flight, which use the file
  // and the window.
  Geometry geometry_;
  DirectFile file_;
  AlignedBuffer window_;
  std::unique_ptr<IoEngine> engine_;
  int rank_ = 0;
  bool deletion_noticed_ = false;
};

}  // namespace io
}  // namespace zero
