#include "nvme/nvme_state.hpp"

#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <future>

#include "util/error.hpp"
#include "util/log.hpp"
#include "util/test_hooks.hpp"

namespace zero {
namespace io {
namespace {

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

}  // namespace

NvmeState::Geometry NvmeState::geometry(const std::vector<size_t>& update_elems, int arrays, int64_t chunk_elems,
                                        int buffer_count, size_t elem_size) {
  Geometry g;
  g.arrays = arrays;
  g.elem_size = elem_size;
  const size_t kAlignElems = g.align_elems();
  g.unit_elems = update_elems;
  g.unit_pos.reserve(update_elems.size());
  for (size_t n : update_elems) {
    g.unit_pos.push_back(g.positions);
    g.positions += round_up(n, kAlignElems);
  }
  if (arrays == 0 || g.positions == 0) return g;
  g.chunk_elems = static_cast<size_t>(
      std::min<uint64_t>(round_up(static_cast<uint64_t>(std::max<int64_t>(chunk_elems, 1)), kAlignElems), g.positions));
  // When every chunk fits in the window at once, the chunks are made as even as 4 KiB allows, so that the window
  // is never more than a few KiB larger than the file.
  if (g.chunks() <= static_cast<uint64_t>(std::max(buffer_count, 1)))
    g.chunk_elems = static_cast<size_t>(round_up((g.positions + g.chunks() - 1) / g.chunks(), kAlignElems));
  g.slots = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(std::max(buffer_count, 1)), g.chunks()));
  return g;
}

NvmeState::NvmeState(const std::string& dir, const std::string& file_name, Geometry geometry, const AioSettings& aio,
                     int rank)
    : geometry_(std::move(geometry)),
      file_(DirectFile::create(dir + "/" + file_name, geometry_.file_bytes(), true)),
      window_(static_cast<size_t>(geometry_.staging_bytes())),
      engine_(make_engine(aio)),
      rank_(rank) {
  engine_->register_buffer(window_.data(), window_.size());  // io_uring maps the window once (fixed buffers)
}

NvmeState::~NvmeState() {
  if (!file_.path().empty()) ::unlink(file_.path().c_str());
}

// A file deleted under the engine loses nothing (the engine holds it open; its space comes back when the engine
// goes), but whoever deleted it should hear so, once.
void NvmeState::notice_deletion() {
  struct stat st {};
  if (!deletion_noticed_ && ::fstat(file_.fd(), &st) == 0 && st.st_nlink == 0) {
    deletion_noticed_ = true;
    log_message(ZERO_LOG_WARNING, rank_,
                "NVMe offload: '" + file_.path() +
                    "' was deleted while the engine uses it; training goes on from the open file, whose disk space is "
                    "freed when the engine is destroyed");
  }
}

bool NvmeState::in_memory_file_system() const {
  struct statfs fs {};
  return ::fstatfs(file_.fd(), &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC);
}

float* NvmeState::slot_array(size_t slot, int array) const {
  return static_cast<float*>(window_.data()) + (slot * geometry_.arrays + array) * geometry_.chunk_elems;
}

void NvmeState::start_chunk(size_t chunk, bool write) {
  if (geometry_.elem_size != sizeof(float)) fail(ZERO_ERR_INTERNAL, "NvmeState::stream: fp32 arrays only");
  const uint64_t first = chunk * geometry_.chunk_elems;
  const uint64_t elems = std::min<uint64_t>(geometry_.chunk_elems, geometry_.positions - first);
  const size_t slot = chunk % static_cast<size_t>(geometry_.slots);
  for (int a = 0; a < geometry_.arrays; ++a) {
    const uint64_t offset = array_offset(a) + first * sizeof(float);
    if (write)
      engine_->start_write(file_, slot_array(slot, a), elems * sizeof(float), offset);
    else
      engine_->start_read(file_, slot_array(slot, a), elems * sizeof(float), offset);
  }
}

