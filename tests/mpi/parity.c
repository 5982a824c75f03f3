/*
 * Parity: training through libzero at any stage and rank count ends with exactly (bit for bit) the weights of a
 * single-process reference AdamW applied to the averaged gradients, in fp32, bf16 and fp16.
 *
 *   mpirun -np N test_parity --stage S --gas G [--dtype fp32|bf16|fp16] [--bucket ELEMS] [--persist ELEMS]
 *                            [--comm mpi|shm|shm-nodes:L|split|nccl|custom|custom-async] [--overlap 0|1]
 *                            [--prefetch ELEMS] [--reuse ELEMS] [--live ELEMS] [--explicit-prefetch 0|1]
 *                            [--shuffle 0|1] [--norm-in-update 0|1] [--nvme DIR] [--nvme-params DIR] [--partial 0|1]
 *                            [--loss-averaged 0|1] [--device emulator|cuda] [--offload optimizer|all]
 *
 * --partial 1 ends every fourth window early, as a training loop does at the end of an epoch whose length is not a
 * multiple of the window: after k = 1, 2, ... G - 1 micro-steps in turn, zero_step_with(partial_window) steps, and
 * the weights must be the bits of a reference that averages over k (an engine configured with G = k); every eighth
 * whole window also goes through zero_step_with(partial_window). --loss-averaged 1 divides each micro-step's
 * gradients by the window's micro-steps before adding them (the Hugging Face Trainer divides the loss) and steps with
 * zero_step_with(loss_averaged): the reference sums them and divides by N x loss scale only. With it k is a power of
 * two (1 for k = 3), so the test's division is exact.
 *
 * --device puts the engine on a device (zero_engine_set_device): params and gradients are read and written through
 * zero_engine_copy, and the norm is always a device pass of its own; at more than one rank the collectives go
 * through host memory (the host-staged path). With "emulator" every access to device memory is checked for stream
 * order, and the weights must be the same reference bits. --offload optimizer (ZeRO-Offload: the fp32 master and
 * AdamW's state in host memory, stepped by the CPU) or all (stage 3's param shards there too) with it.
 *
 * --overlap 1 sets overlap_comm: bucket reductions complete later, while backward goes on, and the new params are
 * all-gathered in the background after the step (stages 1-2: zero_gather waits for its unit); the weights must be
 * the same bits.
 *
 * --prefetch, --reuse and --live set stage3_prefetch_bucket_size, stage3_max_reuse_distance and
 * stage3_max_live_parameters (default: DeepSpeed's with --overlap 1, else off): stage 3 all-gathers units ahead of
 * zero_gather in the order of the previous micro-step and keeps released units it will need again; every gathered
 * view is still compared with the reference. --explicit-prefetch 1 calls zero_prefetch for the next unit before
 * each release. --shuffle 1 runs every third step's forward in another unit order (the recorded order is lost
 * and learnt again).
 *
 * --norm-in-update 1 turns clipping and the skip of non-finite steps off (gradient_clipping 0,
 * zero_optimization.compute_grad_norm false, bf16.check_grad_overflow false): nothing needs the norm before the
 * update, so the optimizer pass sums its squares (stages 1-3, and N = 1; the test checks the engine's log says so).
 * The reported norm must be the same bits, and the weights the reference's without clipping.
 *
 * --nvme DIR offloads the fp32 master and the optimizer state to a file under DIR (offload_optimizer device nvme),
 * streamed in chunks of 1024 elements through a window of 3: the same bits as in memory. --nvme-params DIR puts
 * stage 3's param shards in a file under DIR (offload_param; with or without --nvme), read through a 100-element
 * buffer, also when prefetched; fp32 params are their own master, so there the params file holds the one fp32 copy
 * the optimizer updates.
 *
 * --comm custom runs over tests/mpi/custom_backend.h, a backend written in this test over plain MPI calls (MPI's own
 * reductions, in the order MPI picks) through zero_comm_create_custom: blocking, or with start/wait.
 *
 * --comm shm-nodes:L does too across "nodes" of L ranks on this machine (zero_comm_create_shm_nodes: a segment per
 * node, TCP over loopback between them).
 * --comm shm runs over zero_comm_create_shm (the shared-memory communicator a torchrun job uses; mpirun only starts
 * the processes and hands out the segment's name). --expect-arena 1 then also checks that the gradient buckets
 * lived in the segment's shared arena: this process's mapping of the segment beyond the window (a nonzero file
 * offset in /proc/self/smaps) holds pages: its own buckets' or, read in place, its peers'.
 * --comm split: control messages over the MPI module and data collectives over zero_comm_create_shm, one
 * communicator (zero_comm_create_split, what a job with NCCL for data and MPI or gloo for control uses).
 *
 * --comm nccl: control over zero_comm_create_shm, data over libzero's NCCL module (zero_comm_create_nccl; --device
 * cuda), each rank's NCCL_HOSTID the inherited one (or the segment's name) and its rank, so that processes sharing a
 * GPU can join.
 *
 * test_parity_launch is this test built without MPI (ZERO_TEST_WITHOUT_MPI) for machines without it (the GPU
 * check's): a launcher starts the ranks with RANK and WORLD_SIZE (tests/mpi/shm_launch.sh N -1 test_parity_launch
 * --job @JOB@ ...), --comm shm or nccl.
 *
 * --persist sets stage3_param_persistence_threshold: units smaller than that stay resident at stage 3 (two of the
 * model's three units with 200), mixing gathered and resident units in one run.
 *
 * In bf16 and fp16 the engine keeps an fp32 master and writes the params as its round-to-nearest-even; the
 * reference does the same, with its own rounding (nearest by exact distance for both: tests/mpi/fp16_reference.h
 * for fp16). Gradients are reduced in the compute dtype (DeepSpeed's default), so the test keeps every
 * partial sum within 8 significant bits (bf16) to stay exact; fp16 gradients carry the loss scale 2^16.
 *
 * Gradients are small multiples of 2^-10, so every sum over ranks and micro-steps is exact in any order. The
 * averaging is defined as: sum everything, divide once by D = N x G x loss scale (a correctly rounded float
 * division), then multiply by the clip coefficient float(max_norm / (norm + 1e-6)) when the norm exceeds max_norm.
 * The global norm is sqrt(sum of squares / D^2), the squares accumulated in double over the summed gradients, exact
 * in any order. The reference below does the same arithmetic on the full model, independently of the engine's
 * code. Every gathered view is
 * also compared against the reference's weights, so stage 3's all-gathers are checked at every use.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ZERO_EXPERIMENTAL_API
#ifndef ZERO_TEST_WITHOUT_MPI
#include "custom_backend.h"
#endif
#include "fp16_reference.h"
#include "harness.h"
#include "nccl_comm.h"

enum { kSteps = 20 };
static double g_clip = 0.25;
static zero_dtype_t g_dtype = ZERO_DTYPE_FP32;
static const char* g_device = NULL; /* --device: the engine's memory is a device's, reached by zero_engine_copy */

