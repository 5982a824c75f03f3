// libzero's NCCL module against NCCL's own calls, in the same run on the same GPUs (bench/README.md, "GPU"): bus
// bandwidth of the all-gather and the reduce-scatter through the module's callback table (start, then wait: what the
// engine does, its events and stream waits included) over the same collectives called on NCCL directly, and the
// deterministic reduce-scatter (bf16: block exchange + rank-order device sum) over NCCL's own bf16 reduce-scatter.
// Bus bandwidth as nccl-tests counts it: size = the whole per-rank buffer (N blocks), busBw = size / time x (N-1)/N.
// Each figure is the median over alternating pairs (module, then NCCL) of its ratio.
//
//   examples/gpt/launch_ranks.sh N bench_nccl [--sizes 4,16,64,256] [--reps 20]
//
// (the launcher gives each process --world, --rank, --job and its own NCCL_HOSTID, so that several share one GPU).
// Sizes in MiB per rank. Without a CUDA device it says so and exits 0: it is not a test.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "../../backends/nccl/nccl_backend.h"
#include "zero/zero_backend.h"

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_nccl: %s\n", what.c_str());
  std::exit(1);
}
void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}
void ok(zero_status_t s, const char* what, const char* detail = "") {
  if (s != ZERO_OK) die(std::string(what) + ": " + zero_status_string(s) + " " + detail);
}

void* symbol(void* handle, const char* name) {
  void* s = dlsym(handle, name);
  if (s == nullptr) die(std::string("no ") + name);
  return s;
}

// What rank 0 made, handed to the others through a file (the job's name keeps jobs apart): no MPI here.
void share(const std::string& path, int rank, void* bytes, size_t n) {
  if (rank == 0) {
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp, std::ios::binary).write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
    if (std::rename(tmp.c_str(), path.c_str()) != 0) die("cannot write " + path);
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in && in.read(static_cast<char*>(bytes), static_cast<std::streamsize>(n))) return;
    if (std::chrono::steady_clock::now() > deadline) die("rank 0 never wrote " + path);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Raw {  // NCCL's own calls, loaded as the module loads them
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
};

}  // namespace

