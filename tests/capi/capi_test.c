/*
 * The C API in plain C (CMocka): every call with NULL and wrong-state arguments returns its documented status
 * with a message that names the problem, and a whole training run on a one-rank communicator. Run under ASan
 * and UBSan in CI, which also proves that failed calls leak nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "zero/zero.h"

static const char* kConfig =
    "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
    " \"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 0}}";

/* Asserts the status and that zero_last_error() mentions `fragment`. */
#define assert_fails(call, status, fragment)                                         \
  do {                                                                               \
    assert_int_equal((call), (status));                                              \
    if (strstr(zero_last_error(), (fragment)) == NULL)                               \
      fail_msg("message '%s' does not mention '%s'", zero_last_error(), (fragment)); \
  } while (0)

static zero_engine_t* new_engine(zero_comm_t** comm) {
  zero_engine_t* engine = NULL;
  assert_int_equal(zero_comm_create_single(comm), ZERO_OK);
  assert_int_equal(zero_engine_create(&engine, kConfig, *comm), ZERO_OK);
  return engine;
}

static int32_t add_param(zero_engine_t* engine, const char* name, int64_t n, int32_t unit) {
  zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
  int64_t shape[1];
  shape[0] = n;
  d.name = name;
  d.ndim = 1;
  d.shape = shape;
  d.unit = unit;
  int32_t id = -1;
  assert_int_equal(zero_engine_add_param(&id, engine, &d), ZERO_OK);
  return id;
}

static void test_status_strings_and_version(void** state) {
  (void)state;
  assert_string_equal(zero_status_string(ZERO_OK), "ZERO_OK");
  assert_string_equal(zero_status_string(ZERO_ERR_MISMATCH), "ZERO_ERR_MISMATCH");
  assert_string_equal(zero_status_string((zero_status_t)999), "unknown");
  assert_int_equal(zero_get_version(), ZERO_VERSION_NUMBER);
  assert_non_null(zero_last_error());
}

