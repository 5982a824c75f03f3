/* Built against an installed libzero (CMake package, pkg-config, or the Debian packages): checks the version and
 * trains one step on a one-rank communicator, or with --mpi (under mpirun) over MPI through the installed MPI
 * module, libzero-mpi.so.1. */
#include <stdio.h>
#include <string.h>

#include "zero/zero.h"

#define CHECK(call)                                                                      \
  do {                                                                                   \
    zero_status_t s_ = (call);                                                           \
    if (s_ != ZERO_OK) {                                                                 \
      fprintf(stderr, "%s: %s: %s\n", #call, zero_status_string(s_), zero_last_error()); \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

int main(int argc, char** argv) {
  const int mpi = argc > 1 && strcmp(argv[1], "--mpi") == 0;
  if (zero_get_version() / 10000 != ZERO_VERSION_MAJOR) {
    fprintf(stderr, "library major version %u, header %d\n", zero_get_version() / 10000, ZERO_VERSION_MAJOR);
    return 1;
  }
  zero_comm_t* comm = NULL;
  zero_engine_t* engine = NULL;
  if (mpi)
    CHECK(zero_comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD));
  else
    CHECK(zero_comm_create_single(&comm));
  int32_t rank = 0, world = 1;
  CHECK(zero_comm_rank(&rank, comm));
  CHECK(zero_comm_size(&world, comm));
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
  if (rank == 0)
    printf("consumer ok: libzero %s (%u), %s, %d rank(s), step %lld\n", ZERO_VERSION_STRING, zero_get_version(),
           mpi ? "MPI" : "one-rank communicator", (int)world, (long long)info.step);
  return info.step == 1 ? 0 : 1;
}
