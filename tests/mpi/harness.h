/* Shared pieces of the multi-process tests: an error-checking macro and the uneven test model. */
#ifndef ZERO_TESTS_MPI_HARNESS_H_
#define ZERO_TESTS_MPI_HARNESS_H_

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef ZERO_EXPERIMENTAL_API
#define ZERO_EXPERIMENTAL_API /* zero_comm_create_shm */
#endif
#include "zero/zero.h"

/* A failed check ends the job. Built without MPI (ZERO_TEST_WITHOUT_MPI: a machine without it, such as the GPU
 * check's, where a launcher starts the ranks), it ends this process only; the other ranks then fail in their next
 * collective, naming it, instead of waiting for it. */
#ifdef ZERO_TEST_WITHOUT_MPI
#define TEST_ABORT() exit(1)
#else
#include <mpi.h>
#define TEST_ABORT() MPI_Abort(MPI_COMM_WORLD, 1)
#endif

#define CHECK(call)                                                                                    \
  do {                                                                                                 \
    zero_status_t s_ = (call);                                                                         \
    if (s_ != ZERO_OK) {                                                                               \
      fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call, zero_status_string(s_), \
              zero_last_error());                                                                      \
      TEST_ABORT();                                                                                    \
    }                                                                                                  \
  } while (0)

#define EXPECT(cond, ...)                                                            \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "%s:%d: expectation failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                  \
      fprintf(stderr, "\n");                                                         \
      TEST_ABORT();                                                                  \
    }                                                                                \
  } while (0)

/* A 64-bit integer hash: the tests' gradients and values, reproducible on every rank. */
static inline uint64_t test_mix(uint64_t h) {
  h ^= h >> 17;
  h *= 0xed5ad4bbu;
  h ^= h >> 11;
  h *= 0xac4c1b51u;
  h ^= h >> 15;
  return h;
}

/* Eight params of uneven sizes in three units and two groups: some smaller than any rank count, several not
 * divisible by 3 or 4, so shard boundaries cut through params and padding differs per rank count. */
enum { kNumParams = 8, kNumUnits = 3 };
typedef struct {
  const char* name;
  int ndim;
  int64_t shape[2];
  int unit;
  int group; /* 0: config's optimizer params; 1: the "no_decay" group the tests add */
} TestParam;

static const TestParam kModel[kNumParams] = {
    {"embed.weight", 2, {37, 5}, 0, 0}, {"embed.bias", 1, {1, 0}, 0, 1}, {"block.w1", 2, {13, 7}, 1, 0},
    {"block.b1", 1, {3, 0}, 1, 1},      {"block.norm", 1, {2, 0}, 1, 1}, {"head.w2", 2, {7, 11}, 2, 0},
    {"head.b2", 1, {5, 0}, 2, 1},       {"head.out", 1, {129, 0}, 2, 0},
};

static inline size_t test_param_numel(int p) {
  size_t n = 1;
  for (int d = 0; d < kModel[p].ndim; ++d) n *= (size_t)kModel[p].shape[d];
  return n;
}

/* The documented layout rule (docs/architecture.md), computed independently of the engine: params start at
 * multiples of 64 elements inside their unit; a unit is padded to a multiple of 16 x N. */
static inline size_t test_unit_padded(int unit, int world) {
  size_t end = 0;
  for (int p = 0; p < kNumParams; ++p) {
    if (kModel[p].unit != unit) continue;
    size_t start = (end + 63) / 64 * 64;
    end = start + test_param_numel(p);
  }
  size_t multiple = 16 * (size_t)world;
  return (end + multiple - 1) / multiple * multiple;
}

/* Registers kModel, in `dtype`, with the "no_decay" group as group 1. `init` may be NULL (zeros) or hold
 * kNumParams arrays of fp32 initial values. */
static inline void register_test_model(zero_engine_t* engine, zero_dtype_t dtype, float* const* init, int32_t* ids) {
  zero_param_group_desc_t g = ZERO_PARAM_GROUP_DESC_INIT;
  g.name = "no_decay";
  g.lr = 0.005;
  g.weight_decay = 0.0;
  g.beta1 = 0.8;
  g.beta2 = 0.99;
  int32_t group = -1;
  CHECK(zero_engine_add_param_group(&group, engine, &g));
  if (group != 1) {
    fprintf(stderr, "expected group id 1, got %d\n", group);
    TEST_ABORT();
  }
  for (int p = 0; p < kNumParams; ++p) {
    zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
    d.name = kModel[p].name;
    d.ndim = kModel[p].ndim;
    d.shape = kModel[p].shape;
    d.unit = kModel[p].unit;
    d.group = kModel[p].group;
    d.dtype = dtype;
    d.init_data = init ? init[p] : NULL;
    d.init_dtype = ZERO_DTYPE_FP32;
    CHECK(zero_engine_add_param(&ids[p], engine, &d));
  }
}

/* "--dtype fp32|bf16|fp16" and the matching config block. */
/* The shared-memory communicator (zero_comm_create_shm, no MPI inside libzero) for a process started by a
 * launcher: its rank and the job's size from the launcher's environment (Open MPI's mpirun, or torchrun's RANK and
 * WORLD_SIZE), and `name`, which the test gives every rank alike (CTest: one per test). With
 * ZERO_TEST_SHM_RANKS_PER_NODE, across "nodes" of that many ranks (zero_comm_create_shm_nodes). */
