/*
 * ZeRO beside tensor and pipeline parallelism: the ranks form a grid of M = T x P model-parallel ranks (T
 * tensor-parallel ranks in each of P pipeline stages, tensor-parallel fastest) by D data-parallel ones: world rank r is
 * model-parallel rank r % M (tensor-parallel rank r % M % T, stage r % M / T) and data-parallel rank r / M. Each
 * rank's engine runs over its data-parallel group, with its model-parallel group given by
 * zero_engine_set_model_parallel, and holds its part of a Megatron-style transformer layer: its stage's units (all
 * four without a pipeline), in them its tensor-parallel part of a vocab-parallel embedding and head (rows split),
 * column-parallel linears (output rows split, with their biases), row-parallel linears (input columns split), and
 * LayerNorms and row-parallel biases whole on every tensor-parallel rank (ZERO_PARAM_MODEL_PARALLEL_DUPLICATE on
 * tensor-parallel ranks other than 0).
 *
 *   mpirun -np T*P*D test_model_parallel --tp T [--pp P] --case CASE [--stage S] [--gas G] [--dir DIR]
 *
 * parity      every rank's part equals, bit for bit, the same elements of a single-process AdamW reference of the
 *             whole model on the whole job's averaged gradients, with clipping engaged on some steps: every rank
 *             clips by the norm of the whole model, its replicated params counted once. With a pipeline, the
 *             micro-steps run as its 1F1B schedule does (the next micro-batch's forward before a backward).
 * overflow    fp16: one tensor-parallel rank of one data-parallel group writes an inf into a replicated param on
 *             one step and into a split param on another; every rank skips exactly those steps, with one loss
 *             scale, and the replicated params stay equal across tensor-parallel ranks.
 * clip-differs, layout-differs, missing-group
 *             finalize fails on every rank with a clear error: a tensor-parallel rank configured with another
 *             gradient_clipping (ZERO_ERR_MISMATCH naming the key, on every rank); one rank registering a shard of
 *             another size (ZERO_ERR_MISMATCH on its data-parallel group, ZERO_ERR_REMOTE elsewhere); one rank without
 *             the model-parallel group (ZERO_ERR_MISMATCH on its data-parallel group; its model-parallel partners,
 *             who wait for it in an exchange it never joins, get an error by the timeout at the latest).
 * lr-differs  the tensor-parallel ranks set different learning rates: zero_step is ZERO_ERR_MISMATCH on every rank,
 *             naming each model-parallel rank's rate, and the engine trains once they agree.
 * step-fails  a rank's zero_step fails its checks: every rank gets the error (ZERO_ERR_REMOTE elsewhere) before data
 *             moves, and the next zero_step trains on every rank (needs the test hooks).
 * norm-fails  a rank fails in the model-parallel exchange of the norm: every rank's zero_step fails, none hangs.
 * finalize-fails  one rank cannot allocate in finalize: every rank fails, and finalize again trains (test hooks).
 * save-fails  the last part's manifest cannot be written: every rank's save fails, `latest` keeps the previous
 *             checkpoint, nothing is left behind; the last part loading another save than the others is
 *             ZERO_ERR_MISMATCH everywhere; then one part's shard is truncated: every rank's load fails (needs the
 *             test hooks).
 * checkpoint  T x D ranks save (one directory per model-parallel rank); then the same weights are loaded by a grid
 *             of T x 1 ranks (the lower world ranks), which go on training equal to the reference with D = 1; a load
 *             by a job with another model-parallel size is refused naming both sizes.
 *
 * Gradients are small multiples of 2^-10 (exact sums in any order), as in tests/mpi/parity.c.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, truncate */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <unistd.h>

#include "harness.h"

enum { kH = 12, kF = 24, kV = 18, kParams = 13, kUnits = 4, kSteps = 8 };
enum Split { kWhole, kRows, kCols };

typedef struct {
  const char* name;
  int ndim;
  int64_t shape[2]; /* of the whole param */
  enum Split split;
  int unit, group;
} MpParam;

static const MpParam kLayer[kParams] = {
    {"embed.weight", 2, {kV, kH}, kRows, 0, 0},     {"ln1.weight", 1, {kH, 0}, kWhole, 1, 1},
    {"ln1.bias", 1, {kH, 0}, kWhole, 1, 1},         {"attn.qkv.weight", 2, {3 * kH, kH}, kRows, 1, 0},
    {"attn.qkv.bias", 1, {3 * kH, 0}, kRows, 1, 1}, {"attn.proj.weight", 2, {kH, kH}, kCols, 1, 0},
    {"attn.proj.bias", 1, {kH, 0}, kWhole, 1, 1},   {"mlp.fc.weight", 2, {kF, kH}, kRows, 2, 0},
    {"mlp.fc.bias", 1, {kF, 0}, kRows, 2, 1},       {"mlp.out.weight", 2, {kH, kF}, kCols, 2, 0},
    {"mlp.out.bias", 1, {kH, 0}, kWhole, 2, 1},     {"final_ln.weight", 1, {kH, 0}, kWhole, 3, 1},
    {"head.weight", 2, {kV, kH}, kRows, 3, 0},
};

