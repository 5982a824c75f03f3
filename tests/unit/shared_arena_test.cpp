// The shared arena (core/comm/shared_arena.cpp) and the node window's zero-copy path over it (node_window.hpp), in
// one process: ranks as threads, their arena shares in one memfd each rank's SharedArena maps, single copy on
// (process_vm_readv of this process's own memory works as between ranks). Whatever mix of ranks has its buffer in
// the arena (read in place) or in private memory (read with the system call), a reduce-scatter gives every block
// the bits of the one rank-order sum, and an all-gather every block.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "comm/node_window.hpp"
#include "comm/rank_order_sum.hpp"
#include "comm/shared_arena.hpp"
#include "numeric/dtype.hpp"

namespace zero {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// A memfd of `ranks` shares of `share` bytes (sparse), closed when the test ends.
struct ArenaFile {
  int fd = -1;
  ArenaFile(int ranks, size_t share) {
    fd = memfd_create("libzero-arena-test", MFD_CLOEXEC);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(share * static_cast<size_t>(ranks))), 0);
  }
  ~ArenaFile() { close(fd); }
  size_t committed() const {
    struct stat st {};
    fstat(fd, &st);
    return static_cast<size_t>(st.st_blocks) * 512;
  }
};

TEST(SharedArena, HandsOutExtentsCommitsThemAndGivesThemBack) {
  ArenaFile file(2, 8 * kMiB);
  SharedArena arena(file.fd, 0, 8 * kMiB, 1, 2);
  EXPECT_EQ(file.committed(), 0u);  // sparse until an extent is handed out
  void* a = arena.allocate(3 * kMiB, 64);
  void* b = arena.allocate(1000, 64);
  EXPECT_EQ(arena.offset_of(a, 3 * kMiB), 0u);  // rank 1's share starts at its own offset 0
  EXPECT_EQ(arena.offset_of(b, 1000), 4 * kMiB);
  EXPECT_EQ(static_cast<const char*>(a), arena.share(1));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % (2 * kMiB), 0u);  // aligned as the host allocator aligns large buffers
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % (2 * kMiB), 0u);
  EXPECT_EQ(arena.shared_bytes_in_use(), 6 * kMiB);
  EXPECT_EQ(file.committed(), 6 * kMiB);
  std::memset(a, 1, 3 * kMiB);  // committed: no SIGBUS
  // What the peer (rank 0's arena over the same file) sees at rank 1's share.
  SharedArena peer(file.fd, 0, 8 * kMiB, 0, 2);
  EXPECT_EQ(peer.share(1)[12345], 1);
  EXPECT_EQ(peer.offset_of(a, 1), SharedArena::kNotShared);  // not in rank 0's share
  // Too large for what is left: served from the host allocator, outside the arena.
  void* c = arena.allocate(4 * kMiB, 64);
  EXPECT_EQ(arena.offset_of(c, 4 * kMiB), SharedArena::kNotShared);
  arena.deallocate(c, 4 * kMiB);
  // Given back, the memory returns to the file and the extents merge: the whole share is free again.
  arena.deallocate(a, 3 * kMiB);
  arena.deallocate(b, 1000);
  EXPECT_EQ(arena.shared_bytes_in_use(), 0u);
  EXPECT_EQ(file.committed(), 0u);
  void* whole = arena.allocate(8 * kMiB, 64);
  EXPECT_EQ(arena.offset_of(whole, 8 * kMiB), 0u);
  arena.deallocate(whole, 8 * kMiB);
}

TEST(SharedArena, ABufferThatOverrunsTheShareIsNotShared) {
  ArenaFile file(1, 2 * kMiB);
  SharedArena arena(file.fd, 0, 2 * kMiB, 0, 1);
  void* a = arena.allocate(kMiB, 64);
  EXPECT_EQ(arena.offset_of(a, 2 * kMiB), 0u);
  EXPECT_EQ(arena.offset_of(a, 2 * kMiB + 1), SharedArena::kNotShared);
  EXPECT_EQ(arena.offset_of(static_cast<char*>(a) - 1, 2), SharedArena::kNotShared);
  arena.deallocate(a, kMiB);
}

