/*
 * Formulas: each rank's zero_memory_stats equals the bytes predicted from the layout, and zero_comm_stats per
 * step equals the ZeRO traffic formula, for stages 0-3 at the rank count mpirun gives.
 *
 *   mpirun -np N test_formulas [--dtype fp32|bf16|fp16]
 *
 * libzero initialises MPI itself here (the test never calls MPI_Init), which covers that path too.
 *
 * Prediction for fp32 params with Adam (Psi = padded params, summed over units; S_u = unit u's shard):
 *   stage 0: params 4 Psi,   grads 4 Psi,   optimizer 8 Psi
 *   stage 1: params 4 Psi,   grads 4 Psi,   optimizer 8 Psi / N
 *   stage 2: params 4 Psi,   grads 4 Psi/N, optimizer 8 Psi / N, buckets 4 x largest bucket
 *   stage 3: params 4 Psi/N, grads 4 Psi/N, optimizer 8 Psi / N, buckets 4 x largest bucket,
 *            gathered 4 x largest unit (one unit gathered at a time)
 * With bf16/fp16 params (c = 2 bytes per element instead of 4) the params, their all-gathers and the gathered units
 * shrink to c bytes per element, gradients stay fp32 (the default accumulation dtype), the reductions run in the
 * compute dtype (DeepSpeed's default communication_data_type), and a separate fp32 master appears: 4 Psi at stage
 * 0, 4 Psi / N at stages 1-3. The fp32 master copy aliases fp32 params (master_param_bytes = 0). Traffic per step, in
 * elements sent by one rank: stages 0-2 2 Psi (N-1)/N (all-reduce = reduce-scatter + all-gather), stage 3 3 Psi (N-1)/N
 * (gather in forward and backward, reduce-scatter of gradients), plus the gradient norm's sum: one all-reduce of
 * one fp64 per step (2 x 8 (N-1)/N bytes). The small messages of the failure-safety mechanism (the agreement before
 * each collective call) and, at stages 2-3, the exchange of which params had gradients in the micro-step are counted
 * apart, as control traffic: this test counts them too (each at most a few hundred bytes).
 */
#include <string.h>

#include "harness.h"

static const long kBucketElems = 300; /* small enough that the three units fall into more than one bucket */

static zero_dtype_t g_dtype = ZERO_DTYPE_FP32;