static int g_tp = 1, g_tp_rank = 0; /* tensor-parallel size and this rank's place */
static int g_pp = 1, g_pp_rank = 0; /* pipeline stages and this rank's: stage s holds units s*U/P .. (s+1)*U/P-1 */

static int stage_units(void) { return kUnits / g_pp; }
static int holds(int p) { return kLayer[p].unit / stage_units() == g_pp_rank; }
static int local_unit(int p) { return kLayer[p].unit - g_pp_rank * stage_units(); }
static double g_clip = 0.3;
static zero_dtype_t g_dtype = ZERO_DTYPE_FP32;

static size_t whole_numel(int p) { return (size_t)kLayer[p].shape[0] * (kLayer[p].ndim == 2 ? kLayer[p].shape[1] : 1); }
static int64_t local_extent(int p, int dim) {
  const int64_t e = kLayer[p].shape[dim];
  return (kLayer[p].split == kRows && dim == 0) || (kLayer[p].split == kCols && dim == 1) ? e / g_tp : e;
}
static size_t local_numel(int p) { return (size_t)local_extent(p, 0) * (kLayer[p].ndim == 2 ? local_extent(p, 1) : 1); }
/* The whole param's element that this rank's local element i is. */
static size_t whole_index(int p, size_t i) {
  if (kLayer[p].split == kWhole) return i;
  if (kLayer[p].ndim == 1) return (size_t)g_tp_rank * local_numel(p) + i;
  const size_t cols = (size_t)local_extent(p, 1), row = i / cols, col = i % cols;
  if (kLayer[p].split == kRows) return ((size_t)g_tp_rank * (size_t)local_extent(p, 0) + row) * cols + col;
  return row * (size_t)kLayer[p].shape[1] + (size_t)g_tp_rank * cols + col;
}

/* What data-parallel rank `dp` adds to whole element i of param p in micro-step k of step t; every tensor-parallel
 * rank computes the same value for an element it holds. */
static float mp_grad(int t, int k, int dp, int p, size_t i) {
  uint64_t common = test_mix((uint64_t)t * 1000003u ^ (uint64_t)p * 15485863u ^ (uint64_t)i * 2654435761u);
  uint64_t own = test_mix(common ^ ((uint64_t)k * 7919u + 1) * 104729u ^ (uint64_t)(dp + 1) * 0x9e3779b97f4a7c15u);
  int v = (int)(common % 17) - 8 + (int)(own % 9) - 4;
  return (float)ldexp(v * (t % 3 + 1), -10);
}
static float init_value(int p, size_t i) { return (float)ldexp((double)((int)((p * 31 + i * 7) % 41) - 20), -6); }

typedef struct {
  double lr, weight_decay, beta1, beta2, eps;
} Hyper;
static const Hyper kGroups[2] = {{0.01, 0.02, 0.9, 0.999, 1e-8}, {0.005, 0.0, 0.8, 0.99, 1e-8}};

/* The single-process reference of the whole layer (tests/mpi/parity.c's arithmetic). */
typedef struct {
  float *w[kParams], *m[kParams], *v[kParams], *g[kParams];
} Reference;

static void reference_init(Reference* ref) {
  for (int p = 0; p < kParams; ++p) {
    const size_t n = whole_numel(p);
    ref->w[p] = malloc(n * sizeof(float));
    ref->m[p] = calloc(n, sizeof(float));
    ref->v[p] = calloc(n, sizeof(float));
    ref->g[p] = calloc(n, sizeof(float));
    for (size_t i = 0; i < n; ++i) ref->w[p][i] = init_value(p, i);
  }
}

static double reference_step(Reference* ref, int t, int samples) {
  double sum_sq = 0.0;
  for (int p = 0; p < kParams; ++p)
    for (size_t i = 0; i < whole_numel(p); ++i) sum_sq += (double)ref->g[p][i] * (double)ref->g[p][i];
  const double divisor = (double)samples, norm = sqrt(sum_sq / (divisor * divisor));
  const double clip = g_clip > 0 && norm > g_clip ? g_clip / (norm + 1e-6) : 1.0;
  const float divisor_f = (float)divisor, clip_f = (float)clip;
  for (int p = 0; p < kParams; ++p) {
    const Hyper* h = &kGroups[kLayer[p].group];
    const double bc1 = 1.0 - pow(h->beta1, t), bc2 = 1.0 - pow(h->beta2, t);
    const float b1 = (float)h->beta1, b2 = (float)h->beta2, omb1 = (float)(1.0 - h->beta1),
                omb2 = (float)(1.0 - h->beta2);
    const float step_size = (float)(h->lr / bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2)), eps = (float)h->eps;
    const float decay = (float)(1.0 - h->lr * h->weight_decay);
    for (size_t i = 0; i < whole_numel(p); ++i) {
      float w = ref->w[p][i];
      float g = (ref->g[p][i] / divisor_f) * clip_f;
      g = g + 0.0f * w;
      const float m = b1 * ref->m[p][i] + omb1 * g, v = b2 * ref->v[p][i] + omb2 * (g * g);
      const float denom = sqrtf(v) * inv_sqrt_bc2 + eps;
      w = w * decay;
      w = w - step_size * (m / denom);
      ref->m[p][i] = m, ref->v[p][i] = v, ref->w[p][i] = w, ref->g[p][i] = 0.0f;
    }
  }
  return norm;
}

