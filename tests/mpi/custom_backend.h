/*
 * A communicator backend written the way a framework would write its own (torch.distributed, mpi4py, a Java or Go
 * transport): zero.h's callback table (zero_comm_ops_t), here over plain MPI calls in the test itself, not inside
 * libzero. It uses MPI's own reductions (MPI_Reduce_scatter_block, whose summation order MPI chooses), so it does not
 * claim ZERO_COMM_DETERMINISTIC. Two flavours:
 *  - blocking: `run` only (libzero's timeout cannot cover a collective then);
 *  - async: `start`/`wait` over MPI's non-blocking collectives, polled with a timeout.
 */
#ifndef ZERO_TESTS_MPI_CUSTOM_BACKEND_H_
#define ZERO_TESTS_MPI_CUSTOM_BACKEND_H_

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp16_reference.h"
#include "zero/zero.h"

typedef struct {
  MPI_Comm comm;
  int rank, size;
  MPI_Op sum_bf16, sum_fp16;
  char error[256];
  int destroyed;
} TestBackend;

typedef struct {
  MPI_Request request;
  zero_collective_t coll;
} TestRequest;

static float tb_bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t tb_float_to_bf16(float f) { /* round to nearest even (no NaNs in the tests) */
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float tb_fp16_to_float(uint16_t h) { return fp16_reference_to_float(h); }
static uint16_t tb_float_to_fp16(float f) { return fp16_reference_from_float(f); }
static void tb_sum_bf16(void* in, void* inout, int* len, MPI_Datatype* type) {
  (void)type;
  const uint16_t* a = (const uint16_t*)in;
  uint16_t* b = (uint16_t*)inout;
  for (int i = 0; i < *len; ++i) b[i] = tb_float_to_bf16(tb_bf16_to_float(a[i]) + tb_bf16_to_float(b[i]));
}
static void tb_sum_fp16(void* in, void* inout, int* len, MPI_Datatype* type) {
  (void)type;
  const uint16_t* a = (const uint16_t*)in;
  uint16_t* b = (uint16_t*)inout;
  for (int i = 0; i < *len; ++i) b[i] = tb_float_to_fp16(tb_fp16_to_float(a[i]) + tb_fp16_to_float(b[i]));
}

static MPI_Datatype tb_type(int32_t dtype) {
  switch (dtype) {
    case ZERO_DTYPE_FP32:
      return MPI_FLOAT;
    case ZERO_DTYPE_FP64:
      return MPI_DOUBLE;
    case ZERO_DTYPE_INT64:
      return MPI_INT64_T;
    case ZERO_DTYPE_BF16:
    case ZERO_DTYPE_FP16:
      return MPI_UINT16_T;
    default:
      return MPI_BYTE;
  }
}
static size_t tb_size(int32_t dtype) {
  return dtype == ZERO_DTYPE_FP32 ? 4 : dtype == ZERO_DTYPE_FP64 || dtype == ZERO_DTYPE_INT64 ? 8 : dtype == 5 ? 1 : 2;
}
static MPI_Op tb_sum(TestBackend* b, int32_t dtype) {
  return dtype == ZERO_DTYPE_BF16 ? b->sum_bf16 : dtype == ZERO_DTYPE_FP16 ? b->sum_fp16 : MPI_SUM;
}

/* Starts any collective as an MPI non-blocking one (the blocking flavour waits for it at once). */
static zero_status_t tb_start_mpi(TestBackend* b, const zero_collective_t* c, MPI_Request* request) {
  const int n = (int)c->count;
  MPI_Datatype t = tb_type(c->dtype);
  int rc = MPI_SUCCESS;
  switch (c->kind) {
    case ZERO_COLL_ALL_GATHER:
      rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, c->buf, n, t, b->comm, request);
      break;
    case ZERO_COLL_REDUCE_SCATTER: /* MPI puts the result at the start of the buffer; moved after completion */
      rc = MPI_Ireduce_scatter_block(MPI_IN_PLACE, c->buf, n, t, tb_sum(b, c->dtype), b->comm, request);
      break;
    case ZERO_COLL_ALL_REDUCE: {
      MPI_Op op = c->op == ZERO_REDUCE_MIN ? MPI_MIN : c->op == ZERO_REDUCE_MAX ? MPI_MAX : tb_sum(b, c->dtype);
      rc = MPI_Iallreduce(MPI_IN_PLACE, c->buf, n, t, op, b->comm, request);
      break;
    }
    case ZERO_COLL_BROADCAST:
      rc = MPI_Ibcast(c->buf, n, t, c->root, b->comm, request);
      break;
    default:
      snprintf(b->error, sizeof b->error, "test backend: unknown collective kind %d", c->kind);
      return ZERO_ERR_INVALID_ARGUMENT;
  }
  if (rc != MPI_SUCCESS) {
    snprintf(b->error, sizeof b->error, "test backend: MPI error %d in %s", rc, c->label ? c->label : "?");
    return ZERO_ERR_COMM;
  }
  return ZERO_OK;
}

