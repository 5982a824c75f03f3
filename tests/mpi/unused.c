/*
 * Params without gradients, and gradients that come late, at stages 2-3 (gradient buckets):
 *  - "head.b2" never gets a gradient. In the first micro-step its bucket (the first one reduced) waits for it, and
 *    every later bucket with it; from then on the bucket no longer expects it, so bucket memory stays at one
 *    bucket while backward runs (checked with zero_memory_stats before zero_backward_end).
 *  - "embed.bias" gets a gradient only in odd micro-steps, only on rank 0, and only after every other gradient of the
 *    micro-step (its bucket is reduced by then): a gradient for a bucket already reduced is reduced again by
 *    zero_backward_end, on every rank.
 *  - unit 1 (a block a model skips, as an expert nobody is routed to) gets gradients only in the first micro-step of
 *    every third step: whole accumulation windows go by in which no reduction writes its shard accumulator, which
 *    the optimizer pass does not clear at stages 2-3 (the next window's first reduction writes it): zero_step
 *    must zero it, or the last window's gradient would be applied again.
 * The final weights and every step's gradient norm equal stage 1's (which reduces whole gradients in zero_step, with
 * no buckets) bit for bit.
 * With --overlap 1 (overlap_comm) the same, with up to two buckets in flight beside the one being filled.
 *
 *   mpirun -np N test_unused [--overlap 0|1]
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { kSteps = 6, kGas = 2 };
static int g_overlap = 0;
static const int kNeverUsed = 6;     /* head.b2, unit 2: in the first bucket reduced */
static const int kSometimesUsed = 1; /* embed.bias, unit 0: in the last bucket */
static const int kSkippedUnit = 1;   /* block.*: a bucket of its own */

static float grad_value(int t, int k, int rank, int p, size_t i) {
  return (float)ldexp((double)((int)((t * 7 + k * 3 + rank * 5 + p * 11 + (int)i) % 13) - 6), -10);
}

/* Trains at `stage`; returns the final weights (all params, registration order) and, at stages 2-3, the largest
 * bucket memory seen before zero_backward_end in micro-steps after the first. */
