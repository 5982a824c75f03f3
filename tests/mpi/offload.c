/*
 * offload_optimizer with device "nvme" against the same model trained in memory, in one job:
 *
 *   mpirun -np N test_offload --dir DIR --stage S [--dtype fp32|bf16] [--buffers B] [--scenario NAME]
 *
 * Two engines on one communicator get the same gradients: one keeps everything in memory, the other puts the fp32
 * master and the optimizer state in a file under DIR, streamed in chunks of 1024 elements through B of them (3 by
 * default). The model's units are several chunks long, its params interleave units and groups in registration
 * order, one is never given a gradient, and none is a multiple of 1024, so chunks cut params and segments anywhere.
 *
 * --sr 1 trains bf16 with stochastic rounding, whose checkpoints carry the params (read from and written to the
 * params file with --params 1).
 * --params 1 also puts the offloaded engine's param shards on NVMe (offload_param, stage 3, every unit sharded);
 * with fp32 params the params file holds the master (the optimizer file only the state), which checkpoints read and
 * loads write there.
 *
 * Scenarios:
 *   parity      (default) after every step the params are the same bits; the file and window are the sizes the
 *               layout implies; the offloaded engine's checkpoint shards are byte for byte the in-memory engine's
 *               (so any engine, at any N, reads them); an offloaded engine loading the in-memory engine's
 *               checkpoint trains on with the same bits.
 *   stream-io   the last rank's optimizer pass fails halfway (hook nvme.stream): ZERO_ERR_IO naming its file
 *               there, ZERO_ERR_REMOTE on the others, every engine unusable afterwards.
 *   read-io     reading the offloaded state for a save fails on the last rank (hook nvme.read): the save fails
 *               everywhere with ZERO_ERR_IO (the others' message names the rank and its reason, as every
 *               checkpoint failure does), the engines stay usable and train on with the same bits.
 *   truncate    the last rank's file is truncated under the engine: the next zero_step fails with ZERO_ERR_IO
 *               saying the file is shorter than expected, ZERO_ERR_REMOTE elsewhere.
 *   delete      rank 0's file is deleted under the engine: training goes on with the same bits (the engine holds
 *               the file open) and a warning says so.
 *   save        (with --ckpt CKPT) trains 3 steps and saves the offloaded engine's checkpoint to CKPT.
 *   load        (with --ckpt CKPT, saved by `save` at another N) both engines load it — the offloaded one streams it
 *               into its file — hold the same params, and train on with the same bits.
 *   save-full   a save of the offloaded engine succeeds, then the next fails because the last rank may not write
 *               files past 4 KiB (a full disk, as its checkpoint shards see it): ZERO_ERR_IO on every rank, the
 *               engines usable; with the limit lifted they train on, and the first checkpoint loads with the same
 *               bits (nothing that was saved is lost).
 *   load-full   loading into the offloaded engine fails on the last rank, which cannot create the second state
 *               file the load streams into: ZERO_ERR_IO on every rank, the engines train on unchanged.
 *   file-limit  the last rank may not write files past 64 KiB (RLIMIT_FSIZE: what a full disk looks like to
 *               posix_fallocate): finalize fails there with ZERO_ERR_IO naming nvme_path, ZERO_ERR_REMOTE
 *               elsewhere; with the limit lifted the same finalize succeeds and training matches.
 */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define ZERO_EXPERIMENTAL_API
#include "harness.h"

enum { kParams = 7, kUnits = 3, kSteps = 5, kGas = 2 };
static const struct {
  const char* name;
  int64_t numel;
  int unit, group;
} kNet[kParams] = {{"embed", 5003, 1, 0}, {"bias0", 7, 0, 1}, {"w1", 4099, 2, 0}, {"unused", 1500, 0, 0},
                   {"w2", 2222, 1, 1},    {"w3", 3001, 2, 0}, {"bias1", 65, 0, 0}};

static zero_dtype_t g_dtype = ZERO_DTYPE_FP32;
static int g_rank = 0, g_world = 1;
static int g_warned_deleted = 0;
static int g_stochastic = 0;  /* --sr 1: bf16 with stochastic rounding (checkpoints then carry the params) */
static int g_params_nvme = 0; /* --params 1: the offloaded engine also puts its param shards on NVMe */
static int g_run = 0;         /* rank 0's process id: names this run's checkpoints, removed at the end */

static uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

static float grad_value(int step, int micro, int p, int64_t i) {
  const uint64_t h = mix(((uint64_t)step << 40) ^ ((uint64_t)micro << 32) ^ ((uint64_t)g_rank << 48) ^
                         ((uint64_t)p << 24) ^ (uint64_t)i);
  return (float)((int)(h % 2001) - 1000) * 1e-4f;
}

static void on_log(void* user, int32_t level, int32_t rank, const char* message) {
  (void)user, (void)level, (void)rank;
  if (strstr(message, "was deleted while the engine uses it") != NULL) g_warned_deleted = 1;
}

static zero_engine_t* make_engine(zero_comm_t* comm, int stage, const char* dir, int buffers, int32_t* ids,
                                  int finalize) {
  char offload[512] = "";
  if (dir != NULL)
    snprintf(offload, sizeof offload,
             ", \"sub_group_size\": 1024, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"%s\", "
             "\"buffer_count\": %d, \"pin_memory\": true}",
             dir, buffers);
  if (dir != NULL && g_params_nvme)
    snprintf(offload + strlen(offload), sizeof offload - strlen(offload),
             ", \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"%s/params\", \"buffer_size\": 3000}", dir);
  char config[1024];
  snprintf(config, sizeof config,
           "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": %d, \"gradient_clipping\": 0.5,"
           " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.1}},"
           " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 3000,"
           " \"stage3_param_persistence_threshold\": %d%s}%s%s}",
           kGas, stage, g_params_nvme ? 0 : 100000, offload,
           g_stochastic ? ", \"bf16\": {\"enabled\": true, \"stochastic_rounding\": true}" : dtype_config(g_dtype),
           dir != NULL ? ", \"aio\": {\"block_size\": 8192, \"queue_depth\": 4}" : "");
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, comm));
  zero_param_group_desc_t g = ZERO_PARAM_GROUP_DESC_INIT;
  g.name = "no_decay";
  g.lr = 0.02;
  g.weight_decay = 0.0;
  int32_t group1 = -1;
  CHECK(zero_engine_add_param_group(&group1, engine, &g));
  static float* init[kParams]; /* read by finalize: kept for the program's life */
  for (int p = 0; p < kParams; ++p) {
    if (init[p] == NULL) {
      init[p] = malloc((size_t)kNet[p].numel * sizeof(float));
      for (int64_t i = 0; i < kNet[p].numel; ++i)
        init[p][i] = (float)((int)(mix((uint64_t)p * 7919u + (uint64_t)i) % 201) - 100) / 128.0f;
    }
    zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
    d.name = kNet[p].name;
    d.ndim = 1;
    d.shape = &kNet[p].numel;
    d.dtype = g_dtype;
    d.unit = kNet[p].unit;
    d.group = kNet[p].group == 1 ? group1 : 0;
    d.init_data = init[p];
    d.init_dtype = ZERO_DTYPE_FP32;
    CHECK(zero_engine_add_param(&ids[p], engine, &d));
  }
  if (finalize) CHECK(zero_engine_finalize(engine));
  return engine;
}

/* One micro-step's forward and backward; returns the first failing status. */
static zero_status_t micro_step(zero_engine_t* e, const int32_t* ids, int step, int micro) {
  zero_status_t s;
  for (int u = 0; u < kUnits; ++u) {
    if ((s = zero_gather(e, u)) != ZERO_OK) return s;
    if ((s = zero_release(e, u)) != ZERO_OK) return s;
  }
  for (int u = kUnits - 1; u >= 0; --u) {
    if ((s = zero_gather(e, u)) != ZERO_OK) return s;
    for (int p = kParams - 1; p >= 0; --p) {
      if (kNet[p].unit != u || strcmp(kNet[p].name, "unused") == 0) continue;
      float* g = NULL;
      if ((s = zero_grad_data((void**)&g, e, ids[p])) != ZERO_OK) return s;
      for (int64_t i = 0; i < kNet[p].numel; ++i) g[i] += grad_value(step, micro, p, i);
      if ((s = zero_grad_ready(e, ids[p])) != ZERO_OK) return s;
    }
    if ((s = zero_release(e, u)) != ZERO_OK) return s;
  }
  return zero_backward_end(e);
}

