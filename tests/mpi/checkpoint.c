/*
 * Checkpoints under mpirun. Every mode compares states by saving them and comparing the shard files byte for byte:
 * identical files mean identical fp32 master weights and optimizer state.
 *
 *   test_checkpoint --mode resume  --stage S [--dtype D | --stochastic-rounding 1] [--device NAME] --dir DIR
 *       train 10 steps, save, train 10 more, save; separately load the first checkpoint and train the same 10
 *       steps, save: both final checkpoints are identical.
 *   test_checkpoint --mode save    --stage S --dir DIR --tag T
 *       train 10 steps and save as T (the source of a reshard test).
 *   test_checkpoint --mode reshard --stage S --dir DIR --from T
 *       load T (saved with any rank count and stage), train 10 more steps, save; separately train 20 steps
 *       continuously at this rank count and stage, save: identical. Every rank adds the same gradient and there is
 *       no clipping, so the average (sum x fl(1/N)) is exactly that gradient for N = 1..4 and the continuous run
 *       does not depend on N.
 *   test_checkpoint --mode faults  --stage S --dir DIR
 *       a truncated shard, a flipped byte, a deleted file and a full disk (injected ENOSPC) are each detected on
 *       every rank with a clear error, the engine is untouched, and the previous checkpoint still loads exactly.
 *   test_checkpoint --mode export  --stage S --dir DIR
 *       train 10 steps with stage3_gather_16bit_weights_on_model_save and save as "export"; rank 0 writes the
 *       gathered weights (fp32, params in registration order) to DIR/export-weights.bin for the zero-ckpt and
 *       Python safetensors checks (tests/tools/).
 *   test_checkpoint --mode kill    --stage S --dir DIR     (run under a wrapper: rank 1 dies mid-save)
 *   test_checkpoint --mode after-kill --stage S --dir DIR (the checkpoint before the kill loads exactly)
 */
#define _POSIX_C_SOURCE 200809L /* truncate, pread, pwrite, setenv */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

enum { kHalf = 10 };
static zero_dtype_t g_dtype = ZERO_DTYPE_FP32;
static int g_stage = 0, g_rank = 0, g_world = 1;
static const char* g_dir = "ckpt";
static const char* g_device = NULL; /* --device: the engines run on a device (zero_engine_set_device) */
static const char* g_extra = "";    /* more zero_optimization keys */
static int g_stochastic = 0;        /* --stochastic-rounding: bf16 with bf16.stochastic_rounding */

static float grad_value(int t, int p, size_t i) { /* the same on every rank */
  return (float)ldexp((double)((int)((t * 7 + p * 13 + (int)i * 5) % 9) - 4), -10);
}

static void engine_config(char* config, size_t size) {
  snprintf(config, size,
           "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.02}},"
           " \"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 0,"
           " \"reduce_bucket_size\": 300%s}%s}",
           g_stage, g_extra,
           g_stochastic
               ? ", \"bf16\": {\"enabled\": true, \"stochastic_rounding\": true, \"stochastic_rounding_seed\": 5}"
               : dtype_config(g_dtype));
}

static zero_engine_t* make_engine(zero_comm_t* comm, int32_t* ids) {
  char config[640];
  engine_config(config, sizeof config);
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, comm));
  if (g_device != NULL) CHECK(zero_engine_set_device(engine, g_device));
  float* init[kNumParams];
  for (int p = 0; p < kNumParams; ++p) {
    init[p] = malloc(test_param_numel(p) * sizeof(float));
    for (size_t i = 0; i < test_param_numel(p); ++i) init[p][i] = (float)ldexp((double)((int)((p + i) % 11) - 5), -5);
  }
  register_test_model(engine, g_dtype, init, ids);
  CHECK(zero_engine_finalize(engine));
  for (int p = 0; p < kNumParams; ++p) free(init[p]);
  return engine;
}

