/*
 * Frozen params (ZERO_PARAM_FROZEN) under mpirun: a fine-tuning job's pretrained base, packed quantized weights, and
 * the like, kept in their own dtypes as bytes beside the trained params.
 *
 * Every mode trains two engines side by side on their own communicators, with the same gradients: A holds the test
 * model (tests/mpi/harness.h) plus frozen params (bf16 words with NaN payloads in unit 0, fp32 with NaN payloads in
 * unit 2, and a unit 3 of frozen params only: uint8, int8, fp64, int64 and opaque bytes); B holds the test model
 * alone, whose training the parity suite proves against a reference. A's trained weights must equal B's bit for bit
 * at every gather (frozen params change nothing in training: no gradient, no norm, no optimizer state), A's frozen
 * bytes must equal rank 0's initial bytes at every gather (never converted, also when sharded and all-gathered), and
 * A's checkpoint's master and optimizer files must be B's, byte for byte.
 *
 *   test_frozen --mode train   --stage S [--dtype D] [--persist P] [--overlap 0|1] [--nvme NVME] --dir DIR
 *       train, check the memory statistics against the layout rule, save A and B, compare their files; load A's
 *       checkpoint into a new engine (zeros for frozen params) and see every frozen byte back; save without the
 *       frozen params (exclude_frozen) and load that into an engine whose frozen params differ: they are kept.
 *       --nvme offloads the optimizer state and the trained param shards to NVMe (the frozen bytes stay in memory).
 *   test_frozen --mode save    --stage S --dir DIR --tag T        (the source of a reshard)
 *   test_frozen --mode reshard --stage S --dir DIR --from T       (load T saved at any N and stage: the bytes are
 *       back, and training goes on exactly as an engine trained without the checkpoint)
 *   test_frozen --mode modify  --stage S [--dtype D] --dir DIR
 *       the last rank writes new values into a unit's trained and frozen params and publishes them with
 *       zero_release_modified: every rank sees them, and A (and B, modified alike) train on to equal weights.
 *   test_frozen --mode export  --stage S --dir DIR
 *       stage3_gather_16bit_weights_on_model_save: DIR/export/model.safetensors holds the frozen params as they are;
 *       rank 0 writes the expected bytes to DIR/expected-frozen.bin for tests/tools/frozen_export_test.py.
 *   test_frozen --mode faults  --stage S --dir DIR
 *       one rank fails (ZERO_TEST_FAIL) in a frozen unit's gather and in zero_release_modified, ranks name different
 *       modifier ranks, one rank has the unit released: every rank gets a named error, and the engine stays usable
 *       where nothing moved; a frozen param has no gradient.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#define ZERO_EXPERIMENTAL_API
#include "harness.h"

enum { kSteps = 6, kNumFrozen = 7, kUnitsA = kNumUnits + 1 };
static zero_dtype_t g_dtype = ZERO_DTYPE_FP32;
static int g_stage = 0, g_rank = 0, g_world = 1, g_overlap = 0;
static long g_persist = 0;
static const char* g_dir = "frozen";
static const char* g_nvme = NULL; /* offload_optimizer and offload_param to NVMe under this directory */

typedef struct {
  const char* name;
  zero_dtype_t dtype;
  int ndim;
  int64_t shape[2];
  int unit;
} FrozenParam;

static const FrozenParam kFrozen[kNumFrozen] = {
    {"embed.base", ZERO_DTYPE_BF16, 2, {9, 7}, 0},      {"head.base", ZERO_DTYPE_FP32, 1, {33, 0}, 2},
    {"quant.packed", ZERO_DTYPE_UINT8, 1, {300, 0}, 3}, {"quant.codes", ZERO_DTYPE_INT8, 2, {5, 13}, 3},
    {"quant.scale", ZERO_DTYPE_FP64, 1, {3, 0}, 3},     {"quant.index", ZERO_DTYPE_INT64, 1, {4, 0}, 3},
    {"quant.raw", ZERO_DTYPE_BYTES, 1, {17, 0}, 3},
};

