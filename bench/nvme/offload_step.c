/*
 * zero_step with the optimizer state offloaded to NVMe against the same step in memory, one process:
 *
 *   bench_offload_step --dir DIR [--params-millions P] [--units U] [--steps S] [--dtype fp32|bf16]
 *                      [--buffers B] [--chunk ELEMS] [--stage S] [--only memory|offload] [--comm single|mpi]
 *                      [--params-nvme 0|1]
 *
 * --comm mpi runs on MPI_COMM_WORLD (under mpirun; libzero initialises MPI itself) and --only runs one of the two
 * engines: bench/nvme/largest.sh uses both to find the largest model a 2-rank job trains under a memory limit.
 *
 * The model: P million params in U equal units, AdamW, clipping at 1.0, one unit per gradient bucket (DeepSpeed's
 * default reduce_bucket_size, 5e8 elements, would hold the whole model in one fp32 bucket). Each iteration adds a
 * constant gradient into every param, declares it ready, ends the micro-step and steps; the figure is the median
 * zero_step time over S steps after one warm-up, for the in-memory engine (what the optimizer itself costs) and then
 * for the offloaded one. The last line is machine-readable for bench/nvme/step.sh, which measures the disk with fio on
 * a file of the same size and prints the ratio against max(read, write, optimizer).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ZERO_EXPERIMENTAL_API
#include "zero/zero.h"

#define CHECK(call)                                                                      \
  do {                                                                                   \
    zero_status_t s_ = (call);                                                           \
    if (s_ != ZERO_OK) {                                                                 \
      fprintf(stderr, "%s: %s: %s\n", #call, zero_status_string(s_), zero_last_error()); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

typedef struct {
  double step_s; /* median zero_step */
  uint64_t file_bytes, window_bytes, host_bytes;
} Result;

static int g_mpi = 0;
static int g_params_nvme = 0; /* --params-nvme 1: offload_param too (stage 3) */

static Result run(const char* dir, double params_m, int units, int steps, int bf16, int buffers, long chunk,
                  int stage) {
  zero_comm_t* comm = NULL;
  if (g_mpi)
    CHECK(zero_comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD));
  else
    CHECK(zero_comm_create_single(&comm));
  char offload[512] = "";
  if (dir != NULL && chunk > 0) snprintf(offload, sizeof offload, ", \"sub_group_size\": %ld", chunk);
  if (dir != NULL && g_params_nvme)
    snprintf(offload + strlen(offload), sizeof offload - strlen(offload),
             ", \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"%s\"}", dir);
  if (dir != NULL)
    snprintf(offload + strlen(offload), sizeof offload - strlen(offload),
             ", \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"%s\", \"buffer_count\": %d}", dir,
             buffers);
  char config[1024];
  snprintf(config, sizeof config,
           "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_clipping\": 1.0,"
           " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4, \"weight_decay\": 0.01}},"
           " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": %lld%s}%s}",
           stage, (long long)(params_m * 1e6 / units), offload, bf16 ? ", \"bf16\": {\"enabled\": true}" : "");
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, comm));
  const int64_t per_unit = (int64_t)(params_m * 1e6 / units);
  int32_t* ids = malloc(sizeof(int32_t) * (size_t)units);
  char name[32];
  for (int u = 0; u < units; ++u) {
    zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
    snprintf(name, sizeof name, "w%d", u);
    d.name = name;
    d.ndim = 1;
    d.shape = &per_unit;
    d.unit = u;
    CHECK(zero_engine_add_param(&ids[u], engine, &d));
  }
  CHECK(zero_engine_finalize(engine));
  double* times = malloc(sizeof(double) * (size_t)(steps + 1));
  for (int t = 0; t <= steps; ++t) {
    for (int u = units - 1; u >= 0; --u) {
      CHECK(zero_gather(engine, u));
      float* g = NULL;
      CHECK(zero_grad_data((void**)&g, engine, ids[u]));
      for (int64_t i = 0; i < per_unit; ++i) g[i] += 1e-3f * (float)((i & 7) - 3);
      CHECK(zero_grad_ready(engine, ids[u]));
      CHECK(zero_release(engine, u));
    }
    CHECK(zero_backward_end(engine));
    zero_step_info_t info = ZERO_STEP_INFO_INIT;
    const double t0 = now();
    CHECK(zero_step(&info, engine));
    times[t] = now() - t0;
  }
  qsort(times + 1, (size_t)steps, sizeof(double), cmp_double);
  Result r;
  r.step_s = times[1 + steps / 2];
  zero_memory_placement_t mp = ZERO_MEMORY_PLACEMENT_INIT;
  CHECK(zero_memory_placement(&mp, engine));
  r.file_bytes = mp.nvme_bytes;
  r.window_bytes = mp.staging_bytes;
  r.host_bytes = mp.host_bytes;
  free(times);
  free(ids);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
  return r;
}