/* Adds step t's gradient times the loss scale. */
typedef struct {
  int t;
  float scale;
} ScaledStep;
static void add_scaled_gradient(float* g, int p, size_t numel, const void* ctx) {
  const ScaledStep* step = ctx;
  for (size_t i = 0; i < numel; ++i) g[i] += grad_value(step->t, p, i) * step->scale;
}

static void train(zero_engine_t* engine, const int32_t* ids, int first, int last) {
  for (int t = first; t <= last; ++t) {
    double scale = 1;
    CHECK(zero_loss_scale(&scale, engine));
    const ScaledStep step = {t, (float)scale};
    test_backward(engine, ids, add_scaled_gradient, &step);
    CHECK(zero_backward_end(engine));
    zero_step_info_t info = ZERO_STEP_INFO_INIT;
    CHECK(zero_step(&info, engine));
    EXPECT(info.step == t, "step %lld, expected %d", (long long)info.step, t);
  }
}

static char* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  EXPECT(f != NULL, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  *size = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  char* data = malloc(*size + 1);
  EXPECT(fread(data, 1, *size, f) == *size, "cannot read %s", path);
  fclose(f);
  return data;
}

/* This rank's shard files of checkpoints a and b are byte-identical. */
static void expect_same_shards(const char* a, const char* b) {
  const char* kinds[3] = {"master", "optimizer", "params"}; /* params only with stochastic rounding */
  for (int k = 0; k < (g_stochastic ? 3 : 2); ++k) {
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/%s/%s.rank%05d-of-%05d.safetensors", g_dir, a, kinds[k], g_rank, g_world);
    snprintf(pb, sizeof pb, "%s/%s/%s.rank%05d-of-%05d.safetensors", g_dir, b, kinds[k], g_rank, g_world);
    size_t na = 0, nb = 0;
    char* da = read_file(pa, &na);
    char* db = read_file(pb, &nb);
    EXPECT(na == nb && memcmp(da, db, na) == 0, "%s and %s differ", pa, pb);
    free(da);
    free(db);
  }
}

static void save(zero_engine_t* engine, const char* tag) { CHECK(zero_save_checkpoint(engine, g_dir, tag)); }

static void barrier(void) { MPI_Barrier(MPI_COMM_WORLD); }

static void mode_resume(zero_comm_t* comm) {
  int32_t ids[kNumParams];
  zero_engine_t* a = make_engine(comm, ids);
  train(a, ids, 1, kHalf);
  save(a, "resume-a10");
  train(a, ids, kHalf + 1, 2 * kHalf);
  save(a, "resume-a20");
  zero_engine_destroy(a);
  zero_engine_t* b = make_engine(comm, ids);
  CHECK(zero_load_checkpoint(b, g_dir, "resume-a10"));
  save(b, "resume-b10"); /* a load and an immediate save round-trip every saved byte */
  train(b, ids, kHalf + 1, 2 * kHalf);
  save(b, "resume-b20");
  zero_engine_destroy(b);
  barrier();
  expect_same_shards("resume-a10", "resume-b10");
  expect_same_shards("resume-a20", "resume-b20");
  if (g_rank == 0)
    printf("resume ok: %s stage %d on %d ranks: 10 steps after loading equal 10 steps without stopping\n",
           dtype_text(g_dtype), g_stage, g_world);
}

static void mode_save(zero_comm_t* comm, const char* tag) {
  int32_t ids[kNumParams];
  zero_engine_t* e = make_engine(comm, ids);
  train(e, ids, 1, kHalf);
  save(e, tag);
  zero_engine_destroy(e);
  if (g_rank == 0) printf("saved %s: stage %d on %d ranks after %d steps\n", tag, g_stage, g_world, kHalf);
}

