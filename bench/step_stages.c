/*
 * One training iteration per ZeRO stage, split into where the time goes: the micro-step's collective calls
 * (zero_gather in forward and backward, zero_grad_ready with its bucket reductions, zero_backward_end: all
 * exposed communication, since this benchmark runs no model), zero_step (its reductions at stages 0-1, the norm
 * exchange, the optimizer pass, publishing the params), and the stage-3 / stage-0 ratio of the whole iteration.
 * The model: --params-millions fp32 params in --units equal units (one param each), AdamW, clipping at 1.0
 * (--clip 0: no clipping and no norm before the update, compute_grad_norm false: in fp32 the optimizer pass sums the
 * squares, the "1pass" step of step_vs_torch.py; 16-bit modes may still check for overflow first).
 * Medians over --steps iterations after one warm-up. The gradient writes (one add per element, what a framework's
 * backward would produce) are timed apart ("grad writes") and left out of the communication figure; "of which
 * ready" is the part of it spent in zero_grad_ready (at stages 2-3 with overlap off: the buckets' reductions and the
 * adds of the reduced blocks into the accumulators).
 *
 * --overlap 1 sets overlap_comm (bucket reductions completed later, while backward goes on; new params all-gathered
 * in the background; stage-3 prefetch and reuse with DeepSpeed's defaults).
 *
 * --compute-ms C adds C ms of a model's compute per unit in forward and 2C in backward, between the calls, so that
 * communication can hide behind it: --compute-kind sleep (default) leaves the core free, as a GPU's kernels do;
 * spin keeps it busy, as a CPU model does. The compute is not counted in "micro-step comm".
 * --dtype bf16 trains bf16 params with an fp32 master (bf16.enabled): gradients still accumulate in fp32, and are
 * reduced in bf16 (DeepSpeed's default communication dtype), so stages 0-1 widen them after the reduction.
 * --comm shm runs the engine over libzero's shared-memory communicator (zero_comm_create_shm, what a torchrun job
 * without MPI uses; its gradient buckets then live in the node's shared arena) instead of the MPI module; MPI
 * still launches the ranks and takes the times.
 *
 *   mpirun -np 2 bench_step_stages --params-millions 64 --units 16 --steps 5 [--overlap 0|1] [--compute-ms C]
 *                                  [--compute-kind sleep|spin] [--stages 0,3] [--dtype fp32|bf16] [--comm mpi|shm]
 *                                  [--clip 1|0]
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ZERO_EXPERIMENTAL_API /* zero_comm_create_shm */
#include "zero/zero.h"

#define CHECK(call)                                                                      \
  do {                                                                                   \
    zero_status_t s_ = (call);                                                           \
    if (s_ != ZERO_OK) {                                                                 \
      fprintf(stderr, "%s: %s: %s\n", #call, zero_status_string(s_), zero_last_error()); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                      \
    }                                                                                    \
  } while (0)

static double g_compute_ms = 0;
static int g_spin = 0;

/* A model's compute for `ms` milliseconds. */
static void compute(double ms) {
  if (ms <= 0) return;
  if (g_spin) {
    const double end = MPI_Wtime() + ms * 1e-3;
    volatile double x = 1.0;
    while (MPI_Wtime() < end)
      for (int i = 0; i < 1000; ++i) x = x * 1.0000001 + 1e-9;
    return;
  }
  struct timespec t = {(time_t)(ms / 1000), (long)((ms - 1000.0 * (double)(time_t)(ms / 1000)) * 1e6)};
  nanosleep(&t, NULL);
}

static int compare(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, compare);
  return v[n / 2];
}

