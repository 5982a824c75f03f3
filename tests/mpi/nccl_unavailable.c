/*
 * zero_comm_create_nccl where NCCL cannot run: every rank returns an error at once, with a message that says what is
 * missing, and none waits for another forever; the control communicator stays usable (the ranks' collective
 * sequences still match: an engine on it then trains a step).
 *
 *   mpirun -np N test_nccl_unavailable [--expect TEXT]...
 *
 * Each --expect TEXT is one acceptable fragment of the message (the first that matches wins): on a machine without
 * a GPU "no CUDA device", without NCCL "NCCL could not be loaded", without the module "NCCL module could not be
 * loaded" (ZERO_NCCL_MODULE, ZERO_NCCL_LIBRARY set by the test to a path that does not exist). On a machine where
 * NCCL does run the program says so and exits 77 (a skip): the GPU check covers that case.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ZERO_EXPERIMENTAL_API
#include "harness.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  zero_comm_t* control = NULL;
  CHECK(zero_comm_create_mpi(&control, ZERO_MPI_COMM_WORLD));

  const double begin = MPI_Wtime();
  zero_comm_t* nccl = NULL;
  const zero_status_t s = zero_comm_create_nccl(&nccl, control, 0, 20.0);
  const double took = MPI_Wtime() - begin;
  const char* message = zero_last_error();
  int ok = s == ZERO_OK, any_ok = 0;
  MPI_Allreduce(&ok, &any_ok, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_ok) {
    EXPECT(ok, "rank %d failed (%s: %s) where another rank's NCCL communicator was made", rank, zero_status_string(s),
           message);
    if (rank == 0) printf("NCCL runs here: nothing to test (the GPU check covers it)\n");
    zero_comm_destroy(nccl);
    zero_comm_destroy(control);
    MPI_Finalize();
    return 77;
  }
  EXPECT(s == ZERO_ERR_UNSUPPORTED, "rank %d: %s, expected ZERO_ERR_UNSUPPORTED: %s", rank, zero_status_string(s),
         message);
  EXPECT(nccl == NULL, "a failed call set *out_comm");
  EXPECT(strstr(message, "zero_comm_create_nccl") != NULL, "rank %d's message does not name the call: %s", rank,
         message);
  int matched = 0;
  for (int i = 1; i + 1 < argc; i += 2)
    if (strcmp(argv[i], "--expect") == 0 && strstr(message, argv[i + 1]) != NULL) matched = 1;
  EXPECT(matched, "rank %d's message says none of the expected reasons: %s", rank, message);
  EXPECT(took < 15.0, "rank %d took %.1f s to fail", rank, took);

  /* The control communicator's sequences still agree: an engine on it trains a step. */
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine, "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"stage\": 2}}",
                           control));
  zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
  const int64_t shape[1] = {10};
  d.name = "w";
  d.shape = shape;
  d.ndim = 1;
  d.dtype = ZERO_DTYPE_FP32;
  int32_t w = -1;
  CHECK(zero_engine_add_param(&w, engine, &d));
  CHECK(zero_engine_finalize(engine));
  CHECK(zero_gather(engine, 0));
  float* g = NULL;
  CHECK(zero_grad_data((void**)&g, engine, w));
  g[0] = 1.0f;
  CHECK(zero_grad_ready(engine, w));
  CHECK(zero_release(engine, 0));
  CHECK(zero_backward_end(engine));
  CHECK(zero_step(NULL, engine));
  zero_engine_destroy(engine);
  if (rank == 0) printf("zero_comm_create_nccl failed on every rank in %.2f s: %s\n", took, message);
  CHECK(zero_comm_finalize(control));
  zero_comm_destroy(control);
  MPI_Finalize();
  return 0;
}