static void mode_reshard(zero_comm_t* comm, const char* from) {
  int32_t ids[kNumParams];
  char cont[128], resh[128];
  snprintf(cont, sizeof cont, "continuous-n%d-s%d-from-%s", g_world, g_stage, from);
  snprintf(resh, sizeof resh, "resharded-n%d-s%d-from-%s", g_world, g_stage, from);
  zero_engine_t* a = make_engine(comm, ids);
  train(a, ids, 1, 2 * kHalf);
  save(a, cont);
  zero_engine_destroy(a);
  zero_engine_t* b = make_engine(comm, ids);
  CHECK(zero_load_checkpoint(b, g_dir, from));
  train(b, ids, kHalf + 1, 2 * kHalf);
  save(b, resh);
  zero_engine_destroy(b);
  barrier();
  expect_same_shards(cont, resh);
  if (g_rank == 0)
    printf("reshard ok: %s loaded at stage %d on %d ranks continues exactly like continuous training\n", from, g_stage,
           g_world);
}

/* The weights as this rank sees them, gathered unit by unit. */
static float* snapshot(zero_engine_t* e, const int32_t* ids) {
  size_t total = 0;
  for (int p = 0; p < kNumParams; ++p) total += test_param_numel(p);
  float* out = malloc(total * sizeof(float));
  size_t at = 0;
  for (int u = 0; u < kNumUnits; ++u) {
    CHECK(zero_gather(e, u));
    for (int p = 0; p < kNumParams; ++p) {
      if (kModel[p].unit != u) continue;
      void* d = NULL;
      CHECK(zero_param_data(&d, e, ids[p]));
      CHECK(zero_engine_copy(e, out + at, d, test_param_numel(p) * sizeof(float)));
      at += test_param_numel(p);
    }
    CHECK(zero_release(e, u));
  }
  return out;
}

static void expect_load_fails_from(zero_engine_t* e, const int32_t* ids, const char* dir, const char* tag,
                                   zero_status_t want, const char* fragment, const char* what) {
  float* before = snapshot(e, ids);
  zero_status_t s = zero_load_checkpoint(e, dir, tag);
  EXPECT(s == want, "%s: rank %d got %s: %s", what, g_rank, zero_status_string(s), zero_last_error());
  EXPECT(strstr(zero_last_error(), fragment) != NULL, "%s: rank %d: message lacks '%s': %s", what, g_rank, fragment,
         zero_last_error());
  if (g_rank == 0) printf("%s: every rank got %s: %s\n", what, zero_status_string(s), zero_last_error());
  float* after = snapshot(e, ids);
  size_t total = 0;
  for (int p = 0; p < kNumParams; ++p) total += test_param_numel(p);
  EXPECT(memcmp(before, after, total * sizeof(float)) == 0, "%s: a failed load changed the weights", what);
  free(before);
  free(after);
}

static void expect_load_fails(zero_engine_t* e, const int32_t* ids, const char* tag, zero_status_t want,
                              const char* fragment, const char* what) {
  expect_load_fails_from(e, ids, g_dir, tag, want, fragment, what);
}

static void copy_checkpoint(const char* from, const char* to) { /* rank 0, with the shell */
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "rm -rf '%s/%s' && cp -r '%s/%s' '%s/%s'", g_dir, to, g_dir, from, g_dir, to);
  EXPECT(system(cmd) == 0, "%s failed", cmd);
}

/* Saves a checkpoint of another model in `dir`: the test model with its first param transposed. */
static void save_transposed_model(zero_comm_t* comm, const char* dir, const char* tag) {
  char config[640];
  engine_config(config, sizeof config);
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, comm));
  zero_param_group_desc_t g = ZERO_PARAM_GROUP_DESC_INIT;
  g.name = "no_decay";
  int32_t group = -1;
  CHECK(zero_engine_add_param_group(&group, engine, &g));
  for (int p = 0; p < kNumParams; ++p) {
    int64_t shape[2] = {kModel[p].shape[p == 0 ? 1 : 0], kModel[p].shape[p == 0 ? 0 : 1]};
    zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
    d.name = kModel[p].name;
    d.ndim = kModel[p].ndim;
    d.shape = shape;
    d.unit = kModel[p].unit;
    d.group = kModel[p].group;
    d.dtype = g_dtype;
    int32_t id = -1;
    CHECK(zero_engine_add_param(&id, engine, &d));
  }
  CHECK(zero_engine_finalize(engine));
  CHECK(zero_save_checkpoint(engine, dir, tag));
  zero_engine_destroy(engine);
}