// A range that need not be aligned, through the window: aligned pieces of at most the window's size; a write
// whose ends fall inside a 4 KiB block reads that piece first, so the neighbours' bytes survive.
void NvmeState::transfer(int unit, int array, size_t offset, char* data, size_t n, bool write) {
  if (n == 0) return;
  if (offset + n > geometry_.unit_elems[unit])
    fail(ZERO_ERR_INTERNAL, "NVMe state: elements " + std::to_string(offset) + ".." + std::to_string(offset + n) +
                                " are outside unit " + std::to_string(unit) + "'s " +
                                std::to_string(geometry_.unit_elems[unit]));
  const size_t esize = geometry_.elem_size;
  const uint64_t begin = array_offset(array) + (geometry_.unit_pos[unit] + offset) * esize, end = begin + n * esize;
  const uint64_t capacity = window_.size();
  char* bounce = static_cast<char*>(window_.data());
  for (uint64_t lo = begin / kDirectAlignment * kDirectAlignment; lo < end; lo += capacity) {
    const uint64_t hi = std::min(lo + capacity, round_up(end, kDirectAlignment));
    const uint64_t from = std::max(lo, begin), to = std::min(hi, end);
    char* user = data + (from - begin);
    if (!write || from != lo || to != hi) engine_->read(file_, bounce, hi - lo, lo);
    if (!write) {
      std::memcpy(user, bounce + (from - lo), to - from);
      continue;
    }
    std::memcpy(bounce + (from - lo), user, to - from);
    engine_->write(file_, bounce, hi - lo, lo);
  }
}

void NvmeState::read(int unit, int array, size_t offset, void* out, size_t n) {
  if (test_hooks::active("nvme.read", rank_))
    fail(ZERO_ERR_IO, "reading '" + file_.path() + "': Input/output error (errno 5) (test hook)");
  transfer(unit, array, offset, static_cast<char*>(out), n, false);
}

void NvmeState::write(int unit, int array, size_t offset, const void* in, size_t n) {
  transfer(unit, array, offset, static_cast<char*>(const_cast<void*>(in)), n, true);
}

// Chunk i is updated while the I/O thread reads chunks i+1 .. i+slots-2 and writes chunk i-1 back; the chunks in
// use at any moment are consecutive and at most `slots` of them, so chunk k lives in slot k % slots.
void NvmeState::stream(const std::function<void(const Piece&, float* const* arrays)>& update) {
  const size_t chunks = geometry_.chunks(), slots = static_cast<size_t>(geometry_.slots);
  if (chunks == 0) return;
  notice_deletion();
  std::future<void> in_flight;
  size_t next_read = 0, unit = 0;
  std::vector<float*> arrays(static_cast<size_t>(geometry_.arrays));
  try {
    for (size_t i = 0; i < chunks; ++i) {
      if (in_flight.valid()) in_flight.get();  // chunk i-1's predecessor written, the reads ahead arrived
      const bool one_slot = slots == 1;        // chunk i-1 must leave the only slot before chunk i comes in
      if (one_slot && i > 0) {
        start_chunk(i - 1, true);
        engine_->finish();
      }
      if (next_read <= i) {  // not read ahead (the first chunk, or a window of fewer than 3 slots)
        start_chunk(i, false);
        engine_->finish();
        next_read = i + 1;
      }
      const size_t busy_from = i == 0 ? 0 : i - 1;  // chunk i-1 is written back during this iteration
      for (; next_read < chunks && next_read < busy_from + slots; ++next_read) start_chunk(next_read, false);
      if (i > 0 && !one_slot) start_chunk(i - 1, true);
      in_flight = std::async(std::launch::async, [this] { engine_->finish(); });

      const uint64_t first = i * geometry_.chunk_elems, last = first + geometry_.chunk_elems;
      for (; unit < geometry_.unit_pos.size() && geometry_.unit_pos[unit] < last; ++unit) {
        const uint64_t pos = geometry_.unit_pos[unit];
        const uint64_t lo = std::max(first, pos), hi = std::min(last, pos + geometry_.unit_elems[unit]);
        if (lo < hi) {
          for (int a = 0; a < geometry_.arrays; ++a) arrays[a] = slot_array(i % slots, a) + (lo - first);
          update(Piece{static_cast<int>(unit), static_cast<size_t>(lo - pos), static_cast<size_t>(hi - lo)},
                 arrays.data());
          if (i + 1 == (chunks + 1) / 2 && test_hooks::active("nvme.stream", rank_))  // halfway through the pass
            fail(ZERO_ERR_IO, "writing '" + file_.path() + "': Input/output error (errno 5) (test hook)");
        }
        if (pos + round_up(geometry_.unit_elems[unit], geometry_.align_elems()) > last)
          break;  // continues in the next chunk
      }
    }
    in_flight.get();
    start_chunk(chunks - 1, true);
    engine_->finish();
  } catch (...) {
    // The I/O thread may still be moving bytes into or out of the window: it must stop before anything unwinds.
    if (in_flight.valid()) {
      try {
        in_flight.get();
      } catch (...) {
      }
    }
    try {
      engine_->finish();  // requests started but not yet waited for
    } catch (...) {
    }
    throw;
  }
}

}  // namespace io
}  // namespace zero
