/*
 * A small data-parallel training run through the public C API only: a two-layer MLP (softsign) regresses a fixed
 * teacher function on synthetic data. Every rank draws its own samples; libzero shards the parameters,
 * gradients and Adam state according to the ZeRO stage and keeps the replicas identical.
 *
 *   mpirun -np 4 ./train_demo [--stage 0-3] [--steps N] [--hidden H]
 *
 * It prints the loss as it falls and, at the end, each rank's memory by category next to the ZeRO formula and a
 * checksum of the final weights.
 *
 * The model uses only +, -, *, / and |x| in fp32 (softsign, not tanh), evaluated in a fixed order: the Java and Go
 * versions (examples/java/TrainDemo.java, examples/go/train_demo) then compute the same bits, so the three languages'
 * final weights are compared exactly (tests/bindings/three_languages.sh).
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zero/zero.h"

enum { kInputs = 64, kBatch = 32 };

#define CHECK(call)                                                                             \
  do {                                                                                          \
    zero_status_t s_ = (call);                                                                  \
    if (s_ != ZERO_OK) {                                                                        \
      fprintf(stderr, "%s failed: %s: %s\n", #call, zero_status_string(s_), zero_last_error()); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                             \
    }                                                                                           \
  } while (0)

/* xorshift64*: a tiny deterministic generator so every run draws the same data. */
static double uniform(uint64_t* state) {
  *state ^= *state >> 12;
  *state ^= *state << 25;
  *state ^= *state >> 27;
  return (double)((*state * 2685821657736338717ull) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* softsign(a) = a / (1 + |a|); its derivative, from the output h, is (1 - |h|)^2. */
static float softsign(float a) { return a / (1.0f + fabsf(a)); }

typedef struct {
  int hidden;
  float *w1, *b1, *w2, *b2; /* parameter views, valid while the unit is gathered */
} Mlp;

/* Forward for one sample; returns the output and keeps the hidden activations in h. */
static float forward(const Mlp* m, const float* x, float* h) {
  float y = m->b2[0];
  for (int j = 0; j < m->hidden; ++j) {
    float a = m->b1[j];
    for (int i = 0; i < kInputs; ++i) a += m->w1[j * kInputs + i] * x[i];
    h[j] = softsign(a);
    y += m->w2[j] * h[j];
  }
  return y;
}

/* A fixed function with exact coefficients (multiples of 1/8). */
static float teacher(const float* x) {
  float y = 0.0f;
  for (int i = 0; i < kInputs; ++i) y += (float)((i * 7) % 13 - 6) / 8.0f * x[i];
  return softsign(y) + 0.5f * x[0] * x[1];
}

/* FNV-1a over the bytes of every param in id order, each unit gathered: the same number at every stage and rank
 * count when the weights are the same bits. */
static uint64_t weights_checksum(zero_engine_t* engine, const int32_t* ids, int count) {
  uint64_t hash = 14695981039346656037ull;
  CHECK(zero_gather(engine, 0));
  CHECK(zero_gather(engine, 1));
  for (int p = 0; p < count; ++p) {
    zero_param_info_t info = ZERO_PARAM_INFO_INIT;
    CHECK(zero_param_info(&info, engine, ids[p]));
    const unsigned char* bytes = NULL;
    CHECK(zero_param_data((void**)&bytes, engine, ids[p]));
    for (uint64_t b = 0; b < info.param_bytes; ++b) {
      hash ^= bytes[b];
      hash *= 1099511628211ull;
    }
  }
  CHECK(zero_release(engine, 1));
  CHECK(zero_release(engine, 0));
  return hash;
}

/* Trains at `stage` for `steps` steps; fills `mem` with this rank's memory statistics at the end. */
static void run_training(int stage, int steps, int hidden, int verbose, zero_memory_stats_t* mem) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  zero_comm_t* comm = NULL;
  CHECK(zero_comm_create_mpi(&comm, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD)));
  char config[512];
  snprintf(config, sizeof config,
           "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": 1, \"gradient_clipping\": 1.0,"
           " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.003, \"weight_decay\": 0.01}},"
           " \"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 0}}",
           kBatch, stage);
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, comm));
  /* Biases get no weight decay, as usual. */
  zero_param_group_desc_t no_decay = ZERO_PARAM_GROUP_DESC_INIT;
  no_decay.name = "no_decay";
  no_decay.weight_decay = 0.0;
  int32_t bias_group = 0;
  CHECK(zero_engine_add_param_group(&bias_group, engine, &no_decay));

  /* Initial values: only rank 0's are used; finalize broadcasts them. */
  float* w1_init = malloc(sizeof(float) * (size_t)hidden * kInputs);
  float* w2_init = malloc(sizeof(float) * (size_t)hidden);
  uint64_t seed = 42;
  for (int i = 0; i < hidden * kInputs; ++i) w1_init[i] = (float)(uniform(&seed) / sqrt((double)kInputs));
  for (int i = 0; i < hidden; ++i) w2_init[i] = (float)(uniform(&seed) / sqrt((double)hidden));

  int64_t shape_w1[2] = {hidden, kInputs}, shape_b1[1] = {hidden}, shape_w2[2] = {1, hidden}, shape_b2[1] = {1};
  const char* names[4] = {"layer1.weight", "layer1.bias", "layer2.weight", "layer2.bias"};
  const int64_t* shapes[4] = {shape_w1, shape_b1, shape_w2, shape_b2};
  const int ndims[4] = {2, 1, 2, 1};
  const void* inits[4] = {w1_init, NULL, w2_init, NULL};
  int32_t ids[4];
  for (int p = 0; p < 4; ++p) {
    zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
    d.name = names[p];
    d.ndim = ndims[p];
    d.shape = shapes[p];
    d.unit = p / 2; /* one unit per layer: stage 3 gathers layer by layer */
    d.group = (p % 2 == 1) ? bias_group : 0;
    d.init_data = inits[p];
    CHECK(zero_engine_add_param(&ids[p], engine, &d));
  }
  CHECK(zero_engine_finalize(engine));
  free(w1_init);
  free(w2_init);

  float* x = malloc(sizeof(float) * kBatch * kInputs);
  float* h = malloc(sizeof(float) * (size_t)kBatch * hidden);
  float* dh = malloc(sizeof(float) * (size_t)hidden);
  float out[kBatch], target[kBatch];
  uint64_t data_seed = 1000 + (uint64_t)rank; /* each rank reads its own slice of the data */
  Mlp m = {hidden, NULL, NULL, NULL, NULL};
  double t0 = MPI_Wtime();
  if (verbose && rank == 0)
    printf("training a %d-parameter MLP at ZeRO stage %d on %d ranks\n", hidden * (kInputs + 2) + 1, stage, world);
  for (int step = 1; step <= steps; ++step) {
    for (int s = 0; s < kBatch; ++s) {
      for (int i = 0; i < kInputs; ++i) x[s * kInputs + i] = (float)uniform(&data_seed);
      target[s] = teacher(&x[s * kInputs]);
    }
    /* Forward needs both units at once in this tiny model. */
    CHECK(zero_gather(engine, 0));
    CHECK(zero_gather(engine, 1));
    CHECK(zero_param_data((void**)&m.w1, engine, ids[0]));
    CHECK(zero_param_data((void**)&m.b1, engine, ids[1]));
    CHECK(zero_param_data((void**)&m.w2, engine, ids[2]));
    CHECK(zero_param_data((void**)&m.b2, engine, ids[3]));
    double loss = 0.0;
    for (int s = 0; s < kBatch; ++s) {
      out[s] = forward(&m, &x[s * kInputs], &h[(size_t)s * hidden]);
      loss += 0.5 * (out[s] - target[s]) * (out[s] - target[s]) / kBatch;
    }
    /* Backward, layer 2 first; gradients are added into the engine's buffers. */
    float *gw1, *gb1, *gw2, *gb2;
    CHECK(zero_grad_data((void**)&gw2, engine, ids[2]));
    CHECK(zero_grad_data((void**)&gb2, engine, ids[3]));
    for (int s = 0; s < kBatch; ++s) {
      float dy = (out[s] - target[s]) / kBatch;
      gb2[0] += dy;
      for (int j = 0; j < hidden; ++j) gw2[j] += dy * h[(size_t)s * hidden + j];
    }
    CHECK(zero_grad_ready(engine, ids[2]));
    CHECK(zero_grad_ready(engine, ids[3]));
    CHECK(zero_grad_data((void**)&gw1, engine, ids[0]));
    CHECK(zero_grad_data((void**)&gb1, engine, ids[1]));
    for (int s = 0; s < kBatch; ++s) {
      float dy = (out[s] - target[s]) / kBatch;
      for (int j = 0; j < hidden; ++j) {
        float hj = h[(size_t)s * hidden + j];
        float slope = 1.0f - fabsf(hj);
        dh[j] = dy * m.w2[j] * (slope * slope);
        gb1[j] += dh[j];
        for (int i = 0; i < kInputs; ++i) gw1[j * kInputs + i] += dh[j] * x[s * kInputs + i];
      }
    }
    CHECK(zero_grad_ready(engine, ids[0]));
    CHECK(zero_grad_ready(engine, ids[1]));
    CHECK(zero_release(engine, 1));
    CHECK(zero_release(engine, 0));
    CHECK(zero_backward_end(engine));
    zero_step_info_t info = ZERO_STEP_INFO_INIT;
    CHECK(zero_step(&info, engine));

    double mean_loss = 0.0;
    MPI_Allreduce(&loss, &mean_loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    mean_loss /= world;
    if (verbose && rank == 0 && (step == 1 || step % 20 == 0 || step == steps))
      printf("step %4d  loss %.5f  grad_norm %.4f  %.2f ms/step\n", step, mean_loss, info.grad_norm,
             1e3 * (MPI_Wtime() - t0) / step);
  }

  uint64_t checksum = weights_checksum(engine, ids, 4);
  if (verbose && rank == 0) printf("final weights checksum %016llx\n", (unsigned long long)checksum);
  *mem = (zero_memory_stats_t)ZERO_MEMORY_STATS_INIT;
  CHECK(zero_memory_stats(mem, engine));
  free(x);
  free(h);
  free(dh);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
}

