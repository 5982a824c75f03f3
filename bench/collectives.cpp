// libzero's collectives against Open MPI's and against a memory-copy ceiling, measured in the same run.
//
//   mpirun -np N build/release/bench_collectives [--sizes 1,4,16,64,256] [--reps 7]
//
// For each size (MiB of the whole buffer per rank, nccl-tests' "size": N blocks for reduce-scatter and
// all-gather) and each implementation, the median over --reps timed runs (after one warm-up) of the slowest rank,
// as bus bandwidth in nccl-tests' convention: busBw = size / time x (N - 1) / N for reduce-scatter and all-gather,
// x 2 (N - 1) / N for all-reduce. Implementations:
//   libzero       the MPI module through libzero's communicator (shared-memory window when every rank is on one
//                 node: the default; single copy from 32 KiB per block where process_vm_readv works)
//   lz-2copy      the same with ZERO_MPI_SINGLE_COPY=0 (every chunk through the window's halves)
//   libzero-mpi   the same module with ZERO_MPI_SHM=0 (an in-place all-to-all and a rank-order sum)
//   lz-shm        libzero's own shared-memory communicator (zero_comm_create_shm: what a torchrun job without MPI
//                 uses), the same window and sums without MPI
//   lz-arena      the same communicator on buffers from its shared arena (Communicator::shared_allocator, where the
//                 engine puts its gradient buckets): the peers' pieces summed in place, no copy into private memory
//   Open MPI      MPI_Reduce_scatter_block (out of place), MPI_Allgather and MPI_Allreduce (in place), fp32 sum
// The ceiling is memcpy of size x (N - 1) / N bytes on every rank at once (what a rank must at least move),
// expressed as the same bus bandwidth; "of ceil" is libzero's fraction of it. A reduce-scatter cannot reach it on a
// memory-bound machine: besides reading the N - 1 peers' pieces of its block it reads its own piece and writes the
// result, (N + 1) / N x size bytes of memory traffic against the copy's 2 (N - 1) / N x size, so its bound is
// 2 (N - 1) / (N + 1) of the ceiling (2/3 at 2 ranks). "of bound" is libzero's fraction of that bound: the same
// copy time for the traffic the collective must at least cause (all-gather: the ceiling; all-reduce: the sum of the
// two). All ranks run every measurement
// together, separated by barriers; the buffers are touched before timing (no first-touch page faults timed).
// "arena/bnd" is lz-arena's fraction of the bound.
#include <mpi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/engine_comm.hpp"
#include "comm/mpi_loader.hpp"
#include "comm/shm_communicator.hpp"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The median over `reps` of the slowest rank's time of `body` (after a warm-up run).
double median_time(int reps, const std::function<void()>& body) {
  body();
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now();
    body();
    double t = now() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    times.push_back(t);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// n floats set to `value`, 2 MiB-aligned with huge pages advised from 2 MiB up, as the engine's buffers are.
// Or from `allocator` (a communicator's shared arena).
class Buffer {
 public:
  Buffer(size_t n, float value, std::shared_ptr<zero::Allocator> allocator = nullptr)
      : bytes_((std::max<size_t>(n, 1) * sizeof(float) + kHuge - 1) / kHuge * kHuge), allocator_(std::move(allocator)) {
    if (allocator_) {
      p_ = static_cast<float*>(allocator_->allocate(bytes_, kHuge));
    } else {
      p_ = static_cast<float*>(std::aligned_alloc(kHuge, bytes_));
      if (p_ == nullptr) std::abort();
      madvise(p_, bytes_, MADV_HUGEPAGE);  // a hint
    }
    std::fill(p_, p_ + n, value);
  }
  ~Buffer() {
    if (allocator_)
      allocator_->deallocate(p_, bytes_);
    else
      std::free(p_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* data() const { return p_; }

 private:
  static constexpr size_t kHuge = size_t{2} << 20;
  size_t bytes_ = 0;
  std::shared_ptr<zero::Allocator> allocator_;
  float* p_ = nullptr;
};

std::vector<double> parse_list(const char* text) {
  std::vector<double> out;
  std::string s(text);
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    out.push_back(std::atof(s.substr(start, comma - start).c_str()));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::vector<double> sizes = {1, 4, 16, 64, 256};
  int reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--sizes") == 0) sizes = parse_list(argv[i + 1]);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
  }
  if (std::getenv("ZERO_MPI_BACKEND") == nullptr) setenv("ZERO_MPI_BACKEND", ZERO_MPI_MODULE_PATH, 1);
  auto shm = zero::make_mpi_communicator(ZERO_MPI_COMM_WORLD);
  setenv("ZERO_MPI_SINGLE_COPY", "0", 1);
  auto two_copy = zero::make_mpi_communicator(ZERO_MPI_COMM_WORLD);
  unsetenv("ZERO_MPI_SINGLE_COPY");
  setenv("ZERO_MPI_SHM", "0", 1);
  auto plain = zero::make_mpi_communicator(ZERO_MPI_COMM_WORLD);
  unsetenv("ZERO_MPI_SHM");
  // The shared-memory communicator joins by a name every rank must pass: rank 0's process id, broadcast.
  long job = static_cast<long>(getpid());
  MPI_Bcast(&job, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  auto own_shm = zero::make_shm_communicator("bench-collectives-" + std::to_string(job), rank, world, 60.0);
  zero::EngineComm lz(shm), lz_two(two_copy), lz_mpi(plain), lz_shm(own_shm);
  const std::shared_ptr<zero::Allocator> arena = own_shm->shared_allocator();
  if (rank == 0 && !arena) std::printf("note: no shared arena (single copy off?): lz-arena runs on private memory\n");

  const double n = world, share = (n - 1) / n;
  if (rank == 0) {
    std::printf("bench_collectives: %d ranks, fp32, median of %d, bus bandwidth GB/s (nccl-tests convention)\n", world,
                reps);
    std::printf("%-15s %8s %10s %10s %10s %10s %10s %10s %10s %10s %10s %10s %10s\n", "collective", "MiB", "libzero",
                "lz-2copy", "lz-mpi", "lz-shm", "lz-arena", "Open MPI", "ceiling", "of ceil", "of bound", "arena/bnd",
                "vs OMPI");
  }
  for (double mib : sizes) {
    const size_t bytes = static_cast<size_t>(mib * 1048576.0) / (4 * static_cast<size_t>(world)) * 4 * world;
    const size_t elems = bytes / 4, block = elems / static_cast<size_t>(world);
    // Buffers as the engine allocates them (core/memory/allocator.cpp): 2 MiB-aligned, huge pages advised.
    Buffer buf(elems, 1.0f), recv(block, 0.0f), src(elems, 0.5f), dst(elems, 0.0f), shared(elems, 1.0f, arena);
    // The ceiling: every rank copies what it must move, at once.
    const size_t moved = static_cast<size_t>(static_cast<double>(bytes) * share);
    const double t_copy = median_time(reps, [&] { std::memcpy(dst.data(), src.data(), moved); });
    const double ceiling = static_cast<double>(bytes) * share / t_copy / 1e9;
    struct Row {
      const char* name;
      double factor;
      double bound;  // the traffic bound as a fraction of the ceiling
      std::function<void()> lz, lz_two, lz_mpi, lz_shm, lz_arena, ompi;
    };
    const double rs_bound = 2 * (n - 1) / (n + 1);
    const Row rows[] = {
        {"reduce-scatter", share, rs_bound,
         [&] { lz.reduce_scatter_sum(buf.data(), block, zero::ElemType::kF32, "bench"); },
         [&] { lz_two.reduce_scatter_sum(buf.data(), block, zero::ElemType::kF32, "bench"); },
         [&] { lz_mpi.reduce_scatter_sum(buf.data(), block, zero::ElemType::kF32, "bench"); },
         [&] { lz_shm.reduce_scatter_sum(buf.data(), block, zero::ElemType::kF32, "bench"); },
         [&] { lz_shm.reduce_scatter_sum(shared.data(), block, zero::ElemType::kF32, "bench"); },
         [&] {
           MPI_Reduce_scatter_block(buf.data(), recv.data(), static_cast<int>(block), MPI_FLOAT, MPI_SUM,
                                    MPI_COMM_WORLD);
         }},
        {"all-gather", share, 1.0, [&] { lz.all_gather(buf.data(), block, zero::ElemType::kF32, "bench"); },
         [&] { lz_two.all_gather(buf.data(), block, zero::ElemType::kF32, "bench"); },
         [&] { lz_mpi.all_gather(buf.data(), block, zero::ElemType::kF32, "bench"); },
         [&] { lz_shm.all_gather(buf.data(), block, zero::ElemType::kF32, "bench"); },
         [&] { lz_shm.all_gather(shared.data(), block, zero::ElemType::kF32, "bench"); },
         [&] {
           MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf.data(), static_cast<int>(block), MPI_FLOAT,
                         MPI_COMM_WORLD);
         }},
        {"all-reduce", 2 * share, 2 / (1 / rs_bound + 1),
         [&] { lz.all_reduce_sum(buf.data(), elems, zero::ElemType::kF32, "bench"); },
         [&] { lz_two.all_reduce_sum(buf.data(), elems, zero::ElemType::kF32, "bench"); },
         [&] { lz_mpi.all_reduce_sum(buf.data(), elems, zero::ElemType::kF32, "bench"); },
         [&] { lz_shm.all_reduce_sum(buf.data(), elems, zero::ElemType::kF32, "bench"); },
         [&] { lz_shm.all_reduce_sum(shared.data(), elems, zero::ElemType::kF32, "bench"); },
         [&] { MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(elems), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); }},
    };
    for (const Row& row : rows) {
      auto bw = [&](double t) { return static_cast<double>(bytes) * row.factor / t / 1e9; };
      // Paired: each implementation in turn, so that drift in the machine's state affects all alike.
      const double a = bw(median_time(reps, row.lz)), a2 = bw(median_time(reps, row.lz_two)),
                   b = bw(median_time(reps, row.lz_mpi)), d = bw(median_time(reps, row.lz_shm)),
                   e = bw(median_time(reps, row.lz_arena)), c = bw(median_time(reps, row.ompi));
      const double ceil_bw = ceiling * row.factor / share;
      if (rank == 0)
        std::printf("%-15s %8.0f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %9.0f%% %9.0f%% %9.0f%% %9.2fx\n",
                    row.name, mib, a, a2, b, d, e, c, ceil_bw, 100.0 * a / ceil_bw, 100.0 * a / (ceil_bw * row.bound),
                    100.0 * e / (ceil_bw * row.bound), a / c);
    }
    std::fflush(stdout);
  }
  lz.backend().finalize();
  two_copy->finalize();
  plain->finalize();
  own_shm->finalize();
  MPI_Finalize();
  return 0;
}
