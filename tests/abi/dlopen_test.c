/*
 * Uses libzero the way another framework would: dlopen("libzero.so.1") by SONAME, resolve every public symbol
 * with dlsym, check the runtime version against the header, and run a 2-rank training step through function
 * pointers only. This program links neither libzero nor MPI: libzero.so links no MPI either, and loads its MPI
 * module (libzero-mpi.so.1) by SONAME when asked for an MPI communicator, which initialises MPI. A wrong
 * ZERO_MPI_BACKEND path must give a clear error first.
 *
 *   mpirun -np 2 test_dlopen
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zero/zero.h"
#include "zero_abi_symbols.h" /* generated from zero.h: kZeroSymbols, kZeroSymbolCount */

#define RESOLVE(type, name) type name##_fn = (type)resolve(lib, #name)

static void* resolve(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (p == NULL) {
    fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());
    return NULL;
  }
  return p;
}

#define CHECK(call)                                                                  \
  do {                                                                               \
    zero_status_t s_ = (call);                                                       \
    if (s_ != ZERO_OK) {                                                             \
      fprintf(stderr, "%s failed: %s: %s\n", #call, status_fn(s_), last_error_fn()); \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

int main(void) {
  void* lib = dlopen("libzero.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "dlopen(libzero.so.1): %s\n", dlerror());
    return 1;
  }
  if (dlopen("libzero-mpi.so.1", RTLD_NOW | RTLD_NOLOAD) != NULL) {
    fprintf(stderr, "loading libzero.so.1 loaded the MPI module too; it must load only on demand\n");
    return 1;
  }
  for (size_t i = 0; i < kZeroSymbolCount; ++i)
    if (resolve(lib, kZeroSymbols[i]) == NULL) return 1;

  /* Function pointer types, written out as a framework would (ISO C allows converting dlsym's void*). */
  typedef uint32_t (*version_t)(void);
  typedef const char* (*status_string_t)(zero_status_t);
  typedef const char* (*last_error_t)(void);
  typedef zero_status_t (*comm_create_mpi_t)(zero_comm_t**, int64_t);
  typedef zero_status_t (*comm_int_t)(int*, const zero_comm_t*);
  typedef void (*comm_destroy_t)(zero_comm_t*);
  typedef zero_status_t (*engine_create_t)(zero_engine_t**, const char*, zero_comm_t*);
  typedef zero_status_t (*add_param_t)(int32_t*, zero_engine_t*, const zero_param_desc_t*);
  typedef zero_status_t (*engine_t)(zero_engine_t*);
  typedef zero_status_t (*engine_id_t)(zero_engine_t*, int32_t);
  typedef zero_status_t (*data_t)(void**, zero_engine_t*, int32_t);
  typedef zero_status_t (*step_t)(zero_step_info_t*, zero_engine_t*);
  typedef zero_status_t (*comm_finalize_t)(zero_comm_t*);
  typedef void (*engine_destroy_t)(zero_engine_t*);

  version_t version_fn;
  status_string_t status_fn;
  last_error_t last_error_fn;
  *(void**)&version_fn = resolve(lib, "zero_get_version");
  *(void**)&status_fn = resolve(lib, "zero_status_string");
  *(void**)&last_error_fn = resolve(lib, "zero_last_error");
  if (version_fn() != ZERO_VERSION_NUMBER) {
    fprintf(stderr, "runtime version %u, header %d\n", version_fn(), ZERO_VERSION_NUMBER);
    return 1;
  }
  comm_create_mpi_t comm_create_mpi;
  comm_int_t comm_rank, comm_size;
  comm_destroy_t comm_destroy;
  engine_create_t engine_create;
  add_param_t add_param;
  engine_t finalize, backward_end;
  engine_id_t gather, release, grad_ready;
  data_t param_data, grad_data;
  step_t step;
  engine_destroy_t engine_destroy;
  comm_finalize_t comm_finalize;
  *(void**)&comm_create_mpi = resolve(lib, "zero_comm_create_mpi");
  *(void**)&comm_rank = resolve(lib, "zero_comm_rank");
  *(void**)&comm_size = resolve(lib, "zero_comm_size");
  *(void**)&comm_destroy = resolve(lib, "zero_comm_destroy");
  *(void**)&engine_create = resolve(lib, "zero_engine_create");
  *(void**)&add_param = resolve(lib, "zero_engine_add_param");
  *(void**)&finalize = resolve(lib, "zero_engine_finalize");
  *(void**)&backward_end = resolve(lib, "zero_backward_end");
  *(void**)&gather = resolve(lib, "zero_gather");
  *(void**)&release = resolve(lib, "zero_release");
  *(void**)&grad_ready = resolve(lib, "zero_grad_ready");
  *(void**)&param_data = resolve(lib, "zero_param_data");
  *(void**)&grad_data = resolve(lib, "zero_grad_data");
  *(void**)&step = resolve(lib, "zero_step");
  *(void**)&engine_destroy = resolve(lib, "zero_engine_destroy");
  *(void**)&comm_finalize = resolve(lib, "zero_comm_finalize");

  zero_comm_t* comm = NULL;
  /* A wrong module path is a clear error, not a crash. */
  setenv("ZERO_MPI_BACKEND", "/nonexistent/libzero-mpi.so.1", 1);
  if (comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD) != ZERO_ERR_UNSUPPORTED || comm != NULL ||
      strstr(last_error_fn(), "/nonexistent/libzero-mpi.so.1") == NULL) {
    fprintf(stderr, "a missing MPI module was not reported: %s\n", last_error_fn());
    return 1;
  }
  unsetenv("ZERO_MPI_BACKEND");
  CHECK(comm_create_mpi(&comm, ZERO_MPI_COMM_WORLD));
  if (dlopen("libzero-mpi.so.1", RTLD_NOW | RTLD_NOLOAD) == NULL) {
    fprintf(stderr, "zero_comm_create_mpi did not load libzero-mpi.so.1 by its SONAME\n");
    return 1;
  }
  int rank = 0, world = 0;
  CHECK(comm_rank(&rank, comm));
  CHECK(comm_size(&world, comm));
  zero_engine_t* engine = NULL;
  CHECK(engine_create(&engine,
                      "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.5, \"weight_decay\": 0}},"
                      " \"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 0}}",
                      comm));
  const float init[5] = {1, 2, 3, 4, 5};
  int64_t shape[1] = {5};
  zero_param_desc_t desc = ZERO_PARAM_DESC_INIT;
  desc.name = "w";
  desc.ndim = 1;
  desc.shape = shape;
  desc.init_data = init;
  int32_t w = -1;
  CHECK(add_param(&w, engine, &desc));
  CHECK(finalize(engine));
  float* g = NULL;
  float* p = NULL;
  CHECK(gather(engine, 0));
  CHECK(grad_data((void**)&g, engine, w));
  for (int i = 0; i < 5; ++i) g[i] += (float)(rank + 1); /* positive everywhere: Adam's first step is -lr */
  CHECK(grad_ready(engine, w));
  CHECK(release(engine, 0));
  CHECK(backward_end(engine));
  zero_step_info_t info = ZERO_STEP_INFO_INIT;
  CHECK(step(&info, engine));
  CHECK(gather(engine, 0));
  CHECK(param_data((void**)&p, engine, w));
  int ok = info.step == 1;
  for (int i = 0; i < 5; ++i) ok = ok && p[i] > init[i] - 0.5f - 1e-5f && p[i] < init[i] - 0.5f + 1e-5f;
  CHECK(release(engine, 0));
  engine_destroy(engine);
  CHECK(comm_finalize(comm)); /* libzero initialised MPI: this finalises it */
  comm_destroy(comm);
  if (!ok) {
    fprintf(stderr, "rank %d: unexpected weights after one step\n", rank);
    return 1;
  }
  if (rank == 0)
    printf("dlopen ok: %zu symbols resolved, version %u, one stage-3 step on %d ranks\n", kZeroSymbolCount,
           version_fn(), world);
  dlclose(lib);
  return 0;
}
