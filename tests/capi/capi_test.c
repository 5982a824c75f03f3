/*
 * The C API in plain C (CMocka): every call with NULL and wrong-state arguments returns its documented status
 * with a message that names the problem; the struct_size rules (init functions, smaller, larger with a zero or a
 * non-zero tail); the views' metadata; logging, abort, the per-engine error; a custom communicator; and a whole
 * training run on a one-rank communicator. Run under ASan and UBSan in CI, which also proves that failed calls
 * leak nothing.
 */
#define ZERO_EXPERIMENTAL_API
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static zero_engine_t* new_engine_with(zero_comm_t** comm, const char* config) {
  zero_engine_t* engine = NULL;
  assert_int_equal(zero_comm_create_single(comm), ZERO_OK);
  assert_int_equal(zero_engine_create(&engine, config, *comm), ZERO_OK);
  return engine;
}

static zero_engine_t* new_engine(zero_comm_t** comm) { return new_engine_with(comm, kConfig); }

static int32_t add_param(zero_engine_t* engine, const char* name, int64_t n, int32_t unit) {
  zero_param_desc_t d;
  assert_int_equal(zero_param_desc_init(&d, sizeof d), ZERO_OK);
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
  assert_string_equal(zero_status_string(ZERO_ERR_REMOTE), "ZERO_ERR_REMOTE");
  assert_string_equal(zero_status_string(ZERO_ERR_TIMEOUT), "ZERO_ERR_TIMEOUT");
  assert_string_equal(zero_status_string(ZERO_ERR_ABORTED), "ZERO_ERR_ABORTED");
  /* Any int32 is a valid argument: out-of-range values are named, never undefined behaviour. */
  assert_string_equal(zero_status_string(999), "unknown");
  assert_string_equal(zero_status_string(-1), "unknown");
  assert_string_equal(zero_status_string(INT32_MIN), "unknown");
  assert_int_equal(zero_get_version(), ZERO_VERSION_NUMBER);
  assert_non_null(zero_last_error());
  zero_string_destroy(NULL);
}