static float* train(zero_comm_t* comm, int stage, int rank, uint64_t* late_bucket_bytes, uint64_t* first_bucket_bytes,
                    double* norms) {
  char config[512];
  snprintf(config, sizeof config,
           "{\"gradient_accumulation_steps\": %d, \"train_micro_batch_size_per_gpu\": 1,"
           " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
           " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 250,"
           " \"stage3_param_persistence_threshold\": 0, \"overlap_comm\": %s}}",
           kGas, stage, g_overlap ? "true" : "false");
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, comm));
  int32_t ids[kNumParams];
  register_test_model(engine, ZERO_DTYPE_FP32, NULL, ids);
  CHECK(zero_engine_finalize(engine));
  *late_bucket_bytes = 0;
  int micro = 0;
  for (int t = 1; t <= kSteps; ++t) {
    for (int k = 0; k < kGas; ++k, ++micro) {
      for (int u = kNumUnits - 1; u >= 0; --u) {
        CHECK(zero_gather(engine, u));
        for (int p = kNumParams - 1; p >= 0; --p) {
          if (kModel[p].unit != u || p == kNeverUsed || p == kSometimesUsed) continue;
          if (u == kSkippedUnit && !(t % 3 == 0 && k == 0)) continue;
          float* g = NULL;
          CHECK(zero_grad_data((void**)&g, engine, ids[p]));
          for (size_t i = 0; i < test_param_numel(p); ++i) g[i] += grad_value(t, k, rank, p, i);
          CHECK(zero_grad_ready(engine, ids[p]));
        }
        CHECK(zero_release(engine, u));
      }
      if (micro % 2 == 1 && rank == 0) { /* late: its bucket was reduced above (or expects nothing) */
        float* g = NULL;
        CHECK(zero_grad_data((void**)&g, engine, ids[kSometimesUsed]));
        for (size_t i = 0; i < test_param_numel(kSometimesUsed); ++i) g[i] += grad_value(t, k, rank, kSometimesUsed, i);
        CHECK(zero_grad_ready(engine, ids[kSometimesUsed]));
      }
      zero_memory_stats_t mem = ZERO_MEMORY_STATS_INIT;
      CHECK(zero_memory_stats(&mem, engine));
      if (micro == 0) *first_bucket_bytes = mem.bucket_bytes;
      if (micro > 0 && mem.bucket_bytes > *late_bucket_bytes) *late_bucket_bytes = mem.bucket_bytes;
      CHECK(zero_backward_end(engine));
    }
    zero_step_info_t info = ZERO_STEP_INFO_INIT;
    CHECK(zero_step(&info, engine));
    norms[t - 1] = info.grad_norm;
  }
  size_t total = 0;
  for (int p = 0; p < kNumParams; ++p) total += test_param_numel(p);
  float* out = malloc(total * sizeof(float));
  size_t at = 0;
  for (int p = 0; p < kNumParams; ++p) {
    CHECK(zero_gather(engine, kModel[p].unit));
    void* data = NULL;
    CHECK(zero_param_data(&data, engine, ids[p]));
    memcpy(out + at, data, test_param_numel(p) * sizeof(float));
    at += test_param_numel(p);
    CHECK(zero_release(engine, kModel[p].unit));
  }
  zero_engine_destroy(engine);
  return out;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  for (int i = 1; i + 1 < argc; i += 2)
    if (strcmp(argv[i], "--overlap") == 0) g_overlap = atoi(argv[i + 1]);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  zero_comm_t* comm = NULL;
  CHECK(zero_comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD));
  size_t total = 0;
  for (int p = 0; p < kNumParams; ++p) total += test_param_numel(p);
  uint64_t late = 0, first = 0;
  double reference_norms[kSteps], norms[kSteps];
  float* reference = train(comm, 1, rank, &late, &first, reference_norms);
  /* The largest bucket: the layout rule of harness.h, units in backward order, 250 elements per bucket. */
  uint64_t largest = 0, bucket = 0;
  for (int u = kNumUnits - 1; u >= 0; --u) {
    const uint64_t n = test_unit_padded(u, world);
    if (bucket > 0 && bucket + n > 250) bucket = 0;
    bucket += n;
    if (bucket > largest) largest = bucket;
  }
  for (int stage = 2; stage <= 3; ++stage) {
    float* got = train(comm, stage, rank, &late, &first, norms);
    /* Stages 2-3 sum the squares as the last micro-step's reductions write the accumulators, except for a unit no
     * reduction of that micro-step wrote (the skipped block), whose squares zero_step reads: the same bits. */
    for (int t = 0; t < kSteps; ++t)
      EXPECT(memcmp(&norms[t], &reference_norms[t], sizeof(double)) == 0, "stage %d step %d: norm %.17g, stage 1 %.17g",
             stage, t + 1, norms[t], reference_norms[t]);
    for (size_t i = 0; i < total; ++i)
      EXPECT(memcmp(&got[i], &reference[i], sizeof(float)) == 0, "stage %d: weight %zu is %.9g, stage 1 has %.9g",
             stage, i, got[i], reference[i]);
    /* The one being filled, with overlap two in flight, and the skipped block's: after a micro-step without them its
     * gradients are not expected, so they wait in a bucket buffer of their own until zero_backward_end. */
    const uint64_t buckets = (g_overlap ? 3 : 1) + 1;
    EXPECT(late <= buckets * 4 * largest,
           "stage %d: %llu bytes of buckets after the first micro-step, one bucket is %llu", stage,
           (unsigned long long)late, (unsigned long long)(4 * largest));
    if (rank == 0)
      printf(
          "unused ok: stage %d on %d ranks equals stage 1 bit for bit; bucket memory %llu bytes in the first "
          "micro-step, at most %llu after (one bucket: %llu)\n",
          stage, world, (unsigned long long)first, (unsigned long long)late, (unsigned long long)(4 * largest));
    free(got);
  }
  free(reference);
  zero_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}
