// libFuzzer target: any bytes as a DeepSpeed config, through the C API as a user would hand it over —
// zero_config_check, then zero_engine_create and, when the config is accepted, a small model trained for one
// optimizer step (every micro-step the config asks for). Any input must give ZERO_OK or a clear error; a crash, a
// sanitizer report, a leak or a hang is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "zero/zero.h"

namespace {

void quiet(void*, int32_t, int32_t, const char*) {}

// A clear error is fine; ZERO_ERR_INTERNAL is how the C API reports an exception libzero did not expect (a
// std::out_of_range, a length_error, ...): a bug, so the fuzzer stops on it.
zero_status_t checked(zero_status_t status) {
  if (status == ZERO_ERR_INTERNAL) {
    std::fprintf(stderr, "ZERO_ERR_INTERNAL: %s\n", zero_last_error());
    __builtin_trap();
  }
  return status;
}

// Two units, odd sizes, in the param dtype the config chose.
void train_one_step(zero_engine_t* engine) {
  zero_engine_info_t info = ZERO_ENGINE_INFO_INIT;
  if (checked(zero_engine_info(&info, engine)) != ZERO_OK) return;
  static const int64_t kShapes[2][2] = {{7, 3}, {5, 1}};
  int32_t ids[2];
  for (int p = 0; p < 2; ++p) {
    zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
    d.name = p == 0 ? "w" : "b";
    d.ndim = 2;
    d.shape = kShapes[p];
    d.unit = p;
    d.dtype = info.param_dtype;
    if (checked(zero_engine_add_param(&ids[p], engine, &d)) != ZERO_OK) return;
  }
  if (checked(zero_engine_finalize(engine)) != ZERO_OK) return;
  const int micro_steps = info.gradient_accumulation_steps < 8 ? info.gradient_accumulation_steps : 8;
  for (int m = 0; m < micro_steps; ++m) {
    for (int u = 1; u >= 0; --u) {
      if (checked(zero_gather(engine, u)) != ZERO_OK) return;
      void* g = nullptr;
      if (checked(zero_grad_data(&g, engine, ids[u])) != ZERO_OK) return;
      // A gradient of ones in the accumulation dtype: 1.0 is 0x3f80 in bf16, 0x3c00 in fp16.
      const size_t n = static_cast<size_t>(kShapes[u][0] * kShapes[u][1]);
      for (size_t i = 0; i < n; ++i) {
        if (info.grad_dtype == ZERO_DTYPE_FP32)
          static_cast<float*>(g)[i] += 1.0f;
        else
          static_cast<uint16_t*>(g)[i] = info.grad_dtype == ZERO_DTYPE_BF16 ? 0x3f80 : 0x3c00;
      }
      if (checked(zero_grad_ready(engine, ids[u])) != ZERO_OK) return;
      if (checked(zero_release(engine, u)) != ZERO_OK) return;
    }
    if (checked(zero_backward_end(engine)) != ZERO_OK) return;
  }
  zero_step_info_t step = ZERO_STEP_INFO_INIT;
  checked(zero_step(&step, engine));  // more micro-steps than 8 are asked for: a clear error, which is fine
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zero_set_log_callback(quiet, nullptr, ZERO_LOG_DEBUG);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  char* report = nullptr;
  if (checked(zero_config_check(&report, text.c_str(), 2)) == ZERO_OK) zero_string_destroy(report);
  zero_comm_t* comm = nullptr;
  if (zero_comm_create_single(&comm) != ZERO_OK) __builtin_trap();
  zero_engine_t* engine = nullptr;
  if (checked(zero_engine_create(&engine, text.c_str(), comm)) == ZERO_OK) {
    train_one_step(engine);
    zero_engine_destroy(engine);
  }
  zero_comm_destroy(comm);
  return 0;
}
