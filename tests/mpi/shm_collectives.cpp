// The MPI module's two paths give the same bits: reduce-scatters and all-gathers through the node's shared window
// (the default when every rank is on one node) against the in-place all-to-all and rank-order sum (ZERO_MPI_SHM=0),
// on values whose sums round (random signs and exponents), in fp32, bf16 and fp16, for counts that are not
// multiples of a chunk, with chunks small enough that a collective takes many of them
// (ZERO_MPI_SHM_HALF_BYTES=4096), several collectives started before the first is waited for (a group), and
// all-gathers of control bytes. Also checks the sums against a sum computed here in rank order. With
// ZERO_TEST_MPI_NODES (the module's test build cuts the machine into "nodes") the first communicator takes the
// hierarchical path (core/comm/hierarchy.cpp), which must give the same bits too.
//
//   mpirun -np N test_shm_collectives
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/engine_comm.hpp"
#include "comm/mpi_loader.hpp"
#include "comm/rank_order_sum.hpp"
#include "numeric/dtype.hpp"
#include "util/error.hpp"

namespace {

int g_failures = 0;
#define EXPECT(cond, ...)                                     \
  do {                                                        \
    if (!(cond)) {                                            \
      std::fprintf(stderr, "FAILED: " __VA_ARGS__);           \
      std::fprintf(stderr, " (%s:%d)\n", __FILE__, __LINE__); \
      ++g_failures;                                           \
    }                                                         \
  } while (0)

// Rank r's contribution: values of every magnitude and sign, different per rank and element.
std::vector<uint16_t> make_bits(int rank, size_t n, zero::ElemType type, std::vector<float>& as_float) {
  std::mt19937 rng(1234u + 77u * static_cast<unsigned>(rank));
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-12, 12);
  std::vector<uint16_t> bits(type == zero::ElemType::kF32 ? 2 * n : n);
  as_float.resize(n);
  for (size_t i = 0; i < n; ++i) {
    float v = std::ldexp(mant(rng), expo(rng));
    if (type == zero::ElemType::kBF16) {
      bits[i] = zero::float_to_bf16_rne(v);
      v = zero::bf16_to_float(bits[i]);
    } else if (type == zero::ElemType::kF16) {
      bits[i] = zero::float_to_fp16_rne(v);
      v = zero::fp16_to_float(bits[i]);
    } else {
      std::memcpy(&bits[2 * i], &v, 4);
    }
    as_float[i] = v;
  }
  return bits;
}

int32_t zdtype(zero::ElemType t) { return static_cast<int32_t>(t); }

}  // namespace

