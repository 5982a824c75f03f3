/*
 * Non-finite gradients in fp32 and bf16 under mpirun, with DeepSpeed ZeRO 1-2's rule (docs/config.md):
 *
 *   mpirun -np N test_nonfinite --stage S --dtype fp32|bf16 --check 0|1
 *
 * --check 1 (the default configs): a step whose gradient norm is inf or nan, from one element on one rank, is
 * skipped on every rank, weights and step counter untouched; ten in a row fail zero_step with
 * ZERO_ERR_INVALID_STATE on every rank, and a clean step then goes through.
 *
 * --check 0 (gradient_clipping 0 and zero_optimization.compute_grad_norm false in fp32, bf16.check_grad_overflow
 * false in bf16): the step is applied on every rank, as DeepSpeed applies it: the reported norm is not finite, the
 * poisoned element's weight becomes nan while every other weight has the bits of a run without the inf, and rank 0
 * logs a warning each time. Where nothing needs the norm first the optimizer pass sums it (stages 1-3, N = 1), so
 * this also checks that the pass sees a non-finite gradient.
 */
#include <math.h>
#include <string.h>

#include "harness.h"

enum { kPoisonParam = 3, kPoisonElem = 1, kGiveUp = 10 };

static int g_warnings = 0;

static void count_warnings(void* user_data, int32_t level, int32_t rank, const char* message) {
  (void)user_data;
  (void)rank;
  if (level == ZERO_LOG_WARNING && strstr(message, "applied with a non-finite gradient norm") != NULL) ++g_warnings;
}