static void make_config(char* out, size_t size, int stage, int gas, double clip, double timeout_s) {
  snprintf(out, size,
           "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": %d, \"gradient_clipping\": %g,"
           " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": %g, \"betas\": [%g, %g], \"eps\": %g,"
           " \"weight_decay\": %g}}, \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 300,"
           " \"stage3_param_persistence_threshold\": 0}, \"libzero\": {\"timeout_s\": %g}%s}",
           gas, clip, kGroups[0].lr, kGroups[0].beta1, kGroups[0].beta2, kGroups[0].eps, kGroups[0].weight_decay, stage,
           timeout_s, dtype_config(g_dtype));
}

/* The initial values this rank offers; read by zero_engine_finalize. */
static float* g_init[kParams];
static void free_init(void) {
  for (int p = 0; p < kParams; ++p) free(g_init[p]), g_init[p] = NULL;
}

/* Registers this rank's part of the layer; `shrink` registers param 3 one row short (another tensor-parallel layout).
 */
static void register_layer(zero_engine_t* engine, int32_t* ids, int provide_init, int shrink) {
  zero_param_group_desc_t g = ZERO_PARAM_GROUP_DESC_INIT;
  g.name = "no_decay";
  g.lr = kGroups[1].lr, g.weight_decay = kGroups[1].weight_decay;
  g.beta1 = kGroups[1].beta1, g.beta2 = kGroups[1].beta2;
  int32_t group = -1;
  CHECK(zero_engine_add_param_group(&group, engine, &g));
  for (int p = 0; p < kParams; ++p) {
    ids[p] = -1;
    if (!holds(p)) continue;
    int64_t shape[2] = {local_extent(p, 0), kLayer[p].ndim == 2 ? local_extent(p, 1) : 0};
    if (shrink && p == 3) shape[0] -= 1;
    float* init = NULL;
    if (provide_init) {
      init = g_init[p] = malloc(local_numel(p) * sizeof(float));
      for (size_t i = 0; i < local_numel(p); ++i) init[i] = init_value(p, whole_index(p, i));
    }
    zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
    d.name = kLayer[p].name;
    d.ndim = kLayer[p].ndim;
    d.shape = shape;
    d.unit = local_unit(p);
    d.group = kLayer[p].group;
    d.init_data = init;
    d.init_dtype = ZERO_DTYPE_FP32;
    /* Megatron's rule: what is not split across tensor-parallel ranks counts on the first of them. */
    d.flags = kLayer[p].split == kWhole && g_tp_rank > 0 ? ZERO_PARAM_MODEL_PARALLEL_DUPLICATE : 0;
    CHECK(zero_engine_add_param(&ids[p], engine, &d));
  }
}

static void forward_pass(zero_engine_t* engine) {
  for (int u = 0; u < stage_units(); ++u) {
    CHECK(zero_gather(engine, u));
    CHECK(zero_release(engine, u));
  }
}

/* The backward of one micro-step on this rank, adding its part of data-parallel rank `dp`'s gradients. With `ref`,
 * the reference adds the whole job's (every data-parallel rank's) for the same micro-step. `poison` >= 0 writes an
 * inf into that param's first local element. */
static void backward_pass(zero_engine_t* engine, const int32_t* ids, int t, int k, int dp, int dp_size, float scale,
                          Reference* ref, int poison) {
  for (int u = stage_units() - 1; u >= 0; --u) {
    CHECK(zero_gather(engine, u));
    for (int p = kParams - 1; p >= 0; --p) {
      if (!holds(p) || local_unit(p) != u) continue;
      float* grad = NULL;
      CHECK(zero_grad_data((void**)&grad, engine, ids[p]));
      for (size_t i = 0; i < local_numel(p); ++i) grad[i] += mp_grad(t, k, dp, p, whole_index(p, i)) * scale;
      if (p == poison) grad[0] = INFINITY;
      CHECK(zero_grad_ready(engine, ids[p]));
    }
    CHECK(zero_release(engine, u));
  }
  CHECK(zero_backward_end(engine));
  if (ref != NULL)
    for (int r = 0; r < dp_size; ++r)
      for (int p = 0; p < kParams; ++p)
        for (size_t i = 0; i < whole_numel(p); ++i) ref->g[p][i] += mp_grad(t, k, r, p, i);
}

static void micro_step(zero_engine_t* engine, const int32_t* ids, int t, int k, int dp, int dp_size, float scale,
                       Reference* ref, int poison) {
  forward_pass(engine);
  backward_pass(engine, ids, t, k, dp, dp_size, scale, ref, poison);
}

