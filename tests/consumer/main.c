/* Built against an installed libzero (CMake package, pkg-config, or the Debian packages): checks the version and
 * trains one step on a one-rank communicator. */
#include <stdio.h>

#include "zero/zero.h"

#define CHECK(call)                                                                      \
  do {                                                                                   \
    zero_status_t s_ = (call);                                                           \
    if (s_ != ZERO_OK) {                                                                 \
      fprintf(stderr, "%s: %s: %s\n", #call, zero_status_string(s_), zero_last_error()); \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

int main(void) {
  if (zero_get_version() / 10000 != ZERO_VERSION_MAJOR) {
    fprintf(stderr, "library major version %u, header %d\n", zero_get_version() / 10000, ZERO_VERSION_MAJOR);
    return 1;
  }
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = NULL;
  CHECK(zero_comm_create_single(&comm));
  CHECK(zero_engine_create(&engine, "{\"optimizer\": {\"type\": \"AdamW\"}}", comm));
  int64_t shape[1] = {4};
  zero_param_desc_t desc = ZERO_PARAM_DESC_INIT;
  desc.name = "w";
  desc.ndim = 1;
  desc.shape = shape;
  int32_t w = 0;
  CHECK(zero_engine_add_param(&w, engine, &desc));
  CHECK(zero_engine_finalize(engine));
  float* g = NULL;
  CHECK(zero_grad_data((void**)&g, engine, w));
  g[0] += 1.0f;
  CHECK(zero_grad_ready(engine, w));
  CHECK(zero_backward_end(engine));
  zero_step_info_t info = ZERO_STEP_INFO_INIT;
  CHECK(zero_step(&info, engine));
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
  printf("consumer ok: libzero %s (%u), step %lld\n", ZERO_VERSION_STRING, zero_get_version(), (long long)info.step);
  return info.step == 1 ? 0 : 1;
}
