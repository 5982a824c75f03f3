/*
 * The plugin interface between libzero.so and its NCCL module, libzero-nccl.so.1. The module fills the public callback
 * table of zero_backend.h (zero_comm_ops_t) for a device communicator, as a framework's own NCCL process group would,
 * so that libzero.so links neither CUDA nor NCCL. zero_comm_create_nccl() dlopens the module and bootstraps it over
 * a host communicator in two steps: every rank prepares (rank 0 also makes NCCL's unique id), libzero agrees on the
 * outcome and broadcasts the id over the host communicator, then every rank opens its NCCL communicator.
 */
#ifndef ZERO_BACKENDS_NCCL_NCCL_BACKEND_H_
#define ZERO_BACKENDS_NCCL_NCCL_BACKEND_H_

#include <stddef.h>
#include <stdint.h>

#include "zero/zero.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZERO_NCCL_BACKEND_SONAME "libzero-nccl.so.1"
#define ZERO_NCCL_BACKEND_PREPARE "zero_nccl_backend_prepare"
#define ZERO_NCCL_BACKEND_OPEN "zero_nccl_backend_open"
/* NCCL's ncclUniqueId. */
#define ZERO_NCCL_UNIQUE_ID_BYTES 128

/* Loads NCCL (ZERO_NCCL_LIBRARY, else libnccl.so.2 as the dynamic linker finds it: a system NCCL or the pip
 * nvidia-nccl wheel's) and checks that CUDA device `device` exists. With `out_unique_id` (rank 0) it also makes the
 * communicator's unique id (ZERO_NCCL_UNIQUE_ID_BYTES). `out_version` gets NCCL's version (ncclGetVersion). On
 * failure `error_text` (capacity bytes) says why. */
typedef zero_status_t (*zero_nccl_backend_prepare_fn)(int32_t* out_version, void* out_unique_id, int32_t device,
                                                      char* error_text, size_t capacity);
ZERO_API zero_status_t zero_nccl_backend_prepare(int32_t* out_version, void* out_unique_id, int32_t device,
                                                 char* error_text, size_t capacity);

/* Opens rank `rank` of `size` on CUDA device `device` with the unique id rank 0 made, within `timeout_s` seconds
 * (NCCL's non-blocking initialisation, polled; aborted when the time is up). `out_ops` must be initialised (struct_size
 * set); on success it is filled (ZERO_COMM_DEVICE_BUFFERS | ZERO_COMM_DETERMINISTIC) and *out_user_data is the
 * backend's state, for every callback and finally out_ops->destroy. */
typedef zero_status_t (*zero_nccl_backend_open_fn)(zero_comm_ops_t* out_ops, void** out_user_data, int32_t rank,
                                                   int32_t size, int32_t device, const void* unique_id,
                                                   double timeout_s, char* error_text, size_t capacity);
ZERO_API zero_status_t zero_nccl_backend_open(zero_comm_ops_t* out_ops, void** out_user_data, int32_t rank,
                                              int32_t size, int32_t device, const void* unique_id, double timeout_s,
                                              char* error_text, size_t capacity);

#ifdef __cplusplus
}
#endif

#endif /* ZERO_BACKENDS_NCCL_NCCL_BACKEND_H_ */