static void expect_parts_equal(zero_engine_t* engine, const int32_t* ids, const Reference* ref, const char* when) {
  for (int u = 0; u < stage_units(); ++u) {
    CHECK(zero_gather(engine, u));
    for (int p = 0; p < kParams; ++p) {
      if (!holds(p) || local_unit(p) != u) continue;
      const float* w = NULL;
      CHECK(zero_param_data((void**)&w, engine, ids[p]));
      for (size_t i = 0; i < local_numel(p); ++i) {
        const float want = ref->w[p][whole_index(p, i)];
        EXPECT(memcmp(&w[i], &want, sizeof want) == 0,
               "%s: tensor-parallel rank %d, pipeline stage %d: %s[%zu] (whole [%zu]) is %.9g, reference %.9g", when,
               g_tp_rank, g_pp_rank, kLayer[p].name, i, whole_index(p, i), w[i], want);
      }
    }
    CHECK(zero_release(engine, u));
  }
}

typedef struct {
  int world_rank, dp, dp_size;
  MPI_Comm dp_mpi, mp_mpi, tp_mpi; /* tp_mpi: the tensor-parallel ranks of this rank's pipeline stage */
  zero_comm_t *dp_comm, *mp_comm;
} Grid;

/* The first `ranks` world ranks as a grid of (g_tp x g_pp) model-parallel ranks (tensor-parallel fastest) by
 * ranks / (g_tp x g_pp) data-parallel ones; the others get MPI_COMM_NULL. */
static Grid make_grid(int ranks) {
  Grid g;
  memset(&g, 0, sizeof g);
  MPI_Comm_rank(MPI_COMM_WORLD, &g.world_rank);
  const int in = g.world_rank < ranks, mp = g_tp * g_pp, mp_rank = g.world_rank % mp;
  g_tp_rank = mp_rank % g_tp;
  g_pp_rank = mp_rank / g_tp;
  g.dp = g.world_rank / mp;
  g.dp_size = ranks / mp;
  MPI_Comm_split(MPI_COMM_WORLD, in ? mp_rank : MPI_UNDEFINED, g.dp, &g.dp_mpi);
  MPI_Comm_split(MPI_COMM_WORLD, in ? g.dp : MPI_UNDEFINED, mp_rank, &g.mp_mpi);
  if (in) MPI_Comm_split(g.mp_mpi, g_pp_rank, g_tp_rank, &g.tp_mpi);
  if (in) {
    CHECK(zero_comm_create_mpi(&g.dp_comm, (int64_t)MPI_Comm_c2f(g.dp_mpi)));
    CHECK(zero_comm_create_mpi(&g.mp_comm, (int64_t)MPI_Comm_c2f(g.mp_mpi)));
  }
  return g;
}

static void free_grid(Grid* g) {
  if (g->dp_comm == NULL) return;
  CHECK(zero_comm_finalize(g->dp_comm));
  CHECK(zero_comm_finalize(g->mp_comm));
  zero_comm_destroy(g->dp_comm);
  zero_comm_destroy(g->mp_comm);
  MPI_Comm_free(&g->dp_mpi);
  MPI_Comm_free(&g->mp_mpi);
  MPI_Comm_free(&g->tp_mpi);
}

static zero_engine_t* make_engine(const Grid* g, int stage, int gas, double clip, int32_t* ids) {
  char config[1024];
  make_config(config, sizeof config, stage, gas, clip, 60.0);
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, g->dp_comm));
  CHECK(zero_engine_set_model_parallel(engine, g->mp_comm));
  register_layer(engine, ids, g->dp == 0, 0);
  CHECK(zero_engine_finalize(engine));
  free_init();
  return engine;
}

/* Steps first..last of training, compared with the reference after each. */
static int train(zero_engine_t* engine, const int32_t* ids, const Grid* g, Reference* ref, int gas, int first,
                 int last) {
  int clipped = 0;
  for (int t = first; t <= last; ++t) {
    if (g_pp == 1) {
      for (int k = 0; k < gas; ++k) micro_step(engine, ids, t, k, g->dp, g->dp_size, 1.0f, ref, -1);
    } else { /* a pipeline's schedule (1F1B): the next micro-batch's forward before this one's backward */
      forward_pass(engine);
      for (int k = 0; k < gas; ++k) {
        if (k + 1 < gas) forward_pass(engine);
        backward_pass(engine, ids, t, k, g->dp, g->dp_size, 1.0f, ref, -1);
      }
    }
    zero_step_info_t info = ZERO_STEP_INFO_INIT;
    CHECK(zero_step(&info, engine));
    const double norm = reference_step(ref, t, g->dp_size * gas);
    EXPECT(info.grad_norm == norm, "step %d: grad_norm %.17g, reference %.17g", t, info.grad_norm, norm);
    EXPECT(!info.skipped, "step %d skipped", t);
    clipped += norm > g_clip;
    expect_parts_equal(engine, ids, ref, "after a step");
  }
  return clipped;
}

