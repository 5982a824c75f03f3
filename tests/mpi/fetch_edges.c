/*
 * Fetching ahead (overlap_comm, stage-3 prefetch and reuse) where an outside user's program leaves the beaten
 * path: every case ends with the right bits and no rank waiting for another.
 *
 *   mpirun -np N test_fetch_edges
 *
 *   load-after-eval   train, save, train, an evaluation forward (no zero_backward_end: units kept for reuse), load:
 *                     every param equals the checkpoint's, not what was kept.
 *   release-order     a unit kept for reuse is prefetched explicitly while some ranks still hold it gathered and
 *                     others have released it (zero_release is local): every rank takes the same decision.
 *   resident-skipped  a resident unit (published in the background after the step) gathered on rank 0 only, then
 *                     a checkpoint save and a forward: no rank waits for another, the params are unchanged.
 *   live-budget       one large unit and six small ones, stage3_max_live_parameters below one pooled buffer: the
 *                     pool stays at the one buffer the framework's gathers need.
 *   destroy           an engine destroyed right after a normal last zero_step with background all-gathers in
 *                     flight (stage 2, and stage 3 with resident units) gives every buffer back to its allocator.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ZERO_EXPERIMENTAL_API
#include "harness.h"

static int g_rank = 0, g_world = 1;

static void add_grads(float* g, int param, size_t numel, const void* ctx) {
  (void)ctx;
  for (size_t i = 0; i < numel; ++i) g[i] += (float)((int)((i + (size_t)param) % 7) - 3) / 128.0f;
}

static zero_engine_t* make_engine(zero_comm_t* comm, int stage, long persist, const char* extra) {
  char config[1024];
  snprintf(config, sizeof config,
           "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
           " \"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": %ld,"
           " \"overlap_comm\": true%s}, \"libzero\": {\"timeout_s\": 20}}",
           stage, persist, extra);
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, comm));
  return engine;
}

static void train_step(zero_engine_t* engine, const int32_t* ids) {
  test_forward(engine);
  test_backward(engine, ids, add_grads, NULL);
  CHECK(zero_backward_end(engine));
  CHECK(zero_step(NULL, engine));
}

/* Gathers unit `u`, copies its params' values, releases it. */
static void copy_unit(zero_engine_t* engine, const int32_t* ids, int u, float** out) {
  CHECK(zero_gather(engine, u));
  for (int p = 0; p < kNumParams; ++p) {
    if (kModel[p].unit != u) continue;
    void* data = NULL;
    CHECK(zero_param_data(&data, engine, ids[p]));
    memcpy(out[p], data, test_param_numel(p) * sizeof(float));
  }
  CHECK(zero_release(engine, u));
}

/* Every param's values, gathering each unit in forward order. */
static void snapshot(zero_engine_t* engine, const int32_t* ids, float** out) {
  for (int u = 0; u < kNumUnits; ++u) copy_unit(engine, ids, u, out);
}

typedef struct {
  float* p[kNumParams];
} Weights;

static void weights_alloc(Weights* w) {
  for (int p = 0; p < kNumParams; ++p) w->p[p] = malloc(test_param_numel(p) * sizeof(float));
}

static void weights_free(Weights* w) {
  for (int p = 0; p < kNumParams; ++p) free(w->p[p]);
}

static void expect_same(const Weights* a, const Weights* b, const char* what) {
  for (int p = 0; p < kNumParams; ++p)
    EXPECT(memcmp(a->p[p], b->p[p], test_param_numel(p) * sizeof(float)) == 0, "%s: %s differs on rank %d", what,
           kModel[p].name, g_rank);
}

static void load_after_eval(zero_comm_t* comm, const char* dir) {
  zero_engine_t* engine = make_engine(comm, 3, 0, "");
  int32_t ids[kNumParams];
  register_test_model(engine, ZERO_DTYPE_FP32, NULL, ids);
  CHECK(zero_engine_finalize(engine));
  Weights saved, loaded;
  weights_alloc(&saved), weights_alloc(&loaded);
  train_step(engine, ids); /* records the order: forward 0 1 2, backward 2 1 0 */
  snapshot(engine, ids, saved.p);
  CHECK(zero_save_checkpoint(engine, dir, "one"));
  train_step(engine, ids);
  test_forward(engine); /* evaluation: unit 2 is kept for the backward that never comes */
  CHECK(zero_load_checkpoint(engine, dir, "one"));
  snapshot(engine, ids, loaded.p);
  expect_same(&saved, &loaded, "load-after-eval");
  weights_free(&saved), weights_free(&loaded);
  zero_engine_destroy(engine);
}

static void release_order(zero_comm_t* comm) {
  zero_engine_t* engine = make_engine(comm, 3, 0, "");
  int32_t ids[kNumParams];
  register_test_model(engine, ZERO_DTYPE_FP32, NULL, ids);
  CHECK(zero_engine_finalize(engine));
  Weights before, after;
  weights_alloc(&before), weights_alloc(&after);
  train_step(engine, ids);
  snapshot(engine, ids, before.p); /* the next micro-step's forward; unit 2 ends kept for reuse */
  CHECK(zero_gather(engine, 2));   /* kept again at its release: backward gathers it next */
  if (g_rank == 0) CHECK(zero_release(engine, 2));
  CHECK(zero_prefetch(engine, 2));
  if (g_rank != 0) CHECK(zero_release(engine, 2));
  CHECK(zero_prefetch(engine, 1));
  for (int u = kNumUnits - 1; u >= 0; --u) copy_unit(engine, ids, u, after.p); /* backward */
  expect_same(&before, &after, "release-order");
  weights_free(&before), weights_free(&after);
  zero_engine_destroy(engine);
}