static size_t elem_size(zero_dtype_t t) {
  switch (t) {
    case ZERO_DTYPE_FP32:
      return 4;
    case ZERO_DTYPE_BF16:
    case ZERO_DTYPE_FP16:
      return 2;
    case ZERO_DTYPE_FP64:
    case ZERO_DTYPE_INT64:
      return 8;
    default:
      return 1;
  }
}
static size_t frozen_numel(int q) {
  size_t n = 1;
  for (int d = 0; d < kFrozen[q].ndim; ++d) n *= (size_t)kFrozen[q].shape[d];
  return n;
}
static size_t frozen_bytes(int q) { return frozen_numel(q) * elem_size(kFrozen[q].dtype); }

static uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

/* Byte b of frozen param q's initial values (`salt` 0: rank 0's). Any bytes, so 16- and 32-bit words land on NaNs,
 * infinities and denormals too; some words are set to NaNs with payloads, which a conversion through fp32 would
 * quiet. */
static void fill_frozen(int q, unsigned char* out, uint64_t salt) {
  const size_t n = frozen_bytes(q);
  for (size_t b = 0; b < n; ++b) out[b] = (unsigned char)mix((uint64_t)q * 1000003u + b + salt * 0x9e3779b97f4a7c15ull);
  if (salt != 0) return;
  if (kFrozen[q].dtype == ZERO_DTYPE_BF16) {
    const uint16_t nans[4] = {0x7f81, 0xffc3, 0x7fa5, 0x7f80 /* +inf */};
    memcpy(out, nans, sizeof nans);
  } else if (kFrozen[q].dtype == ZERO_DTYPE_FP32) {
    const uint32_t nans[2] = {0x7fa00001u, 0xff800123u};
    memcpy(out + 8, nans, sizeof nans);
  }
}

/* The documented layout of a unit's frozen bytes (docs/architecture.md): each param at a multiple of 64 bytes, the
 * unit padded to a multiple of 64 x N bytes. Computed here independently of the engine. */
static size_t frozen_offset(int q) {
  size_t end = 0, offset = 0;
  for (int r = 0; r <= q; ++r) {
    if (kFrozen[r].unit != kFrozen[q].unit) continue;
    offset = (end + 63) / 64 * 64;
    end = offset + frozen_bytes(r);
  }
  return offset;
}
static size_t frozen_unit_padded(int unit, int world) {
  size_t end = 0;
  for (int q = 0; q < kNumFrozen; ++q)
    if (kFrozen[q].unit == unit) end = frozen_offset(q) + frozen_bytes(q);
  const size_t multiple = 64 * (size_t)world;
  return (end + multiple - 1) / multiple * multiple;
}
static size_t unit_elements(int unit) { /* trained and frozen, as persistence counts them */
  size_t n = 0, end = 0;
  for (int p = 0; p < kNumParams; ++p)
    if (kModel[p].unit == unit) end = (end + 63) / 64 * 64 + test_param_numel(p);
  n = end;
  for (int q = 0; q < kNumFrozen; ++q) n += kFrozen[q].unit == unit ? frozen_numel(q) : 0;
  return n;
}

typedef struct {
  zero_comm_t* comm;
  zero_engine_t* engine;
  int32_t ids[kNumParams];
  int32_t frozen_ids[kNumFrozen];
  int frozen; /* A (1) or B (0) */
} Model;

static void config_text(char* out, size_t size, const char* extra) {
  char nvme[512] = "";
  if (g_nvme != NULL)
    snprintf(nvme, sizeof nvme,
             ", \"sub_group_size\": 1024, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"%s\"},"
             " \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"%s\", \"buffer_size\": 100}",
             g_nvme, g_nvme);
  snprintf(out, size,
           "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_clipping\": 0.5,"
           " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.02}},"
           " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 300,"
           " \"stage3_param_persistence_threshold\": %ld, \"overlap_comm\": %s%s%s}%s}",
           g_stage, g_persist, g_overlap ? "true" : "false", extra, nvme, dtype_config(g_dtype));
}