TEST(SharedArena, AForkedChildNeverGivesBackTheOwnersMemory) {
  ArenaFile file(1, 4 * kMiB);
  SharedArena arena(file.fd, 0, 4 * kMiB, 0, 1);
  char* a = static_cast<char*>(arena.allocate(2 * kMiB, 64));
  std::memset(a, 7, 2 * kMiB);
  const pid_t child = fork();
  if (child == 0) {
    // What a forked worker does when it drops the engine it inherited: the pages are the parent's, shared.
    arena.deallocate(a, 2 * kMiB);
    void* b = arena.allocate(2 * kMiB, 64);  // from the host allocator in the child
    _exit(arena.offset_of(b, 2 * kMiB) == SharedArena::kNotShared ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(a[12345], 7);
  EXPECT_EQ(file.committed(), 2 * kMiB);
  arena.deallocate(a, 2 * kMiB);
  EXPECT_EQ(file.committed(), 0u);
}

// `ranks` threads run one collective through windows over shared slots, each rank's buffer in the arena where
// `in_arena[r]`; `fill` gives rank r's initial buffer.
struct Job {
  int ranks;
  size_t half = 64 << 10;
  std::vector<char> slots_memory;
  ArenaFile file;
  std::vector<std::shared_ptr<SharedArena>> arenas;
  std::vector<std::unique_ptr<NodeWindow>> windows;
  Job(int n, bool arena) : ranks(n), file(n, 64 * kMiB) {
    slots_memory.assign(NodeWindow::slot_bytes(half) * static_cast<size_t>(n) + 64, 0);
    char* base = slots_memory.data();
    base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
    std::vector<char*> slots;
    for (int r = 0; r < n; ++r) slots.push_back(base + static_cast<size_t>(r) * NodeWindow::slot_bytes(half));
    for (int r = 0; r < n; ++r) {
      arenas.push_back(std::make_shared<SharedArena>(file.fd, 0, 64 * kMiB, r, n));
      windows.push_back(std::make_unique<NodeWindow>(r, n, half, slots, nullptr));
      windows.back()->reset_line();
      windows.back()->publish_probe();
    }
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(windows[static_cast<size_t>(r)]->probe_peers());
      windows[static_cast<size_t>(r)]->set_single_copy(true, "");
      windows[static_cast<size_t>(r)]->set_direct_min_bytes(0);  // small blocks too
      const std::shared_ptr<SharedArena>& mine = arenas[static_cast<size_t>(r)];
      if (arena) windows[static_cast<size_t>(r)]->set_arena(mine->share(0), mine->share_bytes(), mine);
    }
  }
  // Runs collective `sequence` of `kind` on every rank's buffer (a reduce-scatter handing rank r's block to
  // sinks[r] where given).
  void run(uint64_t sequence, int32_t kind, int32_t dtype, std::vector<char*>& bufs, size_t count, size_t esize,
           const std::vector<ReducedSink*>& sinks = {}) {
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        NodeWindow& w = *windows[static_cast<size_t>(r)];
        NodeWindow::Op op = w.begin(sequence, kind, dtype, bufs[static_cast<size_t>(r)], count, esize);
        if (!sinks.empty()) op.sink = sinks[static_cast<size_t>(r)];
        EXPECT_TRUE(op.direct);
        for (;;) {
          const NodeWindow::Progress p = w.step(op);
          if (p == NodeWindow::Progress::kDone) break;
          ASSERT_EQ(p, NodeWindow::Progress::kWaiting) << w.mismatch() << w.failure();
          std::this_thread::yield();
        }
      });
    for (std::thread& t : threads) t.join();
  }
};