static void test_null_arguments(void** state) {
  (void)state;
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = NULL;
  int32_t value = 0;
  int32_t id = 0;
  void* ptr = NULL;
  double scale = 0;
  assert_fails(zero_comm_create_single(NULL), ZERO_ERR_INVALID_ARGUMENT, "out_comm is NULL");
  assert_fails(zero_comm_create_mpi(NULL, ZERO_MPI_COMM_WORLD), ZERO_ERR_INVALID_ARGUMENT, "out_comm is NULL");
  assert_fails(zero_comm_create_custom(NULL, NULL, NULL), ZERO_ERR_INVALID_ARGUMENT, "out_comm is NULL");
  assert_fails(zero_comm_create_custom(&comm, NULL, NULL), ZERO_ERR_INVALID_ARGUMENT, "zero_comm_ops_t pointer");
  assert_null(comm);
  assert_fails(zero_comm_rank(NULL, NULL), ZERO_ERR_INVALID_ARGUMENT, "out_rank is NULL");
  assert_fails(zero_comm_rank(&value, NULL), ZERO_ERR_INVALID_ARGUMENT, "comm is NULL");
  assert_fails(zero_comm_size(&value, NULL), ZERO_ERR_INVALID_ARGUMENT, "comm is NULL");
  assert_fails(zero_comm_finalize(NULL), ZERO_ERR_INVALID_ARGUMENT, "comm is NULL");
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
  assert_fails(zero_engine_set_num_threads(NULL, 1), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_save_checkpoint(NULL, "d", "t"), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_load_checkpoint(NULL, "d", NULL), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  zero_memory_stats_t mem = ZERO_MEMORY_STATS_INIT;
  zero_comm_stats_t cs = ZERO_COMM_STATS_INIT;
  zero_engine_info_t info = ZERO_ENGINE_INFO_INIT;
  zero_param_info_t pi = ZERO_PARAM_INFO_INIT;
  zero_unit_info_t ui = ZERO_UNIT_INFO_INIT;
  assert_fails(zero_memory_stats(&mem, NULL), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_engine_info(&info, NULL), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_comm_stats(&cs, NULL), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_param_info(&pi, NULL, 0), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_unit_info(&ui, NULL, 0), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  char* report = NULL;
  assert_fails(zero_config_check(NULL, kConfig, 1), ZERO_ERR_INVALID_ARGUMENT, "out_report is NULL");
  assert_fails(zero_config_check(&report, NULL, 1), ZERO_ERR_INVALID_ARGUMENT, "json_config is NULL");
  assert_fails(zero_config_check(&report, kConfig, 0), ZERO_ERR_INVALID_ARGUMENT, "world_size");
  assert_null(report);
  assert_fails(zero_engine_recent_collectives(NULL, NULL), ZERO_ERR_INVALID_ARGUMENT, "out_json is NULL");
  assert_fails(zero_engine_recent_collectives(&report, NULL), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_non_null(zero_engine_last_error(NULL));
  zero_engine_abort(NULL);

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
  d.dtype = 7;
  assert_fails(zero_engine_add_param(&id, engine, &d), ZERO_ERR_INVALID_ARGUMENT, "desc->dtype");
  d.dtype = ZERO_DTYPE_FP64; /* a communicator dtype, not a param dtype */
  assert_fails(zero_engine_add_param(&id, engine, &d), ZERO_ERR_INVALID_ARGUMENT, "desc->dtype");
  d.dtype = -1;
  d.init_dtype = 9;
  assert_fails(zero_engine_add_param(&id, engine, &d), ZERO_ERR_INVALID_ARGUMENT, "init_dtype");
  d.init_dtype = -1;
  d.name = "bad\xff\xfename";
  assert_fails(zero_engine_add_param(&id, engine, &d), ZERO_ERR_INVALID_ARGUMENT, "not valid UTF-8");
  d.name = "w";
  int64_t huge[2] = {INT64_C(1) << 32, INT64_C(1) << 32};
  d.ndim = 2;
  d.shape = huge;
  assert_fails(zero_engine_add_param(&id, engine, &d), ZERO_ERR_INVALID_ARGUMENT, "more than 2^56 elements");
  d.ndim = 0;
  d.shape = NULL;
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
}

/* struct_size: the init functions, a smaller struct than this ABI's, a larger one with a zero tail (accepted)
 * and with a non-zero tail (refused, naming the offset). */
typedef struct {
  zero_param_desc_t known;
  uint64_t newer_field;
} NewerParamDesc;

typedef struct {
  zero_memory_stats_t known;
  uint64_t newer_field;
} NewerMemoryStats;

static void test_struct_sizes(void** state) {
  (void)state;
  zero_param_desc_t d;
  memset(&d, 0x5a, sizeof d);
  assert_int_equal(zero_param_desc_init(&d, sizeof d), ZERO_OK);
  assert_int_equal(d.struct_size, sizeof d);
  assert_int_equal(d.dtype, -1);
  assert_int_equal(d.init_dtype, -1);
  assert_null(d.name);
  assert_fails(zero_param_desc_init(NULL, sizeof d), ZERO_ERR_INVALID_ARGUMENT, "NULL");
  assert_fails(zero_param_desc_init(&d, 8), ZERO_ERR_INVALID_ARGUMENT, "smaller than zero_param_desc_t");

  /* Every init function, with a larger struct: defaults set, the unknown tail zeroed. */
  NewerParamDesc newer;
  memset(&newer, 0x5a, sizeof newer);
  assert_int_equal(zero_param_desc_init(&newer.known, sizeof newer), ZERO_OK);
  assert_int_equal(newer.known.struct_size, sizeof newer);
  assert_true(newer.newer_field == 0);
  zero_param_group_desc_t g;
  assert_int_equal(zero_param_group_desc_init(&g, sizeof g), ZERO_OK);
  assert_true(g.lr == ZERO_INHERIT && g.eps == ZERO_INHERIT);
  zero_step_info_t si;
  assert_int_equal(zero_step_info_init(&si, sizeof si), ZERO_OK);
  zero_engine_info_t ei;
  assert_int_equal(zero_engine_info_init(&ei, sizeof ei), ZERO_OK);
  zero_memory_stats_t ms;
  assert_int_equal(zero_memory_stats_init(&ms, sizeof ms), ZERO_OK);
  zero_comm_stats_t cs;
  assert_int_equal(zero_comm_stats_init(&cs, sizeof cs), ZERO_OK);
  zero_param_info_t pi;
  assert_int_equal(zero_param_info_init(&pi, sizeof pi), ZERO_OK);
  zero_unit_info_t ui;
  assert_int_equal(zero_unit_info_init(&ui, sizeof ui), ZERO_OK);
  zero_comm_ops_t ops;
  assert_int_equal(zero_comm_ops_init(&ops, sizeof ops), ZERO_OK);
  assert_int_equal(ops.size, 1);
  assert_null(ops.run);
  zero_collective_t coll;
  assert_int_equal(zero_collective_init(&coll, sizeof coll), ZERO_OK);
  assert_fails(zero_unit_info_init(&ui, 4), ZERO_ERR_INVALID_ARGUMENT, "zero_unit_info_t");

  zero_comm_t* comm = NULL;
  zero_engine_t* engine = new_engine(&comm);
  int32_t id = -1;
  int64_t shape[1] = {4};
  /* Input: smaller than 0.3's struct. */
  d.name = "w";
  d.ndim = 1;
  d.shape = shape;
  d.struct_size = offsetof(zero_param_desc_t, init_dtype);
  assert_fails(zero_engine_add_param(&id, engine, &d), ZERO_ERR_INVALID_ARGUMENT, "zero_param_desc_init");
  /* Input: larger with a zero tail (a newer header whose new field keeps its default) is accepted. */
  newer.known.name = "w";
  newer.known.ndim = 1;
  newer.known.shape = shape;
  assert_int_equal(zero_engine_add_param(&id, engine, &newer.known), ZERO_OK);
  /* Input: larger with a non-zero tail is refused, never silently truncated. */
  newer.known.name = "v";
  newer.newer_field = 1;
  char offset[32];
  snprintf(offset, sizeof offset, "byte offset %zu", offsetof(NewerParamDesc, newer_field));
  assert_fails(zero_engine_add_param(&id, engine, &newer.known), ZERO_ERR_UNSUPPORTED, offset);
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);

  /* Output: smaller than 0.3's struct is refused; larger is filled up to what the library knows and struct_size
   * says how much that was; the unknown tail keeps what the caller put there. */
  ms.struct_size = offsetof(zero_memory_stats_t, grad_bytes);
  assert_fails(zero_memory_stats(&ms, engine), ZERO_ERR_INVALID_ARGUMENT, "zero_memory_stats_init");
  NewerMemoryStats big;
  assert_int_equal(zero_memory_stats_init(&big.known, sizeof big), ZERO_OK);
  big.newer_field = 777;
  assert_int_equal(zero_memory_stats(&big.known, engine), ZERO_OK);
  assert_int_equal(big.known.struct_size, sizeof(zero_memory_stats_t));
  assert_true(big.newer_field == 777);
  assert_true(big.known.param_bytes > 0);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
}

/* A program built against 0.3's zero.h passes the structs 0.4 grew at their 0.3 sizes: init functions, inputs and
 * outputs accept them, and the fields 0.4 appended keep their defaults. Frozen params' registration checks. */
static void test_structs_of_an_older_header(void** state) {
  (void)state;
  const size_t desc_03 = offsetof(zero_param_desc_t, flags),
               stats_03 = offsetof(zero_memory_stats_t, frozen_param_bytes),
               info_03 = offsetof(zero_param_info_t, flags);
  assert_int_equal(desc_03, 64);
  assert_int_equal(stats_03, 64);
  assert_int_equal(info_03, 128);
  zero_param_desc_t d;
  memset(&d, 0x5a, sizeof d);
  assert_int_equal(zero_param_desc_init(&d, desc_03), ZERO_OK);
  assert_int_equal(d.struct_size, desc_03);
  assert_true(d.flags == 0x5a5a5a5au); /* beyond the 0.3 size: not touched */
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = new_engine(&comm);
  int64_t shape[1] = {3};
  d.name = "w";
  d.ndim = 1;
  d.shape = shape;
  int32_t id = -1;
  assert_int_equal(zero_engine_add_param(&id, engine, &d), ZERO_OK); /* trained: flags not read */

  zero_param_desc_t f;
  assert_int_equal(zero_param_desc_init(&f, sizeof f), ZERO_OK);
  f.name = "q";
  f.ndim = 1;
  f.shape = shape;
  f.flags = ZERO_PARAM_FROZEN | 4;
  assert_fails(zero_engine_add_param(&id, engine, &f), ZERO_ERR_UNSUPPORTED, "flags has bits");
  f.flags = ZERO_PARAM_FROZEN;
  f.dtype = 8;
  assert_fails(zero_engine_add_param(&id, engine, &f), ZERO_ERR_INVALID_ARGUMENT, "frozen param");
  f.dtype = ZERO_DTYPE_UINT8;
  f.init_dtype = ZERO_DTYPE_FP32;
  assert_fails(zero_engine_add_param(&id, engine, &f), ZERO_ERR_INVALID_ARGUMENT, "copied as they are");
  f.init_dtype = -1;
  const unsigned char packed[3] = {0x0f, 0xf0, 0xa5};
  f.init_data = packed;
  assert_int_equal(zero_engine_add_param(&id, engine, &f), ZERO_OK);
  zero_param_desc_t t;
  assert_int_equal(zero_param_desc_init(&t, sizeof t), ZERO_OK);
  t.name = "u8";
  t.ndim = 1;
  t.shape = shape;
  t.dtype = ZERO_DTYPE_UINT8;
  assert_fails(zero_engine_add_param(&id, engine, &t), ZERO_ERR_INVALID_ARGUMENT, "ZERO_PARAM_FROZEN");
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);

  zero_memory_stats_t ms;
  memset(&ms, 0x5a, sizeof ms);
  assert_int_equal(zero_memory_stats_init(&ms, stats_03), ZERO_OK);
  assert_int_equal(zero_memory_stats(&ms, engine), ZERO_OK);
  assert_int_equal(ms.struct_size, stats_03);
  assert_true(ms.frozen_param_bytes == 0x5a5a5a5a5a5a5a5aull); /* not written beyond what the caller has */
  zero_memory_stats_t full = ZERO_MEMORY_STATS_INIT;
  assert_int_equal(zero_memory_stats(&full, engine), ZERO_OK);
  assert_true(full.frozen_param_bytes == 64); /* 3 bytes, whole at N = 1, padded to 64 */
  assert_true(full.total_bytes == ms.total_bytes);
  zero_param_info_t info;
  assert_int_equal(zero_param_info_init(&info, info_03), ZERO_OK);
  assert_int_equal(zero_param_info(&info, engine, 1), ZERO_OK);
  assert_int_equal(info.param_dtype, ZERO_DTYPE_UINT8);
  assert_int_equal(info.grad_dtype, -1);
  /* The frozen param's bytes, as registered; it has no gradient. */
  assert_int_equal(zero_gather(engine, 0), ZERO_OK);
  void* data = NULL;
  assert_int_equal(zero_param_data(&data, engine, 1), ZERO_OK);
  assert_memory_equal(data, packed, sizeof packed);
  assert_fails(zero_grad_data(&data, engine, 1), ZERO_ERR_INVALID_ARGUMENT, "is frozen");
  assert_fails(zero_grad_ready(engine, 1), ZERO_ERR_INVALID_ARGUMENT, "is frozen");
  /* zero_release_modified on one rank: this rank's writes become the values. */
  ((unsigned char*)data)[1] = 0x42;
  assert_fails(zero_release_modified(engine, 0, 1), ZERO_ERR_INVALID_ARGUMENT, "modifier rank 1 is not a rank");
  assert_int_equal(zero_release_modified(engine, 0, 0), ZERO_OK);
  assert_fails(zero_release_modified(engine, 0, 0), ZERO_ERR_INVALID_STATE, "not gathered");
  assert_int_equal(zero_gather(engine, 0), ZERO_OK);
  assert_int_equal(zero_param_data(&data, engine, 1), ZERO_OK);
  assert_int_equal(((unsigned char*)data)[1], 0x42);
  assert_int_equal(zero_release(engine, 0), ZERO_OK);

  zero_save_options_t so;
  memset(&so, 0x5a, sizeof so);
  assert_int_equal(zero_save_options_init(&so, sizeof so), ZERO_OK);
  assert_int_equal(so.exclude_frozen, 0);
  so.exclude_frozen = 2;
  assert_fails(zero_save_checkpoint_with(engine, "/nonexistent", "t", &so), ZERO_ERR_INVALID_ARGUMENT,
               "exclude_frozen must be 0 or 1");
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
}

/* 16-bit training from 16-bit values: they cross as they are (no detour through fp32, which would quiet a NaN's
 * payload), and the fp32 master is widened from them (an SGD step with lr 0 writes back the same bits). */
static void test_sixteen_bit_initial_values_cross_as_they_are(void** state) {
  (void)state;
  zero_comm_t* comm = NULL;
  zero_engine_t* engine =
      new_engine_with(&comm,
                      "{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0}}, \"bf16\": {\"enabled\": true},"
                      " \"gradient_clipping\": 0, \"zero_optimization\": {\"stage\": 1}}");
  const uint16_t values[6] = {0x7f81, 0x3f80, 0x0001, 0xff80,
                              0x8000, 0x4049}; /* a NaN with a payload, 1, a
                                                  denormal, -inf, -0, 3.14 */
  zero_param_desc_t d;
  assert_int_equal(zero_param_desc_init(&d, sizeof d), ZERO_OK);
  int64_t shape[1] = {6};
  d.name = "w";
  d.ndim = 1;
  d.shape = shape;
  d.init_data = values;
  d.init_dtype = ZERO_DTYPE_BF16;
  int32_t id = -1;
  assert_int_equal(zero_engine_add_param(&id, engine, &d), ZERO_OK);
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  void* data = NULL;
  assert_int_equal(zero_gather(engine, 0), ZERO_OK);
  assert_int_equal(zero_param_data(&data, engine, id), ZERO_OK);
  assert_memory_equal(data, values, sizeof values);
  assert_int_equal(zero_release(engine, 0), ZERO_OK);
  assert_int_equal(zero_backward_end(engine), ZERO_OK);
  assert_int_equal(zero_step(NULL, engine), ZERO_OK);
  assert_int_equal(zero_gather(engine, 0), ZERO_OK);
  assert_int_equal(zero_param_data(&data, engine, id), ZERO_OK);
  /* The finite values go through the master and back unchanged (the infinity and the NaN become NaNs: SGD's
   * weight-decay term multiplies them by zero). */
  const uint16_t* now = (const uint16_t*)data;
  for (int i = 1; i < 6; ++i)
    if (i != 3) assert_int_equal(now[i], values[i]);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
}

static void test_wrong_order(void** state) {
  (void)state;
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = new_engine(&comm);
  void* ptr = NULL;
  zero_unit_info_t ui = ZERO_UNIT_INFO_INIT;
  assert_fails(zero_engine_finalize(engine), ZERO_ERR_INVALID_STATE, "no params");
  assert_fails(zero_param_data(&ptr, engine, 0), ZERO_ERR_INVALID_STATE, "zero_engine_finalize first");
  assert_fails(zero_gather(engine, 0), ZERO_ERR_INVALID_STATE, "zero_engine_finalize first");
  assert_fails(zero_step(NULL, engine), ZERO_ERR_INVALID_STATE, "zero_engine_finalize first");
  assert_fails(zero_unit_info(&ui, engine, 0), ZERO_ERR_INVALID_STATE, "zero_engine_finalize first");
  /* The engine remembers its last error, whichever thread made it. */
  assert_non_null(strstr(zero_engine_last_error(engine), "zero_unit_info needs zero_engine_finalize first"));
  /* Nothing is planned before finalize: no figures rather than zeros that read as a measurement. */
  zero_memory_stats_t early_stats = ZERO_MEMORY_STATS_INIT;
  zero_memory_placement_t early_placement = ZERO_MEMORY_PLACEMENT_INIT;
  assert_fails(zero_memory_stats(&early_stats, engine), ZERO_ERR_INVALID_STATE,
               "zero_memory_stats: needs zero_engine_finalize first");
  assert_fails(zero_memory_placement(&early_placement, engine), ZERO_ERR_INVALID_STATE,
               "zero_memory_placement: needs zero_engine_finalize first");
  double lr = 0;
  assert_fails(zero_get_lr(&lr, engine, 0), ZERO_ERR_INVALID_STATE, "zero_engine_finalize first");
  int32_t w = add_param(engine, "w", 10, 0);
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  assert_fails(zero_engine_finalize(engine), ZERO_ERR_INVALID_STATE, "already finalized");
  /* The next step's rate: the config's, then zero_set_lr's. */
  assert_int_equal(zero_get_lr(&lr, engine, 0), ZERO_OK);
  assert_true(lr == 0.01);
  assert_int_equal(zero_set_lr(engine, 0, 0.25), ZERO_OK);
  assert_int_equal(zero_get_lr(&lr, engine, 0), ZERO_OK);
  assert_true(lr == 0.25);
  assert_int_equal(zero_set_lr(engine, 0, 0.01), ZERO_OK);
  assert_fails(zero_get_lr(&lr, engine, 1), ZERO_ERR_INVALID_ARGUMENT, "no param group 1");
  assert_fails(zero_get_lr(NULL, engine, 0), ZERO_ERR_INVALID_ARGUMENT, "out_lr is NULL");
  int32_t id = 0;
  zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
  d.name = "late";
  assert_fails(zero_engine_add_param(&id, engine, &d), ZERO_ERR_INVALID_STATE, "before zero_engine_finalize");
  assert_fails(zero_param_data(&ptr, engine, w), ZERO_ERR_INVALID_STATE, "zero_gather(engine, 0)");
  assert_null(ptr); /* a failed call leaves its outputs untouched */
  assert_fails(zero_param_data(&ptr, engine, 7), ZERO_ERR_INVALID_ARGUMENT, "no param with id 7");
  assert_fails(zero_release(engine, 0), ZERO_ERR_INVALID_STATE, "not gathered");
  assert_fails(zero_gather(engine, 3), ZERO_ERR_INVALID_ARGUMENT, "no unit 3");
  assert_fails(zero_unit_info(&ui, engine, 3), ZERO_ERR_INVALID_ARGUMENT, "no unit 3");
  assert_fails(zero_step(NULL, engine), ZERO_ERR_INVALID_STATE, "got 0");
  zero_step_info_t info = ZERO_STEP_INFO_INIT;
  info.struct_size = 1;
  assert_fails(zero_step(&info, engine), ZERO_ERR_INVALID_ARGUMENT, "zero_step_info_init");
  zero_step_options_t so;
  memset(&so, 0x5a, sizeof so);
  assert_int_equal(zero_step_options_init(&so, sizeof so), ZERO_OK);
  assert_int_equal(so.partial_window, 0);
  assert_int_equal(so.loss_averaged, 0);
  assert_fails(zero_step_with(NULL, engine, &so), ZERO_ERR_INVALID_STATE, "steps after fewer");
  so.partial_window = 1;
  assert_fails(zero_step_with(NULL, engine, &so), ZERO_ERR_INVALID_STATE, "nothing to average");
  so.loss_averaged = -1;
  assert_fails(zero_step_with(NULL, engine, &so), ZERO_ERR_INVALID_ARGUMENT, "must be 0 or 1");
  so.struct_size = 4;
  assert_fails(zero_step_with(NULL, engine, &so), ZERO_ERR_INVALID_ARGUMENT, "zero_step_options_init");
  assert_fails(zero_step_options_init(&so, 4), ZERO_ERR_INVALID_ARGUMENT, "zero_step_options_t");
  assert_fails(zero_set_lr(engine, 4, 0.1), ZERO_ERR_INVALID_ARGUMENT, "no param group 4");
  assert_fails(zero_engine_set_num_threads(engine, -2), ZERO_ERR_INVALID_ARGUMENT, "threads must be in [0, 4096]");
  /* A checkpoint between zero_grad_data and zero_backward_end would leave the micro-step half-done: refused
   * (checked before the directory is looked at, so none is needed here). */
  assert_int_equal(zero_grad_data(&ptr, engine, w), ZERO_OK);
  assert_fails(zero_save_checkpoint(engine, "/nonexistent-dir", "t"), ZERO_ERR_INVALID_STATE, "a micro-step has begun");
  assert_fails(zero_load_checkpoint(engine, "/nonexistent-dir", NULL), ZERO_ERR_INVALID_STATE,
               "a micro-step has begun");
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
  assert_fails(zero_engine_create(&engine,
                                  "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"stage\": 3, "
                                  "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/x\", "
                                  "\"ratio\": 0.5}}}",
                                  comm),
               ZERO_ERR_UNSUPPORTED, "offload_optimizer.ratio");
  assert_fails(zero_engine_create(&engine, "not json", comm), ZERO_ERR_CONFIG, "not valid JSON");
  assert_fails(
      zero_engine_create(&engine, "{\"optimizer\": {\"type\": \"AdamW\"}, \"libzero\": {\"timeout\": 5}}", comm),
      ZERO_ERR_CONFIG, "did you mean 'libzero.timeout_s'");
  assert_null(engine);
  /* zero_config_check: the same verdict without an engine, and the report on success. */
  char* report = NULL;
  assert_fails(zero_config_check(&report, "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimizaton\": {}}", 4),
               ZERO_ERR_CONFIG, "did you mean 'zero_optimization'");
  assert_null(report);
  assert_int_equal(zero_config_check(&report, kConfig, 4), ZERO_OK);
  assert_non_null(report);
  assert_non_null(strstr(report, "accepted by libzero for world size 4"));
  assert_non_null(strstr(report, "zero stage             3"));
  zero_string_destroy(report);
  zero_comm_destroy(comm);
}

/* Logging: a callback receives the warnings libzero would print. */
typedef struct {
  int calls;
  int32_t level, rank;
  char text[512];
} LogSink;

static void capture_log(void* user_data, int32_t level, int32_t rank, const char* message) {
  LogSink* sink = (LogSink*)user_data;
  sink->calls += 1;
  sink->level = level;
  sink->rank = rank;
  snprintf(sink->text, sizeof sink->text, "%s", message);
}

static void test_logging(void** state) {
  (void)state;
  LogSink sink;
  memset(&sink, 0, sizeof sink);
  assert_fails(zero_set_log_callback(capture_log, &sink, 9), ZERO_ERR_INVALID_ARGUMENT, "max_level");
  assert_int_equal(zero_set_log_callback(capture_log, &sink, ZERO_LOG_WARNING), ZERO_OK);
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = new_engine_with(
      &comm, "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"round_robin_gradients\": true}}");
  assert_int_equal(sink.calls, 1);
  assert_int_equal(sink.level, ZERO_LOG_WARNING);
  assert_int_equal(sink.rank, 0);
  assert_non_null(strstr(sink.text, "round_robin_gradients"));
  zero_engine_destroy(engine);
  /* ZERO_LOG_OFF: nothing. */
  assert_int_equal(zero_set_log_callback(capture_log, &sink, ZERO_LOG_OFF), ZERO_OK);
  assert_int_equal(
      zero_engine_create(
          &engine, "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"round_robin_gradients\": true}}",
          comm),
      ZERO_OK);
  assert_int_equal(sink.calls, 1);
  zero_engine_destroy(engine);
  assert_int_equal(zero_set_log_callback(NULL, NULL, ZERO_LOG_WARNING), ZERO_OK);
  zero_comm_destroy(comm);
}

/* Views: param and unit metadata, and the generation that changes on every gather and release, at every stage
 * (stage 0 too: zero_param_data needs a gather at every stage). */
static void test_views(void** state) {
  (void)state;
  for (int stage = 0; stage <= 3; ++stage) {
    char config[256];
    snprintf(config, sizeof config,
             "{\"optimizer\": {\"type\": \"AdamW\"}, \"bf16\": {\"enabled\": true},"
             " \"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 10}}",
             stage);
    zero_comm_t* comm = NULL;
    zero_engine_t* engine = new_engine_with(&comm, config);
    int64_t shape[3] = {2, 3, 5};
    zero_param_desc_t d = ZERO_PARAM_DESC_INIT; /* dtype -1: the engine's compute dtype, bf16 */
    d.name = "block.w";
    d.ndim = 3;
    d.shape = shape;
    d.unit = 1;
    int32_t w = -1, b = -1;
    assert_int_equal(zero_engine_add_param(&w, engine, &d), ZERO_OK);
    b = add_param(engine, "embed", 4, 0); /* a small unit: resident at stage 3 (threshold 10) */
    zero_param_info_t pi;
    assert_int_equal(zero_param_info_init(&pi, sizeof pi), ZERO_OK);
    assert_int_equal(zero_param_info(&pi, engine, w), ZERO_OK); /* before finalize too */
    assert_string_equal(pi.name, "block.w");
    assert_int_equal(pi.ndim, 3);
    assert_true(pi.shape[0] == 2 && pi.shape[1] == 3 && pi.shape[2] == 5 && pi.shape[3] == 0);
    assert_true(pi.numel == 30);
    assert_int_equal(pi.unit, 1);
    assert_int_equal(pi.group, 0);
    assert_int_equal(pi.param_dtype, ZERO_DTYPE_BF16);
    assert_int_equal(pi.grad_dtype, ZERO_DTYPE_FP32);
    assert_true(pi.param_bytes == 60 && pi.grad_bytes == 120);
    assert_fails(zero_param_info(&pi, engine, 2), ZERO_ERR_INVALID_ARGUMENT, "no param with id 2");
    assert_fails(zero_param_info(NULL, engine, 0), ZERO_ERR_INVALID_ARGUMENT, "NULL");
    assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
    for (int unit = 0; unit < 2; ++unit) {
      const int32_t param = unit == 0 ? b : w;
      zero_unit_info_t ui = ZERO_UNIT_INFO_INIT;
      assert_int_equal(zero_unit_info(&ui, engine, unit), ZERO_OK);
      assert_int_equal(ui.gathered, 0);
      assert_int_equal(ui.num_params, 1);
      assert_true(ui.numel == (unit == 0 ? 4u : 30u));
      const uint64_t g0 = ui.generation;
      void* p = NULL;
      assert_fails(zero_param_data(&p, engine, param), ZERO_ERR_INVALID_STATE, "not gathered");
      assert_int_equal(zero_gather(engine, unit), ZERO_OK);
      assert_int_equal(zero_unit_info(&ui, engine, unit), ZERO_OK);
      assert_int_equal(ui.gathered, 1);
      const uint64_t g1 = ui.generation;
      assert_true(g1 != g0);
      assert_int_equal(zero_param_data(&p, engine, param), ZERO_OK);
      assert_int_equal(zero_release(engine, unit), ZERO_OK);
      assert_int_equal(zero_unit_info(&ui, engine, unit), ZERO_OK);
      assert_int_equal(ui.gathered, 0);
      assert_true(ui.generation != g1 && ui.generation != g0);
      /* A view made before a release and a new gather sees a different generation. */
      assert_int_equal(zero_gather(engine, unit), ZERO_OK);
      assert_int_equal(zero_unit_info(&ui, engine, unit), ZERO_OK);
      assert_true(ui.generation != g1);
      assert_int_equal(zero_release(engine, unit), ZERO_OK);
    }
    zero_engine_destroy(engine);
    zero_comm_destroy(comm);
  }
}

/* Abort: every later call says ZERO_ERR_ABORTED; destroy still works. */
static void test_abort(void** state) {
  (void)state;
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = new_engine(&comm);
  zero_engine_t* other = NULL;
  assert_int_equal(zero_engine_create(&other, kConfig, comm), ZERO_OK);
  add_param(other, "v", 3, 0);
  int32_t w = add_param(engine, "w", 10, 0);
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  zero_engine_abort(engine);
  zero_engine_abort(engine); /* twice is fine */
  assert_fails(zero_gather(engine, 0), ZERO_ERR_ABORTED, "zero_engine_abort");
  void* p = NULL;
  assert_fails(zero_grad_data(&p, engine, w), ZERO_ERR_ABORTED, "zero_engine_abort");
  assert_fails(zero_step(NULL, engine), ZERO_ERR_ABORTED, "zero_engine_abort");
  /* Another engine on the aborted communicator is unusable too (the collective sequence is gone), and no new
   * one can be made on it. */
  assert_fails(zero_engine_finalize(other), ZERO_ERR_ABORTED, "aborted");
  zero_engine_t* third = NULL;
  assert_fails(zero_engine_create(&third, kConfig, comm), ZERO_ERR_ABORTED, "aborted");
  zero_engine_destroy(other);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
}

/* A custom communicator: a one-rank backend written here, blocking (run only). The table is validated, its
 * destroy callback runs exactly once, when the last reference goes. */
typedef struct {
  int runs;
  int destroyed;
} CustomState;

static zero_status_t custom_run(void* user_data, const zero_collective_t* coll) {
  CustomState* s = (CustomState*)user_data;
  s->runs += 1;
  /* With one rank every collective leaves the buffer as it is. */
  return coll->struct_size >= sizeof(zero_collective_t) && coll->sequence == (uint64_t)s->runs ? ZERO_OK
                                                                                               : ZERO_ERR_INTERNAL;
}

static void custom_destroy(void* user_data) { ((CustomState*)user_data)->destroyed += 1; }

static zero_status_t custom_start(void** out_request, void* user_data, const zero_collective_t* coll) {
  (void)out_request, (void)user_data, (void)coll;
  return ZERO_OK;
}

/* An engine on `comm` with one 10-element param, finalized, after one step of a gradient of 1 in its first element. */
static zero_engine_t* engine_after_one_step(zero_comm_t* comm) {
  zero_engine_t* engine = NULL;
  assert_int_equal(zero_engine_create(&engine, kConfig, comm), ZERO_OK);
  int32_t w = add_param(engine, "w", 10, 0);
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  assert_int_equal(zero_gather(engine, 0), ZERO_OK);
  float* g = NULL;
  assert_int_equal(zero_grad_data((void**)&g, engine, w), ZERO_OK);
  g[0] += 1.0f;
  assert_int_equal(zero_grad_ready(engine, w), ZERO_OK);
  assert_int_equal(zero_release(engine, 0), ZERO_OK);
  assert_int_equal(zero_backward_end(engine), ZERO_OK);
  assert_int_equal(zero_step(NULL, engine), ZERO_OK);
  return engine;
}

static zero_status_t custom_group(void* user_data) {
  (void)user_data;
  return ZERO_OK;
}

static void test_custom_communicator(void** state) {
  (void)state;
  CustomState cs = {0, 0};
  zero_comm_ops_t ops;
  zero_comm_t* comm = NULL;
  assert_int_equal(zero_comm_ops_init(&ops, sizeof ops), ZERO_OK);
  assert_fails(zero_comm_create_custom(&comm, &ops, &cs), ZERO_ERR_INVALID_ARGUMENT,
               "ops->run is NULL and there is no start/wait");
  ops.run = custom_run;
  ops.destroy = custom_destroy;
  ops.rank = 1;
  assert_fails(zero_comm_create_custom(&comm, &ops, &cs), ZERO_ERR_INVALID_ARGUMENT, "ops->rank");
  ops.rank = 0;
  ops.start = custom_start;
  assert_fails(zero_comm_create_custom(&comm, &ops, &cs), ZERO_ERR_INVALID_ARGUMENT, "go together");
  ops.start = NULL;
  ops.flags = 0x80;
  assert_fails(zero_comm_create_custom(&comm, &ops, &cs), ZERO_ERR_UNSUPPORTED, "flags");
  ops.flags = ZERO_COMM_DETERMINISTIC;
  assert_null(comm);
  assert_int_equal(cs.destroyed, 0); /* a refused table is not the library's to destroy */
  assert_int_equal(zero_comm_create_custom(&comm, &ops, &cs), ZERO_OK);
  zero_engine_t* engine = engine_after_one_step(comm);
  assert_true(cs.runs > 0);
  zero_engine_info_t info = ZERO_ENGINE_INFO_INIT;
  assert_int_equal(zero_engine_info(&info, engine), ZERO_OK);
  assert_int_equal(info.deterministic, 1);
  zero_comm_destroy(comm); /* the engine keeps it alive */
  assert_int_equal(cs.destroyed, 0);
  zero_engine_destroy(engine);
  assert_int_equal(cs.destroyed, 1);

  /* Determinism is a capability the config may ask for: a backend without ZERO_COMM_DETERMINISTIC is refused at
   * finalize with libzero.deterministic, accepted (and reported) without it. */
  const char* strict =
      "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"stage\": 2}, \"libzero\": {\"deterministic\": "
      "true}}";
  ops.flags = 0;
  cs.runs = 0; /* a new communicator numbers its collectives from 1 again */
  assert_int_equal(zero_comm_create_custom(&comm, &ops, &cs), ZERO_OK);
  assert_int_equal(zero_engine_create(&engine, strict, comm), ZERO_OK);
  add_param(engine, "w", 10, 0);
  assert_fails(zero_engine_finalize(engine), ZERO_ERR_UNSUPPORTED, "does not sum in rank order");
  zero_engine_destroy(engine);
  assert_int_equal(zero_engine_create(&engine, kConfig, comm), ZERO_OK);
  add_param(engine, "w", 10, 0);
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  assert_int_equal(zero_engine_info(&info, engine), ZERO_OK);
  assert_int_equal(info.deterministic, 0);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
  zero_comm_t* single = NULL;
  engine = new_engine_with(&single, strict); /* the single-process backend is deterministic */
  zero_comm_destroy(single);
  add_param(engine, "w", 10, 0);
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  zero_engine_destroy(engine);
}

/* A split communicator: control messages over one, data over the other. Its arguments are checked (no side twice,
 * no split inside a split, no device communicator for control); an engine trains on it; finalizing it leaves the
 * caller's communicators as they were. A 0.3 program's zero_comm_ops_t (without the group callbacks) is accepted. */
static void test_split_communicator(void** state) {
  (void)state;
  zero_comm_t *control = NULL, *data = NULL, *split = NULL, *nested = NULL, *device = NULL;
  assert_int_equal(zero_comm_create_single(&control), ZERO_OK);
  assert_int_equal(zero_comm_create_single(&data), ZERO_OK);
  assert_fails(zero_comm_create_split(NULL, control, data), ZERO_ERR_INVALID_ARGUMENT, "out_comm is NULL");
  assert_fails(zero_comm_create_split(&split, NULL, data), ZERO_ERR_INVALID_ARGUMENT, "control is NULL");
  assert_fails(zero_comm_create_split(&split, control, control), ZERO_ERR_INVALID_ARGUMENT, "the same communicator");
  assert_int_equal(zero_comm_create_split(&split, control, data), ZERO_OK);
  assert_fails(zero_comm_create_split(&nested, split, data), ZERO_ERR_INVALID_ARGUMENT, "itself a split");

  CustomState cs = {0, 0};
  zero_comm_ops_t ops;
  assert_int_equal(zero_comm_ops_init(&ops, sizeof ops), ZERO_OK);
  ops.run = custom_run;
  ops.flags = ZERO_COMM_DEVICE_BUFFERS;
  ops.group_begin = custom_group;
  assert_fails(zero_comm_create_custom(&device, &ops, &cs), ZERO_ERR_INVALID_ARGUMENT, "go together");
  ops.group_end = custom_group;
  assert_int_equal(zero_comm_create_custom(&device, &ops, &cs), ZERO_OK);
  assert_fails(zero_comm_create_split(&nested, device, data), ZERO_ERR_INVALID_ARGUMENT, "takes device buffers");
  zero_comm_destroy(device);
  ops.group_begin = ops.group_end = NULL;
  ops.flags = 0;
  ops.struct_size = offsetof(zero_comm_ops_t, group_begin); /* as built against 0.3's zero.h */
  assert_int_equal(zero_comm_create_custom(&device, &ops, &cs), ZERO_OK);
  zero_comm_destroy(device);

  zero_engine_t* engine = engine_after_one_step(split);
  zero_engine_destroy(engine);
  assert_int_equal(zero_comm_finalize(split), ZERO_OK);
  assert_int_equal(zero_comm_finalize(control), ZERO_OK); /* still the caller's to finalize */
  assert_int_equal(zero_comm_finalize(data), ZERO_OK);
  zero_comm_destroy(split);
  zero_comm_destroy(control);
  zero_comm_destroy(data);

  /* A side finalized by its owner under a live engine: the engine's next call is refused before anything moves,
   * and the other side is left as it was (it still finalizes). */
  assert_int_equal(zero_comm_create_single(&control), ZERO_OK);
  assert_int_equal(zero_comm_create_single(&data), ZERO_OK);
  assert_int_equal(zero_comm_create_split(&split, control, data), ZERO_OK);
  engine = engine_after_one_step(split);
  assert_int_equal(zero_comm_finalize(control), ZERO_OK);
  assert_fails(zero_gather(engine, 0), ZERO_ERR_INVALID_STATE, "communicator was finalized");
  zero_engine_destroy(engine);
  assert_fails(zero_comm_finalize(split), ZERO_ERR_INVALID_STATE, "control side is already finalized");
  assert_int_equal(zero_comm_finalize(data), ZERO_OK);
  zero_comm_destroy(split);
  zero_comm_destroy(control);
  zero_comm_destroy(data);
}

/* A start/wait backend whose collectives never complete (a peer that never arrives): the watchdog fires with the
 * timeout, and zero_engine_abort from another thread interrupts the wait at once, whether or not the backend has an
 * abort callback. */
static zero_status_t never_start(void** out_request, void* user_data, const zero_collective_t* coll) {
  (void)user_data;
  *out_request = (void*)coll; /* any non-NULL handle */
  return ZERO_OK;
}
static zero_status_t never_wait(int32_t* out_done, void* user_data, void* request, double timeout_s) {
  (void)user_data, (void)request;
  const struct timespec slice = {0, (long)(timeout_s * 0.5e9)};
  nanosleep(&slice, NULL);
  *out_done = 0;
  return ZERO_OK;
}
static void* abort_soon(void* engine) {
  const struct timespec t = {0, 300 * 1000 * 1000};
  nanosleep(&t, NULL);
  zero_engine_abort((zero_engine_t*)engine);
  return NULL;
}
static double seconds_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void test_custom_backend_that_never_completes(void** state) {
  (void)state;
  zero_comm_ops_t ops;
  assert_int_equal(zero_comm_ops_init(&ops, sizeof ops), ZERO_OK);
  ops.start = never_start;
  ops.wait = never_wait; /* no run, no abort callback */
  zero_comm_t* comm = NULL;
  assert_int_equal(zero_comm_create_custom(&comm, &ops, NULL), ZERO_OK);
  zero_engine_t* engine = NULL;
  assert_int_equal(
      zero_engine_create(&engine, "{\"optimizer\": {\"type\": \"AdamW\"}, \"libzero\": {\"timeout_s\": 0.5}}", comm),
      ZERO_OK);
  add_param(engine, "w", 10, 0);
  double t = seconds_now();
  assert_fails(zero_engine_finalize(engine), ZERO_ERR_TIMEOUT, "did not complete within 0.50 s");
  assert_true(seconds_now() - t < 3.0);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);

  /* A long timeout, and an abort from another thread 0.3 s in. */
  assert_int_equal(zero_comm_create_custom(&comm, &ops, NULL), ZERO_OK);
  assert_int_equal(
      zero_engine_create(&engine, "{\"optimizer\": {\"type\": \"AdamW\"}, \"libzero\": {\"timeout_s\": 60}}", comm),
      ZERO_OK);
  add_param(engine, "w", 10, 0);
  pthread_t thread;
  pthread_create(&thread, NULL, abort_soon, engine);
  t = seconds_now();
  assert_fails(zero_engine_finalize(engine), ZERO_ERR_ABORTED, "aborted");
  assert_true(seconds_now() - t < 1.5);
  pthread_join(thread, NULL);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
}