/* `frozen_salt`: rank 0's frozen initial values (0: the pattern every check expects), or -1 for none (zeros). */
static Model open_model(int frozen, long frozen_salt, const char* extra) {
  Model m;
  memset(&m, 0, sizeof m);
  m.frozen = frozen;
  CHECK(zero_comm_create_mpi(&m.comm, ZERO_MPI_COMM_WORLD));
  char config[1024];
  config_text(config, sizeof config, extra);
  CHECK(zero_engine_create(&m.engine, config, m.comm));
  float* init[kNumParams];
  for (int p = 0; p < kNumParams; ++p) {
    init[p] = malloc(test_param_numel(p) * sizeof(float));
    for (size_t i = 0; i < test_param_numel(p); ++i)
      init[p][i] = g_rank == 0 ? (float)ldexp((double)((int)((p * 31 + i * 7) % 41) - 20), -6) : 99.0f;
  }
  register_test_model(m.engine, g_dtype, init, m.ids);
  unsigned char* values[kNumFrozen] = {NULL};
  if (frozen)
    for (int q = 0; q < kNumFrozen; ++q) {
      values[q] = malloc(frozen_bytes(q));
      /* The other ranks offer other bytes: rank 0's must win. */
      fill_frozen(q, values[q], g_rank == 0 ? (uint64_t)frozen_salt : 77u + (uint64_t)g_rank);
      zero_param_desc_t d;
      CHECK(zero_param_desc_init(&d, sizeof d));
      d.name = kFrozen[q].name;
      d.ndim = kFrozen[q].ndim;
      d.shape = kFrozen[q].shape;
      d.unit = kFrozen[q].unit;
      d.dtype = kFrozen[q].dtype;
      d.flags = ZERO_PARAM_FROZEN;
      d.init_data = frozen_salt < 0 ? NULL : values[q];
      CHECK(zero_engine_add_param(&m.frozen_ids[q], m.engine, &d));
    }
  CHECK(zero_engine_finalize(m.engine));
  for (int p = 0; p < kNumParams; ++p) free(init[p]);
  for (int q = 0; q < kNumFrozen; ++q) free(values[q]);
  return m;
}

static void close_model(Model* m) {
  zero_engine_destroy(m->engine);
  zero_comm_destroy(m->comm);
}

static int units_of(const Model* m) { return m->frozen ? kUnitsA : kNumUnits; }

/* The frozen params of `unit` hold rank 0's bytes of `salt` (gathered: every byte of every rank's shard). */
static void expect_frozen(const Model* m, int unit, uint64_t salt, const char* when) {
  if (!m->frozen) return;
  for (int q = 0; q < kNumFrozen; ++q) {
    if (kFrozen[q].unit != unit) continue;
    unsigned char* want = malloc(frozen_bytes(q));
    fill_frozen(q, want, salt);
    void* data = NULL;
    CHECK(zero_param_data(&data, m->engine, m->frozen_ids[q]));
    for (size_t b = 0; b < frozen_bytes(q); ++b)
      EXPECT(((const unsigned char*)data)[b] == want[b], "%s: %s byte %zu is 0x%02x, expected 0x%02x", when,
             kFrozen[q].name, b, ((const unsigned char*)data)[b], want[b]);
    free(want);
  }
}

/* A's trained params equal B's in `unit`, bit for bit. */
static void expect_same_trained(const Model* a, const Model* b, int unit, const char* when) {
  for (int p = 0; p < kNumParams; ++p) {
    if (kModel[p].unit != unit) continue;
    void *x = NULL, *y = NULL;
    CHECK(zero_param_data(&x, a->engine, a->ids[p]));
    CHECK(zero_param_data(&y, b->engine, b->ids[p]));
    EXPECT(memcmp(x, y, test_param_numel(p) * elem_size(g_dtype)) == 0,
           "%s: %s differs from the run without frozen params", when, kModel[p].name);
  }
}

static float grad_value(int t, int p, size_t i) {
  /* Multiples of 2^-10, the same on every rank (no clipping dependence on N for the reshard mode's comparison). */
  return (float)ldexp((double)((int)(mix((uint64_t)t * 7919u + (uint64_t)p * 104729u + i) % 9) - 4), -10);
}