typedef struct {
  double lr, weight_decay, beta1, beta2, eps;
} Hyper;

/* group 0 = the config's optimizer params, group 1 = register_test_model's no_decay group. */
static const Hyper kGroups[2] = {{0.01, 0.02, 0.9, 0.999, 1e-8}, {0.005, 0.0, 0.8, 0.99, 1e-8}};

typedef struct {
  int in_update, own_pass; /* finalize: which pass sums the norm */
  int steps_folded_all;    /* zero_step: steps on which every unit's squares came from the reductions */
  char all_units[64];
} NormLog;

static void record_norm_log(void* user_data, int32_t level, int32_t rank, const char* message) {
  (void)level;
  (void)rank;
  NormLog* log = (NormLog*)user_data;
  log->in_update += strstr(message, "the gradient norm is summed in the optimizer pass") != NULL;
  log->own_pass += strstr(message, "the gradient norm is summed before the update") != NULL;
  log->steps_folded_all += strstr(message, log->all_units) != NULL;
}

/* The gradient rank `rank` adds to element i of param p in micro-step k of step t: a multiple of 2^-10. A part
 * shared by all ranks and micro-steps keeps the averaged norm near 0.13 x (t % 3 + 1) whatever N and the
 * accumulation, so a clip at 0.25 engages on some steps and not on others; a per-rank part makes the ranks
 * disagree, as real data-parallel gradients do. */
static float test_grad(int t, int k, int rank, int p, size_t i) {
  uint64_t common = test_mix((uint64_t)t * 1000003u ^ (uint64_t)p * 15485863u ^ (uint64_t)i * 2654435761u);
  uint64_t own = test_mix(common ^ ((uint64_t)k * 7919u + 1) * 104729u ^ (uint64_t)(rank + 1) * 0x9e3779b97f4a7c15u);
  /* In 16-bit modes |sum over ranks and micro-steps| <= 16 x 4 x 3 = 192 < 2^8: exact in bf16's 8 bits. */
  int v = g_dtype == ZERO_DTYPE_FP32 ? (int)(common % 17) - 8 + (int)(own % 9) - 4
                                     : (int)(common % 7) - 3 + (int)(own % 3) - 1;
  return (float)ldexp(v * (t % 3 + 1), -10);
}