static void case_parity(int world, int stage, int gas) {
  Grid g = make_grid(world);
  int32_t ids[kParams];
  zero_engine_t* engine = make_engine(&g, stage, gas, g_clip, ids);
  Reference ref;
  reference_init(&ref);
  expect_parts_equal(engine, ids, &ref, "initial");
  const int clipped = train(engine, ids, &g, &ref, gas, 1, kSteps);
  EXPECT(clipped > 0 && clipped < kSteps, "clipping engaged on %d of %d steps", clipped, kSteps);
  if (g.world_rank == 0)
    printf(
        "model-parallel parity ok: %d tensor-parallel x %d pipeline x %d data-parallel ranks, stage %d, gas %d, %d "
        "steps (%d clipped), every part bit-identical to the whole model's reference\n",
        g_tp, g_pp, g.dp_size, stage, gas, kSteps, clipped);
  zero_engine_destroy(engine);
  free_grid(&g);
}

static void case_overflow(int world, int stage) {
  Grid g = make_grid(world);
  int32_t ids[kParams];
  zero_engine_t* engine = make_engine(&g, stage, 1, g_clip, ids);
  const int poison_rank = world - 1; /* the last model-parallel rank of the last data-parallel group */
  /* Step 2: a replicated param (counted on the first tensor-parallel rank of its stage, checked everywhere);
   * step 4: a split one. */
  int replicated = -1, split = -1;
  for (int p = 0; p < kParams; ++p) {
    if (!holds(p)) continue;
    if (kLayer[p].split == kWhole && replicated < 0) replicated = p;
    if (kLayer[p].split != kWhole && split < 0) split = p;
  }
  int skipped_steps = 0;
  for (int t = 1; t <= 6; ++t) {
    double scale = 0;
    CHECK(zero_loss_scale(&scale, engine));
    const int poison = g.world_rank != poison_rank ? -1 : t == 2 ? replicated : t == 4 ? split : -1;
    micro_step(engine, ids, t, 0, g.dp, g.dp_size, (float)scale, NULL, poison);
    zero_step_info_t info = ZERO_STEP_INFO_INIT;
    CHECK(zero_step(&info, engine));
    int mine[2] = {info.skipped, 0}, all_skipped[64 * 2];
    double scales[64], norm = info.grad_norm, norms[64];
    MPI_Allgather(mine, 2, MPI_INT, all_skipped, 2, MPI_INT, MPI_COMM_WORLD);
    MPI_Allgather(&info.loss_scale, 1, MPI_DOUBLE, scales, 1, MPI_DOUBLE, MPI_COMM_WORLD);
    MPI_Allgather(&norm, 1, MPI_DOUBLE, norms, 1, MPI_DOUBLE, MPI_COMM_WORLD);
    for (int r = 0; r < world; ++r) {
      EXPECT(all_skipped[2 * r] == (t == 2 || t == 4), "step %d: world rank %d skipped=%d", t, r, all_skipped[2 * r]);
      EXPECT(scales[r] == scales[0], "step %d: world rank %d loss scale %g, rank 0 %g", t, r, scales[r], scales[0]);
      EXPECT(memcmp(&norms[r], &norms[0], sizeof(double)) == 0 || (isnan(norms[r]) && isnan(norms[0])),
             "step %d: world rank %d grad_norm %.17g, rank 0 %.17g", t, r, norms[r], norms[0]);
    }
    skipped_steps += info.skipped;
  }
  /* The replicated params must be the same bits on every tensor-parallel rank. */
  for (int u = 0; u < stage_units(); ++u) {
    CHECK(zero_gather(engine, u));
    for (int p = 0; p < kParams; ++p) {
      if (!holds(p) || kLayer[p].split != kWhole || local_unit(p) != u) continue;
      uint16_t* w = NULL;
      CHECK(zero_param_data((void**)&w, engine, ids[p]));
      uint16_t first[kH];
      memcpy(first, w, sizeof first);
      MPI_Bcast(first, kH, MPI_UINT16_T, 0, g.tp_mpi);
      EXPECT(memcmp(first, w, sizeof first) == 0, "%s differs between tensor-parallel ranks", kLayer[p].name);
    }
    CHECK(zero_release(engine, u));
  }
  if (g.world_rank == 0)
    printf(
        "model-parallel overflow ok: an inf on one tensor-parallel rank (a replicated param, then a split one) "
        "skipped %d steps on all %d ranks alike\n",
        skipped_steps, world);
  zero_engine_destroy(engine);
  free_grid(&g);
}

