/*
 * Every rank count and accumulation count trains the same weights whenever the averaged gradient is the same.
 *
 *   mpirun -np N test_invariance --stage S --gas G [--dtype fp32|bf16] [--stochastic-rounding 1]
 *
 * Every rank adds the same gradient g_t in each of its G micro-steps, so the averaged gradient is g_t whatever N and
 * G. Rank 0 also trains a second engine on a one-rank communicator with one micro-step per step, adding g_t once:
 * the reference is libzero itself at N = 1, G = 1. The final weights must be equal bit for bit, on every rank, at
 * every stage, with clipping engaging on some steps.
 *
 * The gradients are k x 2^-12 with |k| < 2^12: not a problem for the sums (N x G x g is exact in fp32 for N x G <=
 * 16, the squares and their sums exact in fp64), but N x G = 3 or 9 is not a power of two, so an averaging that
 * multiplied by a rounded 1/(N x G), or folded the clip into it, would differ from N = 1 in the last bit. libzero
 * divides the sum once by N x G (exact when the average is representable) and clips with a separate multiply.
 *
 * With bf16 stochastic rounding the bf16 params must be equal too: each element's rounding is keyed by its index
 * in the model without padding (the padding of a unit grows with N, so a padded index would round a later unit's
 * elements differently at N = 3 than at N = 1).
 */
#include <math.h>
#include <string.h>

#include "harness.h"

enum { kSteps = 12 };
static zero_dtype_t g_dtype = ZERO_DTYPE_FP32;
static int g_stochastic_rounding = 0;

static uint64_t mix64(uint64_t h) {
  h ^= h >> 31;
  h *= 0x7fb5d329728ea185ull;
  h ^= h >> 27;
  h *= 0x81dadef4bc2dd44dull;
  h ^= h >> 33;
  return h;
}

/* The same on every rank and micro-step. */
static float grad_value(int t, int p, size_t i) {
  const uint64_t h = mix64((uint64_t)t * 1000003u + (uint64_t)p * 7919u + i);
  const int k = (int)(h % 4001) - 2000; /* |k| < 2^11 */
  return (float)ldexp((double)k * (double)(t % 3 + 1), -12);
}

static zero_engine_t* make(zero_comm_t* comm, int stage, int gas, int32_t* ids) {
  char config[768];
  snprintf(config, sizeof config,
           "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": %d, \"gradient_clipping\": 12.0,"
           " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}},"
           " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 400,"
           " \"stage3_param_persistence_threshold\": 0}%s%s}",
           gas, stage,
           g_dtype != ZERO_DTYPE_BF16 ? ""
           : g_stochastic_rounding    ? ", \"bf16\": {\"enabled\": true, \"stochastic_rounding\": true}"
                                      : ", \"bf16\": {\"enabled\": true}",
           /* sums of bf16 values would round: reduce in fp32 */
           g_dtype == ZERO_DTYPE_BF16 ? ", \"communication_data_type\": \"fp32\"" : "");
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, comm));
  float* init[kNumParams];
  for (int p = 0; p < kNumParams; ++p) {
    init[p] = malloc(test_param_numel(p) * sizeof(float));
    for (size_t i = 0; i < test_param_numel(p); ++i)
      init[p][i] = (float)ldexp((double)((p * 13 + i * 5) % 29) - 14, -5);
  }
  register_test_model(engine, g_dtype, init, ids);
  CHECK(zero_engine_finalize(engine));
  for (int p = 0; p < kNumParams; ++p) free(init[p]);
  return engine;
}

/* Adds g_t (the step number is the context). */
static void add_step_gradient(float* g, int p, size_t numel, const void* ctx) {
  const int t = *(const int*)ctx;
  for (size_t i = 0; i < numel; ++i) g[i] += grad_value(t, p, i);
}

static void micro_step(zero_engine_t* engine, const int32_t* ids, int t) {
  test_backward(engine, ids, add_step_gradient, &t);
  CHECK(zero_backward_end(engine));
}

/* The weights as bytes, param by param. */
static void read_weights(zero_engine_t* engine, const int32_t* ids, unsigned char* out, size_t elem) {
  size_t at = 0;
  for (int u = 0; u < kNumUnits; ++u) {
    CHECK(zero_gather(engine, u));
    for (int p = 0; p < kNumParams; ++p) {
      if (kModel[p].unit != u) continue;
      void* data = NULL;
      CHECK(zero_param_data(&data, engine, ids[p]));
      memcpy(out + at, data, test_param_numel(p) * elem);
      at += test_param_numel(p) * elem;
    }
    CHECK(zero_release(engine, u));
  }
}

int main(int argc, char** argv) {
  int stage = 0, gas = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--stage") == 0) stage = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--gas") == 0) gas = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--dtype") == 0) g_dtype = parse_dtype_arg(argv[i + 1]);
    if (strcmp(argv[i], "--stochastic-rounding") == 0) g_stochastic_rounding = atoi(argv[i + 1]);
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  zero_comm_t* comm = NULL;
  CHECK(zero_comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD));
  int32_t ids[kNumParams], ref_ids[kNumParams];
  zero_engine_t* engine = make(comm, stage, gas, ids);
  zero_comm_t* single = NULL;
  CHECK(zero_comm_create_single(&single));
  zero_engine_t* reference = make(single, stage, 1, ref_ids);

  int clipped = 0;
  for (int t = 1; t <= kSteps; ++t) {
    for (int k = 0; k < gas; ++k) micro_step(engine, ids, t);
    micro_step(reference, ref_ids, t);
    zero_step_info_t got = ZERO_STEP_INFO_INIT, want = ZERO_STEP_INFO_INIT;
    CHECK(zero_step(&got, engine));
    CHECK(zero_step(&want, reference));
    EXPECT(got.grad_norm == want.grad_norm, "step %d: grad_norm %.17g at N=%d G=%d, %.17g at N=1 G=1", t, got.grad_norm,
           world, gas, want.grad_norm);
    clipped += got.grad_norm > 12.0;
  }
  EXPECT(clipped > 0 && clipped < kSteps, "clipping engaged on %d of %d steps", clipped, kSteps);

  size_t total = 0;
  for (int p = 0; p < kNumParams; ++p) total += test_param_numel(p);
  const size_t elem = g_dtype == ZERO_DTYPE_FP32 ? 4 : 2;
  unsigned char* a = malloc(total * elem);
  unsigned char* b = malloc(total * elem);
  read_weights(engine, ids, a, elem);
  read_weights(reference, ref_ids, b, elem);
  for (size_t i = 0; i < total * elem; i += elem)
    EXPECT(memcmp(a + i, b + i, elem) == 0, "weight element %zu differs from N=1 G=1 (N=%d G=%d stage %d)", i / elem,
           world, gas, stage);
  if (rank == 0)
    printf(
        "invariance ok: %s%s, stage %d, N=%d G=%d: the same weights as N=1 G=1, bit for bit (%d of %d steps "
        "clipped)\n",
        dtype_text(g_dtype), g_stochastic_rounding ? " with stochastic rounding" : "", stage, world, gas, clipped,
        kSteps);
  free(a);
  free(b);
  zero_engine_destroy(reference);
  zero_engine_destroy(engine);
  zero_comm_destroy(single);
  zero_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}