/* The reference rounding of an fp32 master to the compute dtype. */
static uint16_t round_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  uint32_t down_bits = u & 0xffff0000u, up_bits = down_bits + 0x10000u;
  float down, up;
  memcpy(&down, &down_bits, 4);
  memcpy(&up, &up_bits, 4);
  double e_down = fabs((double)x - down), e_up = fabs((double)up - x);
  if (e_down < e_up || (e_down == e_up && ((down_bits >> 16) & 1u) == 0)) return (uint16_t)(down_bits >> 16);
  return (uint16_t)(up_bits >> 16);
}
static uint16_t round_fp16(float x) { return fp16_reference_from_float(x); /* nearest by exact distance */ }

static float init_value(int p, size_t i) { return (float)ldexp((double)((int)((p * 31 + i * 7) % 41) - 20), -6); }

/* The reference: AdamW on full tensors, one float operation sequence per element. */
typedef struct {
  float* w[kNumParams];
  float* m[kNumParams];
  float* v[kNumParams];
  float* g[kNumParams]; /* summed over ranks and micro-steps */
} Reference;

static double reference_step(Reference* ref, int t, int world, int gas, double scale) {
  double sum_sq = 0.0;
  for (int p = 0; p < kNumParams; ++p)
    for (size_t i = 0; i < test_param_numel(p); ++i) sum_sq += (double)ref->g[p][i] * (double)ref->g[p][i];
  double divisor = (double)world * (double)gas * scale;
  double norm = sqrt(sum_sq / (divisor * divisor));
  double clip = g_clip > 0 && norm > g_clip ? g_clip / (norm + 1e-6) : 1.0;
  float divisor_f = (float)divisor, clip_f = (float)clip;
  for (int p = 0; p < kNumParams; ++p) {
    const Hyper* h = &kGroups[kModel[p].group];
    double bc1 = 1.0 - pow(h->beta1, t), bc2 = 1.0 - pow(h->beta2, t);
    float b1 = (float)h->beta1, b2 = (float)h->beta2, omb1 = (float)(1.0 - h->beta1), omb2 = (float)(1.0 - h->beta2);
    float step_size = (float)(h->lr / bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2)), eps = (float)h->eps;
    float decay = (float)(1.0 - h->lr * h->weight_decay);
    for (size_t i = 0; i < test_param_numel(p); ++i) {
      float w = ref->w[p][i];
      float g = (ref->g[p][i] / divisor_f) * clip_f;
      g = g + 0.0f * w;
      float m = b1 * ref->m[p][i] + omb1 * g;
      float v = b2 * ref->v[p][i] + omb2 * (g * g);
      float denom = sqrtf(v) * inv_sqrt_bc2 + eps;
      w = w * decay;
      w = w - step_size * (m / denom);
      ref->m[p][i] = m;
      ref->v[p][i] = v;
      ref->w[p][i] = w;
      ref->g[p][i] = 0.0f;
    }
  }
  return norm;
}

static void expect_weights_equal(zero_engine_t* engine, const int32_t* ids, const Reference* ref, int unit,
                                 const char* when) {
  for (int p = 0; p < kNumParams; ++p) {
    if (kModel[p].unit != unit) continue;
    void* param = NULL;
    CHECK(zero_param_data(&param, engine, ids[p]));
    const size_t bytes = test_param_numel(p) * (g_dtype == ZERO_DTYPE_FP32 ? 4 : 2);
    void* data = malloc(bytes);
    CHECK(zero_engine_copy(engine, data, param, bytes)); /* host or device memory alike */
    for (size_t i = 0; i < test_param_numel(p); ++i) {
      if (g_dtype == ZERO_DTYPE_FP32) {
        float got = ((const float*)data)[i];
        EXPECT(memcmp(&got, &ref->w[p][i], sizeof(float)) == 0, "%s: %s[%zu] is %.9g, reference %.9g", when,
               kModel[p].name, i, got, ref->w[p][i]);
      } else {
        uint16_t got = ((const uint16_t*)data)[i];
        uint16_t want = g_dtype == ZERO_DTYPE_BF16 ? round_bf16(ref->w[p][i]) : round_fp16(ref->w[p][i]);
        EXPECT(got == want, "%s: %s[%zu] is 0x%04x, reference 0x%04x (master %.9g)", when, kModel[p].name, i, got, want,
               ref->w[p][i]);
      }
    }
    free(data);
  }
}