static void mode_faults(zero_comm_t* comm) {
  int32_t ids[kNumParams];
  zero_engine_t* e = make_engine(comm, ids);
  train(e, ids, 1, kHalf);
  save(e, "good");
  train(e, ids, kHalf + 1, kHalf + 3); /* move on, so a failed load would be visible */
  char victim[512];
  const int victim_rank = g_world - 1;
  snprintf(victim, sizeof victim, "master.rank%05d-of-%05d.safetensors", victim_rank, g_world);
  char path[768];

  if (g_rank == 0) {
    copy_checkpoint("good", "truncated");
    snprintf(path, sizeof path, "%s/truncated/%s", g_dir, victim);
    EXPECT(truncate(path, 100) == 0, "truncate %s", path);
  }
  barrier();
  expect_load_fails(e, ids, "truncated", ZERO_ERR_CHECKPOINT_CORRUPT, victim, "truncated shard");

  if (g_rank == 0) {
    copy_checkpoint("good", "flipped");
    snprintf(path, sizeof path, "%s/flipped/%s", g_dir, victim);
    int fd = open(path, O_RDWR);
    unsigned char c = 0;
    EXPECT(pread(fd, &c, 1, 200) == 1, "read");
    c ^= 0x10;
    EXPECT(pwrite(fd, &c, 1, 200) == 1, "write");
    close(fd);
  }
  barrier();
  expect_load_fails(e, ids, "flipped", ZERO_ERR_CHECKPOINT_CORRUPT, "checksum", "flipped byte");

  if (g_rank == 0) {
    copy_checkpoint("good", "deleted");
    snprintf(path, sizeof path, "%s/deleted/optimizer.rank%05d-of-%05d.safetensors", g_dir, 0, g_world);
    EXPECT(unlink(path) == 0, "unlink %s", path);
  }
  barrier();
  expect_load_fails(e, ids, "deleted", ZERO_ERR_CHECKPOINT_CORRUPT, "is missing", "deleted file");

  /* Another model's checkpoint: every rank fails before anything is read, the engine stays usable (the snapshot
   * after the failure gathers, and training goes on below) and so does its communicator (another engine on it). */
  char other_dir[600];
  snprintf(other_dir, sizeof other_dir, "%s/other-model", g_dir);
  save_transposed_model(comm, other_dir, "transposed");
  expect_load_fails_from(e, ids, other_dir, NULL, ZERO_ERR_MISMATCH,
                         "shape [5, 37] in the checkpoint, [37, 5] in this engine", "another model");
  save_transposed_model(comm, other_dir, "transposed-again");
  train(e, ids, kHalf + 4, kHalf + 4);

  /* A full disk on one rank in the middle of a save: every rank fails, `latest` and "good" are untouched. */
  char fault[64];
  snprintf(fault, sizeof fault, "save.enospc:%d", victim_rank);
  setenv("ZERO_TEST_FAIL", fault, 1);
  zero_status_t s = zero_save_checkpoint(e, g_dir, "full-disk");
  unsetenv("ZERO_TEST_FAIL");
  EXPECT(s == ZERO_ERR_IO, "full disk: rank %d got %s: %s", g_rank, zero_status_string(s), zero_last_error());
  EXPECT(strstr(zero_last_error(), "No space left on device") != NULL, "full disk message: %s", zero_last_error());
  if (g_rank == 0) printf("full disk: every rank got %s: %s\n", zero_status_string(s), zero_last_error());
  barrier();
  struct stat st;
  snprintf(path, sizeof path, "%s/full-disk", g_dir);
  EXPECT(stat(path, &st) != 0, "a failed save left %s", path);
  size_t n = 0;
  snprintf(path, sizeof path, "%s/latest", g_dir);
  char* latest = read_file(path, &n);
  EXPECT(n >= 4 && strncmp(latest, "good", 4) == 0, "latest is '%.*s' after a failed save", (int)n, latest);
  free(latest);

  /* A full disk when rank 0 writes the manifest: every rank fails, and nothing is left behind (no .tmp.TAG). */
  setenv("ZERO_TEST_FAIL", "save.manifest-enospc:0", 1);
  s = zero_save_checkpoint(e, g_dir, "manifest-full");
  unsetenv("ZERO_TEST_FAIL");
  EXPECT(s == ZERO_ERR_IO, "manifest on a full disk: rank %d got %s: %s", g_rank, zero_status_string(s),
         zero_last_error());
  barrier();
  snprintf(path, sizeof path, "%s/.tmp.manifest-full", g_dir);
  EXPECT(stat(path, &st) != 0, "a failed manifest write left %s", path);
  snprintf(path, sizeof path, "%s/manifest-full", g_dir);
  EXPECT(stat(path, &st) != 0, "a failed manifest write left %s", path);

  /* A full disk when rank 0 updates `latest`: the checkpoint is complete, so the save succeeds (with an error
   * logged), `latest` still names the previous checkpoint, no latest.tmp.* is left, and the tag loads. */
  setenv("ZERO_TEST_FAIL", "save.latest-enospc:0", 1);
  s = zero_save_checkpoint(e, g_dir, "latest-full");
  unsetenv("ZERO_TEST_FAIL");
  EXPECT(s == ZERO_OK, "latest on a full disk: rank %d got %s: %s", g_rank, zero_status_string(s), zero_last_error());
  barrier();
  snprintf(path, sizeof path, "%s/latest", g_dir);
  latest = read_file(path, &n);
  EXPECT(n >= 4 && strncmp(latest, "good", 4) == 0, "latest is '%.*s' after its update failed", (int)n, latest);
  free(latest);
  if (g_rank == 0) {
    char cmd[768];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -q 'latest.tmp'", g_dir);
    EXPECT(system(cmd) != 0, "a failed update of latest left a latest.tmp.* file in %s", g_dir);
  }
  CHECK(zero_load_checkpoint(e, g_dir, "latest-full"));

  /* The manifest has its own checksum: one changed byte (here in the step count) is caught. */
  if (g_rank == 0) {
    copy_checkpoint("good", "manifest-edited");
    char cmd[768];
    snprintf(cmd, sizeof cmd, "sed -i 's/\"step\": \\([0-9]\\)/\"step\": 9\\1/' '%s/manifest-edited/manifest.json'",
             g_dir);
    EXPECT(system(cmd) == 0, "%s", cmd);
  }
  barrier();
  expect_load_fails(e, ids, "manifest-edited", ZERO_ERR_CHECKPOINT_CORRUPT, "fails its checksum", "edited manifest");

  /* An existing tag is never overwritten. */
  EXPECT(zero_save_checkpoint(e, g_dir, "good") == ZERO_ERR_INVALID_ARGUMENT, "overwriting a tag: %s",
         zero_last_error());

  /* The previous checkpoint still loads, exactly. */
  CHECK(zero_load_checkpoint(e, g_dir, NULL));
  save(e, "good-reloaded");
  barrier();
  expect_same_shards("good", "good-reloaded");
  zero_engine_destroy(e);
  if (g_rank == 0)
    printf("faults ok: stage %d on %d ranks; the previous checkpoint loads bit-exactly\n", g_stage, g_world);
}