static float weight(const void* data, zero_dtype_t dtype, size_t i) {
  if (dtype == ZERO_DTYPE_FP32) return ((const float*)data)[i];
  uint32_t bits = (uint32_t)((const uint16_t*)data)[i] << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* Every param's weights, gathered unit by unit, as floats. */
static void snapshot(zero_engine_t* engine, const int32_t* ids, zero_dtype_t dtype, float** out) {
  for (int u = 0; u < kNumUnits; ++u) {
    CHECK(zero_gather(engine, u));
    for (int p = 0; p < kNumParams; ++p) {
      if (kModel[p].unit != u) continue;
      void* data = NULL;
      CHECK(zero_param_data(&data, engine, ids[p]));
      for (size_t i = 0; i < test_param_numel(p); ++i) out[p][i] = weight(data, dtype, i);
    }
    CHECK(zero_release(engine, u));
  }
}

/* One micro-step (harness.h's backward pass); with `poison`, rank 1 (the last rank when N < 2) puts an inf into one
 * gradient element. */
typedef struct {
  int rank, world, poison;
} Poison;

static void add_grads(float* g, int param, size_t numel, const void* ctx) {
  const Poison* c = (const Poison*)ctx;
  for (size_t i = 0; i < numel; ++i) g[i] += (float)ldexp((double)((i % 5) + 1), -12);
  if (c->poison && param == kPoisonParam && c->rank == (c->world > 1 ? 1 : 0)) g[kPoisonElem] = INFINITY;
}

static void backward(zero_engine_t* engine, const int32_t* ids, int rank, int world, int poison) {
  const Poison c = {rank, world, poison};
  test_backward(engine, ids, add_grads, &c);
  CHECK(zero_backward_end(engine));
}

int main(int argc, char** argv) {
  int stage = 0, check = 1;
  zero_dtype_t dtype = ZERO_DTYPE_FP32;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--stage") == 0) stage = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--check") == 0) check = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--dtype") == 0) dtype = parse_dtype_arg(argv[i + 1]);
  }
  if (dtype == ZERO_DTYPE_FP16) {
    fprintf(stderr, "fp16 always checks (tests/mpi/loss_scale.c)\n");
    return 2;
  }
  zero_comm_t* comm = NULL;
  CHECK(zero_comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD));
  int rank = 0, world = 0;
  CHECK(zero_comm_rank(&rank, comm));
  CHECK(zero_comm_size(&world, comm));
  const char* check_off = dtype == ZERO_DTYPE_FP32 ? ", \"compute_grad_norm\": false" : "";
  const char* precision = dtype == ZERO_DTYPE_FP32 ? ""
                          : check                  ? ", \"bf16\": {\"enabled\": true}"
                                                   : ", \"bf16\": {\"enabled\": true, \"check_grad_overflow\": false}";
  char config[512];
  snprintf(config, sizeof config,
           "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"gradient_clipping\": %s,"
           " \"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 0%s}%s}",
           check ? "1.0" : "0", stage, check ? "" : check_off, precision);
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, comm));
  int32_t ids[kNumParams];
  float *init[kNumParams], *before[kNumParams], *after[kNumParams];
  for (int p = 0; p < kNumParams; ++p) {
    const size_t n = test_param_numel(p);
    init[p] = malloc(n * sizeof(float));
    before[p] = malloc(n * sizeof(float));
    after[p] = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; ++i) init[p][i] = 0.25f * (float)((int)((i + p) % 7) - 3);
  }
  register_test_model(engine, dtype, init, ids);
  CHECK(zero_engine_finalize(engine));
  /* Without the check, the same model trained on the same gradients without the inf: with clipping off the update
   * is element-wise, so every other weight must have exactly its bits. */
  zero_engine_t* clean = NULL;
  int32_t clean_ids[kNumParams];
  float* clean_after[kNumParams];
  if (!check) {
    CHECK(zero_engine_create(&clean, config, comm));
    register_test_model(clean, dtype, init, clean_ids);
    CHECK(zero_engine_finalize(clean));
    for (int p = 0; p < kNumParams; ++p) clean_after[p] = malloc(test_param_numel(p) * sizeof(float));
  }
  CHECK(zero_set_log_callback(count_warnings, NULL, ZERO_LOG_WARNING));

  /* A clean step, then a poisoned one, then a clean one. */
  zero_step_info_t info = ZERO_STEP_INFO_INIT;
  backward(engine, ids, rank, world, 0);
  CHECK(zero_step(&info, engine));
  EXPECT(!info.skipped && info.step == 1 && isfinite(info.grad_norm), "clean step: skipped %d, step %lld, norm %g",
         info.skipped, (long long)info.step, info.grad_norm);
  snapshot(engine, ids, dtype, before);
  backward(engine, ids, rank, world, 1);
  CHECK(zero_step(&info, engine));
  EXPECT(!isfinite(info.grad_norm), "poisoned step: norm %g", info.grad_norm);
  snapshot(engine, ids, dtype, after);
  if (clean) {
    for (int t = 0; t < 2; ++t) {
      zero_step_info_t clean_info = ZERO_STEP_INFO_INIT;
      backward(clean, clean_ids, rank, world, 0);
      CHECK(zero_step(&clean_info, clean));
    }
    snapshot(clean, clean_ids, dtype, clean_after);
  }
  if (check) {
    EXPECT(info.skipped && info.step == 1, "poisoned step with the check: skipped %d, step %lld", info.skipped,
           (long long)info.step);
    for (int p = 0; p < kNumParams; ++p)
      EXPECT(memcmp(before[p], after[p], test_param_numel(p) * sizeof(float)) == 0, "%s moved on a skipped step",
             kModel[p].name);
  } else {
    EXPECT(!info.skipped && info.step == 2, "poisoned step without the check: skipped %d, step %lld", info.skipped,
           (long long)info.step);
    for (int p = 0; p < kNumParams; ++p)
      for (size_t i = 0; i < test_param_numel(p); ++i) {
        if (p == kPoisonParam && i == kPoisonElem) {
          EXPECT(isnan(after[p][i]), "%s[%zu] is %g after an inf gradient, expected nan", kModel[p].name, i,
                 after[p][i]);
        } else {
          EXPECT(isfinite(after[p][i]) && after[p][i] != before[p][i], "%s[%zu]: %g -> %g on an applied step",
                 kModel[p].name, i, before[p][i], after[p][i]);
          EXPECT(memcmp(&after[p][i], &clean_after[p][i], sizeof(float)) == 0, "%s[%zu]: %.9g, without the inf %.9g",
                 kModel[p].name, i, after[p][i], clean_after[p][i]);
        }
      }
    EXPECT(g_warnings == (rank == 0), "rank %d logged %d warnings about the applied step", rank, g_warnings);
  }
  backward(engine, ids, rank, world, 0);
  CHECK(zero_step(&info, engine));
  EXPECT(!info.skipped && info.step == (check ? 2 : 3) && isfinite(info.grad_norm),
         "clean step after: skipped %d, step %lld, norm %g", info.skipped, (long long)info.step, info.grad_norm);

  /* Poisoned steps in a row: with the check, the tenth ends in an error on every rank; without, all are applied. */
  int failed_at = 0;
  for (int t = 1; t <= kGiveUp && !failed_at; ++t) {
    backward(engine, ids, rank, world, 1);
    const zero_status_t status = zero_step(&info, engine);
    if (status != ZERO_OK) {
      EXPECT(status == ZERO_ERR_INVALID_STATE && strstr(zero_last_error(), "not finite") != NULL,
             "poisoned step %d: status %d (%s)", t, (int)status, zero_last_error());
      failed_at = t;
    } else {
      EXPECT(info.skipped == check, "poisoned step %d: skipped %d", t, info.skipped);
    }
  }
  EXPECT(failed_at == (check ? kGiveUp : 0), "zero_step failed at poisoned step %d in a row, expected %d", failed_at,
         check ? kGiveUp : 0);
  if (!check) EXPECT(g_warnings == (rank == 0 ? 1 + kGiveUp : 0), "rank %d: %d warnings", rank, g_warnings);
  backward(engine, ids, rank, world, 0);
  CHECK(zero_step(&info, engine));
  EXPECT(!info.skipped, "the clean step after the poisoned ones was skipped");
  CHECK(zero_set_log_callback(NULL, NULL, ZERO_LOG_WARNING));
  if (rank == 0)
    printf("non-finite ok: %s, stage %d, %d ranks, check %s: %s\n", dtype_text(dtype), stage, world,
           check ? "on" : "off",
           check ? "steps skipped on every rank, the tenth in a row an error" : "steps applied, nan where the inf was");
  for (int p = 0; p < kNumParams; ++p) free(init[p]), free(before[p]), free(after[p]);
  if (clean) {
    for (int p = 0; p < kNumParams; ++p) free(clean_after[p]);
    zero_engine_destroy(clean);
  }
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
  return 0;
}
