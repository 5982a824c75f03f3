/*
 * The device engine through the C API (experimental zero_engine_set_device, zero_engine_copy), in plain C
 * (CMocka): the same training on a CPU engine and on the "emulator" device engine gives the same params bit for bit,
 * gradients and params moving through zero_engine_copy; and the clear errors: an unknown device, a device chosen
 * after finalize, offload on the device engine, "cuda" where the module or the device is missing.
 */
#define ZERO_EXPERIMENTAL_API
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "zero/zero.h"

#define assert_fails(call, status, fragment)                                         \
  do {                                                                               \
    assert_int_equal((call), (status));                                              \
    if (strstr(zero_last_error(), (fragment)) == NULL)                               \
      fail_msg("message '%s' does not mention '%s'", zero_last_error(), (fragment)); \
  } while (0)

static const char* kConfig =
    "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"gradient_clipping\": 1.0,"
    " \"bf16\": {\"enabled\": true}, \"data_types\": {\"grad_accum_dtype\": \"fp32\"},"
    " \"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 0}}";

enum { kParams = 3 };
static const int64_t kSizes[kParams] = {5, 300, 4097};

static zero_engine_t* new_engine(zero_comm_t** comm, const char* config, const char* device) {
  zero_engine_t* engine = NULL;
  assert_int_equal(zero_comm_create_single(comm), ZERO_OK);
  assert_int_equal(zero_engine_create(&engine, config, *comm), ZERO_OK);
  if (device != NULL) assert_int_equal(zero_engine_set_device(engine, device), ZERO_OK);
  return engine;
}

/* Trains kParams params (units 0, 1, 1) for 3 steps; returns each param's bf16 bytes, concatenated. */
static uint16_t* train(const char* device) {
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = new_engine(&comm, kConfig, device);
  int64_t total = 0;
  float* inits[kParams]; /* read at zero_engine_finalize */
  for (int p = 0; p < kParams; ++p) {
    float* init = inits[p] = malloc((size_t)kSizes[p] * sizeof(float));
    for (int64_t i = 0; i < kSizes[p]; ++i) init[i] = (float)((i * 7 + p) % 33 - 16) / 16.0f;
    zero_param_desc_t d;
    assert_int_equal(zero_param_desc_init(&d, sizeof d), ZERO_OK);
    d.name = p == 0 ? "a" : (p == 1 ? "b" : "c");
    d.ndim = 1;
    d.shape = &kSizes[p];
    d.unit = p == 0 ? 0 : 1;
    d.init_data = init;
    d.init_dtype = ZERO_DTYPE_FP32;
    int32_t id = -1;
    assert_int_equal(zero_engine_add_param(&id, engine, &d), ZERO_OK);
    total += kSizes[p];
  }
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  for (int p = 0; p < kParams; ++p) free(inits[p]);
  /* Where its memory is, as DLPack says it: kDLCPU, or kDLExtDev for the emulator's (no consumer may read it). */
  int32_t type = -1, ordinal = -1;
  assert_int_equal(zero_engine_device(&type, &ordinal, engine), ZERO_OK);
  assert_int_equal(type, device != NULL && strcmp(device, "emulator") == 0 ? 12 : 1);
  assert_int_equal(ordinal, 0);
  for (int step = 0; step < 3; ++step) {
    for (int32_t unit = 1; unit >= 0; --unit) {
      assert_int_equal(zero_gather(engine, unit), ZERO_OK);
      for (int p = kParams - 1; p >= 0; --p) {
        if ((p == 0 ? 0 : 1) != unit) continue;
        const size_t n = (size_t)kSizes[p];
        float* g = malloc(n * sizeof(float));
        void* grad = NULL;
        assert_int_equal(zero_grad_data(&grad, engine, p), ZERO_OK);
        assert_int_equal(zero_engine_copy(engine, g, grad, n * sizeof(float)), ZERO_OK); /* add, never overwrite */
        for (size_t i = 0; i < n; ++i) g[i] += (float)((int)((i * 13 + (size_t)step * 5 + (size_t)p) % 41) - 20) / 8.0f;
        assert_int_equal(zero_engine_copy(engine, grad, g, n * sizeof(float)), ZERO_OK);
        assert_int_equal(zero_grad_ready(engine, p), ZERO_OK);
        free(g);
      }
      assert_int_equal(zero_release(engine, unit), ZERO_OK);
    }
    assert_int_equal(zero_backward_end(engine), ZERO_OK);
    zero_step_info_t info;
    assert_int_equal(zero_step_info_init(&info, sizeof info), ZERO_OK);
    assert_int_equal(zero_step(&info, engine), ZERO_OK);
  }
  uint16_t* out = calloc((size_t)total, sizeof(uint16_t));
  int64_t at = 0;
  for (int32_t unit = 0; unit < 2; ++unit) {
    assert_int_equal(zero_gather(engine, unit), ZERO_OK);
    for (int p = 0; p < kParams; ++p) {
      if ((p == 0 ? 0 : 1) != unit) continue;
      void* data = NULL;
      assert_int_equal(zero_param_data(&data, engine, p), ZERO_OK);
      int64_t offset = 0;
      for (int q = 0; q < p; ++q) offset += kSizes[q];
      assert_int_equal(zero_engine_copy(engine, out + offset, data, (size_t)kSizes[p] * 2), ZERO_OK);
      at += kSizes[p];
    }
    assert_int_equal(zero_release(engine, unit), ZERO_OK);
  }
  assert_int_equal(at, total);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
  return out;
}