static zero_status_t train_step(zero_engine_t* e, const int32_t* ids, int step) {
  for (int k = 0; k < kGas; ++k) {
    zero_status_t s = micro_step(e, ids, step, k);
    if (s != ZERO_OK) return s;
  }
  zero_step_info_t info = ZERO_STEP_INFO_INIT;
  return zero_step(&info, e);
}

static void expect_same_params(zero_engine_t* a, const int32_t* ida, zero_engine_t* b, const int32_t* idb,
                               const char* when) {
  const size_t esize = g_dtype == ZERO_DTYPE_FP32 ? 4 : 2;
  for (int u = 0; u < kUnits; ++u) {
    CHECK(zero_gather(a, u));
    CHECK(zero_gather(b, u));
    for (int p = 0; p < kParams; ++p) {
      if (kNet[p].unit != u) continue;
      void *x = NULL, *y = NULL;
      CHECK(zero_param_data(&x, a, ida[p]));
      CHECK(zero_param_data(&y, b, idb[p]));
      EXPECT(memcmp(x, y, (size_t)kNet[p].numel * esize) == 0, "%s: param '%s' differs (rank %d)", when, kNet[p].name,
             g_rank);
    }
    CHECK(zero_release(a, u));
    CHECK(zero_release(b, u));
  }
}

static int files_equal(const char* x, const char* y) {
  FILE *f = fopen(x, "rb"), *g = fopen(y, "rb");
  int same = f != NULL && g != NULL;
  while (same) {
    int c = fgetc(f), d = fgetc(g);
    same = c == d;
    if (c == EOF || d == EOF) break;
  }
  if (f) fclose(f);
  if (g) fclose(g);
  return same;
}

/* This rank's offload file (the engine names it libzero-optimizer.rank<R>.<host>.<pid>.<n>.<random>.swap). */
static void own_file(const char* dir, char* out, size_t size) {
  char prefix[160], host[64] = "host";
  gethostname(host, sizeof host - 1);
  snprintf(prefix, sizeof prefix, "libzero-optimizer.rank%d.%s.%d.", g_rank, host, (int)getpid());
  out[0] = '\0';
  DIR* d = opendir(dir);
  EXPECT(d != NULL, "cannot list %s", dir);
  for (struct dirent* e; (e = readdir(d)) != NULL;)
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) snprintf(out, size, "%s/%s", dir, e->d_name);
  closedir(d);
  EXPECT(out[0] != '\0', "rank %d: no file %s* in %s", g_rank, prefix, dir);
}

/* A failure on the last rank: ZERO_ERR_IO there with `fragment` in its message; `elsewhere` on the others (a
 * checkpoint's phases share the failing rank's status and message, "rank N: ..."; other calls give
 * ZERO_ERR_REMOTE). */
static void expect_failure_as(zero_status_t s, int here, const char* fragment, const char* what,
                              zero_status_t elsewhere) {
  const zero_status_t want = here ? ZERO_ERR_IO : elsewhere;
  EXPECT(s == want, "rank %d: %s returned %s, expected %s (%s)", g_rank, what, zero_status_string(s),
         zero_status_string(want), zero_last_error());
  if (here || elsewhere == ZERO_ERR_IO)
    EXPECT(strstr(zero_last_error(), fragment) != NULL, "rank %d: %s: '%s' lacks '%s'", g_rank, what, zero_last_error(),
           fragment);
}

static void expect_failure(zero_status_t s, int here, const char* fragment, const char* what) {
  expect_failure_as(s, here, fragment, what, ZERO_ERR_REMOTE);
}