/* zero_comm_finalize: afterwards only destroy is valid. */
static void test_comm_finalize(void** state) {
  (void)state;
  zero_comm_t* comm = NULL;
  assert_int_equal(zero_comm_create_single(&comm), ZERO_OK);
  zero_engine_t* early = NULL;
  assert_int_equal(zero_engine_create(&early, kConfig, comm), ZERO_OK);
  add_param(early, "w", 10, 0);
  assert_int_equal(zero_engine_finalize(early), ZERO_OK);
  assert_int_equal(zero_comm_finalize(comm), ZERO_OK);
  /* Engines made before the finalize are unusable now, local calls included. */
  assert_fails(zero_gather(early, 0), ZERO_ERR_INVALID_STATE, "communicator was finalized");
  void* p = NULL;
  assert_fails(zero_grad_data(&p, early, 0), ZERO_ERR_INVALID_STATE, "communicator was finalized");
  zero_engine_destroy(early);
  assert_fails(zero_comm_finalize(comm), ZERO_ERR_INVALID_STATE, "already finalized");
  zero_engine_t* engine = NULL;
  assert_fails(zero_engine_create(&engine, kConfig, comm), ZERO_ERR_INVALID_STATE, "finalized");
  zero_comm_destroy(comm);
}

/* The shared-memory communicator's arguments, a name already in use (another job's segment) and a one-rank job,
 * which trains and finalizes like any other communicator and leaves no segment behind. */