static void resident_skipped(zero_comm_t* comm, const char* dir) {
  /* Unit 0 (193 elements) stays resident below a threshold of 194; reuse only. */
  zero_engine_t* engine = make_engine(comm, 3, 194, ", \"stage3_prefetch_bucket_size\": 0");
  int32_t ids[kNumParams];
  register_test_model(engine, ZERO_DTYPE_FP32, NULL, ids);
  CHECK(zero_engine_finalize(engine));
  Weights first, second;
  weights_alloc(&first), weights_alloc(&second);
  train_step(engine, ids);
  for (int u = 0; u < kNumUnits; ++u) { /* a data-dependent branch: only rank 0 runs unit 0 */
    if (u == 0 && g_rank != 0) continue;
    CHECK(zero_gather(engine, u));
    CHECK(zero_release(engine, u));
  }
  CHECK(zero_save_checkpoint(engine, dir, "resident"));
  snapshot(engine, ids, first.p);
  snapshot(engine, ids, second.p);
  expect_same(&first, &second, "resident-skipped");
  weights_free(&first), weights_free(&second);
  zero_engine_destroy(engine);
}

static void live_budget(zero_comm_t* comm) {
  zero_engine_t* engine = make_engine(comm, 3, 0, ", \"stage3_max_live_parameters\": 1000");
  enum { kUnits = 7 };
  int32_t ids[kUnits];
  for (int u = 0; u < kUnits; ++u) {
    char name[16];
    snprintf(name, sizeof name, "p%d", u);
    int64_t shape[1] = {u == 0 ? 16384 : 128};
    zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
    d.name = name, d.ndim = 1, d.shape = shape, d.unit = u;
    CHECK(zero_engine_add_param(&ids[u], engine, &d));
  }
  CHECK(zero_engine_finalize(engine));
  zero_memory_stats_t m = ZERO_MEMORY_STATS_INIT;
  uint64_t largest = 0;
  for (int step = 0; step < 3; ++step) {
    for (int u = 0; u < kUnits; ++u) {
      CHECK(zero_gather(engine, u));
      CHECK(zero_release(engine, u));
    }
    for (int u = kUnits - 1; u >= 0; --u) {
      CHECK(zero_gather(engine, u));
      float* g = NULL;
      CHECK(zero_grad_data((void**)&g, engine, ids[u]));
      g[0] += 1.0f;
      CHECK(zero_grad_ready(engine, ids[u]));
      CHECK(zero_release(engine, u));
      CHECK(zero_memory_stats(&m, engine));
      if (m.gathered_bytes > largest) largest = m.gathered_bytes;
    }
    CHECK(zero_backward_end(engine));
    CHECK(zero_step(NULL, engine));
  }
  /* One pooled buffer holds the largest unit: 16384 elements, padded to a multiple of 16 x N, in fp32. */
  EXPECT(largest < 2 * 16384 * sizeof(float) + 64 * (uint64_t)g_world * sizeof(float),
         "live-budget: %llu bytes of gathered buffers with a budget below one buffer", (unsigned long long)largest);
  zero_engine_destroy(engine);
}

static long g_blocks = 0;
static void* counted_alloc(void* user_data, size_t bytes, size_t alignment) {
  (void)user_data;
  void* p = NULL;
  if (posix_memalign(&p, alignment, bytes) != 0) return NULL;
  g_blocks += 1;
  return p;
}
static void counted_free(void* user_data, void* p, size_t bytes) {
  (void)user_data, (void)bytes;
  g_blocks -= 1;
  free(p);
}

static void destroy_after_step(zero_comm_t* comm, int stage, long persist) {
  zero_engine_t* engine = make_engine(comm, stage, persist, "");
  zero_allocator_t a = ZERO_ALLOCATOR_INIT;
  a.alloc = counted_alloc, a.free = counted_free;
  CHECK(zero_engine_set_allocator(engine, ZERO_MEMORY_HOST, &a));
  int32_t ids[kNumParams];
  register_test_model(engine, ZERO_DTYPE_FP32, NULL, ids);
  CHECK(zero_engine_finalize(engine));
  train_step(engine, ids);
  train_step(engine, ids); /* the last step: its all-gathers are still in flight */
  zero_engine_destroy(engine);
  EXPECT(g_blocks == 0, "destroy (stage %d): %ld buffers never given back to the allocator", stage, g_blocks);
}

int main(int argc, char** argv) {
  const char* dir = argc > 1 ? argv[1] : "fetch-edges-ckpt";
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  zero_comm_t* comm = NULL;
  CHECK(zero_comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD));
  load_after_eval(comm, dir);
  release_order(comm);
  resident_skipped(comm, dir);
  live_budget(comm);
  destroy_after_step(comm, 2, 0);
  destroy_after_step(comm, 3, 194);
  if (g_rank == 0) printf("fetch edges ok: %d ranks\n", g_world);
  CHECK(zero_comm_finalize(comm));
  zero_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}