static void tb_finish(TestBackend* b, const zero_collective_t* c) {
  if (c->kind == ZERO_COLL_REDUCE_SCATTER && b->rank != 0) {
    const size_t bytes = c->count * tb_size(c->dtype);
    memmove((char*)c->buf + (size_t)b->rank * bytes, c->buf, bytes);
  }
}

static zero_status_t tb_run(void* ud, const zero_collective_t* c) {
  TestBackend* b = (TestBackend*)ud;
  MPI_Request request;
  zero_status_t s = tb_start_mpi(b, c, &request);
  if (s != ZERO_OK) return s;
  MPI_Wait(&request, MPI_STATUS_IGNORE);
  tb_finish(b, c);
  return ZERO_OK;
}

static zero_status_t tb_start(void** out_request, void* ud, const zero_collective_t* c) {
  TestBackend* b = (TestBackend*)ud;
  TestRequest* r = (TestRequest*)malloc(sizeof *r);
  r->coll = *c;
  zero_status_t s = tb_start_mpi(b, c, &r->request);
  if (s != ZERO_OK) {
    free(r);
    return s;
  }
  *out_request = r;
  return ZERO_OK;
}

static zero_status_t tb_wait(int32_t* out_done, void* ud, void* request, double timeout_s) {
  TestBackend* b = (TestBackend*)ud;
  TestRequest* r = (TestRequest*)request;
  const double begin = MPI_Wtime();
  for (;;) {
    int done = 0;
    MPI_Test(&r->request, &done, MPI_STATUS_IGNORE);
    if (done) {
      tb_finish(b, &r->coll);
      free(r);
      *out_done = 1;
      return ZERO_OK;
    }
    if (MPI_Wtime() - begin >= timeout_s) {
      *out_done = 0;
      return ZERO_OK;
    }
  }
}

static const char* tb_error(void* ud) { return ((TestBackend*)ud)->error; }

static void tb_destroy(void* ud) {
  TestBackend* b = (TestBackend*)ud;
  MPI_Op_free(&b->sum_bf16);
  MPI_Op_free(&b->sum_fp16);
  MPI_Comm_free(&b->comm);
  free(b);
}

/* A libzero communicator over a duplicate of MPI_COMM_WORLD, through the callback table only. */
static zero_status_t create_test_backend_comm(zero_comm_t** out, int async) {
  TestBackend* b = (TestBackend*)calloc(1, sizeof *b);
  MPI_Comm_dup(MPI_COMM_WORLD, &b->comm);
  MPI_Comm_rank(b->comm, &b->rank);
  MPI_Comm_size(b->comm, &b->size);
  MPI_Op_create(tb_sum_bf16, 1, &b->sum_bf16);
  MPI_Op_create(tb_sum_fp16, 1, &b->sum_fp16);
  zero_comm_ops_t ops;
  zero_comm_ops_init(&ops, sizeof ops);
  ops.rank = b->rank;
  ops.size = b->size;
  ops.local_size = b->size;
  ops.flags = 0; /* MPI's reductions choose their own order */
  ops.run = tb_run;
  if (async) {
    ops.start = tb_start;
    ops.wait = tb_wait;
  }
  ops.error_message = tb_error;
  ops.destroy = tb_destroy;
  zero_status_t s = zero_comm_create_custom(out, &ops, b);
  if (s != ZERO_OK) tb_destroy(b);
  return s;
}

#endif /* ZERO_TESTS_MPI_CUSTOM_BACKEND_H_ */
