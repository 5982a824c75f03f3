/*
 * Checkpoint I/O at scale: registers a model of --params-millions (in --units equal units, each one param), saves
 * it at stage 3 on the ranks mpirun gives and loads it back, and prints the save and load bandwidth. The
 * checkpoint is left in --dir for bench/consolidate_rss.sh.
 *
 *   mpirun -np 2 bench_checkpoint_io --params-millions 120 --units 4 --dir /tmp/zero-bench-ckpt
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zero/zero.h"

#define CHECK(call)                                                                      \
  do {                                                                                   \
    zero_status_t s_ = (call);                                                           \
    if (s_ != ZERO_OK) {                                                                 \
      fprintf(stderr, "%s: %s: %s\n", #call, zero_status_string(s_), zero_last_error()); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                      \
    }                                                                                    \
  } while (0)

int main(int argc, char** argv) {
  double millions = 120;
  int units = 4;
  const char* dir = "/tmp/zero-bench-ckpt";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--params-millions") == 0) millions = atof(argv[i + 1]);
    if (strcmp(argv[i], "--units") == 0) units = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
  }
  int mpi_provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &mpi_provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  zero_comm_t* comm = NULL;
  CHECK(zero_comm_create_mpi(&comm, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD)));
  zero_engine_t* engine = NULL;
  CHECK(zero_engine_create(&engine,
                           "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"stage\": 3,"
                           " \"stage3_param_persistence_threshold\": 0}}",
                           comm));
  const int64_t per_unit = (int64_t)(millions * 1e6 / units);
  for (int u = 0; u < units; ++u) {
    char name[64];
    snprintf(name, sizeof name, "layer%d.weight", u);
    int64_t shape[1] = {per_unit};
    zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
    d.name = name;
    d.ndim = 1;
    d.shape = shape;
    d.unit = u;
    int32_t id = 0;
    CHECK(zero_engine_add_param(&id, engine, &d));
  }
  CHECK(zero_engine_finalize(engine));
  char cmd[512];
  if (rank == 0) {
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  CHECK(zero_save_checkpoint(engine, dir, "big"));
  double t1 = MPI_Wtime();
  CHECK(zero_load_checkpoint(engine, dir, "big"));
  double t2 = MPI_Wtime();
  const double bytes = (double)per_unit * units * 12.0; /* fp32 master + Adam's two moments */
  if (rank == 0)
    printf(
        "%d ranks, %.0f M params in %d units: save %.2f s (%.2f GB/s), load with verification %.2f s "
        "(%.2f GB/s), %.2f GB on disk\n",
        world, millions, units, t1 - t0, bytes / (t1 - t0) / 1e9, t2 - t1, bytes / (t2 - t1) / 1e9, bytes / 1e9);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}