static void run_stage(int stage, zero_comm_t* comm, int rank, int world, uint64_t* table_row) {
  char config[512];
  snprintf(config, sizeof config,
           "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}},"
           " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": %ld,"
           " \"stage3_param_persistence_threshold\": 0}%s}",
           stage, kBucketElems, dtype_config(g_dtype));
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, config, comm));
  int32_t ids[kNumParams];
  register_test_model(engine, g_dtype, NULL, ids);
  CHECK(zero_engine_finalize(engine));

  /* Independent prediction from the layout rule. */
  uint64_t psi = 0, largest_unit = 0, largest_bucket = 0, bucket = 0;
  for (int u = kNumUnits - 1; u >= 0; --u) { /* buckets fill in backward order */
    uint64_t n = test_unit_padded(u, world);
    psi += n;
    if (n > largest_unit) largest_unit = n;
    if (bucket > 0 && bucket + n > (uint64_t)kBucketElems) bucket = 0;
    bucket += n;
    if (bucket > largest_bucket) largest_bucket = bucket;
  }
  const uint64_t c = g_dtype == ZERO_DTYPE_FP32 ? 4 : 2; /* compute (and communication) bytes per element */
  uint64_t want_params = stage == 3 ? c * psi / world : c * psi;
  uint64_t want_grads = stage <= 1 ? 4 * psi : 4 * psi / world;
  uint64_t want_master = c == 4 ? 0 : (stage == 0 ? 4 * psi : 4 * psi / world);
  uint64_t want_optim = stage == 0 ? 8 * psi : 8 * psi / world;
  uint64_t want_buckets = stage >= 2 ? 4 * largest_bucket : 0;
  uint64_t want_gathered = stage == 3 ? c * largest_unit : 0;

  zero_comm_stats_t before = ZERO_COMM_STATS_INIT, after = ZERO_COMM_STATS_INIT;
  for (int t = 0; t < 2; ++t) { /* measure the second step: the first one also allocates the pools */
    CHECK(zero_comm_stats(&before, engine));
    test_forward(engine);
    test_backward(engine, ids, test_grad_first_element, NULL);
    CHECK(zero_backward_end(engine));
    CHECK(zero_step(NULL, engine));
    CHECK(zero_comm_stats(&after, engine));
  }

  zero_memory_stats_t mem = ZERO_MEMORY_STATS_INIT;
  CHECK(zero_memory_stats(&mem, engine));
  EXPECT(mem.param_bytes == want_params, "stage %d: param_bytes %llu, predicted %llu", stage,
         (unsigned long long)mem.param_bytes, (unsigned long long)want_params);
  EXPECT(mem.grad_bytes == want_grads, "stage %d: grad_bytes %llu, predicted %llu", stage,
         (unsigned long long)mem.grad_bytes, (unsigned long long)want_grads);
  EXPECT(mem.master_param_bytes == want_master, "stage %d: master_param_bytes %llu, predicted %llu", stage,
         (unsigned long long)mem.master_param_bytes, (unsigned long long)want_master);
  EXPECT(mem.optimizer_state_bytes == want_optim, "stage %d: optimizer_state_bytes %llu, predicted %llu", stage,
         (unsigned long long)mem.optimizer_state_bytes, (unsigned long long)want_optim);
  EXPECT(mem.bucket_bytes == want_buckets, "stage %d: bucket_bytes %llu, predicted %llu", stage,
         (unsigned long long)mem.bucket_bytes, (unsigned long long)want_buckets);
  EXPECT(mem.gathered_bytes == want_gathered, "stage %d: gathered_bytes %llu, predicted %llu", stage,
         (unsigned long long)mem.gathered_bytes, (unsigned long long)want_gathered);
  uint64_t want_total = want_params + want_grads + want_master + want_optim + want_buckets + want_gathered;
  EXPECT(mem.total_bytes == want_total, "stage %d: total_bytes %llu, predicted %llu (something unaccounted)", stage,
         (unsigned long long)mem.total_bytes, (unsigned long long)want_total);

  /* Traffic of one step, in bytes one rank sends. */
  uint64_t ag = after.all_gather.wire_bytes - before.all_gather.wire_bytes;
  uint64_t rs = after.reduce_scatter.wire_bytes - before.reduce_scatter.wire_bytes;
  uint64_t ar = after.all_reduce.wire_bytes - before.all_reduce.wire_bytes;
  uint64_t ar_calls = after.all_reduce.calls - before.all_reduce.calls;
  uint64_t one_psi = c * psi * (uint64_t)(world - 1) / (uint64_t)world; /* Psi (N-1)/N elements, in bytes */
  uint64_t model_traffic = ag + rs + ar;
  uint64_t norm_traffic = 2 * 8 * (uint64_t)(world - 1) / (uint64_t)world;
  uint64_t want_traffic = (stage == 3 ? 3 : 2) * one_psi + norm_traffic;
  EXPECT(model_traffic == want_traffic, "stage %d: %llu bytes of model traffic per step, formula %llu", stage,
         (unsigned long long)model_traffic, (unsigned long long)want_traffic);
  EXPECT(ar_calls == (stage == 0 ? (uint64_t)kNumUnits : 0) + 1, "stage %d: %llu all-reduce calls per step", stage,
         (unsigned long long)ar_calls);
  EXPECT(after.all_reduce.bytes - before.all_reduce.bytes == (stage == 0 ? c * psi : 0) + 8,
         "stage %d: %llu all-reduce bytes per step (the norm's sum is 8)", stage,
         (unsigned long long)(after.all_reduce.bytes - before.all_reduce.bytes));
  /* Control: one agreement per collective call (the step, the micro-step's end, each stage-3 gather and each
   * bucket) and which params had gradients, nothing else; each message is small. */
  uint64_t control_calls = after.control.calls - before.control.calls;
  uint64_t control_bytes = after.control.bytes - before.control.bytes;
  uint64_t buckets = 0;
  for (uint64_t u = 0, b = 0; u < kNumUnits; ++u) { /* the bucket count of the layout rule above */
    uint64_t n = test_unit_padded(kNumUnits - 1 - (int)u, world);
    if (u == 0 || b + n > (uint64_t)kBucketElems) buckets += 1, b = 0;
    b += n;
  }
  uint64_t want_control = 1 /* step */ + 1 /* backward_end */ + (stage >= 2 ? buckets : 0) +
                          (stage >= 2) /* which params had gradients (what each bucket expects next) */ +
                          (stage == 3 ? 2 * kNumUnits : 0);
  EXPECT(control_calls == want_control, "stage %d: %llu control messages per step, expected %llu", stage,
         (unsigned long long)control_calls, (unsigned long long)want_control);
  /* Control messages stay small: the agreement is 13 int64 (the failed rank, then each compared field next to its
   * negation: the control and data sides' positions, the call's kind, id, count and check), 104 bytes. */
  EXPECT(control_bytes <= 112 * control_calls * (uint64_t)world, "stage %d: %llu control bytes", stage,
         (unsigned long long)control_bytes);
  if (stage == 0) EXPECT(ag == 0 && rs == 0, "stage 0 must only all-reduce");
  if (stage > 0)
    EXPECT(ar == norm_traffic, "stage %d: %llu all-reduce bytes sent, the norm's %llu", stage, (unsigned long long)ar,
           (unsigned long long)norm_traffic);
  if (stage == 3)
    EXPECT(ag == 2 * one_psi && rs == one_psi, "stage 3: all-gather %llu, reduce-scatter %llu", (unsigned long long)ag,
           (unsigned long long)rs);
  if (stage == 1 || stage == 2)
    EXPECT(ag == one_psi && rs == one_psi, "stage %d: all-gather %llu, reduce-scatter %llu", stage,
           (unsigned long long)ag, (unsigned long long)rs);

  uint64_t row[10] = {mem.param_bytes,        mem.grad_bytes,
                      mem.master_param_bytes, mem.optimizer_state_bytes,
                      mem.bucket_bytes,       mem.gathered_bytes,
                      mem.total_bytes,        model_traffic,
                      want_traffic,           psi};
  memcpy(table_row, row, sizeof row);
  (void)rank;
  zero_engine_destroy(engine);
}

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; i += 2)
    if (strcmp(argv[i], "--dtype") == 0) g_dtype = parse_dtype_arg(argv[i + 1]);
  zero_comm_t* comm = NULL;
  CHECK(zero_comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD));
  int rank = 0, world = 1;
  CHECK(zero_comm_rank(&rank, comm));
  CHECK(zero_comm_size(&world, comm));
  uint64_t table[4][10];
  for (int stage = 0; stage <= 3; ++stage) run_stage(stage, comm, rank, world, table[stage]);
  if (rank == 0) {
    printf("N = %d, padded params Psi = %llu, %s params, Adam; bytes per rank, measured = predicted\n", world,
           (unsigned long long)table[0][9], dtype_text(g_dtype));
    printf("%-6s %8s %8s %8s %8s %8s %8s %8s %14s\n", "stage", "params", "grads", "master", "optim", "buckets",
           "gathered", "total", "traffic/step");
    for (int s = 0; s < 4; ++s) {
      printf("%-6d", s);
      for (int c = 0; c < 7; ++c) printf(" %8llu", (unsigned long long)table[s][c]);
      printf(" %14llu\n", (unsigned long long)table[s][7]);
    }
  }
  CHECK(zero_comm_finalize(comm)); /* the last communicator: libzero finalises the MPI it initialised */
  zero_comm_destroy(comm);
  return 0;
}