/* One micro-step and step of both models: every gathered unit compared, frozen bytes checked. */
static void train_step(Model* a, Model* b, int t, uint64_t salt) {
  for (int u = 0; u < kUnitsA; ++u) { /* forward */
    CHECK(zero_gather(a->engine, u));
    if (u < kNumUnits) CHECK(zero_gather(b->engine, u));
    expect_frozen(a, u, salt, "forward");
    if (u < kNumUnits) expect_same_trained(a, b, u, "forward");
    CHECK(zero_release(a->engine, u));
    if (u < kNumUnits) CHECK(zero_release(b->engine, u));
  }
  for (int u = kUnitsA - 1; u >= 0; --u) { /* backward */
    Model* models[2] = {a, b};
    for (int k = 0; k < 2; ++k) {
      Model* m = models[k];
      if (u >= units_of(m)) continue;
      CHECK(zero_gather(m->engine, u));
      expect_frozen(m, u, salt, "backward");
      for (int p = kNumParams - 1; p >= 0; --p) {
        if (kModel[p].unit != u) continue;
        float* g = NULL;
        CHECK(zero_grad_data((void**)&g, m->engine, m->ids[p]));
        for (size_t i = 0; i < test_param_numel(p); ++i)
          g[i] += grad_value(t, p, i) * (g_dtype == ZERO_DTYPE_FP16 ? 65536.0f : 1.0f);
        CHECK(zero_grad_ready(m->engine, m->ids[p]));
      }
      CHECK(zero_release(m->engine, u));
    }
  }
  CHECK(zero_backward_end(a->engine));
  CHECK(zero_backward_end(b->engine));
  zero_step_info_t ia = ZERO_STEP_INFO_INIT, ib = ZERO_STEP_INFO_INIT;
  CHECK(zero_step(&ia, a->engine));
  CHECK(zero_step(&ib, b->engine));
  EXPECT(ia.grad_norm == ib.grad_norm, "step %d: grad_norm %.17g with frozen params, %.17g without", t, ia.grad_norm,
         ib.grad_norm);
}

static void check_all(const Model* a, const Model* b, uint64_t salt, const char* when) {
  for (int u = 0; u < kUnitsA; ++u) {
    CHECK(zero_gather(a->engine, u));
    if (u < kNumUnits) CHECK(zero_gather(b->engine, u));
    expect_frozen(a, u, salt, when);
    if (u < kNumUnits) expect_same_trained(a, b, u, when);
    CHECK(zero_release(a->engine, u));
    if (u < kNumUnits) CHECK(zero_release(b->engine, u));
  }
}

/* zero_memory_stats' frozen bytes: every frozen unit whole, except the shards of units stage 3 shards. */
static void check_memory(const Model* a, const Model* b) {
  zero_memory_stats_t ma, mb;
  CHECK(zero_memory_stats_init(&ma, sizeof ma));
  CHECK(zero_memory_stats_init(&mb, sizeof mb));
  CHECK(zero_memory_stats(&ma, a->engine));
  CHECK(zero_memory_stats(&mb, b->engine));
  uint64_t want = 0;
  for (int u = 0; u < kUnitsA; ++u) {
    const size_t padded = frozen_unit_padded(u, g_world);
    const int sharded = g_stage == 3 && unit_elements(u) >= (size_t)g_persist;
    want += sharded ? padded / (size_t)g_world : padded;
  }
  EXPECT(ma.frozen_param_bytes == want, "frozen_param_bytes %llu, the layout rule says %llu",
         (unsigned long long)ma.frozen_param_bytes, (unsigned long long)want);
  EXPECT(mb.frozen_param_bytes == 0, "B has no frozen params but %llu bytes",
         (unsigned long long)mb.frozen_param_bytes);
  EXPECT(ma.param_bytes == mb.param_bytes && ma.grad_bytes == mb.grad_bytes &&
             ma.master_param_bytes == mb.master_param_bytes && ma.optimizer_state_bytes == mb.optimizer_state_bytes,
         "frozen params changed the trained kinds' bytes");
  EXPECT(ma.total_bytes == ma.param_bytes + ma.grad_bytes + ma.master_param_bytes + ma.optimizer_state_bytes +
                               ma.bucket_bytes + ma.gathered_bytes + ma.frozen_param_bytes,
         "total_bytes %llu is not the sum of the kinds", (unsigned long long)ma.total_bytes);
  /* The frozen-only unit has no gradient and no state: a frozen param's info says so. */
  zero_param_info_t info;
  CHECK(zero_param_info_init(&info, sizeof info));
  CHECK(zero_param_info(&info, a->engine, a->frozen_ids[2]));
  EXPECT(info.flags == ZERO_PARAM_FROZEN && info.param_dtype == ZERO_DTYPE_UINT8 && info.grad_dtype == -1 &&
             info.grad_bytes == 0 && info.param_bytes == 300,
         "quant.packed's info: flags %u dtype %d grad dtype %d", info.flags, info.param_dtype, info.grad_dtype);
}