static void test_shm_nodes_communicator(void** state) {
  (void)state;
  zero_listener_t* listener = NULL;
  const char* address = NULL;
  assert_fails(zero_listener_create(NULL, &address, "127.0.0.1"), ZERO_ERR_INVALID_ARGUMENT, "out_listener is NULL");
  assert_fails(zero_listener_create(&listener, &address, NULL), ZERO_ERR_INVALID_ARGUMENT, "host is NULL");
  assert_fails(zero_listener_create(&listener, &address, "no-such-host.invalid"), ZERO_ERR_COMM, "cannot resolve");
  assert_int_equal(zero_listener_create(&listener, &address, "127.0.0.1"), ZERO_OK);
  assert_non_null(strstr(address, "127.0.0.1:"));
  zero_comm_t* comm = NULL;
  const char* addresses[2] = {address, address};
  assert_fails(zero_comm_create_shm_nodes(&comm, NULL, "libzero-capi-nodes", 0, 2, 1, addresses, 5.0),
               ZERO_ERR_INVALID_ARGUMENT, "listener is NULL");
  assert_fails(zero_comm_create_shm_nodes(&comm, listener, "libzero-capi-nodes", 0, 2, 1, NULL, 5.0),
               ZERO_ERR_INVALID_ARGUMENT, "addresses is NULL");
  assert_fails(zero_comm_create_shm_nodes(&comm, listener, "libzero-capi-nodes", 0, 3, 2, addresses, 5.0),
               ZERO_ERR_INVALID_ARGUMENT, "ranks_per_node 2 does not divide 3 ranks");
  const char* missing[2] = {address, NULL};
  assert_fails(zero_comm_create_shm_nodes(&comm, listener, "libzero-capi-nodes", 0, 2, 1, missing, 5.0),
               ZERO_ERR_INVALID_ARGUMENT, "addresses[1] is NULL");
  /* Node 1 never connects: node 0 names it after the join timeout. */
  char name[64];
  snprintf(name, sizeof name, "libzero-capi-nodes-%ld", (long)time(NULL));
  assert_fails(zero_comm_create_shm_nodes(&comm, listener, name, 0, 2, 1, addresses, 0.3), ZERO_ERR_TIMEOUT,
               "node(s) 1 did not connect");
  assert_null(comm);
  /* One node after all: the one-machine communicator. */
  assert_int_equal(zero_comm_create_shm_nodes(&comm, listener, name, 0, 1, 1, addresses, 5.0), ZERO_OK);
  int32_t size = 0;
  assert_int_equal(zero_comm_size(&size, comm), ZERO_OK);
  assert_int_equal(size, 1);
  assert_int_equal(zero_comm_finalize(comm), ZERO_OK);
  zero_comm_destroy(comm);
  zero_listener_destroy(listener);
  zero_listener_destroy(NULL);
}