static void test_the_emulated_device_trains_as_the_cpu(void** state) {
  (void)state;
  uint16_t* cpu = train(NULL);
  uint16_t* dev = train("emulator");
  const int64_t total = kSizes[0] + kSizes[1] + kSizes[2];
  int64_t changed = 0;
  for (int64_t i = 0; i < total; ++i) {
    if (cpu[i] != dev[i]) fail_msg("element %lld: cpu 0x%04x, device 0x%04x", (long long)i, cpu[i], dev[i]);
    changed += cpu[i] != 0;
  }
  assert_true(changed > total / 2);
  free(cpu);
  free(dev);
}

static void test_clear_errors(void** state) {
  (void)state;
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = new_engine(&comm, kConfig, NULL);
  assert_fails(zero_engine_set_device(engine, "tpu"), ZERO_ERR_INVALID_ARGUMENT, "no device named 'tpu'");
  assert_fails(zero_engine_set_device(engine, NULL), ZERO_ERR_INVALID_ARGUMENT, "device is NULL");
  assert_fails(zero_engine_set_device(NULL, "emulator"), ZERO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_fails(zero_engine_set_stream(engine, NULL), ZERO_ERR_INVALID_STATE, "zero_engine_set_device first");
  int64_t shape = 4;
  zero_param_desc_t d;
  assert_int_equal(zero_param_desc_init(&d, sizeof d), ZERO_OK);
  d.name = "w";
  d.ndim = 1;
  d.shape = &shape;
  int32_t id = -1;
  assert_int_equal(zero_engine_add_param(&id, engine, &d), ZERO_OK);
  assert_int_equal(zero_engine_finalize(engine), ZERO_OK);
  assert_fails(zero_engine_set_device(engine, "emulator"), ZERO_ERR_INVALID_STATE, "zero_engine_set_device");
  char a[8] = "abcdefg", b[8] = {0};
  assert_int_equal(zero_engine_copy(engine, b, a, 8), ZERO_OK); /* a CPU engine copies host memory */
  assert_string_equal(b, "abcdefg");
  assert_fails(zero_engine_copy(engine, a + 2, a, 4), ZERO_ERR_INVALID_ARGUMENT, "overlap");
  /* A CPU engine's memory is kDLCPU's, and there is no device stream to order. */
  int32_t type = -1, id_of_device = -1;
  assert_int_equal(zero_engine_device(&type, &id_of_device, engine), ZERO_OK);
  assert_int_equal(type, 1);
  assert_int_equal(id_of_device, 0);
  assert_fails(zero_engine_device(NULL, &id_of_device, engine), ZERO_ERR_INVALID_ARGUMENT, "NULL");
  assert_fails(zero_engine_order_stream(engine, NULL), ZERO_ERR_INVALID_STATE, "no device");
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);

  /* What the device engine does not run yet is refused, naming it: NVMe offload when the device is chosen. */
  engine = new_engine(&comm,
                      "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"zero_optimization\": "
                      "{\"stage\": 3, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp\"}}, "
                      "\"bf16\": {\"enabled\": true}}",
                      NULL);
  assert_fails(zero_engine_set_device(engine, "emulator"), ZERO_ERR_UNSUPPORTED, "NVMe offload");
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);

  /* ZeRO-Offload at stage 0 would not offload anything: refused, not ignored. */
  engine = new_engine(&comm,
                      "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"zero_optimization\": "
                      "{\"stage\": 0, \"offload_optimizer\": {\"device\": \"cpu\"}}}",
                      "emulator");
  assert_int_equal(zero_engine_add_param(&id, engine, &d), ZERO_OK);
  assert_fails(zero_engine_finalize(engine), ZERO_ERR_CONFIG, "stage 1, 2 or 3");
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);

  /* "cuda" where this machine has no module or no device: ZERO_ERR_UNSUPPORTED with the reason. */
  engine = new_engine(&comm, kConfig, NULL);
  const zero_status_t status = zero_engine_set_device(engine, "cuda");
  if (status != ZERO_OK) {
    assert_int_equal(status, ZERO_ERR_UNSUPPORTED);
    if (strstr(zero_last_error(), "CUDA") == NULL) fail_msg("'%s' does not say why", zero_last_error());
  }
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_the_emulated_device_trains_as_the_cpu),
      cmocka_unit_test(test_clear_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
