/*
 * The plugin interface between libzero.so and its MPI module, libzero-mpi.so.1 (docs/abi.md). The module fills the
 * public callback table of zero.h (zero_comm_ops_t), exactly as a framework's own backend would, so libzero.so
 * itself links no MPI. zero_comm_create_mpi() dlopens the module and calls this one exported function.
 */
#ifndef ZERO_BACKENDS_MPI_MPI_BACKEND_H_
#define ZERO_BACKENDS_MPI_MPI_BACKEND_H_

#include "zero/zero.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZERO_MPI_BACKEND_SONAME "libzero-mpi.so.1"
#define ZERO_MPI_BACKEND_ENTRY "zero_mpi_backend_open"

/* Creates the backend for `mpi_comm` (MPI_Comm_c2f of a communicator, or ZERO_MPI_COMM_WORLD), collectively over
 * it. `out_ops` must be initialised (struct_size set); on success it is filled and *out_user_data is the backend's
 * state, to be passed to every callback and finally to out_ops->destroy. On failure `error_text` (capacity bytes)
 * says why. */
typedef zero_status_t (*zero_mpi_backend_open_fn)(zero_comm_ops_t* out_ops, void** out_user_data, int64_t mpi_comm,
                                                  char* error_text, size_t capacity);
ZERO_API zero_status_t zero_mpi_backend_open(zero_comm_ops_t* out_ops, void** out_user_data, int64_t mpi_comm,
                                             char* error_text, size_t capacity);

#ifdef __cplusplus
}
#endif

#endif /* ZERO_BACKENDS_MPI_MPI_BACKEND_H_ */