/* Finalize fails on every rank: `expected` on the ranks that `expects_here` says, some error on the others. */
static void case_finalize_mismatch(int world, const char* which) {
  Grid g = make_grid(world);
  const int odd_rank = world - 1;
  const int clip_differs = strcmp(which, "clip-differs") == 0 && g_tp_rank == 1;
  const int shrink = strcmp(which, "layout-differs") == 0 && g.world_rank == odd_rank;
  const int no_group = strcmp(which, "missing-group") == 0 && g.world_rank == odd_rank;
  char config[1024];
  make_config(config, sizeof config, 2, 1, clip_differs ? 0.5 : g_clip, 5.0);
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, g.dp_comm));
  if (!no_group) CHECK(zero_engine_set_model_parallel(engine, g.mp_comm));
  int32_t ids[kParams];
  register_layer(engine, ids, g.dp == 0, shrink);
  const zero_status_t st = zero_engine_finalize(engine);
  const char* message = zero_last_error();
  free_init();
  EXPECT(st != ZERO_OK, "%s: finalize succeeded on world rank %d", which, g.world_rank);
  /* the data-parallel group of the odd rank */
  const int odd_group = g.world_rank % (g_tp * g_pp) == odd_rank % (g_tp * g_pp);
  if (strcmp(which, "clip-differs") == 0)
    EXPECT(st == ZERO_ERR_MISMATCH && strstr(message, "gradient_clipping") != NULL &&
               strstr(message, "model-parallel rank 1") != NULL,
           "world rank %d: %s: %s", g.world_rank, zero_status_string(st), message);
  else if (odd_group)
    EXPECT(st == ZERO_ERR_MISMATCH && strstr(message, strcmp(which, "missing-group") == 0 ? "model-parallel groups"
                                                                                          : "attn.qkv.weight") != NULL,
           "world rank %d: %s: %s", g.world_rank, zero_status_string(st), message);
  else if (strcmp(which, "layout-differs") == 0)
    EXPECT(st == ZERO_ERR_REMOTE && strstr(message, "model-parallel rank") != NULL, "world rank %d: %s: %s",
           g.world_rank, zero_status_string(st), message);
  printf("world rank %d: %s: %s: %s\n", g.world_rank, which, zero_status_string(st), message);
  zero_engine_destroy(engine);
  /* The communicators may be apart after a timeout: destroyed, not finalized. */
  zero_comm_destroy(g.dp_comm);
  zero_comm_destroy(g.mp_comm);
}

static void case_failure(int world, const char* which) {
  Grid g = make_grid(world);
  int32_t ids[kParams];
  zero_engine_t* engine = make_engine(&g, 2, 1, g_clip, ids);
  const int failing = g_tp * g_pp; /* data-parallel rank 1, model-parallel rank 0 */
  micro_step(engine, ids, 1, 0, g.dp, g.dp_size, 1.0f, NULL, -1);
  if (g.world_rank == failing) {
    char spec[64];
    snprintf(spec, sizeof spec, "%s:%d", strcmp(which, "step-fails") == 0 ? "step" : "step.model_parallel", g.dp);
    setenv("ZERO_TEST_FAIL", spec, 1);
  }
  zero_step_info_t info = ZERO_STEP_INFO_INIT;
  const zero_status_t st = zero_step(&info, engine);
  unsetenv("ZERO_TEST_FAIL");
  const char* message = zero_last_error();
  printf("world rank %d: %s: %s: %s\n", g.world_rank, which, zero_status_string(st), message);
  EXPECT(st != ZERO_OK, "world rank %d: zero_step succeeded", g.world_rank);
  if (g.world_rank == failing) EXPECT(st == ZERO_ERR_INTERNAL && strstr(message, "injected") != NULL, "%s", message);
  if (strcmp(which, "step-fails") == 0) {
    if (g.world_rank != failing) EXPECT(st == ZERO_ERR_REMOTE && strstr(message, "injected") != NULL, "%s", message);
    /* Agreed before data moved: the engine is usable, and the step goes on on every rank. */
    CHECK(zero_step(&info, engine));
    EXPECT(!info.skipped && info.step == 1, "the retried step: step %lld skipped %d", (long long)info.step,
           info.skipped);
    zero_engine_destroy(engine);
    free_grid(&g);
    if (g.world_rank == 0) printf("model-parallel step failure ok: every rank heard it, the retry trained\n");
    return;
  }
  zero_engine_destroy(engine);
  zero_comm_destroy(g.dp_comm);
  zero_comm_destroy(g.mp_comm);
}