static void mode_export(zero_comm_t* comm) {
  g_extra = ", \"stage3_gather_16bit_weights_on_model_save\": true";
  int32_t ids[kNumParams];
  zero_engine_t* e = make_engine(comm, ids);
  train(e, ids, 1, kHalf);
  save(e, "export");
  float* weights = snapshot(e, ids); /* in unit order; written below in registration order */
  if (g_rank == 0) {
    char path[512];
    snprintf(path, sizeof path, "%s/export-weights.bin", g_dir);
    FILE* f = fopen(path, "wb");
    EXPECT(f != NULL, "cannot create %s", path);
    for (int p = 0; p < kNumParams; ++p) {
      size_t at = 0; /* position of param p in the snapshot */
      for (int u = 0; u < kNumUnits; ++u)
        for (int q = 0; q < kNumParams; ++q) {
          if (kModel[q].unit != u) continue;
          if (q == p) goto found;
          at += test_param_numel(q);
        }
    found:
      fwrite(weights + at, sizeof(float), test_param_numel(p), f);
    }
    fclose(f);
    printf("exported: checkpoint 'export' and the gathered weights of %d params\n", kNumParams);
  }
  free(weights);
  zero_engine_destroy(e);
}

static void mode_kill(zero_comm_t* comm) {
  int32_t ids[kNumParams];
  zero_engine_t* e = make_engine(comm, ids);
  train(e, ids, 1, kHalf);
  save(e, "before-kill");
  train(e, ids, kHalf + 1, kHalf + 1);
  setenv("ZERO_TEST_FAIL", "save.kill:1", 1); /* rank 1 exits abruptly after writing its shards */
  zero_save_checkpoint(e, g_dir, "during-kill");
  fprintf(stderr, "rank %d: the save should not have completed\n", g_rank);
  exit(3);
}

