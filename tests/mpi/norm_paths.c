/*
 * The gradient norm has the same bits whichever pass sums its squares, on N ranks with order-sensitive values:
 *
 *   mpirun -np N test_norm_paths
 *
 * bf16 training on random per-rank gradients of every magnitude (bf16 values, so that every configuration reduces
 * the same bf16 sums in rank order; their squares summed in fp64 depend on the order of the sum), params of several
 * norm blocks (2^16 elements) per rank interleaved over two units, 8 steps. A wrong offset or range shows in the
 * weights at any N; a wrong order of the blocks' sums shows at N = 1 (adding a block sum in another order changes a
 * rank's partial sum in its last bits only, which the sum over ranks and the square root mostly round away: with 2
 * and 3 ranks, reversing the blocks went unnoticed in 8 steps, at one rank it showed on the third). The reference
 * accumulates in bf16, so nothing is widened after the reduction and the norm has a pass of its own (stage 1, clipping
 * on). Against it, with fp32 accumulation: stages 0 and 1 sum the squares as they widen what was reduced in bf16 (stage
 * 0 the whole buffer, stage 1 the rank's block), stages 2 and 3 as the last micro-step's reductions write the
 * accumulators, stage 0 without clipping or the skip too (its update range is not its norm shard), and stage 1 without
 * them in the optimizer pass. Every reported norm and every final weight must have the reference's bits, and the
 * engine's debug log must name the path each run took.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "harness.h"

enum { kParams = 4, kSteps = 8 };
static const int64_t kSizes[kParams] = {70001, 3, 600001, 200003};

typedef struct {
  const char* want; /* a fragment of a debug message the run must log */
  int seen;
} LogCheck;

static void check_log(void* user_data, int32_t level, int32_t rank, const char* message) {
  (void)level;
  (void)rank;
  LogCheck* c = (LogCheck*)user_data;
  c->seen += strstr(message, c->want) != NULL;
}

static uint16_t to_bf16(float x) { /* round to nearest even; the values here are finite */
  uint32_t u;
  memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Element i of param p on rank r in step t: a bf16 value of magnitude 2^-15 .. 2^15. */
static float grad_value(int t, int r, int p, int64_t i) {
  uint64_t h =
      (uint64_t)(t * 1000003 + r * 7919 + p * 104729) * 0x9e3779b97f4a7c15ull ^ (uint64_t)i * 0xbf58476d1ce4e5b9ull;
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 29;
  const double mantissa = (double)(h & 0xffff) / 65536.0 - 0.5;
  return from_bf16(to_bf16((float)ldexp(mantissa, (int)((h >> 16) % 31) - 15)));
}

/* Trains kSteps steps; writes each step's norm and the final weights (bf16, all params in order). */
static void train(zero_comm_t* comm, int rank, int stage, int clip, int accum_bf16, const char* want_log, double* norms,
                  uint16_t* weights) {
  char config[512];
  snprintf(config, sizeof config,
           "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"gradient_clipping\": %s,"
           " \"bf16\": {\"enabled\": true%s}, \"data_types\": {\"grad_accum_dtype\": \"%s\"},"
           " \"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 0}}",
           clip ? "1e30" : "0", clip ? "" : ", \"check_grad_overflow\": false", accum_bf16 ? "bf16" : "fp32", stage);
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, comm));
  int32_t ids[kParams];
  for (int p = 0; p < kParams; ++p) {
    zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
    char name[8];
    snprintf(name, sizeof name, "p%d", p);
    d.name = name, d.ndim = 1, d.shape = &kSizes[p], d.unit = p % 2, d.dtype = ZERO_DTYPE_BF16;
    CHECK(zero_engine_add_param(&ids[p], engine, &d));
  }
  LogCheck log = {want_log, 0};
  CHECK(zero_set_log_callback(check_log, &log, ZERO_LOG_DEBUG));
  CHECK(zero_engine_finalize(engine));
  for (int t = 0; t < kSteps; ++t) {
    for (int u = 1; u >= 0; --u) {
      CHECK(zero_gather(engine, u));
      for (int p = kParams - 1; p >= 0; --p) {
        if (p % 2 != u) continue;
        void* g = NULL;
        CHECK(zero_grad_data(&g, engine, ids[p]));
        for (int64_t i = 0; i < kSizes[p]; ++i) {
          const float v = grad_value(t, rank, p, i);
          if (accum_bf16)
            ((uint16_t*)g)[i] = to_bf16(v);
          else
            ((float*)g)[i] = v;
        }
        CHECK(zero_grad_ready(engine, ids[p]));
      }
      CHECK(zero_release(engine, u));
    }
    CHECK(zero_backward_end(engine));
    zero_step_info_t info = ZERO_STEP_INFO_INIT;
    CHECK(zero_step(&info, engine));
    norms[t] = info.grad_norm;
  }
  CHECK(zero_set_log_callback(NULL, NULL, ZERO_LOG_WARNING));
  EXPECT(log.seen > 0, "stage %d, clipping %d, %s accumulation: no '%s' in the debug log", stage, clip,
         accum_bf16 ? "bf16" : "fp32", want_log);
  size_t at = 0;
  for (int p = 0; p < kParams; ++p) {
    CHECK(zero_gather(engine, p % 2));
    void* data = NULL;
    CHECK(zero_param_data(&data, engine, ids[p]));
    memcpy(weights + at, data, (size_t)kSizes[p] * 2);
    at += (size_t)kSizes[p];
    CHECK(zero_release(engine, p % 2));
  }
  zero_engine_destroy(engine);
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  zero_comm_t* comm = NULL;
  CHECK(zero_comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD));
  size_t total = 0;
  for (int p = 0; p < kParams; ++p) total += (size_t)kSizes[p];
  uint16_t* want_w = malloc(total * 2);
  uint16_t* got_w = malloc(total * 2);
  double want[kSteps], got[kSteps];
  train(comm, rank, 1, 1, 1, "the squares of 0 of 2 units were summed", want, want_w);
  const char* folded = "the squares of 2 of 2 units were summed";
  const struct {
    int stage, clip;
    const char* log;
  } runs[] = {{0, 1, folded}, {1, 1, folded}, {2, 1, folded},
              {3, 1, folded}, {0, 0, folded}, {1, 0, "summed in the optimizer pass"}};
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (size_t r = 0; r < sizeof runs / sizeof runs[0]; ++r) {
    /* At one rank stage 0 updates exactly its norm shard: without clipping the optimizer pass sums the norm. */
    const int one_rank_pass = world == 1 && runs[r].stage == 0 && !runs[r].clip;
    train(comm, rank, runs[r].stage, runs[r].clip, 0, one_rank_pass ? "summed in the optimizer pass" : runs[r].log, got,
          got_w);
    for (int t = 0; t < kSteps; ++t)
      EXPECT(memcmp(&got[t], &want[t], sizeof(double)) == 0 && isfinite(want[t]),
             "stage %d, clipping %d, step %d: norm %.17g, the reference's %.17g", runs[r].stage, runs[r].clip, t + 1,
             got[t], want[t]);
    for (size_t i = 0; i < total; ++i)
      EXPECT(got_w[i] == want_w[i], "stage %d, clipping %d: weight %zu is 0x%04x, the reference's 0x%04x",
             runs[r].stage, runs[r].clip, i, got_w[i], want_w[i]);
  }
  if (rank == 0) printf("norm paths ok: 7 configurations, the same norms and weights bit for bit\n");
  free(want_w);
  free(got_w);
  zero_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}