static void test_shm_communicator(void** state) {
  (void)state;
  zero_comm_t* comm = NULL;
  assert_fails(zero_comm_create_shm(&comm, NULL, 0, 1, 5.0), ZERO_ERR_INVALID_ARGUMENT, "name is NULL");
  assert_fails(zero_comm_create_shm(&comm, "libzero-capi", 2, 2, 5.0), ZERO_ERR_INVALID_ARGUMENT, "rank 2 of 2");
  assert_fails(zero_comm_create_shm(&comm, "libzero-capi", 0, 1, 0.0), ZERO_ERR_INVALID_ARGUMENT, "join_timeout_s");
  assert_fails(zero_comm_create_shm(&comm, "a/b", 0, 1, 5.0), ZERO_ERR_INVALID_ARGUMENT, "without '/'");
  char name[64];
  snprintf(name, sizeof name, "libzero-capi-%ld", (long)time(NULL));
  char path[96];
  snprintf(path, sizeof path, "/dev/shm/%s", name);
  FILE* squatter = fopen(path, "w"); /* another job's segment under the same name */
  assert_non_null(squatter);
  fclose(squatter);
  assert_fails(zero_comm_create_shm(&comm, name, 0, 1, 5.0), ZERO_ERR_COMM, "the name is in use");
  remove(path);
  assert_int_equal(zero_comm_create_shm(&comm, name, 0, 1, 5.0), ZERO_OK);
  FILE* left = fopen(path, "r");
  assert_null(left); /* unlinked once every rank joined */
  int32_t size = 0;
  assert_int_equal(zero_comm_size(&size, comm), ZERO_OK);
  assert_int_equal(size, 1);
  zero_engine_t* engine = NULL;
  assert_int_equal(zero_engine_create(&engine, kConfig, comm), ZERO_OK);
  add_param(engine, "w", 10, 0);
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  zero_engine_destroy(engine);
  assert_int_equal(zero_comm_finalize(comm), ZERO_OK);
  zero_comm_destroy(comm);
}