// Random values whose sums round (fp32: a wide exponent range; bf16: 16-bit words).
std::vector<char> random_buffer(size_t bytes, uint32_t seed, int32_t dtype) {
  std::vector<char> out(bytes);
  std::mt19937 gen(seed);
  if (dtype == ZERO_DTYPE_FP32) {
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    std::uniform_int_distribution<int> scale(-20, 20);
    for (size_t i = 0; i < bytes / 4; ++i) {
      const float v = std::ldexp(value(gen), scale(gen));
      std::memcpy(out.data() + 4 * i, &v, 4);
    }
  } else {
    std::uniform_real_distribution<float> value(-4.0f, 4.0f);
    for (size_t i = 0; i < bytes / 2; ++i) {
      const uint16_t v = float_to_bf16_rne(value(gen));
      std::memcpy(out.data() + 2 * i, &v, 2);
    }
  }
  return out;
}

// Collects the pieces a reduce-scatter hands it, and whether they came in order, each element once: their sums, or
// (`sums_sources`) their sources, which it sums itself in rank order, as AccumulatorPieces does.
class CollectingSink final : public ReducedSink {
 public:
  CollectingSink(size_t count, size_t esize, bool sums_sources)
      : esize_(esize), sums_sources_(sums_sources), got_(count * esize) {
    arm();
  }
  const std::vector<char>& got() const { return got_; }
  size_t taken() const { return taken_; }
  bool in_order() const { return in_order_; }
  int pieces() const { return pieces_; }

 private:
  void consume(const void* piece, size_t offset, size_t count) noexcept override {
    in_order_ = in_order_ && offset == taken_ && (offset + count) * esize_ <= got_.size();
    if (!in_order_) return;
    std::memcpy(got_.data() + offset * esize_, piece, count * esize_);
    taken_ += count;
    ++pieces_;
  }
  bool consume_sources(const void* const* sources, int n, int32_t dtype, size_t offset,
                       size_t count) noexcept override {
    if (!sums_sources_) return false;
    in_order_ = in_order_ && offset == taken_ && (offset + count) * esize_ <= got_.size();
    if (!in_order_) return false;
    sum_in_rank_order(got_.data() + offset * esize_, sources, n, count, dtype);
    taken_ += count;
    ++pieces_;
    return true;
  }
  size_t esize_;
  bool sums_sources_;
  std::vector<char> got_;
  size_t taken_ = 0;
  bool in_order_ = true;
  int pieces_ = 0;
};

enum class Sinks { kNone, kSums, kSources };