int main(int argc, char** argv) {
  const char *dir = NULL, *scenario = "parity", *ckpt = NULL;
  int stage = 1, buffers = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
    if (strcmp(argv[i], "--stage") == 0) stage = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--dtype") == 0) g_dtype = parse_dtype_arg(argv[i + 1]);
    if (strcmp(argv[i], "--buffers") == 0) buffers = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--scenario") == 0) scenario = argv[i + 1];
    if (strcmp(argv[i], "--ckpt") == 0) ckpt = argv[i + 1];
    if (strcmp(argv[i], "--params") == 0) g_params_nvme = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--sr") == 0) g_stochastic = atoi(argv[i + 1]), g_dtype = ZERO_DTYPE_BF16;
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  EXPECT(dir != NULL, "--dir is required");
  const int last = g_rank == g_world - 1;
  g_run = (int)getpid();
  MPI_Bcast(&g_run, 1, MPI_INT, 0, MPI_COMM_WORLD);
  CHECK(zero_set_log_callback(on_log, NULL, ZERO_LOG_WARNING));
  zero_comm_t* comm = NULL;
  CHECK(zero_comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD));
  int32_t ids_mem[kParams], ids_off[kParams];
  zero_engine_t* mem = make_engine(comm, stage, NULL, buffers, ids_mem, 1);
  zero_engine_t* off = NULL;

  if (strcmp(scenario, "file-limit") == 0) {
    off = make_engine(comm, stage, dir, buffers, ids_off, 0);
    struct rlimit old;
    getrlimit(RLIMIT_FSIZE, &old);
    if (last) {
      signal(SIGXFSZ, SIG_IGN);
      struct rlimit small = {65536, old.rlim_max};
      setrlimit(RLIMIT_FSIZE, &small);
    }
    expect_failure(zero_engine_finalize(off), last, "nvme_path", "zero_engine_finalize");
    if (last) setrlimit(RLIMIT_FSIZE, &old);
    CHECK(zero_engine_finalize(off));
  } else {
    off = make_engine(comm, stage, dir, buffers, ids_off, 1);
  }

  /* The file and the window: 4 KiB-aligned per unit and array, chunks of 1024 elements. */
  zero_memory_stats_t ms = ZERO_MEMORY_STATS_INIT;
  zero_memory_placement_t mp = ZERO_MEMORY_PLACEMENT_INIT, mp_mem = ZERO_MEMORY_PLACEMENT_INIT;
  CHECK(zero_memory_stats(&ms, off));
  CHECK(zero_memory_placement(&mp, off));
  CHECK(zero_memory_placement(&mp_mem, mem));
  const uint64_t arrays = g_dtype == ZERO_DTYPE_FP32 ? 2 : 3;
  const uint64_t offloaded = ms.master_param_bytes + ms.optimizer_state_bytes;
  if (!g_params_nvme) {
    const uint64_t chunks = mp.nvme_bytes / (arrays * 4096);
    EXPECT(mp.nvme_bytes % (arrays * 4096) == 0 && mp.nvme_bytes >= offloaded &&
               mp.nvme_bytes - offloaded < arrays * kUnits * 4096,
           "NVMe file %llu bytes for %llu bytes of state", (unsigned long long)mp.nvme_bytes,
           (unsigned long long)offloaded);
    EXPECT(mp.staging_bytes == (chunks < (uint64_t)buffers ? chunks : (uint64_t)buffers) * arrays * 4096,
           "window %llu bytes (%llu chunks, %d buffers)", (unsigned long long)mp.staging_bytes,
           (unsigned long long)chunks, buffers);
    EXPECT(mp.host_bytes == ms.total_bytes - offloaded + mp.staging_bytes, "host bytes %llu",
           (unsigned long long)mp.host_bytes);
  } else { /* every unit is sharded (no persistence): every param byte is in the params file too */
    const uint64_t on_disk = offloaded + ms.param_bytes;
    EXPECT(mp.nvme_bytes >= on_disk && mp.nvme_bytes - on_disk < (arrays + 1) * kUnits * 4096,
           "NVMe files %llu bytes for %llu bytes of state and params", (unsigned long long)mp.nvme_bytes,
           (unsigned long long)on_disk);
    EXPECT(mp.host_bytes == ms.total_bytes - on_disk + mp.staging_bytes, "host bytes %llu",
           (unsigned long long)mp.host_bytes);
  }
  EXPECT(mp_mem.nvme_bytes == 0 && mp_mem.staging_bytes == 0, "the in-memory engine reports an NVMe file");

  int step = 1;
  if (strcmp(scenario, "save") == 0 || strcmp(scenario, "load") == 0) {
    EXPECT(ckpt != NULL, "--ckpt is required");
    if (strcmp(scenario, "save") == 0) {
      if (g_rank == 0) {
        char command[600];
        snprintf(command, sizeof command, "rm -rf '%s'", ckpt);
        EXPECT(system(command) == 0, "%s", command);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      for (; step <= 3; ++step) {
        CHECK(train_step(mem, ids_mem, step));
        CHECK(train_step(off, ids_off, step));
      }
      expect_same_params(mem, ids_mem, off, ids_off, "before saving");
      CHECK(zero_save_checkpoint(off, ckpt, "t"));
    } else {
      CHECK(zero_load_checkpoint(mem, ckpt, "t"));
      CHECK(zero_load_checkpoint(off, ckpt, "t"));
      expect_same_params(mem, ids_mem, off, ids_off, "after loading");
      for (step = 4; step <= kSteps; ++step) {
        CHECK(train_step(mem, ids_mem, step));
        CHECK(train_step(off, ids_off, step));
        expect_same_params(mem, ids_mem, off, ids_off, "after a step");
      }
    }
    if (g_rank == 0) printf("offload %s ok: stage %d, %d ranks\n", scenario, stage, g_world);
    zero_engine_destroy(off);
    zero_engine_destroy(mem);
    zero_comm_destroy(comm);
    MPI_Finalize();
    return 0;
  }
  if (strcmp(scenario, "load-full") == 0) {
    /* A load into the offloaded engine streams into a second state file; the last rank cannot create it (a full
     * disk): ZERO_ERR_IO everywhere, and both engines train on unchanged, with the same bits. */
    char saved[512];
    snprintf(saved, sizeof saved, "%s/ckpt-mem-%d", dir, g_run);
    for (; step <= 2; ++step) {
      CHECK(train_step(mem, ids_mem, step));
      CHECK(train_step(off, ids_off, step));
    }
    CHECK(zero_save_checkpoint(mem, saved, "t"));
    struct rlimit old;
    getrlimit(RLIMIT_FSIZE, &old);
    if (last) {
      signal(SIGXFSZ, SIG_IGN);
      struct rlimit small = {4096, old.rlim_max};
      setrlimit(RLIMIT_FSIZE, &small);
    }
    expect_failure_as(zero_load_checkpoint(off, saved, "t"), last, "room for both", "zero_load_checkpoint",
                      ZERO_ERR_IO);
    if (last) setrlimit(RLIMIT_FSIZE, &old);
    for (; step <= kSteps; ++step) {
      CHECK(train_step(mem, ids_mem, step));
      CHECK(train_step(off, ids_off, step));
      expect_same_params(mem, ids_mem, off, ids_off, "after the failed load");
    }
  } else if (strcmp(scenario, "save-full") == 0) {
    char first[512], second[512];
    snprintf(first, sizeof first, "%s/ckpt-mem-%d", dir, g_run); /* removed at the end with the others */
    snprintf(second, sizeof second, "%s/ckpt-off-%d", dir, g_run);
    for (; step <= 2; ++step) {
      CHECK(train_step(mem, ids_mem, step));
      CHECK(train_step(off, ids_off, step));
    }
    CHECK(zero_save_checkpoint(off, first, "t"));
    struct rlimit old;
    getrlimit(RLIMIT_FSIZE, &old);
    if (last) {
      signal(SIGXFSZ, SIG_IGN);
      struct rlimit small = {4096, old.rlim_max};
      setrlimit(RLIMIT_FSIZE, &small);
    }
    expect_failure_as(zero_save_checkpoint(off, second, "t"), last, "File too large", "zero_save_checkpoint",
                      ZERO_ERR_IO);
    if (last) setrlimit(RLIMIT_FSIZE, &old);
    CHECK(train_step(mem, ids_mem, step));
    CHECK(train_step(off, ids_off, step));
    expect_same_params(mem, ids_mem, off, ids_off, "after the failed save");
    CHECK(zero_load_checkpoint(mem, first, "t"));
    CHECK(zero_load_checkpoint(off, first, "t"));
    expect_same_params(mem, ids_mem, off, ids_off, "after loading the first checkpoint");
    for (step = 3; step <= kSteps; ++step) {
      CHECK(train_step(mem, ids_mem, step));
      CHECK(train_step(off, ids_off, step));
      expect_same_params(mem, ids_mem, off, ids_off, "after a step");
    }
    scenario = "save-full";
  } else if (strcmp(scenario, "stream-io") == 0) {
    CHECK(train_step(mem, ids_mem, step));
    expect_failure(train_step(off, ids_off, step), last, "(test hook)", "zero_step");
    EXPECT(train_step(off, ids_off, step + 1) != ZERO_OK && strstr(zero_last_error(), "unusable") != NULL,
           "rank %d: the engine is usable after a failed pass: %s", g_rank, zero_last_error());
    if (g_rank == 0) printf("offload stream-io ok: stage %d, %d ranks\n", stage, g_world);
    zero_engine_destroy(off);
    zero_engine_destroy(mem);
    zero_comm_destroy(comm);
    MPI_Finalize();
    return 0;
  }
  for (; step <= kSteps; ++step) {
    if (step == 2 && strcmp(scenario, "truncate") == 0 && last) {
      char path[512];
      own_file(dir, path, sizeof path);
      EXPECT(truncate(path, 4096) == 0, "truncate %s", path);
    }
    if (step == 2 && strcmp(scenario, "delete") == 0 && g_rank == 0) {
      char path[512];
      own_file(dir, path, sizeof path);
      EXPECT(unlink(path) == 0, "unlink %s", path);
    }
    CHECK(train_step(mem, ids_mem, step));
    if (step == 2 && strcmp(scenario, "truncate") == 0) {
      expect_failure(train_step(off, ids_off, step), last, "shorter than expected", "zero_step");
      if (g_rank == 0) printf("offload truncate ok: stage %d, %d ranks\n", stage, g_world);
      zero_engine_destroy(off);
      zero_engine_destroy(mem);
      zero_comm_destroy(comm);
      MPI_Finalize();
      return 0;
    }
    CHECK(train_step(off, ids_off, step));
    expect_same_params(mem, ids_mem, off, ids_off, "after a step");
    if (step == 3 && strcmp(scenario, "read-io") == 0) {
      char ckpt[512];
      snprintf(ckpt, sizeof ckpt, "%s/ckpt-read-io-%d", dir, g_run);
      expect_failure_as(zero_save_checkpoint(off, ckpt, "t"), last, "(test hook)", "zero_save_checkpoint", ZERO_ERR_IO);
    }
    if (step == 3 && strcmp(scenario, "parity") == 0) {
      /* The shards an offloaded engine saves are the in-memory engine's, byte for byte. */
      char a[512], b[512];
      snprintf(a, sizeof a, "%s/ckpt-mem-%d", dir, g_run);
      snprintf(b, sizeof b, "%s/ckpt-off-%d", dir, g_run);
      CHECK(zero_save_checkpoint(mem, a, "t"));
      CHECK(zero_save_checkpoint(off, b, "t"));
      for (int k = 0; k < 2; ++k) {
        char fa[700], fb[700];
        const char* kind = k == 0 ? "master" : "optimizer";
        snprintf(fa, sizeof fa, "%s/t/%s.rank%05d-of-%05d.safetensors", a, kind, g_rank, g_world);
        snprintf(fb, sizeof fb, "%s/t/%s.rank%05d-of-%05d.safetensors", b, kind, g_rank, g_world);
        EXPECT(files_equal(fa, fb), "rank %d: %s differs from %s", g_rank, fb, fa);
      }
      /* An offloaded engine restores the in-memory engine's checkpoint and trains on with the same bits. */
      int32_t ids_new[kParams];
      zero_engine_t* fresh = make_engine(comm, stage, dir, buffers, ids_new, 1);
      CHECK(zero_load_checkpoint(fresh, a, "t"));
      expect_same_params(mem, ids_mem, fresh, ids_new, "after loading");
      zero_engine_destroy(off);
      off = fresh;
      memcpy(ids_off, ids_new, sizeof ids_new);
    }
  }
  if (strcmp(scenario, "delete") == 0 && g_rank == 0) EXPECT(g_warned_deleted, "no warning about the deleted file");
  if (g_rank == 0)
    printf(
        "offload %s ok: %s, stage %d, %d ranks, %d buffers, %d steps bit-identical to the in-memory engine; file "
        "%llu bytes, window %llu bytes, host %llu bytes\n",
        scenario, dtype_text(g_dtype), stage, g_world, buffers, kSteps, (unsigned long long)mp.nvme_bytes,
        (unsigned long long)mp.staging_bytes, (unsigned long long)mp.host_bytes);
  zero_engine_destroy(off);
  zero_engine_destroy(mem);
  zero_comm_destroy(comm);
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) {
    char command[700];
    snprintf(command, sizeof command, "rm -rf '%s/ckpt-mem-%d' '%s/ckpt-off-%d' '%s/ckpt-read-io-%d'", dir, g_run, dir,
             g_run, dir, g_run);
    EXPECT(system(command) == 0, "%s", command);
  }
  MPI_Finalize();
  return 0;
}