static void case_checkpoint(int world, int stage, const char* dir) {
  Reference ref;
  reference_init(&ref);
  int32_t ids[kParams];
  { /* T x D ranks train 4 steps and save */
    Grid g = make_grid(world);
    zero_engine_t* engine = make_engine(&g, stage, 1, g_clip, ids);
    train(engine, ids, &g, &ref, 1, 1, 4);
    CHECK(zero_save_checkpoint(engine, dir, "step4"));
    if (g.world_rank == 0)
      for (int r = 0; r < g_tp; ++r) {
        char path[512];
        snprintf(path, sizeof path, "%s/step4/mp_rank_%02d/manifest.json", dir, r);
        FILE* f = fopen(path, "r");
        EXPECT(f != NULL, "no %s", path);
        fclose(f);
      }
    zero_engine_destroy(engine);
    free_grid(&g);
  }
  { /* T x 1 ranks (the lower world ranks) load it and go on to step 8 */
    Grid g = make_grid(g_tp);
    if (g.dp_comm != NULL) {
      zero_engine_t* engine = make_engine(&g, stage, 1, g_clip, ids);
      CHECK(zero_load_checkpoint(engine, dir, NULL));
      expect_parts_equal(engine, ids, &ref, "loaded by fewer data-parallel ranks");
      train(engine, ids, &g, &ref, 1, 5, 8);
      zero_engine_destroy(engine);
    }
    free_grid(&g);
  }
  { /* every rank as data-parallel ranks of the whole model, without a model-parallel group: refused */
    const int tp = g_tp;
    g_tp = 1;
    Grid g = make_grid(world);
    char config[1024];
    make_config(config, sizeof config, stage, 1, g_clip, 60.0);
    zero_engine_t* engine = NULL;
    CHECK(zero_engine_create(&engine, config, g.dp_comm));
    register_layer(engine, ids, g.dp == 0, 0);
    CHECK(zero_engine_finalize(engine));
    free_init();
    const zero_status_t st = zero_load_checkpoint(engine, dir, "step4");
    char sizes[128];
    snprintf(sizes, sizeof sizes, "saved with model-parallel size %d, this job has model-parallel size 1", tp);
    EXPECT(st == ZERO_ERR_MISMATCH && strstr(zero_last_error(), sizes) != NULL, "%s: %s", zero_status_string(st),
           zero_last_error());
    zero_engine_destroy(engine);
    free_grid(&g);
    g_tp = tp;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    printf(
        "model-parallel checkpoint ok: %d x %d ranks saved one part per model-parallel rank, %d x 1 loaded it and "
        "trained on bit-identical to the reference, a job without the group was refused\n",
        g_tp, world / g_tp, g_tp);
}

/* The tensor-parallel ranks set different learning rates: zero_step fails on every rank before data moves, naming
 * each model-parallel rank's rate, and trains once they agree. */
static void case_lr_differs(int world) {
  Grid g = make_grid(world);
  int32_t ids[kParams];
  zero_engine_t* engine = make_engine(&g, 2, 1, g_clip, ids);
  micro_step(engine, ids, 1, 0, g.dp, g.dp_size, 1.0f, NULL, -1);
  CHECK(zero_set_lr(engine, 0, g_tp_rank == 1 ? 0.02 : 0.01));
  zero_step_info_t info = ZERO_STEP_INFO_INIT;
  const zero_status_t st = zero_step(&info, engine);
  const char* message = zero_last_error();
  printf("world rank %d: lr-differs: %s: %s\n", g.world_rank, zero_status_string(st), message);
  EXPECT(st == ZERO_ERR_MISMATCH && strstr(message, "learning rates") != NULL &&
             strstr(message, "model-parallel rank 1 0.02") != NULL,
         "world rank %d: %s: %s", g.world_rank, zero_status_string(st), message);
  CHECK(zero_set_lr(engine, 0, 0.01));
  CHECK(zero_step(&info, engine));
  EXPECT(info.step == 1 && !info.skipped, "the step after agreeing: step %lld", (long long)info.step);
  zero_engine_destroy(engine);
  free_grid(&g);
}

/* One rank cannot allocate its buffers in finalize: every rank of the job fails (ZERO_ERR_REMOTE elsewhere), and a
 * second finalize succeeds everywhere (the failure was agreed before data moved). Needs the test hooks. */
static void case_finalize_fails(int world) {
  Grid g = make_grid(world);
  char config[1024];
  make_config(config, sizeof config, 2, 1, g_clip, 60.0);
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, g.dp_comm));
  CHECK(zero_engine_set_model_parallel(engine, g.mp_comm));
  int32_t ids[kParams];
  register_layer(engine, ids, g.dp == 0, 0);
  const int failing = g_tp * g_pp; /* data-parallel rank 1, model-parallel rank 0 */
  if (g.world_rank == failing) setenv("ZERO_TEST_FAIL", "finalize.alloc:1", 1);
  const zero_status_t st = zero_engine_finalize(engine);
  unsetenv("ZERO_TEST_FAIL");
  printf("world rank %d: finalize-fails: %s: %s\n", g.world_rank, zero_status_string(st), zero_last_error());
  EXPECT(st == (g.world_rank == failing ? ZERO_ERR_OUT_OF_MEMORY : ZERO_ERR_REMOTE), "world rank %d: %s", g.world_rank,
         zero_status_string(st));
  CHECK(zero_engine_finalize(engine));
  free_init();
  micro_step(engine, ids, 1, 0, g.dp, g.dp_size, 1.0f, NULL, -1);
  zero_step_info_t info = ZERO_STEP_INFO_INIT;
  CHECK(zero_step(&info, engine));
  zero_engine_destroy(engine);
  free_grid(&g);
  if (g.world_rank == 0) printf("model-parallel finalize failure ok: every rank heard it, the retry trained\n");
}

/* A save whose last part cannot write its manifest fails on every rank and leaves the previous checkpoint named; a
 * load of a checkpoint with one corrupt part fails on every rank. Needs the test hooks. */
