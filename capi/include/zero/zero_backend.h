/*
 * libzero's interface for communicator implementers: a framework's own transport (its process group:
 * torch.distributed, mpi4py, a Java or Go transport) as a table of callbacks, and the collectives libzero hands it.
 * zero.h includes this header, so programs include zero.h alone; a backend may include either. What a program
 * needs to train is in zero.h; this is what a transport needs to carry it (libgit2's sys/ headers are the model).
 * Part of the stable ABI, under zero.h's rules.
 */
#ifndef ZERO_ZERO_BACKEND_H_
#define ZERO_ZERO_BACKEND_H_

#include <stddef.h>
#include <stdint.h>

#include "zero/zero.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Custom communicators. A collective, as libzero hands it to a backend. Element counts follow NCCL's in-place
 * conventions; `buf` always holds the data in place:
 *  - ALL_GATHER: buf holds `size` blocks of `count` elements; this rank's block (at buf + rank * count) is its
 *    input; afterwards every block holds its owner's data.
 *  - REDUCE_SCATTER (always a sum): buf holds `size` blocks of `count` elements, every rank's full input;
 *    afterwards this rank's block (at buf + rank * count) holds the element-wise sum over ranks of that block.
 *    The other blocks are undefined afterwards. 16-bit sums are computed in fp32 and rounded once to nearest
 *    even. With ZERO_COMM_DETERMINISTIC the backend adds contributions in rank order 0, 1, ..., size - 1.
 *  - ALL_REDUCE: buf holds `count` elements, reduced with `op` in place (libzero uses it for small control
 *    messages: fp64 and int64 only; float gradients go through REDUCE_SCATTER + ALL_GATHER).
 *  - BROADCAST: `count` elements of rank `root` to every rank.
 * `dtype` is a zero_dtype_t: FP32, BF16 and FP16 for gradients and parameters; FP64, INT64 and UINT8 for control
 * data. */
enum zero_collective_kind {
  ZERO_COLL_ALL_GATHER = 0,
  ZERO_COLL_REDUCE_SCATTER = 1,
  ZERO_COLL_ALL_REDUCE = 2,
  ZERO_COLL_BROADCAST = 3
};
enum zero_reduce_op { ZERO_REDUCE_SUM = 0, ZERO_REDUCE_MIN = 1, ZERO_REDUCE_MAX = 2 };

typedef struct zero_collective {
  size_t struct_size;
  int32_t kind;  /* zero_collective_kind */
  int32_t dtype; /* zero_dtype_t */
  int32_t op;    /* zero_reduce_op (ALL_REDUCE only) */
  int32_t root;  /* BROADCAST only */
  void* buf;
  uint64_t count;    /* elements per block (ALL_GATHER, REDUCE_SCATTER) or in all (ALL_REDUCE, BROADCAST) */
  uint64_t sequence; /* 1, 2, ... per communicator: every rank issues collective n with the same arguments */
  const char* label; /* what it is for, e.g. "zero_gather: all-gather of unit 3" (diagnostics only) */
  /* Appended in 0.4 (read them only when struct_size covers them): */
  /* A device engine's data collective on a backend with ZERO_COMM_DEVICE_BUFFERS: the cudaStream_t whose work so far
   * produced the input. The backend orders the collective after it, and once wait reports it done, work queued on
   * it afterwards must see the result (cudaStreamWaitEvent on an event after the collective). NULL: host memory,
   * or a backend without the flag. */
  void* stream;
  uint32_t flags; /* zero_collective_flags */
} zero_collective_t;

enum zero_collective_flags {
  /* The engine accepts a sum in any order for this reduce-scatter (libzero.deterministic: false): a deterministic
   * backend may use a faster reduction whose bits depend on its algorithm. */
  ZERO_COLL_ANY_ORDER = 1
};

/* For backends that build descriptors of their own (tests, forwarding layers). */
ZERO_API zero_status_t zero_collective_init(zero_collective_t* coll, size_t struct_size);

/* Backend properties (zero_comm_ops_t.flags). */
enum zero_comm_flags {
  /* Float sums add contributions in rank order: training is then bit-identical across stages and rank counts.
   * Without it every element is still reduced once and its result distributed, so ranks never disagree, but
   * results may differ in the last bit from run to run. */
  ZERO_COMM_DETERMINISTIC = 1,
  /* Data collectives may carry device memory (the engine's device) and a stream (zero_collective_t.stream): NCCL.
   * Without it a device engine stages them through host memory. Control messages are always host memory. */
  ZERO_COMM_DEVICE_BUFFERS = 2
};

