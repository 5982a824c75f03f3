/*
 * Mismatched registration or config across ranks: zero_engine_finalize must return ZERO_ERR_MISMATCH on every rank,
 * naming the first differing param or config key with both values, instead of hanging in a collective of the wrong
 * size or silently training different replicas. A local error on one rank reaches every rank (ZERO_ERR_REMOTE with
 * that rank's message). CTest's timeout turns a hang into a failure.
 *
 *   mpirun -np N test_mismatch      (N >= 2)
 */
#include <string.h>

#include "harness.h"

typedef enum { kShape, kName, kExtraParam, kConfig, kBf16, kScheduler, kCommDtype, kLr, kLocalError } Scenario;

static const char* kBaseConfig = "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"stage\": 3}}";

/* What the odd rank's config says instead, and what the message must name. */
static const char* odd_config(Scenario s) {
  switch (s) {
    case kConfig:
      return "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"stage\": 2}}";
    case kBf16:
      return "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"stage\": 3}, \"bf16\": {\"enabled\": "
             "true}}";
    case kScheduler:
      return "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"stage\": 3}, \"scheduler\": {\"type\": "
             "\"WarmupLR\", \"params\": {\"warmup_num_steps\": 10}}}";
    case kCommDtype:
      return "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"stage\": 3}, \"bf16\": {\"enabled\": "
             "false}, \"communication_data_type\": \"bf16\"}";
    case kLr:
      return "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.0015}}, \"zero_optimization\": {\"stage\": "
             "3}}";
    default:
      return kBaseConfig;
  }
}

static void run(Scenario scenario, const char* label, zero_comm_t* comm, int rank, int world) {
  const int odd_rank = world - 1; /* the last rank registers something else */
  const int odd = rank == odd_rank;
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, odd ? odd_config(scenario) : kBaseConfig, comm));
  int32_t group = 0;
  zero_param_group_desc_t g = ZERO_PARAM_GROUP_DESC_INIT;
  CHECK(zero_engine_add_param_group(&group, engine, &g));
  for (int p = 0; p < kNumParams; ++p) {
    zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
    int64_t shape[2] = {kModel[p].shape[0], kModel[p].shape[1]};
    d.name = kModel[p].name;
    d.ndim = kModel[p].ndim;
    d.shape = shape;
    d.unit = kModel[p].unit;
    d.group = kModel[p].group;
    if (odd && p == 5 && scenario == kShape) shape[1] += 1;
    if (odd && p == 5 && scenario == kName) d.name = "head.w2_renamed";
    if (odd && p == 5 && scenario == kLocalError) d.unit = 7; /* leaves units 3..6 empty: a local error */
    int32_t id = 0;
    CHECK(zero_engine_add_param(&id, engine, &d));
  }
  if (odd && scenario == kExtraParam) {
    zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
    int64_t shape[1] = {4};
    d.name = "extra.bias";
    d.ndim = 1;
    d.shape = shape;
    d.unit = 2;
    int32_t id = 0;
    CHECK(zero_engine_add_param(&id, engine, &d));
  }
  zero_status_t s = zero_engine_finalize(engine);
  const char* msg = zero_last_error();
  zero_status_t want = ZERO_ERR_MISMATCH;
  const char* must_contain = "head.w2";
  if (scenario == kExtraParam) must_contain = "extra.bias";
  if (scenario == kConfig) must_contain = "'zero_optimization.stage' = 3, rank";
  if (scenario == kBf16) must_contain = "(the compute dtype)' = fp32, rank";
  if (scenario == kScheduler) must_contain = "'scheduler.type' = none, rank";
  if (scenario == kCommDtype) must_contain = "'communication_data_type' = fp32, rank";
  if (scenario == kLr) must_contain = "'optimizer.params.lr' = 0.001, rank";
  if (scenario == kLocalError) {
    /* The rank that failed reports its own error; the others hear of it, with its message. */
    want = odd ? ZERO_ERR_INVALID_ARGUMENT : ZERO_ERR_REMOTE;
    must_contain = "unit 3 has no params";
  }
  EXPECT(s == want, "%s: rank %d got %s (%s)", label, rank, zero_status_string(s), msg);
  EXPECT(strstr(msg, must_contain) != NULL, "%s: rank %d: message does not name '%s': %s", label, rank, must_contain,
         msg);
  if (rank == 0) printf("%s: every rank got %s: %s\n", label, zero_status_string(s), msg);
  /* The engine is still registering: a wrong-order call is refused, destroy is fine. */
  EXPECT(zero_step(NULL, engine) == ZERO_ERR_INVALID_STATE, "%s: zero_step after a failed finalize", label);
  zero_engine_destroy(engine);
}

int main(void) {
  zero_comm_t* comm = NULL;
  CHECK(zero_comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD));
  int rank = 0, world = 1;
  CHECK(zero_comm_rank(&rank, comm));
  CHECK(zero_comm_size(&world, comm));
  EXPECT(world >= 2, "run with at least 2 ranks");
  run(kShape, "different shape", comm, rank, world);
  run(kName, "different name", comm, rank, world);
  run(kExtraParam, "extra param", comm, rank, world);
  run(kConfig, "different config", comm, rank, world);
  run(kBf16, "bf16 on one rank only", comm, rank, world);
  run(kScheduler, "a scheduler on one rank only", comm, rank, world);
  run(kCommDtype, "communication_data_type on one rank only", comm, rank, world);
  run(kLr, "a different learning rate on one rank", comm, rank, world);
  run(kLocalError, "local error on one rank", comm, rank, world);
  CHECK(zero_comm_finalize(comm)); /* libzero initialised MPI here, so this also finalises it */
  zero_comm_destroy(comm);
  return 0;
}