/* Kilobytes resident in this process's mappings of the shared-memory object `name` at a nonzero file offset (the
 * shared arena's shares; the window is mapped from offset 0). */
static long arena_resident_kb(const char* name) {
  FILE* f = fopen("/proc/self/smaps", "r");
  if (f == NULL) return -1;
  char line[1024];
  long total = 0;
  int in_arena = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    unsigned long offset = 0;
    char perms[8];
    if (sscanf(line, "%*x-%*x %7s %lx", perms, &offset) == 2) {
      in_arena = strstr(line, name) != NULL && offset != 0;
      continue;
    }
    long kb = 0;
    if (in_arena && sscanf(line, "Rss: %ld kB", &kb) == 1) total += kb;
  }
  fclose(f);
  return total;
}

/* Step t's micro-steps: gas, except every fourth window with --partial, which ends after 1, 2, ..., gas - 1 in turn
 * (a power of two with --loss-averaged). */
static int window_of(int t, int gas, int partial, int loss_averaged) {
  int window = gas;
  if (partial && gas > 1 && t % 4 == 0) window = 1 + (t / 4 - 1) % (gas - 1);
  if (loss_averaged && window == 3) window = 2;
  return window;
}

int main(int argc, char** argv) {
  int stage = 0, gas = 1, overlap = 0, explicit_prefetch = 0, shuffle = 0, norm_in_update = 0, partial = 0;
  int loss_averaged = 0, expect_arena = 0;
  char shm_name[64] = {0};
  long bucket = 400, persist = 0, prefetch = -1, reuse = -1, live = -1;
  const char *nvme_dir = NULL, *nvme_params_dir = NULL, *offload = NULL;
  const char* comm_kind = "mpi";
  const char* job = NULL; /* --job: the segment's name, given to every rank alike by a launcher without MPI */
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--stage") == 0)
      stage = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--gas") == 0)
      gas = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--bucket") == 0)
      bucket = atol(argv[i + 1]);
    else if (strcmp(argv[i], "--overlap") == 0)
      overlap = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--dtype") == 0)
      g_dtype = parse_dtype_arg(argv[i + 1]);
    else if (strcmp(argv[i], "--persist") == 0) /* stage3_param_persistence_threshold */
      persist = atol(argv[i + 1]);
    else if (strcmp(argv[i], "--comm") == 0)
      comm_kind = argv[i + 1];
    else if (strcmp(argv[i], "--prefetch") == 0)
      prefetch = atol(argv[i + 1]);
    else if (strcmp(argv[i], "--reuse") == 0)
      reuse = atol(argv[i + 1]);
    else if (strcmp(argv[i], "--live") == 0)
      live = atol(argv[i + 1]);
    else if (strcmp(argv[i], "--explicit-prefetch") == 0)
      explicit_prefetch = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--shuffle") == 0)
      shuffle = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--norm-in-update") == 0)
      norm_in_update = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--partial") == 0)
      partial = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--loss-averaged") == 0)
      loss_averaged = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--nvme") == 0)
      nvme_dir = argv[i + 1];
    else if (strcmp(argv[i], "--nvme-params") == 0)
      nvme_params_dir = argv[i + 1];
    else if (strcmp(argv[i], "--offload") == 0)
      offload = argv[i + 1];
    else if (strcmp(argv[i], "--device") == 0)
      g_device = argv[i + 1];
    else if (strcmp(argv[i], "--expect-arena") == 0)
      expect_arena = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--job") == 0)
      job = argv[i + 1];
  }
  if (g_dtype != ZERO_DTYPE_FP32) g_clip = 0.12; /* smaller gradients in 16-bit modes (see test_grad) */
  if (norm_in_update) {
    if (g_dtype == ZERO_DTYPE_FP16) {
      fprintf(stderr, "--norm-in-update: fp16 always checks for overflow (the loss scale needs it)\n");
      return 2;
    }
    g_clip = 0.0;
  }
  if (strcmp(comm_kind, "nccl") == 0 && (g_device == NULL || strcmp(g_device, "cuda") != 0)) {
    fprintf(stderr, "--comm nccl carries a device engine's data: it needs --device cuda\n");
    return 2;
  }
  int rank = 0, world = 1;