/* A whole run through the ABI: the comm may be destroyed before the engine (the engine keeps it alive). */
static zero_engine_t* engine_with_matrix(zero_comm_t* comm, int64_t rows, int64_t cols) {
  zero_engine_t* engine = NULL;
  assert_int_equal(zero_engine_create(&engine, kConfig, comm), ZERO_OK);
  zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
  int64_t shape[2] = {rows, cols};
  d.name = "w";
  d.ndim = 2;
  d.shape = shape;
  int32_t id = -1;
  assert_int_equal(zero_engine_add_param(&id, engine, &d), ZERO_OK);
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  return engine;
}

/* A checkpoint of another model (the same param transposed) fails to load on every rank before anything is read:
 * the engine is as it was and trains on, and its communicator serves another engine. */
static void test_load_of_another_model(void** state) {
  (void)state;
  const char* tmp = getenv("TMPDIR");
  char dir[512];
  snprintf(dir, sizeof dir, "%s/zero-capi-XXXXXX", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
  assert_non_null(mkdtemp(dir));
  zero_comm_t* comm = NULL;
  assert_int_equal(zero_comm_create_single(&comm), ZERO_OK);
  zero_engine_t* saver = engine_with_matrix(comm, 2, 3);
  assert_int_equal(zero_save_checkpoint(saver, dir, "2x3"), ZERO_OK);
  zero_engine_destroy(saver);

  zero_engine_t* engine = engine_with_matrix(comm, 3, 2);
  assert_fails(zero_load_checkpoint(engine, dir, NULL), ZERO_ERR_MISMATCH,
               "param #0 'w': shape [2, 3] in the checkpoint, [3, 2] in this engine");
  float* g = NULL;
  assert_int_equal(zero_gather(engine, 0), ZERO_OK);
  assert_int_equal(zero_grad_data((void**)&g, engine, 0), ZERO_OK);
  for (int i = 0; i < 6; ++i) g[i] += 0.25f;
  assert_int_equal(zero_grad_ready(engine, 0), ZERO_OK);
  assert_int_equal(zero_release(engine, 0), ZERO_OK);
  assert_int_equal(zero_backward_end(engine), ZERO_OK);
  zero_step_info_t info = ZERO_STEP_INFO_INIT;
  assert_int_equal(zero_step(&info, engine), ZERO_OK);
  assert_int_equal(info.step, 1);
  /* Tags name directories and are the line in `latest`: a newline or a path out of the directory is refused. */
  assert_fails(zero_save_checkpoint(engine, dir, "step\n2"), ZERO_ERR_INVALID_ARGUMENT,
               "tag 'step\\x0a2' is not usable as a checkpoint directory name: it contains a control character");
  assert_fails(zero_save_checkpoint(engine, dir, "../outside"), ZERO_ERR_INVALID_ARGUMENT, "contains '/'");
  assert_fails(zero_load_checkpoint(engine, dir, "step\n2"), ZERO_ERR_INVALID_ARGUMENT, "control character");
  assert_int_equal(zero_save_checkpoint(engine, dir, "3x2"), ZERO_OK);
  zero_engine_t* other = engine_with_matrix(comm, 3, 2);
  assert_int_equal(zero_load_checkpoint(other, dir, NULL), ZERO_OK);
  zero_engine_destroy(other);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_training_run(void** state) {
  (void)state;
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = new_engine(&comm);
  int32_t rank = -1, size = -1;
  assert_int_equal(zero_comm_rank(&rank, comm), ZERO_OK);
  assert_int_equal(zero_comm_size(&size, comm), ZERO_OK);
  assert_int_equal(rank, 0);
  assert_int_equal(size, 1);
  zero_comm_destroy(comm);
  zero_engine_info_t info = ZERO_ENGINE_INFO_INIT;
  assert_int_equal(zero_engine_info(&info, engine), ZERO_OK);
  assert_int_equal(info.world_size, 1);
  assert_int_equal(info.stage, 3);
  assert_int_equal(info.param_dtype, ZERO_DTYPE_FP32);
  assert_int_equal(info.grad_dtype, ZERO_DTYPE_FP32);
  assert_int_equal(info.num_units, 0);
  assert_true(info.timeout_s == 600.0);
  assert_int_equal(zero_engine_set_num_threads(engine, 2), ZERO_OK);
  assert_int_equal(zero_engine_info(&info, engine), ZERO_OK);
  assert_int_equal(info.optimizer_threads, 2);
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
    zero_window_info_t window = ZERO_WINDOW_INFO_INIT;
    assert_int_equal(zero_engine_window(&window, engine), ZERO_OK);
    assert_true(window.micro_steps == 0 && window.accumulation_steps == 1);
    assert_true(window.total_micro_steps == step - 1 && window.steps == step - 1);
    assert_int_equal(zero_gather(engine, 0), ZERO_OK);
    assert_int_equal(zero_param_data((void**)&p, engine, w), ZERO_OK);
    if (step == 1) assert_memory_equal(p, init, sizeof init);
    assert_int_equal(zero_grad_data((void**)&g, engine, w), ZERO_OK);
    for (int i = 0; i < 3; ++i) g[i] += p[i]; /* the gradient of 0.5 |w|^2 */
    assert_int_equal(zero_grad_ready(engine, w), ZERO_OK);
    assert_int_equal(zero_release(engine, 0), ZERO_OK);
    assert_int_equal(zero_backward_end(engine), ZERO_OK);
    assert_int_equal(zero_engine_window(&window, engine), ZERO_OK);
    assert_true(window.micro_steps == 1 && window.total_micro_steps == step); /* zero_step's turn */
    zero_step_info_t si = ZERO_STEP_INFO_INIT;
    assert_int_equal(zero_step(&si, engine), ZERO_OK);
    assert_int_equal(si.step, step);
    assert_int_equal(si.skipped, 0);
    assert_true(si.grad_norm > 0);
    assert_true(si.lr == 0.01);
  }
  zero_memory_stats_t mem = ZERO_MEMORY_STATS_INIT;
  assert_int_equal(zero_memory_stats(&mem, engine), ZERO_OK);
  assert_true(mem.total_bytes == mem.param_bytes + mem.grad_bytes + mem.master_param_bytes + mem.optimizer_state_bytes +
                                     mem.bucket_bytes + mem.gathered_bytes);
  assert_true(mem.param_bytes == 16 * sizeof(float)); /* 3 params padded to one 16-element shard */
  zero_comm_stats_t cs = ZERO_COMM_STATS_INIT;
  assert_int_equal(zero_comm_stats(&cs, engine), ZERO_OK);
  assert_true(cs.sequence == cs.all_gather.calls + cs.reduce_scatter.calls + cs.all_reduce.calls + cs.broadcast.calls +
                                 cs.control.calls);
  assert_true(cs.all_gather.calls == 3);
  assert_true(cs.all_gather.wire_bytes == 0); /* one rank sends nothing */
  assert_true(cs.control.calls > 0);          /* the agreements */
  char* json = NULL;
  assert_int_equal(zero_engine_recent_collectives(&json, engine), ZERO_OK);
  assert_non_null(strstr(json, "\"state\": \"done\""));
  assert_non_null(strstr(json, "zero_step"));
  zero_string_destroy(json);
  zero_engine_destroy(engine);
  zero_engine_destroy(NULL);
  zero_comm_destroy(NULL);
}

/* A framework's allocator: counts what it hands out; can be told to refuse. */
typedef struct {
  size_t live_bytes, calls;
  int refuse;
} CountingPool;

static void* pool_alloc(void* user_data, size_t bytes, size_t alignment) {
  CountingPool* pool = (CountingPool*)user_data;
  if (pool->refuse) return NULL;
  void* p = NULL;
  if (posix_memalign(&p, alignment, bytes) != 0) return NULL;
  pool->live_bytes += bytes, pool->calls += 1;
  return p;
}

static void pool_free(void* user_data, void* ptr, size_t bytes) {
  CountingPool* pool = (CountingPool*)user_data;
  pool->live_bytes -= bytes;
  free(ptr);
}

static void test_allocator_hook(void** state) {
  (void)state;
  zero_allocator_t a;
  assert_fails(zero_allocator_init(&a, 8), ZERO_ERR_INVALID_ARGUMENT, "struct_size");
  assert_int_equal(zero_allocator_init(&a, sizeof a), ZERO_OK);
  assert_fails(zero_engine_set_allocator(NULL, ZERO_MEMORY_HOST, &a), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");

  CountingPool pool = {0, 0, 0};
  a.alloc = pool_alloc;
  a.free = pool_free;
  a.user_data = &pool;
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = new_engine_with(
      &comm,
      "{\"optimizer\": {\"type\": \"AdamW\"}, \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 2}}");
  zero_comm_destroy(comm);
  assert_fails(zero_engine_set_allocator(engine, 7, &a), ZERO_ERR_INVALID_ARGUMENT, "not a zero_memory_space_t");
  zero_allocator_t no_free = a;
  no_free.free = NULL;
  assert_fails(zero_engine_set_allocator(engine, ZERO_MEMORY_HOST, &no_free), ZERO_ERR_INVALID_ARGUMENT,
               "callback is NULL");
  assert_int_equal(zero_engine_set_allocator(engine, ZERO_MEMORY_HOST, &a), ZERO_OK);
  add_param(engine, "w", 1000, 0);
  add_param(engine, "b", 7, 1);
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  /* Every buffer of the plan came from the pool: params, gradients, master, Adam state, the bucket. */
  zero_memory_stats_t mem = ZERO_MEMORY_STATS_INIT;
  assert_int_equal(zero_memory_stats(&mem, engine), ZERO_OK);
  assert_true(pool.calls >= 2 * 5);
  assert_true(pool.live_bytes >= mem.total_bytes);
  assert_true(pool.live_bytes < mem.total_bytes + 64 * pool.calls); /* only the 64-byte rounding on top */
  assert_fails(zero_engine_set_allocator(engine, ZERO_MEMORY_HOST, &a), ZERO_ERR_INVALID_STATE,
               "must come before zero_engine_finalize");
  zero_engine_destroy(engine);
  assert_int_equal(pool.live_bytes, 0); /* everything went back */

  /* A pool that refuses: finalize fails cleanly, and nothing is left allocated. */
  pool.refuse = 1;
  engine = new_engine(&comm);
  zero_comm_destroy(comm);
  assert_int_equal(zero_engine_set_allocator(engine, ZERO_MEMORY_HOST, &a), ZERO_OK);
  add_param(engine, "w", 1000, 0);
  assert_fails(zero_engine_finalize(engine), ZERO_ERR_OUT_OF_MEMORY, "out of memory");
  /* Nothing is held after a failed finalize: the engine is as before finalize, with no figures to report. */
  assert_fails(zero_memory_stats(&mem, engine), ZERO_ERR_INVALID_STATE, "needs zero_engine_finalize first");
  assert_int_equal(pool.live_bytes, 0);
  pool.refuse = 0;
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK); /* a retry works */
  /* Stage 3: a second unit gathered at once needs a second buffer; the pool refuses it. The engine reports what it
   * holds, no more, and takes the buffer when the pool has memory again. */
  zero_engine_destroy(engine);
  zero_memory_stats_t before = ZERO_MEMORY_STATS_INIT;
  engine = new_engine(&comm);
  zero_comm_destroy(comm);
  assert_int_equal(zero_engine_set_allocator(engine, ZERO_MEMORY_HOST, &a), ZERO_OK);
  add_param(engine, "u0", 1000, 0);
  add_param(engine, "u1", 1000, 1);
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  assert_int_equal(zero_gather(engine, 0), ZERO_OK);
  assert_int_equal(zero_memory_stats(&before, engine), ZERO_OK);
  pool.refuse = 1;
  assert_fails(zero_gather(engine, 1), ZERO_ERR_OUT_OF_MEMORY, "out of memory for the gathered unit 1");
  assert_int_equal(zero_memory_stats(&mem, engine), ZERO_OK);
  assert_true(mem.gathered_bytes == before.gathered_bytes);
  pool.refuse = 0;
  assert_int_equal(zero_gather(engine, 1), ZERO_OK);
  assert_int_equal(zero_memory_stats(&mem, engine), ZERO_OK);
  assert_true(mem.gathered_bytes == 2 * before.gathered_bytes);
  assert_int_equal(zero_release(engine, 0), ZERO_OK);
  assert_int_equal(zero_release(engine, 1), ZERO_OK);
  zero_engine_destroy(engine);
  assert_int_equal(pool.live_bytes, 0);

  /* Device memory is not allocatable in the CPU build, but an allocator for it may be given (the plan does not
   * use it); NULL restores the defaults. */
  engine = new_engine(&comm);
  zero_comm_destroy(comm);
  assert_int_equal(zero_engine_set_allocator(engine, ZERO_MEMORY_DEVICE, &a), ZERO_OK);
  assert_int_equal(zero_engine_set_allocator(engine, ZERO_MEMORY_DEVICE, NULL), ZERO_OK);
  assert_int_equal(zero_engine_set_allocator(engine, ZERO_MEMORY_HOST, NULL), ZERO_OK);
  add_param(engine, "w", 10, 0);
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  zero_engine_destroy(engine);
}

/* zero_prefetch: argument and state errors; a prefetched unit is what zero_gather then gives (one rank, stage 3:
 * the single communicator's all-gather is a copy, so this checks the bookkeeping, not the communication). */
static void test_prefetch(void** state) {
  (void)state;
  assert_fails(zero_prefetch(NULL, 0), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = new_engine_with(&comm,
                                          "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"stage\": 3,"
                                          " \"stage3_param_persistence_threshold\": 0}}");
  zero_comm_destroy(comm);
  const int32_t w = add_param(engine, "w", 100, 0);
  add_param(engine, "v", 300, 1);
  assert_fails(zero_prefetch(engine, 0), ZERO_ERR_INVALID_STATE, "finalize");
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  assert_fails(zero_prefetch(engine, 2), ZERO_ERR_INVALID_ARGUMENT, "no unit 2");
  assert_fails(zero_prefetch(engine, -1), ZERO_ERR_INVALID_ARGUMENT, "no unit -1");
  zero_memory_stats_t one = ZERO_MEMORY_STATS_INIT, two = ZERO_MEMORY_STATS_INIT;
  assert_int_equal(zero_memory_stats(&one, engine), ZERO_OK);
  assert_int_equal(zero_prefetch(engine, 0), ZERO_OK);
  assert_int_equal(zero_prefetch(engine, 0), ZERO_OK); /* already fetched ahead: nothing more */
  assert_int_equal(zero_gather(engine, 1), ZERO_OK);   /* a second buffer while unit 0 waits in the first */
  assert_int_equal(zero_memory_stats(&two, engine), ZERO_OK);
  assert_true(two.gathered_bytes == 2 * one.gathered_bytes);
  assert_int_equal(zero_release(engine, 1), ZERO_OK);
  assert_int_equal(zero_gather(engine, 0), ZERO_OK);
  float* data = NULL;
  assert_int_equal(zero_param_data((void**)&data, engine, w), ZERO_OK);
  assert_true(data != NULL);
  assert_int_equal(zero_release(engine, 0), ZERO_OK);
  zero_engine_destroy(engine);
}

/* offload_optimizer to NVMe with nothing to offload (fp32 params are their own master, SGD without momentum has no
 * state): finalize creates no file — not even the missing directory — and says so once. */
static void test_nothing_to_offload(void** state) {
  (void)state;
  LogSink sink;
  memset(&sink, 0, sizeof sink);
  assert_int_equal(zero_set_log_callback(capture_log, &sink, ZERO_LOG_WARNING), ZERO_OK);
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = new_engine_with(
      &comm,
      "{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1}}, \"zero_optimization\": {\"stage\": 2, "
      "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/nonexistent/libzero-capi-test\"}}}");
  add_param(engine, "w", 1000, 0);
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  assert_int_equal(sink.calls, 1);
  assert_non_null(strstr(sink.text, "nothing to offload"));
  zero_memory_placement_t mp = ZERO_MEMORY_PLACEMENT_INIT;
  zero_memory_stats_t ms = ZERO_MEMORY_STATS_INIT;
  assert_int_equal(zero_memory_placement(&mp, engine), ZERO_OK);
  assert_int_equal(zero_memory_stats(&ms, engine), ZERO_OK);
  assert_true(mp.nvme_bytes == 0 && mp.staging_bytes == 0 && mp.host_bytes == ms.total_bytes);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
  assert_int_equal(zero_set_log_callback(NULL, NULL, ZERO_LOG_WARNING), ZERO_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_strings_and_version),
      cmocka_unit_test(test_null_arguments),
      cmocka_unit_test(test_struct_sizes),
      cmocka_unit_test(test_structs_of_an_older_header),
      cmocka_unit_test(test_sixteen_bit_initial_values_cross_as_they_are),
      cmocka_unit_test(test_wrong_order),
      cmocka_unit_test(test_bad_config),
      cmocka_unit_test(test_logging),
      cmocka_unit_test(test_views),
      cmocka_unit_test(test_abort),
      cmocka_unit_test(test_custom_communicator),
      cmocka_unit_test(test_custom_backend_that_never_completes),
      cmocka_unit_test(test_split_communicator),
      cmocka_unit_test(test_comm_finalize),
      cmocka_unit_test(test_shm_communicator),
      cmocka_unit_test(test_shm_nodes_communicator),
      cmocka_unit_test(test_training_run),
      cmocka_unit_test(test_load_of_another_model),
      cmocka_unit_test(test_allocator_hook),
      cmocka_unit_test(test_prefetch),
      cmocka_unit_test(test_nothing_to_offload),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