// --stop-in-single-copy: the last rank stops in the middle of a single-copy all-gather, then of a reduce-scatter
// (its buffer published, the peers reading it: the module's test hook). It gets ZERO_ERR_COMM saying so; every
// other rank ZERO_ERR_REMOTE naming it, within seconds (not at the 60 s timeout).
int stop_in_single_copy(int rank, int world) {
  const int last = world - 1;
  for (zero::CollKind kind : {zero::CollKind::kAllGather, zero::CollKind::kReduceScatter}) {
    if (rank == last) setenv("ZERO_TEST_MPI_STOP_IN_SINGLE_COPY", std::to_string(last).c_str(), 1);
    auto comm = zero::make_mpi_communicator(ZERO_MPI_COMM_WORLD);
    zero::EngineComm c(comm);
    c.set_timeout(60);
    std::vector<float> v(static_cast<size_t>(world) << 18, 1.0f);  // 1 MiB per block: the single-copy path
    zero_status_t status = ZERO_OK;
    std::string message;
    const auto begin = std::chrono::steady_clock::now();
    try {
      if (kind == zero::CollKind::kAllGather)
        c.all_gather(v.data(), v.size() / static_cast<size_t>(world), zero::ElemType::kF32, "test: all-gather");
      else
        c.reduce_scatter_sum(v.data(), v.size() / static_cast<size_t>(world), zero::ElemType::kF32,
                             "test: reduce-scatter");
    } catch (const zero::Error& e) {
      status = e.status();
      message = e.what();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    const std::string named = "rank " + std::to_string(last) + " has stopped";
    if (rank == last)
      EXPECT(status == ZERO_ERR_COMM && message.find("injected stop") != std::string::npos, "rank %d (%s): %s: %s",
             rank, zero::coll_kind_name(kind), zero::status_name(status), message.c_str());
    else
      EXPECT(status == ZERO_ERR_REMOTE && message.find(named) != std::string::npos && seconds < 20,
             "rank %d (%s): %s after %.1f s: %s", rank, zero::coll_kind_name(kind), zero::status_name(status), seconds,
             message.c_str());
    unsetenv("ZERO_TEST_MPI_STOP_IN_SINGLE_COPY");
    MPI_Barrier(MPI_COMM_WORLD);  // every rank is out before the communicator goes
  }
  int failures = g_failures;
  MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("stop in single copy: %s\n", failures == 0 ? "ok" : "FAILED");
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc > 1 && std::strcmp(argv[1], "--stop-in-single-copy") == 0) return stop_in_single_copy(rank, world);
  // Ranks that ask for different chunk buffers get the smallest: the chunking is part of the protocol.
  setenv("ZERO_MPI_SHM_HALF_BYTES", rank == 0 ? "4096" : "65536", 1);
  auto shm = zero::make_mpi_communicator(ZERO_MPI_COMM_WORLD);
  setenv("ZERO_MPI_SHM", "0", 1);
  auto plain = zero::make_mpi_communicator(ZERO_MPI_COMM_WORLD);
  zero::EngineComm a(shm), b(plain);
  a.set_timeout(60), b.set_timeout(60);

  for (zero::ElemType type : {zero::ElemType::kF32, zero::ElemType::kBF16, zero::ElemType::kF16}) {
    const size_t esize = zero::elem_size(type);
    for (size_t block : {size_t{1}, size_t{7}, size_t{1000}, size_t{4099}, size_t{100003}}) {
      const size_t n = block * static_cast<size_t>(world);
      std::vector<float> mine;
      const std::vector<uint16_t> input = make_bits(rank, n, type, mine);
      std::vector<uint16_t> x = input, y = input;
      a.reduce_scatter_sum(x.data(), block, type, "test: reduce-scatter (window)");
      b.reduce_scatter_sum(y.data(), block, type, "test: reduce-scatter (all-to-all)");
      const char* mx = reinterpret_cast<const char*>(x.data()) + rank * block * esize;
      const char* my = reinterpret_cast<const char*>(y.data()) + rank * block * esize;
      EXPECT(std::memcmp(mx, my, block * esize) == 0, "rank %d: %s reduce-scatter of %zu differs between the paths",
             rank, zero::elem_type_name(type), block);
      // The reference: every rank's input (regenerated here), summed in rank order.
      std::vector<std::vector<uint16_t>> all(static_cast<size_t>(world));
      std::vector<const void*> src;
      for (int r = 0; r < world; ++r) {
        std::vector<float> ignored;
        all[static_cast<size_t>(r)] = make_bits(r, n, type, ignored);
        src.push_back(reinterpret_cast<const char*>(all[static_cast<size_t>(r)].data()) + rank * block * esize);
      }
      std::vector<uint16_t> ref(block * esize / 2 + 1);
      zero::sum_in_rank_order(ref.data(), src.data(), world, block, zdtype(type));
      EXPECT(std::memcmp(mx, ref.data(), block * esize) == 0,
             "rank %d: %s reduce-scatter of %zu is not the rank-order sum", rank, zero::elem_type_name(type), block);

      // All-gather: every block ends as its owner's input.
      x = input;
      a.all_gather(x.data(), block, type, "test: all-gather (window)");
      bool same = true;
      for (int r = 0; r < world; ++r)
        same &= std::memcmp(reinterpret_cast<const char*>(x.data()) + r * block * esize,
                            reinterpret_cast<const char*>(all[static_cast<size_t>(r)].data()) + r * block * esize,
                            block * esize) == 0;
      EXPECT(same, "rank %d: %s all-gather of %zu", rank, zero::elem_type_name(type), block);
    }
  }

  // A group: four reduce-scatters started before the first is waited for (one large enough for the single-copy
  // path between the window's), then the same one by one.
  {
    const size_t blocks[4] = {5000, 3, 100003, 777};
    std::vector<std::vector<uint16_t>> g(4), s(4);
    std::vector<zero::EngineComm::Planned> planned;
    for (int i = 0; i < 4; ++i) {
      std::vector<float> ignored;
      g[i] = make_bits(rank + 10 * i, blocks[i] * static_cast<size_t>(world), zero::ElemType::kF32, ignored);
      s[i] = g[i];
      planned.push_back({zero::CollKind::kReduceScatter, g[i].data(), blocks[i], zero::ElemType::kF32, "test: group"});
    }
    std::vector<zero::EngineComm::Pending> pending = a.start_group(std::move(planned));
    a.wait_all(pending);
    for (int i = 0; i < 4; ++i) {
      b.reduce_scatter_sum(s[i].data(), blocks[i], zero::ElemType::kF32, "test: one by one");
      EXPECT(std::memcmp(reinterpret_cast<char*>(g[i].data()) + rank * blocks[i] * 4,
                         reinterpret_cast<char*>(s[i].data()) + rank * blocks[i] * 4, blocks[i] * 4) == 0,
             "rank %d: group member %d differs", rank, i);
    }
  }

  // Control bytes through the window: a string of every rank's.
  {
    std::vector<char> text(static_cast<size_t>(world) * 32, 0);
    std::snprintf(text.data() + rank * 32, 32, "rank %d here", rank);
    a.control_all_gather(text.data(), 32, "test: control bytes");
    for (int r = 0; r < world; ++r) {
      char want[32];
      std::snprintf(want, sizeof want, "rank %d here", r);
      EXPECT(std::strcmp(text.data() + r * 32, want) == 0, "rank %d: control all-gather slot %d", rank, r);
    }
  }

  // Ranks in different collectives (different counts): every rank gets ZERO_ERR_MISMATCH, nobody sums or copies
  // the others' unrelated data — in an all-gather and in a reduce-scatter, each on a communicator of its own (one
  // is unusable after it). On one node rank 0 differs (the window's descriptors catch it); across nodes
  // (ZERO_TEST_MPI_NODES: the hierarchical path) every rank of the first node differs, so only the messages between
  // the nodes can tell, and the ranks they touch see it while the others learn it from their notice, naming them.
  const char* nodes = std::getenv("ZERO_TEST_MPI_NODES");
  bool odd_one = rank == 0;
  if (nodes != nullptr) {
    std::vector<long> of_rank;
    for (const char* p = nodes; *p != '\0';) {
      char* end = nullptr;
      of_rank.push_back(std::strtol(p, &end, 10));
      p = *end == ',' ? end + 1 : end;
    }
    odd_one = of_rank[static_cast<size_t>(rank)] == of_rank[0];
  }
  for (zero::CollKind kind : {zero::CollKind::kAllGather, zero::CollKind::kReduceScatter}) {
    unsetenv("ZERO_MPI_SHM");
    auto third = zero::make_mpi_communicator(ZERO_MPI_COMM_WORLD);
    zero::EngineComm c(third);
    c.set_timeout(60);
    std::vector<float> v(static_cast<size_t>(world) * 300, 1.0f);
    zero_status_t status = ZERO_OK;
    std::string message;
    try {
      if (kind == zero::CollKind::kAllGather)
        c.all_gather(v.data(), odd_one ? 100 : 200, zero::ElemType::kF32, "test: mismatched all-gather");
      else
        c.reduce_scatter_sum(v.data(), odd_one ? 100 : 200, zero::ElemType::kF32, "test: mismatched reduce-scatter");
    } catch (const zero::Error& e) {
      status = e.status();
      message = e.what();
    }
    const bool told = nodes != nullptr && status == ZERO_ERR_REMOTE && message.find("has stopped") != std::string::npos;
    EXPECT((status == ZERO_ERR_MISMATCH || told) && message.find("not in the same collective") != std::string::npos,
           "rank %d: mismatched %s gave %s: %s", rank, zero::coll_kind_name(kind), zero::status_name(status),
           message.c_str());
    MPI_Barrier(MPI_COMM_WORLD);  // every rank is out before the communicator goes
  }

  a.backend().finalize();
  plain->finalize();
  int failures = g_failures;
  MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("shm collectives: %s\n", failures == 0 ? "ok" : "FAILED");
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