/* A backend as a table of callbacks; `user_data` is passed to each (after any out-parameter). Every callback
 * returns ZERO_OK or an error status; `error_message` (if set) then tells why, and libzero reports it with the
 * collective it was for. Required: run, or start and wait (then run is never called); the rest is optional (NULL). */
typedef struct zero_comm_ops {
  size_t struct_size;
  int32_t rank;
  int32_t size;
  int32_t local_size; /* ranks of this communicator on this node, sharing its cores (0: unknown, taken as 1) */
  uint32_t flags;     /* zero_comm_flags */
  /* Runs a collective to completion (used only when start is NULL). */
  zero_status_t (*run)(void* user_data, const zero_collective_t* coll);
  /* Starts a collective; *out_request identifies it until wait reports it done (NULL: it already completed).
   * `coll` and its buffer stay valid until then. With start/wait, libzero's timeout covers the collective even
   * if a rank never arrives, and zero_engine_abort interrupts the wait. libzero may start several collectives
   * before it waits for the first (a gradient bucket's reduce-scatters, one per unit; with overlap_comm, buckets
   * still in flight while backward goes on; all-gathers started ahead of their use), always in the same order on
   * every rank, and may wait for a later one (a small control message, a gather) before an earlier one
   * completes. With overlap_comm the ranks may also wait in different orders (one rank completes an all-gather
   * started by zero_step in its zero_gather, another only in a later call), so a backend must move every
   * collective it has started while any one is waited for, not only that one (MPI, NCCL and gloo do). A
   * transport that cannot have more than one collective in flight runs each to completion in start and returns
   * NULL. */
  zero_status_t (*start)(void** out_request, void* user_data, const zero_collective_t* coll);
  /* Waits up to `timeout_s` seconds (0: just test). *out_done = 1 when the collective completed (the request is
   * then gone), 0 if still in flight. After a failure libzero never waits for the request again; it keeps the
   * buffer alive (a backend such as MPI cannot cancel a collective). */
  zero_status_t (*wait)(int32_t* out_done, void* user_data, void* request, double timeout_s);
  /* The reason for this backend's last failure, valid until its next call; NULL if unknown. */
  const char* (*error_message)(void* user_data);
  /* This rank stops taking part: pending and future collectives fail promptly, and other ranks should learn it
   * (`reason` says why). Called from any thread, possibly while another thread waits in the backend; must not
   * block. */
  void (*abort)(void* user_data, const char* reason);
  /* After a timeout in collective `sequence`: write into out_text (capacity bytes, NUL-terminated) what the
   * backend knows of the other ranks (which collective each waits in, who does not answer), within about
   * `grace_s` seconds. */
  zero_status_t (*diagnose)(char* out_text, size_t capacity, void* user_data, uint64_t sequence, double grace_s);
  /* Collective teardown (zero_comm_finalize), after every rank agreed to finalize. */
  zero_status_t (*finalize)(void* user_data);
  /* Called once, when the last reference to the communicator goes (zero_comm_destroy and every engine on it
   * destroyed). Local. */
  void (*destroy)(void* user_data);
  /* Appended in 0.4 (optional): the collectives started between group_begin and group_end may be fused into one
   * launch (ncclGroupStart/End); each still completes through wait. */
  zero_status_t (*group_begin)(void* user_data);
  zero_status_t (*group_end)(void* user_data);
} zero_comm_ops_t;

#define ZERO_COMM_OPS_INIT \
  { sizeof(zero_comm_ops_t), 0, 1, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL }

/* Rank 0 of 1, no flags, every callback NULL. */
ZERO_API zero_status_t zero_comm_ops_init(zero_comm_ops_t* ops, size_t struct_size);

/* A communicator over a framework's own transport. The table is copied; `user_data` stays the caller's until
 * ops->destroy is called with it. Local. */
ZERO_API zero_status_t zero_comm_create_custom(zero_comm_t** out_comm, const zero_comm_ops_t* ops, void* user_data);

#ifdef __cplusplus
}
#endif

#endif /* ZERO_ZERO_BACKEND_H_ */
