/*
 * fp16 loss scaling under mpirun: an inf or nan gradient injected on one rank skips the step on every rank
 * (weights and step count untouched), and the scale follows DeepSpeed's dynamic schedule exactly over a scripted
 * sequence of overflows (window, hysteresis, consecutive hysteresis, minimum); then 10 overflows in a row at the
 * minimum scale fail zero_step with ZERO_ERR_INVALID_STATE on every rank, and the engine goes on after it.
 *
 *   mpirun -np 2 test_loss_scale --stage S [--consecutive 0|1]
 *
 * The expected schedule is computed by this file's own model of DeepSpeed's DynamicLossScaler (docs/config.md;
 * tests/unit/deepspeed_test.cpp checks the engine's scaler against DeepSpeed's recorded numbers): on overflow,
 * halve the scale (not below min_loss_scale) if the hysteresis is used up, else use one unit of it; without
 * overflow, double the scale when the clean steps before this one since the last overflow are a positive multiple
 * of loss_scale_window, restoring the hysteresis then (or after every clean step with consecutive_hysteresis).
 */
#include <math.h>
#include <string.h>

#include "harness.h"

enum { kSteps = 24, kWindow = 3, kHysteresis = 2 };
static const double kInitialScale = 256.0, kMinScale = 32.0;

/* 1: inf on rank 1, 2: nan on rank 1. Enough overflows in a row to reach the minimum, then recovery. */
static const int kOverflow[kSteps + 1] = {0, 0, 1, 1, 0, 0, 0, 0, 1, 2, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0};

typedef struct {
  double scale;
  int hysteresis, consecutive;
  long iteration, last_overflow;
} Model;

static void model_update(Model* m, int overflow) {
  if (overflow) {
    if (m->hysteresis <= 1)
      m->scale = fmax(m->scale / 2, kMinScale);
    else
      m->hysteresis -= 1;
    m->last_overflow = m->iteration;
  } else {
    if (m->consecutive) m->hysteresis = kHysteresis;
    const long stable = m->iteration - m->last_overflow - 1;
    if (stable > 0 && stable % kWindow == 0) {
      if (!m->consecutive) m->hysteresis = kHysteresis;
      m->scale *= 2;
    }
  }
  m->iteration += 1;
}

/* One backward: snapshots the weights into `before`, adds the scaled gradients, and on request an inf (1) or a
 * nan (2) into one element of param 3. */
static void backward(zero_engine_t* engine, const int32_t* ids, uint16_t** before, double scale, int poison) {
  for (int u = 0; u < kNumUnits; ++u) {
    CHECK(zero_gather(engine, u));
    for (int p = 0; p < kNumParams; ++p) {
      if (kModel[p].unit != u) continue;
      void* data = NULL;
      CHECK(zero_param_data(&data, engine, ids[p]));
      memcpy(before[p], data, test_param_numel(p) * sizeof(uint16_t));
      float* g = NULL;
      CHECK(zero_grad_data((void**)&g, engine, ids[p]));
      for (size_t i = 0; i < test_param_numel(p); ++i) g[i] += (float)(scale * ldexp((double)((i % 5) + 1), -12));
      if (p == 3 && poison) g[1] = poison == 1 ? INFINITY : NAN;
      CHECK(zero_grad_ready(engine, ids[p]));
    }
    CHECK(zero_release(engine, u));
  }
}