static void mode_after_kill(zero_comm_t* comm) {
  int32_t ids[kNumParams];
  size_t n = 0;
  char path[512];
  snprintf(path, sizeof path, "%s/latest", g_dir);
  char* latest = read_file(path, &n);
  EXPECT(n >= 11 && strncmp(latest, "before-kill", 11) == 0, "latest is '%.*s'", (int)n, latest);
  free(latest);
  struct stat st;
  snprintf(path, sizeof path, "%s/during-kill", g_dir);
  EXPECT(stat(path, &st) != 0, "the interrupted save left %s", path);
  zero_engine_t* e = make_engine(comm, ids);
  CHECK(zero_load_checkpoint(e, g_dir, NULL));
  save(e, "before-kill-reloaded");
  zero_engine_destroy(e);
  barrier();
  expect_same_shards("before-kill", "before-kill-reloaded");
  if (g_rank == 0) printf("after kill ok: latest still names the previous checkpoint, which loads bit-exactly\n");
}

int main(int argc, char** argv) {
  const char* mode = "resume";
  const char* tag = "saved";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--mode") == 0) mode = argv[i + 1];
    if (strcmp(argv[i], "--stage") == 0) g_stage = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--dtype") == 0) g_dtype = parse_dtype_arg(argv[i + 1]);
    if (strcmp(argv[i], "--stochastic-rounding") == 0) g_stochastic = atoi(argv[i + 1]), g_dtype = ZERO_DTYPE_BF16;
    if (strcmp(argv[i], "--dir") == 0) g_dir = argv[i + 1];
    if (strcmp(argv[i], "--device") == 0) g_device = argv[i + 1];
    if (strcmp(argv[i], "--tag") == 0 || strcmp(argv[i], "--from") == 0) tag = argv[i + 1];
  }
  int mpi_provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &mpi_provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  zero_comm_t* comm = NULL;
  CHECK(zero_comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD));
  if (strcmp(mode, "resume") == 0)
    mode_resume(comm);
  else if (strcmp(mode, "save") == 0)
    mode_save(comm, tag);
  else if (strcmp(mode, "reshard") == 0)
    mode_reshard(comm, tag);
  else if (strcmp(mode, "faults") == 0)
    mode_faults(comm);
  else if (strcmp(mode, "export") == 0)
    mode_export(comm);
  else if (strcmp(mode, "kill") == 0)
    mode_kill(comm);
  else if (strcmp(mode, "after-kill") == 0)
    mode_after_kill(comm);
  else
    EXPECT(0, "unknown mode %s", mode);
  zero_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}