static void test_null_arguments(void** state) {
  (void)state;
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = NULL;
  int value = 0;
  int32_t id = 0;
  void* ptr = NULL;
  double scale = 0;
  assert_fails(zero_comm_create_single(NULL), ZERO_ERR_INVALID_ARGUMENT, "out_comm is NULL");
  assert_fails(zero_comm_create_mpi(NULL, ZERO_MPI_COMM_WORLD), ZERO_ERR_INVALID_ARGUMENT, "out_comm is NULL");
  assert_fails(zero_comm_rank(NULL, NULL), ZERO_ERR_INVALID_ARGUMENT, "out_rank is NULL");
  assert_fails(zero_comm_rank(&value, NULL), ZERO_ERR_INVALID_ARGUMENT, "comm is NULL");
  assert_fails(zero_comm_size(&value, NULL), ZERO_ERR_INVALID_ARGUMENT, "comm is NULL");
  assert_fails(zero_engine_create(NULL, kConfig, NULL), ZERO_ERR_INVALID_ARGUMENT, "out_engine is NULL");
  assert_fails(zero_engine_create(&engine, kConfig, NULL), ZERO_ERR_INVALID_ARGUMENT, "comm is NULL");
  assert_null(engine);
  assert_int_equal(zero_comm_create_single(&comm), ZERO_OK);
  assert_fails(zero_engine_create(&engine, NULL, comm), ZERO_ERR_INVALID_ARGUMENT, "json_config is NULL");
  assert_null(engine);

  zero_param_group_desc_t g = ZERO_PARAM_GROUP_DESC_INIT;
  zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
  assert_fails(zero_engine_add_param_group(NULL, NULL, &g), ZERO_ERR_INVALID_ARGUMENT, "out_group is NULL");
  assert_fails(zero_engine_add_param_group(&id, NULL, &g), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_engine_add_param(&id, NULL, &d), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_engine_add_param(NULL, NULL, &d), ZERO_ERR_INVALID_ARGUMENT, "out_param is NULL");
  assert_fails(zero_engine_finalize(NULL), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_param_data(&ptr, NULL, 0), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_param_data(NULL, NULL, 0), ZERO_ERR_INVALID_ARGUMENT, "out_data is NULL");
  assert_fails(zero_grad_data(&ptr, NULL, 0), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_grad_data(NULL, NULL, 0), ZERO_ERR_INVALID_ARGUMENT, "out_data is NULL");
  assert_fails(zero_gather(NULL, 0), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_release(NULL, 0), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_grad_ready(NULL, 0), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_backward_end(NULL), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_step(NULL, NULL), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_loss_scale(&scale, NULL), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_loss_scale(NULL, NULL), ZERO_ERR_INVALID_ARGUMENT, "out_scale is NULL");
  assert_fails(zero_set_lr(NULL, 0, 0.1), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  zero_memory_stats_t mem = ZERO_MEMORY_STATS_INIT;
  zero_comm_stats_t cs = ZERO_COMM_STATS_INIT;
  assert_fails(zero_memory_stats(NULL, &mem), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  zero_engine_info_t info = ZERO_ENGINE_INFO_INIT;
  assert_fails(zero_engine_info(NULL, &info), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_comm_stats(NULL, &cs), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");

  zero_comm_destroy(comm);
  engine = new_engine(&comm);
  assert_fails(zero_engine_add_param_group(&id, engine, NULL), ZERO_ERR_INVALID_ARGUMENT, "pointer is NULL");
  assert_fails(zero_engine_add_param(&id, engine, NULL), ZERO_ERR_INVALID_ARGUMENT, "pointer is NULL");
  assert_fails(zero_engine_add_param(&id, engine, &d), ZERO_ERR_INVALID_ARGUMENT, "desc->name is NULL");
  d.name = "w";
  d.ndim = 2;
  assert_fails(zero_engine_add_param(&id, engine, &d), ZERO_ERR_INVALID_ARGUMENT, "desc->shape is NULL");
  d.ndim = 9;
  assert_fails(zero_engine_add_param(&id, engine, &d), ZERO_ERR_INVALID_ARGUMENT, "ndim");
  d.ndim = 0;
  d.dtype = ZERO_DTYPE_BF16;
  assert_fails(zero_engine_add_param(&id, engine, &d), ZERO_ERR_INVALID_ARGUMENT, "the engine computes in fp32");
  d.dtype = (zero_dtype_t)7;
  assert_fails(zero_engine_add_param(&id, engine, &d), ZERO_ERR_INVALID_ARGUMENT, "not a zero_dtype_t");
  d.dtype = ZERO_DTYPE_FP32;
  d.init_dtype = 9;
  assert_fails(zero_engine_add_param(&id, engine, &d), ZERO_ERR_INVALID_ARGUMENT, "init_dtype");
  d.init_dtype = -1;
  d.struct_size = 8;
  assert_fails(zero_engine_add_param(&id, engine, &d), ZERO_ERR_INVALID_ARGUMENT, "ZERO_PARAM_DESC_INIT");
  assert_fails(zero_memory_stats(engine, NULL), ZERO_ERR_INVALID_ARGUMENT, "NULL");
  mem.struct_size = 0;
  assert_fails(zero_memory_stats(engine, &mem), ZERO_ERR_INVALID_ARGUMENT, "ZERO_MEMORY_STATS_INIT");
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
}

static void test_wrong_order(void** state) {
  (void)state;
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = new_engine(&comm);
  void* ptr = NULL;
  assert_fails(zero_engine_finalize(engine), ZERO_ERR_INVALID_STATE, "no params");
  assert_fails(zero_param_data(&ptr, engine, 0), ZERO_ERR_INVALID_STATE, "zero_engine_finalize first");
  assert_fails(zero_gather(engine, 0), ZERO_ERR_INVALID_STATE, "zero_engine_finalize first");
  assert_fails(zero_step(engine, NULL), ZERO_ERR_INVALID_STATE, "zero_engine_finalize first");
  int32_t w = add_param(engine, "w", 10, 0);
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  assert_fails(zero_engine_finalize(engine), ZERO_ERR_INVALID_STATE, "before zero_engine_finalize");
  int32_t id = 0;
  zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
  d.name = "late";
  assert_fails(zero_engine_add_param(&id, engine, &d), ZERO_ERR_INVALID_STATE, "before zero_engine_finalize");
  assert_fails(zero_param_data(&ptr, engine, w), ZERO_ERR_INVALID_STATE, "zero_gather(engine, 0)");
  assert_null(ptr); /* a failed call leaves its outputs untouched */
  assert_fails(zero_param_data(&ptr, engine, 7), ZERO_ERR_INVALID_ARGUMENT, "no param with id 7");
  assert_fails(zero_release(engine, 0), ZERO_ERR_INVALID_STATE, "not gathered");
  assert_fails(zero_gather(engine, 3), ZERO_ERR_INVALID_ARGUMENT, "no unit 3");
  assert_fails(zero_step(engine, NULL), ZERO_ERR_INVALID_STATE, "got 0");
  zero_step_info_t info = ZERO_STEP_INFO_INIT;
  info.struct_size = 1;
  assert_fails(zero_step(engine, &info), ZERO_ERR_INVALID_ARGUMENT, "ZERO_STEP_INFO_INIT");
  assert_fails(zero_set_lr(engine, 4, 0.1), ZERO_ERR_INVALID_ARGUMENT, "no param group 4");
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
}

static void test_bad_config(void** state) {
  (void)state;
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = NULL;
  assert_int_equal(zero_comm_create_single(&comm), ZERO_OK);
  assert_fails(zero_engine_create(&engine, "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimizaton\": {}}", comm),
               ZERO_ERR_CONFIG, "did you mean 'zero_optimization'");
  assert_null(engine);
  assert_fails(
      zero_engine_create(&engine,
                         "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"offload_optimizer\": "
                         "{\"device\": \"cpu\"}}}",
                         comm),
      ZERO_ERR_UNSUPPORTED, "offload_optimizer");
  assert_fails(zero_engine_create(&engine, "not json", comm), ZERO_ERR_CONFIG, "not valid JSON");
  assert_null(engine);
  zero_comm_destroy(comm);
}

/* A whole run through the ABI: the comm may be destroyed before the engine (the engine keeps it alive). */
static void test_training_run(void** state) {
  (void)state;
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = new_engine(&comm);
  int rank = -1, size = -1;
  assert_int_equal(zero_comm_rank(&rank, comm), ZERO_OK);
  assert_int_equal(zero_comm_size(&size, comm), ZERO_OK);
  assert_int_equal(rank, 0);
  assert_int_equal(size, 1);
  zero_comm_destroy(comm);
  zero_engine_info_t info = ZERO_ENGINE_INFO_INIT;
  assert_int_equal(zero_engine_info(engine, &info), ZERO_OK);
  assert_int_equal(info.world_size, 1);
  assert_int_equal(info.stage, 3);
  assert_int_equal(info.param_dtype, ZERO_DTYPE_FP32);
  assert_int_equal(info.grad_dtype, ZERO_DTYPE_FP32);
  assert_int_equal(info.num_units, 0);
  const float init[3] = {1.0f, 2.0f, 3.0f};
  zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
  int64_t shape[1] = {3};
  d.name = "w";
  d.ndim = 1;
  d.shape = shape;
  d.init_data = init;
  int32_t w = -1;
  assert_int_equal(zero_engine_add_param(&w, engine, &d), ZERO_OK);
  assert_int_equal(w, 0);
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  double scale = 0;
  assert_int_equal(zero_loss_scale(&scale, engine), ZERO_OK);
  assert_true(scale == 1.0);
  for (int step = 1; step <= 3; ++step) {
    float* p = NULL;
    float* g = NULL;
    assert_int_equal(zero_gather(engine, 0), ZERO_OK);
    assert_int_equal(zero_param_data((void**)&p, engine, w), ZERO_OK);
    if (step == 1) assert_memory_equal(p, init, sizeof init);
    assert_int_equal(zero_grad_data((void**)&g, engine, w), ZERO_OK);
    for (int i = 0; i < 3; ++i) g[i] += p[i]; /* the gradient of 0.5 |w|^2 */
    assert_int_equal(zero_grad_ready(engine, w), ZERO_OK);
    assert_int_equal(zero_release(engine, 0), ZERO_OK);
    assert_int_equal(zero_backward_end(engine), ZERO_OK);
    zero_step_info_t info = ZERO_STEP_INFO_INIT;
    assert_int_equal(zero_step(engine, &info), ZERO_OK);
    assert_int_equal(info.step, step);
    assert_int_equal(info.skipped, 0);
    assert_true(info.grad_norm > 0);
  }
  zero_memory_stats_t mem = ZERO_MEMORY_STATS_INIT;
  assert_int_equal(zero_memory_stats(engine, &mem), ZERO_OK);
  assert_true(mem.total_bytes == mem.param_bytes + mem.grad_bytes + mem.master_param_bytes + mem.optimizer_state_bytes +
                                     mem.bucket_bytes + mem.gathered_bytes);
  assert_true(mem.param_bytes == 16 * sizeof(float)); /* 3 params padded to one 16-element shard */
  /* An older caller's smaller stats struct gets only the fields it knows. */
  zero_memory_stats_t old = ZERO_MEMORY_STATS_INIT;
  old.struct_size = offsetof(zero_memory_stats_t, grad_bytes);
  old.grad_bytes = 12345;
  assert_int_equal(zero_memory_stats(engine, &old), ZERO_OK);
  assert_true(old.param_bytes == mem.param_bytes);
  assert_true(old.grad_bytes == 12345);
  zero_comm_stats_t cs = ZERO_COMM_STATS_INIT;
  assert_int_equal(zero_comm_stats(engine, &cs), ZERO_OK);
  assert_true(cs.sequence == cs.all_gather.calls + cs.reduce_scatter.calls + cs.all_reduce.calls + cs.broadcast.calls);
  assert_true(cs.all_gather.calls == 3);
  assert_true(cs.all_gather.wire_bytes == 0); /* one rank sends nothing */
  zero_engine_destroy(engine);
  zero_engine_destroy(NULL);
  zero_comm_destroy(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_strings_and_version),
      cmocka_unit_test(test_null_arguments),
      cmocka_unit_test(test_wrong_order),
      cmocka_unit_test(test_bad_config),
      cmocka_unit_test(test_training_run),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