static void print_memory_table(int stage, const zero_memory_stats_t* mem, int world) {
  uint64_t mine[6] = {mem->param_bytes,  mem->grad_bytes,     mem->optimizer_state_bytes,
                      mem->bucket_bytes, mem->gathered_bytes, mem->total_bytes};
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  uint64_t* all = malloc(sizeof(mine) * (size_t)world);
  MPI_Gather(mine, 6, MPI_UINT64_T, all, 6, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    printf("\nper-rank memory at stage %d (bytes)\n%-6s %12s %12s %12s %12s %12s %12s\n", stage, "rank", "params",
           "grads", "optim", "buckets", "gathered", "total");
    for (int r = 0; r < world; ++r)
      printf("%-6d %12llu %12llu %12llu %12llu %12llu %12llu\n", r, (unsigned long long)all[r * 6],
             (unsigned long long)all[r * 6 + 1], (unsigned long long)all[r * 6 + 2], (unsigned long long)all[r * 6 + 3],
             (unsigned long long)all[r * 6 + 4], (unsigned long long)all[r * 6 + 5]);
  }
  free(all);
}

/* Model states (params + grads + optimizer state) per rank for fp32 Adam, as the ZeRO paper counts them with
 * K = 8 bytes of optimizer state per param: stage 0 16P, 1 8P + 8P/N, 2 4P + 12P/N, 3 16P/N. */