static inline zero_status_t create_shm_comm_from_launcher(zero_comm_t** out, const char* name) {
  const char* rank = getenv("OMPI_COMM_WORLD_RANK");
  const char* size = getenv("OMPI_COMM_WORLD_SIZE");
  if (rank == NULL || size == NULL) {
    rank = getenv("RANK");
    size = getenv("WORLD_SIZE");
  }
  if (rank == NULL || size == NULL) {
    fprintf(stderr, "no launcher environment (OMPI_COMM_WORLD_RANK/SIZE or RANK/WORLD_SIZE)\n");
    exit(2);
  }
  const char* per_node = getenv("ZERO_TEST_SHM_RANKS_PER_NODE");
  if (per_node == NULL) return zero_comm_create_shm(out, name, atoi(rank), atoi(size), 60.0);
  /* "Nodes" of that many ranks on this machine, TCP over loopback between them. The listeners' addresses go
   * through files in /tmp (the test's store: torchrun's would be torch.distributed's): each rank writes its own
   * (renamed into place whole) and reads everyone's. The test command removes them. */
  const int r = atoi(rank), n = atoi(size);
  zero_listener_t* listener = NULL;
  const char* address = NULL;
  zero_status_t st = zero_listener_create(&listener, &address, "127.0.0.1");
  if (st != ZERO_OK) return st;
  char path[512], tmp[520];
  snprintf(path, sizeof path, "/tmp/%s.addr.%d", name, r);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE* f = fopen(tmp, "w");
  if (f == NULL || fprintf(f, "%s", address) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
  char** addresses = calloc((size_t)n, sizeof(char*));
  for (int peer = 0; peer < n; ++peer) {
    addresses[peer] = calloc(256, 1);
    snprintf(path, sizeof path, "/tmp/%s.addr.%d", name, peer);
    /* Polled (the C files including this header ask for different POSIX levels: no sleep call is common to all);
     * the ranks start together, so the files appear within milliseconds. */
    const time_t give_up = time(NULL) + 60;
    for (;;) {
      FILE* in = fopen(path, "r");
      if (in != NULL) {
        const int ok = fgets(addresses[peer], 255, in) != NULL;
        fclose(in);
        if (ok) break;
      }
      if (time(NULL) > give_up) {
        fprintf(stderr, "rank %d: no address from rank %d after 60 s\n", r, peer);
        exit(2);
      }
    }
  }
  st = zero_comm_create_shm_nodes(out, listener, name, r, n, atoi(per_node), (const char* const*)addresses, 60.0);
  zero_listener_destroy(listener);
  for (int peer = 0; peer < n; ++peer) free(addresses[peer]);
  free(addresses);
  return st;
}

static inline zero_dtype_t parse_dtype_arg(const char* s) {
  if (strcmp(s, "bf16") == 0) return ZERO_DTYPE_BF16;
  if (strcmp(s, "fp16") == 0) return ZERO_DTYPE_FP16;
  return ZERO_DTYPE_FP32;
}
static inline const char* dtype_config(zero_dtype_t t) {
  return t == ZERO_DTYPE_BF16   ? ", \"bf16\": {\"enabled\": true}"
         : t == ZERO_DTYPE_FP16 ? ", \"fp16\": {\"enabled\": true}"
                                : "";
}
static inline const char* dtype_text(zero_dtype_t t) {
  return t == ZERO_DTYPE_BF16 ? "bf16" : t == ZERO_DTYPE_FP16 ? "fp16" : "fp32";
}

/* One pass over the test model as a framework makes it. The forward pass gathers and releases every unit in order;
 * the backward pass goes last unit first and, for each param (last first), lets `add` add its gradient into the
 * fp32 gradient buffer `g` of `numel` elements, then declares it ready. */
typedef void (*test_grad_fn)(float* g, int param, size_t numel, const void* ctx);

static inline void test_forward(zero_engine_t* engine) {
  for (int u = 0; u < kNumUnits; ++u) {
    CHECK(zero_gather(engine, u));
    CHECK(zero_release(engine, u));
  }
}

static inline void test_backward(zero_engine_t* engine, const int32_t* ids, test_grad_fn add, const void* ctx) {
  for (int u = kNumUnits - 1; u >= 0; --u) {
    CHECK(zero_gather(engine, u));
    for (int p = kNumParams - 1; p >= 0; --p) {
      if (kModel[p].unit != u) continue;
      /* Through host memory: zero_engine_copy reaches a device engine's gradients as well (a memcpy otherwise). */
      void* grad = NULL;
      CHECK(zero_grad_data(&grad, engine, ids[p]));
      const size_t bytes = test_param_numel(p) * sizeof(float);
      float* g = (float*)malloc(bytes);
      CHECK(zero_engine_copy(engine, g, grad, bytes));
      add(g, p, test_param_numel(p), ctx);
      CHECK(zero_engine_copy(engine, grad, g, bytes));
      free(g);
      CHECK(zero_grad_ready(engine, ids[p]));
    }
    CHECK(zero_release(engine, u));
  }
}

/* The simplest gradient: 2^-10 added to each param's first element. */
static inline void test_grad_first_element(float* g, int param, size_t numel, const void* ctx) {
  (void)param, (void)numel, (void)ctx;
  g[0] += 1.0f / 1024;
}

#endif /* ZERO_TESTS_MPI_HARNESS_H_ */