static char* path_of(const char* a, const char* b, const char* c) {
  static char buffers[4][1024];
  static int next = 0;
  char* out = buffers[next++ % 4];
  snprintf(out, 1024, "%s/%s%s%s", a, b, c[0] ? "/" : "", c);
  return out;
}

static long file_size(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Two files have the same bytes. */
static int same_file(const char* x, const char* y) {
  FILE *f = fopen(x, "rb"), *g = fopen(y, "rb");
  int same = f != NULL && g != NULL;
  while (same) {
    int c = fgetc(f), d = fgetc(g);
    if (c != d) same = 0;
    if (c == EOF || d == EOF) break;
  }
  if (f) fclose(f);
  if (g) fclose(g);
  return same;
}

static void compare_checkpoints(const char* a_tag, const char* b_tag) {
  if (g_rank != 0) return;
  for (int r = 0; r < g_world; ++r)
    for (int k = 0; k < 2; ++k) {
      char name[96];
      snprintf(name, sizeof name, "%s.rank%05d-of-%05d.safetensors", k == 0 ? "master" : "optimizer", r, g_world);
      EXPECT(same_file(path_of(g_dir, a_tag, name), path_of(g_dir, b_tag, name)),
             "%s differs between the checkpoints with and without frozen params", name);
    }
}

static void save_both(Model* a, Model* b, const char* tag) {
  char a_tag[64], b_tag[64];
  snprintf(a_tag, sizeof a_tag, "%s-a", tag);
  snprintf(b_tag, sizeof b_tag, "%s-b", tag);
  CHECK(zero_save_checkpoint(a->engine, g_dir, a_tag));
  CHECK(zero_save_checkpoint(b->engine, g_dir, b_tag));
  MPI_Barrier(MPI_COMM_WORLD);
  compare_checkpoints(a_tag, b_tag);
}

static void mode_train(void) {
  Model a = open_model(1, 0, ""), b = open_model(0, 0, "");
  check_memory(&a, &b);
  for (int t = 1; t <= kSteps; ++t) train_step(&a, &b, t, 0);
  check_all(&a, &b, 0, "trained");
  save_both(&a, &b, "trained");

  /* A new engine whose frozen params start as zeros gets every byte back from the checkpoint. */
  Model c = open_model(1, -1, "");
  CHECK(zero_load_checkpoint(c.engine, g_dir, "trained-a"));
  check_all(&c, &b, 0, "loaded");
  train_step(&c, &b, kSteps + 1, 0); /* and trains on exactly as before */
  close_model(&c);

  /* Without the frozen params: the files hold none, and a load keeps the engine's own (here other bytes). */
  zero_save_options_t options;
  CHECK(zero_save_options_init(&options, sizeof options));
  options.exclude_frozen = 1;
  CHECK(zero_save_checkpoint_with(a.engine, g_dir, "excluded", &options));
  if (g_rank == 0) {
    char name[96];
    snprintf(name, sizeof name, "frozen.rank%05d-of-%05d.safetensors", g_world - 1, g_world);
    EXPECT(file_size(path_of(g_dir, "excluded", name)) < 0 && file_size(path_of(g_dir, "trained-a", name)) > 0,
           "exclude_frozen wrote %s, or the full save did not", name);
  }
  Model e = open_model(1, 5, ""); /* frozen params of other bytes */
  CHECK(zero_load_checkpoint(e.engine, g_dir, "excluded"));
  Model f = open_model(0, 0, "");
  CHECK(zero_load_checkpoint(f.engine, g_dir, "trained-b"));
  check_all(&e, &f, 5, "loaded without frozen params");
  close_model(&e);
  close_model(&f);
  close_model(&a);
  close_model(&b);
  if (g_rank == 0)
    printf(
        "frozen ok: %s, stage %d, %d ranks: trained weights and checkpoints equal the run without frozen params, "
        "frozen bytes unchanged, memory per the layout rule\n",
        dtype_text(g_dtype), g_stage, g_world);
}

static void mode_save(const char* tag) {
  Model a = open_model(1, 0, "");
  Model b = open_model(0, 0, "");
  for (int t = 1; t <= kSteps; ++t) train_step(&a, &b, t, 0);
  CHECK(zero_save_checkpoint(a.engine, g_dir, tag));
  close_model(&a);
  close_model(&b);
}

static void mode_reshard(const char* from) {
  /* B trains the same steps here: the reference at this rank count (every rank adds the same gradient). */
  Model a = open_model(1, -1, ""), b = open_model(0, 0, "");
  Model scratch = open_model(1, 0, "");
  for (int t = 1; t <= kSteps; ++t) train_step(&scratch, &b, t, 0);
  close_model(&scratch);
  CHECK(zero_load_checkpoint(a.engine, g_dir, from));
  check_all(&a, &b, 0, "resharded");
  for (int t = kSteps + 1; t <= kSteps + 3; ++t) train_step(&a, &b, t, 0);
  check_all(&a, &b, 0, "trained after the reshard");
  close_model(&a);
  close_model(&b);
  if (g_rank == 0) printf("frozen reshard ok: %s loaded at %d ranks, stage %d\n", from, g_world, g_stage);
}

/* Rank `writer` writes new values into unit `unit` of `m` (trained: a pattern representable in every dtype; frozen:
 * the bytes of `salt`) and publishes them. */
static void modify(Model* m, int unit, int writer, uint64_t salt) {
  CHECK(zero_gather(m->engine, unit));
  if (g_rank == writer) {
    for (int p = 0; p < kNumParams; ++p) {
      if (kModel[p].unit != unit) continue;
      void* data = NULL;
      CHECK(zero_param_data(&data, m->engine, m->ids[p]));
      for (size_t i = 0; i < test_param_numel(p); ++i) {
        const float v = (float)ldexp((double)((int)(i % 13) - 6), -5);
        uint32_t bits;
        memcpy(&bits, &v, 4);
        if (g_dtype == ZERO_DTYPE_FP32)
          ((float*)data)[i] = v;
        else /* bf16 (the modes this runs in): v has 3 significant bits, its top 16 bits are exact */
          ((uint16_t*)data)[i] = (uint16_t)(bits >> 16);
      }
    }
    for (int q = 0; q < kNumFrozen && m->frozen; ++q) {
      if (kFrozen[q].unit != unit) continue;
      void* data = NULL;
      CHECK(zero_param_data(&data, m->engine, m->frozen_ids[q]));
      fill_frozen(q, data, salt);
    }
  }
  CHECK(zero_release_modified(m->engine, unit, writer));
}

static void mode_modify(void) {
  Model a = open_model(1, 0, ""), b = open_model(0, 0, "");
  for (int t = 1; t <= 3; ++t) train_step(&a, &b, t, 0);
  const int writer = g_world - 1;
  /* Unit 0 (trained and frozen) and unit 2; unit 3 (frozen only) too. */
  for (int u = 0; u < kUnitsA; ++u) {
    if (u == 1) continue;
    modify(&a, u, writer, 9);
    if (u < kNumUnits) modify(&b, u, writer, 9);
  }
  /* Every rank sees the writer's values (frozen: salt 9 in units 0, 2, 3). */
  for (int u = 0; u < kUnitsA; ++u) {
    CHECK(zero_gather(a.engine, u));
    if (u < kNumUnits) CHECK(zero_gather(b.engine, u));
    if (u != 1) expect_frozen(&a, u, 9, "modified");
    if (u < kNumUnits) expect_same_trained(&a, &b, u, "modified");
    if (u == 0 && g_dtype == ZERO_DTYPE_FP32) { /* the writer's pattern on every rank */
      void* data = NULL;
      CHECK(zero_param_data(&data, a.engine, a.ids[0]));
      EXPECT(((const float*)data)[1] == (float)ldexp(-5.0, -5), "embed.weight[1] is %g", ((const float*)data)[1]);
    }
    CHECK(zero_release(a.engine, u));
    if (u < kNumUnits) CHECK(zero_release(b.engine, u));
  }
  /* The master follows: training on keeps A equal to B (both modified alike), and the frozen bytes stay. */
  for (int t = 4; t <= kSteps; ++t) train_step(&a, &b, t, 9);
  check_all(&a, &b, 9, "trained after the modification");
  close_model(&a);
  close_model(&b);
  if (g_rank == 0)
    printf("frozen modify ok: %s, stage %d, %d ranks: rank %d's values everywhere, training goes on from them\n",
           dtype_text(g_dtype), g_stage, g_world, writer);
}

static void mode_export(void) {
  Model a = open_model(1, 0, ", \"stage3_gather_16bit_weights_on_model_save\": true");
  Model b = open_model(0, 0, "");
  for (int t = 1; t <= 2; ++t) train_step(&a, &b, t, 0);
  CHECK(zero_save_checkpoint(a.engine, g_dir, "export"));
  if (g_rank == 0) { /* the frozen params' bytes in registration order, for the Python check */
    FILE* f = fopen(path_of(g_dir, "expected-frozen.bin", ""), "wb");
    EXPECT(f != NULL, "cannot write expected-frozen.bin");
    for (int q = 0; q < kNumFrozen; ++q) {
      unsigned char* want = malloc(frozen_bytes(q));
      fill_frozen(q, want, 0);
      fwrite(want, 1, frozen_bytes(q), f);
      free(want);
    }
    fclose(f);
  }
  close_model(&a);
  close_model(&b);
}

static void expect_status(zero_status_t got, zero_status_t want, const char* what) {
  EXPECT(got == want, "%s: %s (expected %s): %s", what, zero_status_string(got), zero_status_string(want),
         zero_last_error());
}

static void mode_faults(void) {
  Model a = open_model(1, 0, ""), b = open_model(0, 0, "");
  train_step(&a, &b, 1, 0);
  const int failing = g_world - 1;
  const int sharded = g_stage == 3 && g_world > 1; /* a collective gather */

  /* A frozen param has no gradient. */
  void* g = NULL;
  expect_status(zero_grad_data(&g, a.engine, a.frozen_ids[0]), ZERO_ERR_INVALID_ARGUMENT, "zero_grad_data(frozen)");
  EXPECT(strstr(zero_last_error(), "is frozen") != NULL, "message: %s", zero_last_error());
  expect_status(zero_grad_ready(a.engine, a.frozen_ids[0]), ZERO_ERR_INVALID_ARGUMENT, "zero_grad_ready(frozen)");

  /* One rank fails in the gather of the frozen-only unit. */
  if (sharded) {
    char hook[32];
    snprintf(hook, sizeof hook, "gather:%d", failing);
    setenv("ZERO_TEST_FAIL", hook, 1);
    zero_status_t s = zero_gather(a.engine, 3);
    unsetenv("ZERO_TEST_FAIL");
    expect_status(s, g_rank == failing ? ZERO_ERR_INTERNAL : ZERO_ERR_REMOTE, "a gather failing on one rank");
    CHECK(zero_gather(a.engine, 3)); /* nothing moved: usable */
    expect_frozen(&a, 3, 0, "gathered after the failure");
    CHECK(zero_release(a.engine, 3));
  }

  if (g_world > 1) {
    /* Ranks name different modifier ranks. */
    CHECK(zero_gather(a.engine, 3));
    zero_status_t s = zero_release_modified(a.engine, 3, g_rank == 0 ? 0 : 1);
    expect_status(s, ZERO_ERR_MISMATCH, "different modifier ranks");
    EXPECT(strstr(zero_last_error(), "different modifier ranks") != NULL, "message: %s", zero_last_error());
    /* Still gathered and usable: a proper one goes through. */
    CHECK(zero_release_modified(a.engine, 3, 0));
    CHECK(zero_gather(a.engine, 3));
    expect_frozen(&a, 3, 0, "after a release_modified of unchanged values");
    CHECK(zero_release(a.engine, 3));
  }
  /* One rank fails in zero_release_modified: every rank hears of it before anything moves. */
  {
    CHECK(zero_gather(a.engine, 0));
    char hook[48];
    snprintf(hook, sizeof hook, "release_modified:%d", failing);
    setenv("ZERO_TEST_FAIL", hook, 1);
    zero_status_t s = zero_release_modified(a.engine, 0, 0);
    unsetenv("ZERO_TEST_FAIL");
    expect_status(s, g_rank == failing ? ZERO_ERR_INTERNAL : ZERO_ERR_REMOTE, "release_modified failing on one rank");
    if (g_rank != failing)
      EXPECT(strstr(zero_last_error(), "zero_release_modified") != NULL, "message: %s", zero_last_error());
    CHECK(zero_release(a.engine, 0));
  }
  /* One rank has the unit released: INVALID_STATE there, REMOTE on the others. */
  if (g_world > 1) {
    CHECK(zero_gather(a.engine, 2)); /* collective at stage 3; zero_release is local */
    if (g_rank == failing) CHECK(zero_release(a.engine, 2));
    zero_status_t s = zero_release_modified(a.engine, 2, 0);
    expect_status(s, g_rank == failing ? ZERO_ERR_INVALID_STATE : ZERO_ERR_REMOTE, "a unit not gathered on one rank");
    if (g_rank != failing) CHECK(zero_release(a.engine, 2));
  }
  /* A modifier rank that is no rank. */
  CHECK(zero_gather(a.engine, 0));
  expect_status(zero_release_modified(a.engine, 0, g_world), ZERO_ERR_INVALID_ARGUMENT, "modifier rank out of range");
  CHECK(zero_release(a.engine, 0));
  /* After all that, training goes on equal to B. */
  for (int t = 2; t <= 3; ++t) train_step(&a, &b, t, 0);
  check_all(&a, &b, 0, "after the faults");
  close_model(&a);
  close_model(&b);
  if (g_rank == 0) printf("frozen faults ok: stage %d, %d ranks\n", g_stage, g_world);
}

int main(int argc, char** argv) {
  const char *mode = "train", *tag = "frozen", *from = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--mode") == 0)
      mode = argv[i + 1];
    else if (strcmp(argv[i], "--stage") == 0)
      g_stage = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--dtype") == 0)
      g_dtype = parse_dtype_arg(argv[i + 1]);
    else if (strcmp(argv[i], "--persist") == 0)
      g_persist = atol(argv[i + 1]);
    else if (strcmp(argv[i], "--overlap") == 0)
      g_overlap = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--dir") == 0)
      g_dir = argv[i + 1];
    else if (strcmp(argv[i], "--nvme") == 0)
      g_nvme = argv[i + 1];
    else if (strcmp(argv[i], "--tag") == 0)
      tag = argv[i + 1];
    else if (strcmp(argv[i], "--from") == 0)
      from = argv[i + 1];
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  if (g_rank == 0) mkdir(g_dir, 0755);
  MPI_Barrier(MPI_COMM_WORLD);
  if (strcmp(mode, "train") == 0)
    mode_train();
  else if (strcmp(mode, "save") == 0)
    mode_save(tag);
  else if (strcmp(mode, "reshard") == 0 && from != NULL)
    mode_reshard(from);
  else if (strcmp(mode, "modify") == 0)
    mode_modify();
  else if (strcmp(mode, "export") == 0)
    mode_export();
  else if (strcmp(mode, "faults") == 0)
    mode_faults();
  else
    EXPECT(0, "unknown mode %s", mode);
  MPI_Finalize();
  return 0;
}