int main(int argc, char** argv) {
  int stage = 0, consecutive = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--stage") == 0) stage = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--consecutive") == 0) consecutive = atoi(argv[i + 1]);
  }
  zero_comm_t* comm = NULL;
  CHECK(zero_comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD));
  int rank = 0, world = 0;
  CHECK(zero_comm_rank(&rank, comm));
  CHECK(zero_comm_size(&world, comm));
  char config[768];
  snprintf(config, sizeof config,
           "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"gradient_clipping\": 1.0,"
           " \"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 8, \"loss_scale_window\": %d,"
           " \"hysteresis\": %d, \"consecutive_hysteresis\": %s, \"min_loss_scale\": %g},"
           " \"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 0}}",
           kWindow, kHysteresis, consecutive ? "true" : "false", kMinScale, stage);
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, comm));
  int32_t ids[kNumParams];
  float* init[kNumParams];
  for (int p = 0; p < kNumParams; ++p) {
    init[p] = malloc(test_param_numel(p) * sizeof(float));
    for (size_t i = 0; i < test_param_numel(p); ++i) init[p][i] = 0.01f * (float)((i + p) % 7);
  }
  register_test_model(engine, ZERO_DTYPE_FP16, init, ids);
  CHECK(zero_engine_finalize(engine));

  Model model = {kInitialScale, kHysteresis, consecutive, 0, -1};
  uint16_t* before[kNumParams];
  for (int p = 0; p < kNumParams; ++p) before[p] = malloc(test_param_numel(p) * sizeof(uint16_t));
  long taken = 0;
  int skipped_total = 0, halvings_at_min = 0;
  for (int t = 1; t <= kSteps; ++t) {
    double scale = 0;
    CHECK(zero_loss_scale(&scale, engine));
    EXPECT(scale == model.scale, "step %d: zero_loss_scale %g, expected %g", t, scale, model.scale);
    backward(engine, ids, before, scale, rank == 1 ? kOverflow[t] : 0);
    CHECK(zero_backward_end(engine));
    zero_step_info_t info = ZERO_STEP_INFO_INIT;
    CHECK(zero_step(&info, engine));
    const int overflow = kOverflow[t] != 0;
    if (overflow && model.scale == kMinScale && model.hysteresis <= 1) halvings_at_min += 1;
    EXPECT(info.skipped == overflow, "step %d on rank %d: skipped %d, expected %d", t, rank, info.skipped, overflow);
    EXPECT(info.loss_scale == model.scale, "step %d: info.loss_scale %g, expected %g", t, info.loss_scale, model.scale);
    taken += !overflow;
    skipped_total += overflow;
    EXPECT(info.step == taken, "step %d: info.step %lld, expected %ld", t, (long long)info.step, taken);
    model_update(&model, overflow);
    /* A skipped step leaves every weight as it was; a taken one moves them. */
    int changed = 0;
    for (int u = 0; u < kNumUnits; ++u) {
      CHECK(zero_gather(engine, u));
      for (int p = 0; p < kNumParams; ++p) {
        if (kModel[p].unit != u) continue;
        void* data = NULL;
        CHECK(zero_param_data(&data, engine, ids[p]));
        changed |= memcmp(before[p], data, test_param_numel(p) * sizeof(uint16_t)) != 0;
      }
      CHECK(zero_release(engine, u));
    }
    EXPECT(changed == !overflow, "step %d: weights %s", t, changed ? "changed on a skipped step" : "did not move");
  }
  double final_scale = 0;
  CHECK(zero_loss_scale(&final_scale, engine));
  EXPECT(final_scale == model.scale, "final scale %g, expected %g", final_scale, model.scale);

  /* Overflows on every step from here: the scale falls to the minimum, 9 overflows there are skipped with a warning,
   * and the 10th fails zero_step with ZERO_ERR_INVALID_STATE on every rank (DeepSpeed raises at the first); the
   * engine stays usable, and a clean step is then taken. */
  int at_minimum = 0, gave_up = 0;
  for (int t = 0; t < 64 && !gave_up; ++t) {
    double scale = 0;
    CHECK(zero_loss_scale(&scale, engine));
    backward(engine, ids, before, scale, rank == 1 ? 1 : 0);
    CHECK(zero_backward_end(engine));
    at_minimum += model.scale == kMinScale && model.hysteresis <= 1;
    model_update(&model, 1);
    zero_step_info_t info = ZERO_STEP_INFO_INIT;
    const zero_status_t status = zero_step(&info, engine);
    if (at_minimum < 10) {
      EXPECT(status == ZERO_OK && info.skipped, "overflow %d on rank %d: status %d, skipped %d (%s)", t, rank,
             (int)status, info.skipped, zero_last_error());
    } else {
      EXPECT(status == ZERO_ERR_INVALID_STATE && strstr(zero_last_error(), "minimum loss scale") != NULL,
             "overflow %d on rank %d: status %d, expected ZERO_ERR_INVALID_STATE after 10 at the minimum (%s)", t, rank,
             (int)status, zero_last_error());
      gave_up = 1;
    }
  }
  EXPECT(gave_up, "zero_step never gave up at the minimum scale");
  double scale_now = 0;
  CHECK(zero_loss_scale(&scale_now, engine));
  EXPECT(scale_now == kMinScale, "scale %g after giving up, expected the minimum %g", scale_now, kMinScale);
  backward(engine, ids, before, scale_now, 0);
  CHECK(zero_backward_end(engine));
  zero_step_info_t after = ZERO_STEP_INFO_INIT;
  CHECK(zero_step(&after, engine));
  EXPECT(!after.skipped && after.step == taken + 1, "the clean step after giving up: skipped %d, step %lld",
         after.skipped, (long long)after.step);
  EXPECT(halvings_at_min > 0, "the script must reach the minimum scale");
  if (rank == 0)
    printf(
        "loss scale ok: stage %d, %d ranks, consecutive_hysteresis %d: %d of %d steps skipped on every rank, "
        "scale followed the schedule to %g (minimum %g reached); gave up after 10 overflows at the minimum\n",
        stage, world, consecutive, skipped_total, kSteps, final_scale, kMinScale);
  for (int p = 0; p < kNumParams; ++p) free(init[p]), free(before[p]);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
  return 0;
}