int main(int argc, char** argv) {
  const char* dir = NULL;
  double params_m = 64;
  int units = 16, steps = 5, bf16 = 1, buffers = 4, stage = 1;
  long chunk = 0; /* 0: libzero's default chunk */
  const char* only = "";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
    if (strcmp(argv[i], "--params-millions") == 0) params_m = atof(argv[i + 1]);
    if (strcmp(argv[i], "--units") == 0) units = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--steps") == 0) steps = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--dtype") == 0) bf16 = strcmp(argv[i + 1], "bf16") == 0;
    if (strcmp(argv[i], "--buffers") == 0) buffers = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--chunk") == 0) chunk = atol(argv[i + 1]);
    if (strcmp(argv[i], "--stage") == 0) stage = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--only") == 0) only = argv[i + 1];
    if (strcmp(argv[i], "--comm") == 0) g_mpi = strcmp(argv[i + 1], "mpi") == 0;
    if (strcmp(argv[i], "--params-nvme") == 0) g_params_nvme = atoi(argv[i + 1]);
  }
  if (dir == NULL || units < 1 || steps < 1 || params_m <= 0) {
    fprintf(stderr,
            "usage: bench_offload_step --dir DIR [--params-millions P] [--units U] [--steps S] "
            "[--dtype fp32|bf16] [--buffers B] [--chunk ELEMS] [--stage S]\n");
    return 2;
  }
  if (only[0] != '\0') { /* one engine: the largest-model search */
    const int offload = strcmp(only, "offload") == 0;
    const Result r = run(offload ? dir : NULL, params_m, units, steps, bf16, buffers, chunk, stage);
    printf(
        "trained %.0f M %s params at stage %d (%s): zero_step %.3f s, host memory %.1f MiB, NVMe file %.1f MiB "
        "(per rank)\n",
        params_m, bf16 ? "bf16" : "fp32", stage,
        !offload        ? "in memory"
        : g_params_nvme ? "optimizer state and params on NVMe"
                        : "optimizer state on NVMe",
        r.step_s, (double)r.host_bytes / 1048576.0, (double)r.file_bytes / 1048576.0);
    return 0;
  }
  const Result mem = run(NULL, params_m, units, steps, bf16, buffers, chunk, stage);
  const Result off = run(dir, params_m, units, steps, bf16, buffers, chunk, stage);
  printf(
      "%.0f M %s params, stage %d, one rank: zero_step in memory %.3f s, offloaded %.3f s; file %.1f MiB, window "
      "%.1f MiB, host memory %.1f MiB offloaded vs %.1f MiB in memory\n",
      params_m, bf16 ? "bf16" : "fp32", stage, mem.step_s, off.step_s, (double)off.file_bytes / 1048576.0,
      (double)off.window_bytes / 1048576.0, (double)off.host_bytes / 1048576.0, (double)mem.host_bytes / 1048576.0);
  printf("RESULT mem_step_s=%.6f off_step_s=%.6f file_bytes=%llu\n", mem.step_s, off.step_s,
         (unsigned long long)off.file_bytes);
  return 0;
}