#ifdef ZERO_TEST_WITHOUT_MPI
  /* Started by a launcher (tests/mpi/shm_launch.sh, torchrun): RANK and WORLD_SIZE, and --job for the segment. */
  if (getenv("RANK") == NULL || getenv("WORLD_SIZE") == NULL || job == NULL ||
      (strcmp(comm_kind, "shm") != 0 && strcmp(comm_kind, "nccl") != 0)) {
    fprintf(stderr,
            "built without MPI: start every rank with RANK and WORLD_SIZE set, --job NAME (the same on "
            "every rank) and --comm shm or nccl\n");
    return 2;
  }
  rank = atoi(getenv("RANK"));
  world = atoi(getenv("WORLD_SIZE"));
#else
  int mpi_provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &mpi_provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
#endif
  /* The segment's name for the shared-memory communicators: the launcher's, or rank 0's handed out over MPI
   * (mpirun only launches: libzero uses no MPI). */
  char name[64];
  if (job != NULL) {
    snprintf(name, sizeof name, "libzero-parity-%s", job);
  } else {
    snprintf(name, sizeof name, "libzero-parity-%ld-%ld", (long)getpid(), (long)time(NULL));
#ifndef ZERO_TEST_WITHOUT_MPI
    MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
#endif
  }

  zero_comm_t* comm = NULL;
  if (strcmp(comm_kind, "shm") == 0) {
    CHECK(zero_comm_create_shm(&comm, name, rank, world, 60.0));
    snprintf(shm_name, sizeof shm_name, "%s", name);
  } else if (strcmp(comm_kind, "nccl") == 0) {
    /* Control over shared memory, data over libzero's NCCL module, as a job with one GPU per process runs. */
    zero_comm_t* control = NULL;
    CHECK(zero_comm_create_shm(&control, name, rank, world, 60.0));
    CHECK(create_nccl_comm(&comm, control, name));
  }
#ifndef ZERO_TEST_WITHOUT_MPI
  else if (strcmp(comm_kind, "mpi") == 0) {
    CHECK(zero_comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD));
  } else if (strncmp(comm_kind, "shm-nodes:", 10) == 0) {
    /* Nodes of L ranks on this machine: each its own segment, TCP over loopback between them. The addresses are
     * gathered over MPI here, as torchrun's store gathers them: libzero itself uses no MPI. */
    zero_listener_t* listener = NULL;
    const char* address = NULL;
    CHECK(zero_listener_create(&listener, &address, "127.0.0.1"));
    char mine[64] = {0};
    snprintf(mine, sizeof mine, "%s", address);
    char* all = calloc((size_t)world, sizeof mine);
    const char** addresses = calloc((size_t)world, sizeof(char*));
    MPI_Allgather(mine, sizeof mine, MPI_CHAR, all, sizeof mine, MPI_CHAR, MPI_COMM_WORLD);
    for (int r = 0; r < world; ++r) addresses[r] = all + (size_t)r * sizeof mine;
    CHECK(zero_comm_create_shm_nodes(&comm, listener, name, rank, world, atoi(comm_kind + 10), addresses, 60.0));
    zero_listener_destroy(listener);
    free(addresses);
    free(all);
  } else if (strcmp(comm_kind, "split") == 0) {
    /* Control messages over the MPI module, data collectives over shared memory (zero_comm_create_split). */
    zero_comm_t *control = NULL, *data = NULL;
    CHECK(zero_comm_create_mpi(&control, ZERO_MPI_COMM_WORLD));
    CHECK(zero_comm_create_shm(&data, name, rank, world, 60.0));
    CHECK(zero_comm_create_split(&comm, control, data));
    zero_comm_destroy(control); /* the split keeps both */
    zero_comm_destroy(data);
  } else {
    CHECK(create_test_backend_comm(&comm, strcmp(comm_kind, "custom-async") == 0));
  }
