/*
 * A unit of more than 2^31 bytes: one bf16 param of 32769 x 32771 elements (2^30 + 131075, 2 147 745 798 bytes)
 * finalizes, reduces, steps, gathers, saves and loads at 2 ranks, every element exact.
 *
 *   mpirun -np 2 test_large_unit --stage 1|2|3 --dir DIR
 *
 * Gradients are k x 2^-9 with |k| <= 30 on each rank, so their sum over the ranks is exact in bf16 and the
 * average exact in fp32; SGD with lr 1 then gives w - average exactly in the fp32 master, and the bf16 params are
 * its round-to-nearest-even, which this file computes on its own. It needs about 6.5 GiB per rank at stage 1 and
 * exits with 77 (CTest: skipped) when the machine has less than 16 GiB available.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "harness.h"

static const int64_t kShape[2] = {32769, 32771};
static const int64_t kSmall[1] = {1000};

static uint16_t bf16_rne(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float bf16_value(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static float initial(size_t i) { return (float)ldexp((double)((int)(i % 251) - 125), -7); }
static int grad_k(size_t i, int rank) { return (int)((i * 7 + (size_t)rank) % 61) - 30; }
/* The bf16 param after one step: w - (k0 + k1) x 2^-10, rounded to nearest even. */
static uint16_t expected(size_t i) {
  const float w = bf16_value(bf16_rne(initial(i)));
  return bf16_rne(w - (float)ldexp((double)(grad_k(i, 0) + grad_k(i, 1)), -10));
}

/* initial() repeats every 251 elements, grad_k() every 61 and expected() every 251 x 61: each billion-element
 * array is one period written out and copied, so filling and checking cost memory bandwidth, not arithmetic. */
enum { kInitialPeriod = 251, kGradPeriod = 61, kExpectedPeriod = 251 * 61 };

static void fill_periodic(uint16_t* out, size_t numel, const uint16_t* period, size_t length) {
  for (size_t i = 0; i < numel; i += length)
    memcpy(out + i, period, (numel - i < length ? numel - i : length) * sizeof *period);
}

/* The elements of data that differ from the periodic sequence. */
static size_t count_periodic_differences(const uint16_t* data, size_t numel, const uint16_t* period, size_t length) {
  size_t bad = 0;
  for (size_t i = 0; i < numel; i += length) {
    const size_t n = numel - i < length ? numel - i : length;
    if (memcmp(data + i, period, n * sizeof *period) == 0) continue;
    for (size_t j = 0; j < n; ++j) bad += data[i + j] != period[j];
  }
  return bad;
}

static long long available_bytes(void) {
  FILE* f = fopen("/proc/meminfo", "r");
  if (f == NULL) return 0;
  char line[256];
  long long kib = 0;
  while (fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "MemAvailable: %lld kB", &kib) == 1) break;
  fclose(f);
  return kib * 1024;
}

static zero_engine_t* make_engine(zero_comm_t* comm, int stage, const uint16_t* init, int32_t* big, int32_t* small) {
  char config[512];
  snprintf(config, sizeof config,
           "{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 1.0}}, \"gradient_clipping\": 0,"
           " \"bf16\": {\"enabled\": true}, \"data_types\": {\"grad_accum_dtype\": \"bf16\"},"
           " \"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 0}}",
           stage);
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, comm));
  zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
  d.name = "embedding.weight";
  d.ndim = 2;
  d.shape = kShape;
  d.unit = 0;
  d.dtype = ZERO_DTYPE_BF16;
  d.init_data = init;
  d.init_dtype = ZERO_DTYPE_BF16;
  CHECK(zero_engine_add_param(big, engine, &d));
  d.name = "head.bias";
  d.ndim = 1;
  d.shape = kSmall;
  d.unit = 1;
  d.init_data = NULL;
  CHECK(zero_engine_add_param(small, engine, &d));
  CHECK(zero_engine_finalize(engine));
  return engine;
}