static double zero_formula(int stage, double psi, int world) {
  const double formula[4] = {16 * psi, 8 * psi + 8 * psi / world, 4 * psi + 12 * psi / world, 16 * psi / world};
  return formula[stage];
}

int main(int argc, char** argv) {
  int stage = 3, steps = 300, hidden = 512, compare = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--compare-stages") == 0)
      compare = 1;
    else if (i + 1 < argc && strcmp(argv[i], "--stage") == 0)
      stage = atoi(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--steps") == 0)
      steps = atoi(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--hidden") == 0)
      hidden = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--stage 0-3] [--steps N] [--hidden H] [--compare-stages]\n", argv[0]);
      return 2;
    }
  }
  if (stage < 0 || stage > 3 || steps < 1 || hidden < 1) {
    fprintf(stderr, "--stage must be 0-3, --steps and --hidden positive\n");
    return 2;
  }
  int mpi_provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &mpi_provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  zero_memory_stats_t mem;
  if (!compare) {
    run_training(stage, steps, hidden, 1, &mem);
    print_memory_table(stage, &mem, world);
  } else {
    if (rank == 0)
      printf(
          "model states per rank (params + grads + optimizer state), %d ranks, 10 steps per stage\n"
          "%-6s %14s %14s %10s\n",
          world, "stage", "measured", "ZeRO formula", "vs stage 0");
    double stage0 = 0;
    for (int s = 0; s <= 3; ++s) {
      run_training(s, 10, hidden, 0, &mem);
      double states = (double)(mem.param_bytes + mem.grad_bytes + mem.optimizer_state_bytes);
      double psi = (double)mem.param_bytes / 4.0 * (s == 3 ? world : 1); /* padded params */
      if (s == 0) stage0 = states;
      if (rank == 0) printf("%-6d %14.0f %14.0f %9.2fx\n", s, states, zero_formula(s, psi, world), stage0 / states);
    }
  }
  MPI_Finalize();
  return 0;
}