#endif
  if (comm == NULL) {
    fprintf(stderr, "--comm %s: unknown\n", comm_kind);
    return 2;
  }
  char fetch[512] = "";
  if (prefetch >= 0) snprintf(fetch, sizeof fetch, ", \"stage3_prefetch_bucket_size\": %ld", prefetch);
  if (reuse >= 0)
    snprintf(fetch + strlen(fetch), sizeof fetch - strlen(fetch), ", \"stage3_max_reuse_distance\": %ld", reuse);
  if (live >= 0)
    snprintf(fetch + strlen(fetch), sizeof fetch - strlen(fetch), ", \"stage3_max_live_parameters\": %ld", live);
  if (nvme_dir != NULL)
    snprintf(fetch + strlen(fetch), sizeof fetch - strlen(fetch),
             ", \"sub_group_size\": 1024, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"%s\","
             " \"buffer_count\": 3}",
             nvme_dir);
  if (nvme_params_dir != NULL)
    snprintf(fetch + strlen(fetch), sizeof fetch - strlen(fetch),
             ", \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"%s\", \"buffer_size\": 100}",
             nvme_params_dir);
  if (offload != NULL) /* ZeRO-Offload: "optimizer" (the master and state), or "all" (stage 3's params too) */
    snprintf(fetch + strlen(fetch), sizeof fetch - strlen(fetch), ", \"offload_optimizer\": {\"device\": \"cpu\"}%s",
             strcmp(offload, "all") == 0 ? ", \"offload_param\": {\"device\": \"cpu\"}" : "");
  char config[1024];
  snprintf(
      config, sizeof config,
      "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": %d, \"gradient_clipping\": %g,"
      " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": %g, \"betas\": [%g, %g], \"eps\": %g,"
      " \"weight_decay\": %g}},"
      " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": %ld,"
      " \"stage3_param_persistence_threshold\": %ld, \"overlap_comm\": %s%s%s}%s}",
      gas, g_clip, kGroups[0].lr, kGroups[0].beta1, kGroups[0].beta2, kGroups[0].eps, kGroups[0].weight_decay, stage,
      bucket, persist, overlap ? "true" : "false", fetch, norm_in_update ? ", \"compute_grad_norm\": false" : "",
      norm_in_update && g_dtype == ZERO_DTYPE_BF16 ? ", \"bf16\": {\"enabled\": true, \"check_grad_overflow\": false}"
                                                   : dtype_config(g_dtype));
  /* Which pass sums the norm is logged at debug level by finalize. */
  NormLog norm_log = {0, 0, 0, ""};
  snprintf(norm_log.all_units, sizeof norm_log.all_units, "the squares of %d of %d units were summed", kNumUnits,
           kNumUnits);
  CHECK(zero_set_log_callback(record_norm_log, &norm_log, ZERO_LOG_DEBUG));
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, comm));
  if (g_device != NULL) CHECK(zero_engine_set_device(engine, g_device));

  /* Rank 0's initial values must win: the other ranks offer different ones. */
  Reference ref;
  float* init[kNumParams];
  for (int p = 0; p < kNumParams; ++p) {
    size_t n = test_param_numel(p);
    ref.w[p] = malloc(n * sizeof(float));
    ref.m[p] = calloc(n, sizeof(float));
    ref.v[p] = calloc(n, sizeof(float));
    ref.g[p] = calloc(n, sizeof(float));
    init[p] = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; ++i) {
      ref.w[p][i] = init_value(p, i);
      init[p][i] = rank == 0 ? init_value(p, i) : 1000.0f + (float)rank;
    }
  }
  int32_t ids[kNumParams];
  register_test_model(engine, g_dtype, init, ids);
  CHECK(zero_engine_finalize(engine));
  for (int p = 0; p < kNumParams; ++p) free(init[p]);
  /* One rank or a sharded update (stages 1-3): the pass sums the norm; stage 0 at N > 1 updates every element but
   * sums only its shard, so the norm keeps its own pass there. */
  const int expect_in_update = norm_in_update && (stage > 0 || world == 1) && g_device == NULL;
  EXPECT(norm_log.in_update == expect_in_update && norm_log.own_pass == !expect_in_update,
         "the engine logged %d 'summed in the optimizer pass' and %d 'pass of its own', expected %s",
         norm_log.in_update, norm_log.own_pass, expect_in_update ? "the first" : "the second");

  int clipped = 0, partial_steps = 0;
  for (int t = 1; t <= kSteps; ++t) {
    double scale = 0.0; /* fp16: 2^16 throughout (no overflow, window 1000); else 1 */
    CHECK(zero_loss_scale(&scale, engine));
    EXPECT(scale == (g_dtype == ZERO_DTYPE_FP16 ? 65536.0 : 1.0), "loss scale %g", scale);
    const int window = window_of(t, gas, partial, loss_averaged);
    partial_steps += window < gas;
    /* What each micro-step's gradients are divided by before they are added (the loss averaged over the window). */
    const float averaged = loss_averaged ? (float)window : 1.0f;
    for (int k = 0; k < window; ++k) {
      static const int kShuffled[kNumUnits] = {2, 0, 1};
      for (int i = 0; i < kNumUnits; ++i) { /* forward */
        const int u = shuffle && t % 3 == 0 ? kShuffled[i] : i;
        CHECK(zero_gather(engine, u));
        expect_weights_equal(engine, ids, &ref, u, "forward");
        if (explicit_prefetch) CHECK(zero_prefetch(engine, i + 1 < kNumUnits ? i + 1 : kNumUnits - 1));
        CHECK(zero_release(engine, u));
      }
      for (int u = kNumUnits - 1; u >= 0; --u) { /* backward, params in reverse too */
        CHECK(zero_gather(engine, u));
        expect_weights_equal(engine, ids, &ref, u, "backward");
        if (explicit_prefetch && u > 0) CHECK(zero_prefetch(engine, u - 1));
        for (int p = kNumParams - 1; p >= 0; --p) {
          if (kModel[p].unit != u) continue;
          void* grad = NULL; /* the gradient accumulation dtype is fp32 by default in every mode */
          CHECK(zero_grad_data(&grad, engine, ids[p]));
          const size_t n = test_param_numel(p);
          float* sum = malloc(n * sizeof(float));
          CHECK(zero_engine_copy(engine, sum, grad, n * sizeof(float)));
          for (size_t i = 0; i < n; ++i) sum[i] += test_grad(t, k, rank, p, i) / averaged * (float)scale;
          CHECK(zero_engine_copy(engine, grad, sum, n * sizeof(float)));
          free(sum);
          CHECK(zero_grad_ready(engine, ids[p]));
          for (int r = 0; r < world; ++r)
            for (size_t i = 0; i < test_param_numel(p); ++i)
              ref.g[p][i] += test_grad(t, k, r, p, i) / averaged * (float)scale;
        }
        CHECK(zero_release(engine, u));
      }
      CHECK(zero_backward_end(engine));
    }
    zero_step_info_t info = ZERO_STEP_INFO_INIT;
    zero_step_options_t options = ZERO_STEP_OPTIONS_INIT;
    options.partial_window = window < gas || (partial && t % 8 == 1);
    options.loss_averaged = loss_averaged;
    if (options.partial_window || options.loss_averaged)
      CHECK(zero_step_with(&info, engine, &options));
    else
      CHECK(zero_step(&info, engine));
    double norm = reference_step(&ref, t, world, loss_averaged ? 1 : window, scale);
    EXPECT(info.loss_scale == scale, "step %d: loss scale %g, expected %g", t, info.loss_scale, scale);
    EXPECT(info.step == t, "step %lld, expected %d", (long long)info.step, t);
    EXPECT(info.grad_norm == norm, "step %d: grad_norm %.17g, reference %.17g", t, info.grad_norm, norm);
    EXPECT(info.skipped == 0, "step %d skipped", t);
    clipped += g_clip > 0 && norm > g_clip;
  }
  CHECK(zero_set_log_callback(NULL, NULL, ZERO_LOG_WARNING));
  /* Stages 2-3 sum the squares as the window's last micro-step reduces each unit (each unit of the test model gets
   * gradients on every micro-step), stages 0-1 as they widen what was reduced in bf16 or fp16 (the default
   * communication dtype of those modes), wherever the optimizer pass does not sum the norm: every unit on every
   * step, so zero_step reads no shard for the norm. */
  /* A window that ended early did not know its last micro-step was the last: its step reads the shards for the norm
   * at stages 2-3. */
  const int expect_folded = expect_in_update || g_device ? 0
                            : stage >= 2                 ? kSteps - partial_steps
                            : g_dtype != ZERO_DTYPE_FP32 ? kSteps
                                                         : 0;
  EXPECT(norm_log.steps_folded_all == expect_folded,
         "%d steps summed every unit's squares in the reductions, expected %d", norm_log.steps_folded_all,
         expect_folded);
  /* Both paths of the clip (scaled and untouched) must have run, or the test would not cover clipping. */
  if (g_clip > 0) EXPECT(clipped > 0 && clipped < kSteps, "clipping engaged on %d of %d steps", clipped, kSteps);
  for (int u = 0; u < kNumUnits; ++u) {
    CHECK(zero_gather(engine, u));
    expect_weights_equal(engine, ids, &ref, u, "final");
    CHECK(zero_release(engine, u));
  }
  /* Fetching ahead must have happened where it was asked for, or this run would not test it: a pool of more
   * than one gathered unit (prefetch), fewer all-gathers than gathers (reuse). */
  zero_memory_stats_t mem = ZERO_MEMORY_STATS_INIT;
  CHECK(zero_memory_stats(&mem, engine));
  zero_comm_stats_t cs = ZERO_COMM_STATS_INIT;
  CHECK(zero_comm_stats(&cs, engine));
  const uint64_t largest_unit = (uint64_t)test_unit_padded(2, world) * (g_dtype == ZERO_DTYPE_FP32 ? 4 : 2);
  if (stage == 3 && persist == 0 && (prefetch > 0 || explicit_prefetch || (overlap && prefetch < 0)))
    EXPECT(mem.gathered_bytes >= 2 * largest_unit, "prefetch asked for, but %llu bytes of gathered buffers",
           (unsigned long long)mem.gathered_bytes);
  uint64_t gathers = kNumUnits;
  for (int t = 1; t <= kSteps; ++t) {
    const int window = window_of(t, gas, partial, loss_averaged);
    gathers += (uint64_t)window * 2 * kNumUnits;
  }
  if (stage == 3 && persist == 0 && (reuse > 0 || (overlap && reuse < 0)))
    EXPECT(cs.all_gather.calls < gathers, "reuse asked for, but %llu all-gathers for %llu gathers",
           (unsigned long long)cs.all_gather.calls, (unsigned long long)gathers);
  /* Offloaded: every unit's shard is under 1024 elements, so the file holds one 4 KiB block per unit and array
   * (AdamW's two states, and the master in 16-bit modes), and the window three chunks of 1024 elements. */
  if (nvme_dir != NULL && nvme_params_dir == NULL) {
    zero_memory_placement_t mp = ZERO_MEMORY_PLACEMENT_INIT;
    CHECK(zero_memory_placement(&mp, engine));
    const uint64_t arrays = g_dtype == ZERO_DTYPE_FP32 ? 2 : 3, expected = arrays * kNumUnits * 4096;
    EXPECT(mp.nvme_bytes == expected && mp.staging_bytes == expected,
           "NVMe file %llu bytes, window %llu; expected %llu", (unsigned long long)mp.nvme_bytes,
           (unsigned long long)mp.staging_bytes, (unsigned long long)expected);
    EXPECT(mp.host_bytes == mem.total_bytes - mem.master_param_bytes - mem.optimizer_state_bytes + mp.staging_bytes,
           "host bytes %llu", (unsigned long long)mp.host_bytes);
  }
  /* Split: each side numbers its own collectives, so in start order (the recorder's) the sequence numbers fall where
   * a data collective follows a control message; over one communicator they only rise. */
  if (strcmp(comm_kind, "split") == 0 && world > 1) {
    char* recent = NULL;
    CHECK(zero_engine_recent_collectives(&recent, engine));
    long previous = 0;
    int entries = 0, falls = 0;
    for (const char* at = strstr(recent, "\"sequence\":"); at != NULL; at = strstr(at + 1, "\"sequence\":")) {
      const long seq = strtol(at + 11, NULL, 10);
      falls += entries > 0 && seq < previous;
      previous = seq, ++entries;
    }
    EXPECT(entries > 0 && falls > 0, "split communicator: %d collectives numbered as by one communicator", entries);
    EXPECT(strstr(recent, "\"side\": \"data\"") != NULL && strstr(recent, "\"side\": \"control\"") != NULL,
           "the recorder does not tell the sides apart: %.200s", recent);
    zero_string_destroy(recent);
  }
  if (expect_arena) {
    const long kb = shm_name[0] != '\0' ? arena_resident_kb(shm_name) : -1;
    EXPECT(kb > 0, "--expect-arena: %ld KiB of the shared arena resident here (the buckets were not in it)", kb);
    if (rank == 0) printf("shared arena: %ld KiB resident in rank 0\n", kb);
  }
  if (rank == 0 && stage == 3)
    printf("fetching ahead: %llu all-gathers for %llu zero_gather calls; gathered buffers %llu bytes\n",
           (unsigned long long)cs.all_gather.calls, (unsigned long long)gathers,
           (unsigned long long)mem.gathered_bytes);
  if (rank == 0)
    printf(
        "parity ok: %s, stage %d, %d ranks, gradient_accumulation_steps %d, %d steps (%d clipped, %d after a partial "
        "window%s), %s communicator%s%s, bit-identical weights\n",
        dtype_text(g_dtype), stage, world, gas, kSteps, clipped, partial_steps,
        loss_averaged ? ", losses averaged by the caller" : "", comm_kind, g_device ? ", device " : "",
        g_device ? g_device : "");
  for (int p = 0; p < kNumParams; ++p) free(ref.w[p]), free(ref.m[p]), free(ref.v[p]), free(ref.g[p]);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
#ifndef ZERO_TEST_WITHOUT_MPI
  MPI_Finalize();
#endif
  return 0;
}