/* Every element of the big param against expected(); returns the number of differences. */
static size_t count_differences(zero_engine_t* engine, int32_t big, size_t numel) {
  CHECK(zero_gather(engine, 0));
  void* data = NULL;
  CHECK(zero_param_data(&data, engine, big));
  static uint16_t period[kExpectedPeriod];
  for (size_t i = 0; i < kExpectedPeriod; ++i) period[i] = expected(i);
  const size_t bad = count_periodic_differences(data, numel, period, kExpectedPeriod);
  CHECK(zero_release(engine, 0));
  return bad;
}

int main(int argc, char** argv) {
  int stage = 1;
  const char* dir = "large_unit_checkpoint";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--stage") == 0) stage = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 2) {
    if (rank == 0) fprintf(stderr, "run with 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  long long avail = rank == 0 ? available_bytes() : 0;
  MPI_Bcast(&avail, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  if (avail < 16LL << 30) {
    if (rank == 0)
      printf("skipped: %.1f GiB of memory available, the test needs 16 GiB (two ranks of ~6.5 GiB)\n",
             (double)avail / (1 << 30));
    MPI_Finalize();
    return 77;
  }

  const size_t numel = (size_t)kShape[0] * (size_t)kShape[1];
  uint16_t* init = NULL;
  if (rank == 0) { /* rank 0's initial values, in bf16 (exact) */
    init = malloc(numel * sizeof(uint16_t));
    if (init == NULL) MPI_Abort(MPI_COMM_WORLD, 3);
    uint16_t period[kInitialPeriod];
    for (size_t i = 0; i < kInitialPeriod; ++i) period[i] = bf16_rne(initial(i));
    fill_periodic(init, numel, period, kInitialPeriod);
  }
  zero_comm_t* comm = NULL;
  CHECK(zero_comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD));
  int32_t big = -1, small = -1;
  zero_engine_t* engine = make_engine(comm, stage, init, &big, &small);
  free(init);

  /* One step: every rank adds its gradient (bf16 accumulation) in backward order. */
  for (int u = 1; u >= 0; --u) {
    CHECK(zero_gather(engine, u));
    uint16_t* g = NULL;
    if (u == 0) {
      CHECK(zero_grad_data((void**)&g, engine, big));
      uint16_t period[kGradPeriod];
      for (size_t i = 0; i < kGradPeriod; ++i) period[i] = bf16_rne((float)ldexp((double)grad_k(i, rank), -9));
      fill_periodic(g, numel, period, kGradPeriod);
      CHECK(zero_grad_ready(engine, big));
    } else {
      CHECK(zero_grad_data((void**)&g, engine, small));
      for (int i = 0; i < kSmall[0]; ++i) g[i] = bf16_rne(1.0f);
      CHECK(zero_grad_ready(engine, small));
    }
    CHECK(zero_release(engine, u));
  }
  CHECK(zero_backward_end(engine));
  zero_step_info_t info = ZERO_STEP_INFO_INIT;
  CHECK(zero_step(&info, engine));
  EXPECT(!info.skipped && info.step == 1, "step: skipped %d, step %lld", info.skipped, (long long)info.step);
  size_t bad = count_differences(engine, big, numel);
  EXPECT(bad == 0, "rank %d: %zu of %zu elements differ after the step", rank, bad, numel);

  CHECK(zero_save_checkpoint(engine, dir, "large"));
  zero_engine_destroy(engine);
  engine = make_engine(comm, stage, NULL, &big, &small);
  CHECK(zero_load_checkpoint(engine, dir, "large"));
  bad = count_differences(engine, big, numel);
  EXPECT(bad == 0, "rank %d: %zu of %zu elements differ after loading the checkpoint", rank, bad, numel);
  if (rank == 0)
    printf(
        "large unit ok: stage %d, 2 ranks, a bf16 param of %zu elements (%zu bytes): finalize, reduce, step, "
        "gather, save and load exact\n",
        stage, numel, numel * 2);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}