int main(int argc, char** argv) {
  int world = 1, rank = 0, reps = 20;
  std::string job = "bench-nccl", sizes_arg = "4,16,64,256";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--world")
      world = std::atoi(argv[i + 1]);
    else if (a == "--rank")
      rank = std::atoi(argv[i + 1]);
    else if (a == "--job")
      job = argv[i + 1];
    else if (a == "--sizes")
      sizes_arg = argv[i + 1];
    else if (a == "--reps")
      reps = std::atoi(argv[i + 1]);
    else
      die("unknown option " + a);
  }
  if (world < 2 || rank < 0 || rank >= world || reps < 1) die("run under examples/gpt/launch_ranks.sh N (N >= 2)");
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_nccl: no CUDA device: nothing to measure\n");
    return 0;
  }
  ok(cudaSetDevice(rank % devices), "cudaSetDevice");

  const char* module_path = std::getenv("ZERO_NCCL_MODULE");
  void* module = dlopen(module_path != nullptr ? module_path : ZERO_NCCL_BACKEND_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (module == nullptr) die(std::string("cannot load the NCCL module: ") + dlerror());
  auto prepare = reinterpret_cast<zero_nccl_backend_prepare_fn>(symbol(module, ZERO_NCCL_BACKEND_PREPARE));
  auto open = reinterpret_cast<zero_nccl_backend_open_fn>(symbol(module, ZERO_NCCL_BACKEND_OPEN));
  const char* nccl_path = std::getenv("ZERO_NCCL_LIBRARY");
  void* nccl = dlopen(nccl_path != nullptr ? nccl_path : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (nccl == nullptr) die(std::string("cannot load NCCL: ") + dlerror());
  Raw raw{};
  raw.GetUniqueId = reinterpret_cast<decltype(raw.GetUniqueId)>(symbol(nccl, "ncclGetUniqueId"));
  raw.CommInitRank = reinterpret_cast<decltype(raw.CommInitRank)>(symbol(nccl, "ncclCommInitRank"));
  raw.CommDestroy = reinterpret_cast<decltype(raw.CommDestroy)>(symbol(nccl, "ncclCommDestroy"));
  raw.AllGather = reinterpret_cast<decltype(raw.AllGather)>(symbol(nccl, "ncclAllGather"));
  raw.ReduceScatter = reinterpret_cast<decltype(raw.ReduceScatter)>(symbol(nccl, "ncclReduceScatter"));

  // Two communicators over the same ranks: the module's and a plain one.
  char error[1024] = {};
  int32_t version = 0;
  unsigned char ids[2][ZERO_NCCL_UNIQUE_ID_BYTES] = {};
  ok(prepare(&version, rank == 0 ? ids[0] : nullptr, rank % devices, error, sizeof error), "prepare", error);
  if (rank == 0 && raw.GetUniqueId(reinterpret_cast<ncclUniqueId*>(ids[1])) != ncclSuccess) die("ncclGetUniqueId");
  share("/tmp/" + job + ".ids", rank, ids, sizeof ids);
  zero_comm_ops_t ops;
  std::memset(&ops, 0, sizeof ops);
  ops.struct_size = sizeof ops;
  void* backend = nullptr;
  ok(open(&ops, &backend, rank, world, rank % devices, ids[0], 120.0, error, sizeof error), "open", error);
  ncclUniqueId plain_id;
  std::memcpy(&plain_id, ids[1], sizeof plain_id);
  ncclComm_t plain = nullptr;
  if (raw.CommInitRank(&plain, world, plain_id, rank) != ncclSuccess) die("ncclCommInitRank");

  cudaStream_t stream = nullptr;
  ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  if (rank == 0)
    std::printf("NCCL %d, %d ranks on %d device(s); %d pairs per size\n%-34s %8s %12s %12s %8s\n", version, world,
                devices, reps, "collective", "MiB", "module GB/s", "NCCL GB/s", "ratio");
  std::vector<double> sizes;
  for (const char* p = sizes_arg.c_str(); *p != '\0';) {
    char* end = nullptr;
    sizes.push_back(std::strtod(p, &end));
    p = *end == ',' ? end + 1 : end;
  }
  struct Case {
    const char* name;
    int32_t kind, dtype;
    ncclDataType_t nccl_type;
    size_t elem;
  };
  const Case cases[] = {
      {"all-gather fp32", ZERO_COLL_ALL_GATHER, ZERO_DTYPE_FP32, ncclFloat32, 4},
      {"reduce-scatter fp32", ZERO_COLL_REDUCE_SCATTER, ZERO_DTYPE_FP32, ncclFloat32, 4},
      {"reduce-scatter bf16 (rank order)", ZERO_COLL_REDUCE_SCATTER, ZERO_DTYPE_BF16, ncclBfloat16, 2},
  };
  for (double mib : sizes) {
    const size_t bytes =
        static_cast<size_t>(mib * (1 << 20)) / (static_cast<size_t>(world) * 256) * static_cast<size_t>(world) * 256;
    void* buf = nullptr;
    ok(cudaMalloc(&buf, bytes), "cudaMalloc");
    ok(cudaMemset(buf, 0, bytes), "cudaMemset");
    for (const Case& c : cases) {
      const size_t block = bytes / static_cast<size_t>(world) / c.elem;
      auto module_once = [&] {
        zero_collective_t coll;
        zero_collective_init(&coll, sizeof coll);
        coll.kind = c.kind, coll.dtype = c.dtype, coll.buf = buf, coll.count = block, coll.stream = stream;
        coll.label = c.name;
        void* request = nullptr;
        ok(ops.start(&request, backend, &coll), "start", ops.error_message(backend));
        int32_t done = 0;
        while (!done) ok(ops.wait(&done, backend, request, 60.0), "wait", ops.error_message(backend));
        ok(cudaStreamSynchronize(stream), "sync");
      };
      auto nccl_once = [&] {
        char* b = static_cast<char*>(buf);
        const size_t own = static_cast<size_t>(rank) * block * c.elem;
        const ncclResult_t r = c.kind == ZERO_COLL_ALL_GATHER
                                   ? raw.AllGather(b + own, b, block, c.nccl_type, plain, stream)
                                   : raw.ReduceScatter(b, b + own, block, c.nccl_type, ncclSum, plain, stream);
        if (r != ncclSuccess) die("NCCL's own collective failed");
        ok(cudaStreamSynchronize(stream), "sync");
      };
      auto seconds = [](auto&& fn) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      };
      module_once(), nccl_once();  // warm-up: NCCL's first call of a kind sets up its channels
      std::vector<double> ratio, module_t, nccl_t;
      for (int i = 0; i < reps; ++i) {
        const double m = seconds(module_once), n = seconds(nccl_once);
        module_t.push_back(m), nccl_t.push_back(n), ratio.push_back(n / m);
      }
      const double bus = static_cast<double>(bytes) * (world - 1) / world / 1e9;
      if (rank == 0)
        std::printf("%-34s %8.0f %12.2f %12.2f %8.3f\n", c.name, mib, bus / median(module_t), bus / median(nccl_t),
                    median(ratio));
    }
    ok(cudaFree(buf), "cudaFree");
  }
  if (rank == 0)
    std::printf(
        "(ratio: the module's bus bandwidth over NCCL's own, median of pairs; goal >= 0.95 "
        "where both run NCCL's algorithm)\n");
  ops.finalize(backend);
  ops.destroy(backend);
  raw.CommDestroy(plain);
  if (rank == 0) std::remove(("/tmp/" + job + ".ids").c_str());
  return 0;
}