static void case_save_fails(int world, const char* dir) {
  Grid g = make_grid(world);
  int32_t ids[kParams];
  zero_engine_t* engine = make_engine(&g, 2, 1, g_clip, ids);
  micro_step(engine, ids, 1, 0, g.dp, g.dp_size, 1.0f, NULL, -1);
  zero_step_info_t info = ZERO_STEP_INFO_INIT;
  CHECK(zero_step(&info, engine));
  CHECK(zero_save_checkpoint(engine, dir, "good"));
  micro_step(engine, ids, 2, 0, g.dp, g.dp_size, 1.0f, NULL, -1);
  CHECK(zero_step(&info, engine));
  CHECK(zero_save_checkpoint(engine, dir, "good2"));
  const int last_part = g_tp * g_pp - 1; /* its data-parallel rank 0 writes its manifest */
  if (g.world_rank == last_part) setenv("ZERO_TEST_FAIL", "save.manifest-enospc:0", 1);
  zero_status_t st = zero_save_checkpoint(engine, dir, "bad");
  unsetenv("ZERO_TEST_FAIL");
  EXPECT(st != ZERO_OK, "world rank %d: the save succeeded", g.world_rank);
  printf("world rank %d: save-fails: %s: %s\n", g.world_rank, zero_status_string(st), zero_last_error());
  MPI_Barrier(MPI_COMM_WORLD);
  char path[512], latest[64] = "";
  if (g.world_rank == 0) {
    snprintf(path, sizeof path, "%s/bad", dir);
    FILE* f = fopen(path, "r");
    EXPECT(f == NULL, "%s exists after a failed save", path);
    snprintf(path, sizeof path, "%s/.tmp.bad", dir);
    f = fopen(path, "r");
    EXPECT(f == NULL, "%s was left behind", path);
    snprintf(path, sizeof path, "%s/latest", dir);
    f = fopen(path, "r");
    EXPECT(f != NULL && fgets(latest, sizeof latest, f) != NULL && strcmp(latest, "good2\n") == 0,
           "latest says '%s', expected good2", latest);
    fclose(f);
    /* One part's shard, truncated. */
    snprintf(path, sizeof path, "%s/good2/mp_rank_%02d/master.rank00000-of-%05d.safetensors", dir, last_part,
             g.dp_size);
    EXPECT(truncate(path, 100) == 0, "cannot truncate %s", path);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  /* The parts of one load must come from one save: the last part loading another tag is refused everywhere. */
  st = zero_load_checkpoint(engine, dir, g.world_rank % (g_tp * g_pp) == last_part ? "good" : "good2");
  printf("world rank %d: parts of two saves: %s: %s\n", g.world_rank, zero_status_string(st), zero_last_error());
  EXPECT(st == ZERO_ERR_MISMATCH, "world rank %d: loading parts of two saves: %s", g.world_rank,
         zero_status_string(st));
  st = zero_load_checkpoint(engine, dir, "good2");
  printf("world rank %d: corrupt part: %s: %s\n", g.world_rank, zero_status_string(st), zero_last_error());
  EXPECT(st == ZERO_ERR_CHECKPOINT_CORRUPT, "world rank %d: loading a corrupt part: %s", g.world_rank,
         zero_status_string(st));
  zero_engine_destroy(engine);
  free_grid(&g);
  if (g.world_rank == 0) printf("model-parallel save and load failures ok: every rank failed, latest kept\n");
}

int main(int argc, char** argv) {
  int stage = 2, gas = 1;
  const char* which = "parity";
  const char* dir = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--tp") == 0)
      g_tp = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--pp") == 0)
      g_pp = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--stage") == 0)
      stage = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--gas") == 0)
      gas = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--case") == 0)
      which = argv[i + 1];
    else if (strcmp(argv[i], "--dir") == 0)
      dir = argv[i + 1];
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (g_tp < 1 || g_pp < 1 || kUnits % g_pp != 0 || world % (g_tp * g_pp) != 0 || world > 64) {
    fprintf(stderr, "--tp x --pp must divide the rank count (at most 64), --pp the 4 units\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (strcmp(which, "parity") == 0) {
    case_parity(world, stage, gas);
  } else if (strcmp(which, "overflow") == 0) {
    g_dtype = ZERO_DTYPE_FP16;
    case_overflow(world, stage);
  } else if (strcmp(which, "clip-differs") == 0 || strcmp(which, "layout-differs") == 0 ||
             strcmp(which, "missing-group") == 0) {
    case_finalize_mismatch(world, which);
  } else if (strcmp(which, "finalize-fails") == 0) {
    case_finalize_fails(world);
  } else if (strcmp(which, "lr-differs") == 0) {
    case_lr_differs(world);
  } else if (strcmp(which, "save-fails") == 0 && dir != NULL) {
    case_save_fails(world, dir);
  } else if (strcmp(which, "checkpoint") == 0 && dir != NULL) {
    case_checkpoint(world, stage, dir);
  } else if (strcmp(which, "step-fails") == 0 || strcmp(which, "norm-fails") == 0) {
    case_failure(world, which);
  } else {
    fprintf(stderr, "unknown --case %s\n", which);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return 0;
}