void check_mix(int ranks, const std::vector<bool>& in_arena, int32_t dtype, size_t count, bool window_arena = true,
               Sinks sinks = Sinks::kNone) {
  SCOPED_TRACE("ranks " + std::to_string(ranks) + ", dtype " + std::to_string(dtype) + ", count " +
               std::to_string(count));
  Job job(ranks, window_arena);
  const size_t esize = dtype == ZERO_DTYPE_FP32 ? 4 : 2, bytes = count * esize * static_cast<size_t>(ranks);
  std::vector<std::vector<char>> inputs, privates;
  std::vector<char*> bufs;
  for (int r = 0; r < ranks; ++r) {
    inputs.push_back(random_buffer(bytes, 1000u + static_cast<uint32_t>(r), dtype));
    privates.emplace_back(bytes);
    char* buf = in_arena[static_cast<size_t>(r)]
                    ? static_cast<char*>(job.arenas[static_cast<size_t>(r)]->allocate(bytes, 64))
                    : privates.back().data();
    ASSERT_EQ(job.arenas[static_cast<size_t>(r)]->offset_of(buf, bytes) != SharedArena::kNotShared,
              static_cast<bool>(in_arena[static_cast<size_t>(r)]));
    std::memcpy(buf, inputs.back().data(), bytes);
    bufs.push_back(buf);
  }
  std::vector<std::unique_ptr<CollectingSink>> collecting;
  std::vector<ReducedSink*> sink_of;
  for (int r = 0; sinks != Sinks::kNone && r < ranks; ++r) {
    collecting.push_back(std::make_unique<CollectingSink>(count, esize, sinks == Sinks::kSources));
    sink_of.push_back(collecting.back().get());
  }
  job.run(1, ZERO_COLL_REDUCE_SCATTER, dtype, bufs, count, esize, sink_of);
  for (int r = 0; r < ranks; ++r) {
    std::vector<char> expected(count * esize);
    std::vector<const void*> sources;
    for (int from = 0; from < ranks; ++from)
      sources.push_back(inputs[static_cast<size_t>(from)].data() + static_cast<size_t>(r) * count * esize);
    sum_in_rank_order(expected.data(), sources.data(), ranks, count, dtype);
    // A sink that sums the sources leaves the block as it was (this rank's input); otherwise it holds the sum.
    const char* block_holds = sinks == Sinks::kSources
                                  ? inputs[static_cast<size_t>(r)].data() + static_cast<size_t>(r) * count * esize
                                  : expected.data();
    EXPECT_EQ(std::memcmp(bufs[static_cast<size_t>(r)] + static_cast<size_t>(r) * count * esize, block_holds,
                          expected.size()),
              0)
        << "rank " << r << "'s block";
    if (sinks == Sinks::kNone) continue;
    // The sum went to the sink (or the sink made it), in order, each element once, in pieces.
    const CollectingSink& sink = *collecting[static_cast<size_t>(r)];
    EXPECT_TRUE(sink.in_order()) << "rank " << r;
    EXPECT_EQ(sink.taken(), count) << "rank " << r;
    EXPECT_GT(sink.pieces(), count * esize > (128 << 10) ? 1 : 0) << "rank " << r;
    EXPECT_EQ(std::memcmp(sink.got().data(), expected.data(), expected.size()), 0) << "rank " << r << "'s sum";
  }
  // Then an all-gather of the reduced blocks: every rank ends with every block.
  job.run(2, ZERO_COLL_ALL_GATHER, dtype, bufs, count, esize);
  for (int r = 0; r < ranks; ++r)
    for (int b = 0; b < ranks; ++b)
      EXPECT_EQ(std::memcmp(bufs[static_cast<size_t>(r)] + static_cast<size_t>(b) * count * esize,
                            bufs[static_cast<size_t>(b)] + static_cast<size_t>(b) * count * esize, count * esize),
                0)
          << "rank " << r << ", block " << b;
  for (int r = 0; r < ranks; ++r)
    if (in_arena[static_cast<size_t>(r)])
      job.arenas[static_cast<size_t>(r)]->deallocate(bufs[static_cast<size_t>(r)], bytes);
}

TEST(SharedArenaWindow, ReduceScatterAndAllGatherInPlaceWithAnyMixOfRanks) {
  // Counts: less than a sum piece, several pieces with a ragged end.
  for (size_t count : {size_t{1000}, size_t{300001}})
    for (int32_t dtype : {ZERO_DTYPE_FP32, ZERO_DTYPE_BF16}) {
      check_mix(2, {true, true}, dtype, count);
      check_mix(3, {true, true, true}, dtype, count);
      check_mix(3, {true, false, true}, dtype, count);
      check_mix(3, {false, true, false}, dtype, count);
      check_mix(3, {false, false, false}, dtype, count);
      check_mix(4, {false, true, true, false}, dtype, count);
    }
}

// Less than a sum piece and several with a ragged end; both dtypes; ranks in the arena, mixed, and none.
void check_sinks(Sinks sinks) {
  for (size_t count : {size_t{1000}, size_t{300001}})
    for (int32_t dtype : {ZERO_DTYPE_FP32, ZERO_DTYPE_BF16}) {
      check_mix(2, {true, true}, dtype, count, true, sinks);
      check_mix(3, {true, false, true}, dtype, count, true, sinks);
      check_mix(3, {false, false, false}, dtype, count, true, sinks);
    }
}

TEST(SharedArenaWindow, AReduceScatterHandsItsSumToASinkPieceByPiece) { check_sinks(Sinks::kSums); }

TEST(SharedArenaWindow, ASinkThatSumsTheSourcesLeavesTheBlockUnwritten) { check_sinks(Sinks::kSources); }

TEST(SharedArenaWindow, AWindowWithoutTheArenaReadsArenaBuffersWithTheSystemCall) {
  check_mix(3, {true, true, true}, ZERO_DTYPE_FP32, 70000, /*window_arena=*/false);
}

}  // namespace
}  // namespace zero