/* The slowest rank's value. */
static double slowest(double t) {
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

int main(int argc, char** argv) {
  double millions = 64;
  int units = 16, steps = 5, overlap = 0, bf16 = 0, shm = 0, clip = 1;
  const char* stages = "0,1,2,3";
  int bad = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--compute-ms") == 0) g_compute_ms = atof(argv[i + 1]);
    if (strcmp(argv[i], "--compute-kind") == 0) g_spin = strcmp(argv[i + 1], "spin") == 0;
    if (strcmp(argv[i], "--stages") == 0) stages = argv[i + 1];
    if (strcmp(argv[i], "--params-millions") == 0) millions = atof(argv[i + 1]);
    if (strcmp(argv[i], "--units") == 0) units = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--steps") == 0) steps = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--overlap") == 0) overlap = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--clip") == 0) clip = atof(argv[i + 1]) != 0;
    if (strcmp(argv[i], "--comm") == 0) {
      shm = strcmp(argv[i + 1], "shm") == 0;
      if (!shm && strcmp(argv[i + 1], "mpi") != 0) bad = 1;
    }
    if (strcmp(argv[i], "--dtype") == 0) {
      bf16 = strcmp(argv[i + 1], "bf16") == 0;
      if (!bf16 && strcmp(argv[i + 1], "fp32") != 0) bad = 1;
    }
  }
  if (bad || units < 1 || steps < 1 || steps > 100 || millions <= 0) {
    fprintf(stderr,
            "usage: bench_step_stages [--params-millions M] [--units U] [--steps S (1-100)] [--dtype fp32|bf16] "
            "[--comm mpi|shm] [--clip 1|0]\n");
    return 2;
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  zero_comm_t* comm = NULL;
  if (shm) {
    /* The ranks join by a name they share: rank 0's process id. */
    long job = (long)getpid();
    MPI_Bcast(&job, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    char name[64];
    snprintf(name, sizeof name, "bench-step-stages-%ld", job);
    CHECK(zero_comm_create_shm(&comm, name, rank, world, 60.0));
  } else {
    CHECK(zero_comm_create_mpi(&comm, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD)));
  }
  const int64_t per_unit = (int64_t)(millions * 1e6 / units);
  double iteration[4] = {0, 0, 0, 0};
  if (rank == 0)
    printf(
        "%.0f M %s params in %d units, %d ranks (%s), AdamW, %s, overlap_comm %s, compute %.1f ms per unit (%s), "
        "medians of %d iterations (ms, slowest rank)\n"
        "stage  micro-step comm   of which ready   grad writes   zero_step   iteration   MiB moved/rank\n",
        millions, bf16 ? "bf16 (fp32 master and gradients, bf16 reductions)" : "fp32", units, world,
        shm ? "shared-memory communicator" : "MPI module", clip ? "clipping at 1.0" : "no clipping, no norm first",
        overlap ? "on" : "off", g_compute_ms, g_spin ? "spin" : "sleep", steps);
  for (int stage = 0; stage <= 3; ++stage) {
    if (strchr(stages, '0' + stage) == NULL) continue;
    char config[400];
    snprintf(config, sizeof config,
             "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}}, \"gradient_clipping\": %s,"
             " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": %lld,"
             " \"stage3_param_persistence_threshold\": 0, \"overlap_comm\": %s%s}%s}",
             clip ? "1.0" : "0.0", stage, (long long)(2 * per_unit), overlap ? "true" : "false",
             clip ? "" : ", \"compute_grad_norm\": false", bf16 ? ", \"bf16\": {\"enabled\": true}" : "");
    zero_engine_t* engine = NULL;
    CHECK(zero_engine_create(&engine, config, comm));
    for (int u = 0; u < units; ++u) {
      char name[32];
      snprintf(name, sizeof name, "w%d", u);
      int64_t shape[1] = {per_unit};
      zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
      d.name = name, d.ndim = 1, d.shape = shape, d.unit = u;
      d.dtype = bf16 ? ZERO_DTYPE_BF16 : ZERO_DTYPE_FP32;
      int32_t id = -1;
      CHECK(zero_engine_add_param(&id, engine, &d));
    }
    CHECK(zero_engine_finalize(engine));
    double comm_t[100], grad_t[100], step_t[100], iter_t[100], ready_t[100];
    zero_comm_stats_t before = ZERO_COMM_STATS_INIT, after = ZERO_COMM_STATS_INIT;
    for (int it = -1; it < steps; ++it) {
      if (it == 0) CHECK(zero_comm_stats(&before, engine));
      MPI_Barrier(MPI_COMM_WORLD);
      double in_comm = 0, in_grads = 0, in_ready = 0;
      const double t0 = MPI_Wtime();
      for (int u = 0; u < units; ++u) { /* forward */
        double a = MPI_Wtime();
        CHECK(zero_gather(engine, u));
        in_comm += MPI_Wtime() - a;
        compute(g_compute_ms);
        a = MPI_Wtime();
        CHECK(zero_release(engine, u));
        in_comm += MPI_Wtime() - a;
      }
      for (int u = units - 1; u >= 0; --u) { /* backward */
        double a = MPI_Wtime();
        CHECK(zero_gather(engine, u));
        float* g = NULL;
        CHECK(zero_grad_data((void**)&g, engine, u));
        in_comm += MPI_Wtime() - a;
        compute(2 * g_compute_ms);
        a = MPI_Wtime();
        for (int64_t i = 0; i < per_unit; ++i) g[i] += 1e-4f;
        in_grads += MPI_Wtime() - a;
        a = MPI_Wtime();
        CHECK(zero_grad_ready(engine, u));
        in_ready += MPI_Wtime() - a;
        CHECK(zero_release(engine, u));
        in_comm += MPI_Wtime() - a;
      }
      double a = MPI_Wtime();
      CHECK(zero_backward_end(engine));
      in_comm += MPI_Wtime() - a;
      a = MPI_Wtime();
      CHECK(zero_step(NULL, engine));
      const double in_step = MPI_Wtime() - a, total = MPI_Wtime() - t0;
      if (it >= 0) {
        comm_t[it] = slowest(in_comm), grad_t[it] = slowest(in_grads), ready_t[it] = slowest(in_ready);
        step_t[it] = slowest(in_step), iter_t[it] = slowest(total);
      }
    }
    CHECK(zero_comm_stats(&after, engine));
    const double moved =
        (double)(after.all_gather.wire_bytes + after.reduce_scatter.wire_bytes + after.all_reduce.wire_bytes -
                 before.all_gather.wire_bytes - before.reduce_scatter.wire_bytes - before.all_reduce.wire_bytes) /
        steps / 1048576.0;
    iteration[stage] = median(iter_t, steps);
    if (rank == 0)
      printf("%-5d %16.1f %16.1f %13.1f %11.1f %11.1f %16.1f\n", stage, 1e3 * median(comm_t, steps),
             1e3 * median(ready_t, steps), 1e3 * median(grad_t, steps), 1e3 * median(step_t, steps),
             1e3 * iteration[stage], moved);
    fflush(stdout);
    zero_engine_destroy(engine);
  }
  if (rank == 0 && iteration[0] > 0 && iteration[3] > 0)
    printf("stage-3 / stage-0 iteration time: %.2f\n", iteration[3] / iteration[0]);
  CHECK(zero_comm_finalize(comm));
  zero_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}
