/* The multi-process tests' NCCL communicator: data over libzero's NCCL module on CUDA device 0, control over a host
 * communicator. The includer defines _POSIX_C_SOURCE 200809L (setenv). */
#ifndef ZERO_TESTS_MPI_NCCL_COMM_H_
#define ZERO_TESTS_MPI_NCCL_COMM_H_

#include <stdio.h>
#include <stdlib.h>

#include "zero/zero.h"

/* Takes `control` (the new communicator keeps it; the caller's reference is released either way). Processes that
 * share one GPU need NCCL_HOSTID apart (NCCL then joins them over its sockets): each rank's becomes the inherited one,
 * or `job`, with its rank appended. */
static inline zero_status_t create_nccl_comm(zero_comm_t** out, zero_comm_t* control, const char* job) {
  int32_t rank = 0;
  zero_status_t s = zero_comm_rank(&rank, control);
  if (s == ZERO_OK) {
    char host[256];
    const char* inherited = getenv("NCCL_HOSTID");
    snprintf(host, sizeof host, "%s-%d", inherited != NULL ? inherited : job, (int)rank);
    setenv("NCCL_HOSTID", host, 1);
    s = zero_comm_create_nccl(out, control, 0, 120.0);
  }
  zero_comm_destroy(control);
  return s;
}

#endif /* ZERO_TESTS_MPI_NCCL_COMM_H_ */
