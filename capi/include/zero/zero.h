/*
 * libzero — ZeRO (Zero Redundancy Optimizer) training engine, public C API (C99).
 *
 * This is the only public header. A training framework owns forward and backward; libzero owns where every
 * parameter, gradient and optimizer-state byte lives, the collectives that move them, and the optimizer step.
 *
 * Conventions (they hold for every call below unless its comment says otherwise):
 *  - Every fallible call returns zero_status_t. ZERO_OK is 0. On failure, zero_last_error() describes what went
 *    wrong and how to fix it, outputs are left untouched and nothing leaks.
 *  - Output parameters come first and are named out_*. What comes back through T** belongs to the caller and has
 *    its own destroy function, which accepts NULL. Pointers returned by value are borrowed from their parent.
 *  - Structs that cross the ABI lead with `size_t struct_size`; initialise them with their *_INIT macro so that a
 *    program built against an older header keeps working with a newer library.
 *  - Counts are size_t, dimensions int64_t, strings UTF-8 and NUL-terminated.
 *  - Thread safety: an engine (and the communicator it uses) is used by one thread at a time; separate engines
 *    are independent. zero_last_error() is per thread.
 *  - "Collective" calls must be made by every rank of the communicator, in the same order, with matching
 *    arguments where stated.
 */
#ifndef ZERO_ZERO_H_
#define ZERO_ZERO_H_

#include <stddef.h>
#include <stdint.h>

#include "zero/zero_version.h"

#if defined(__GNUC__)
#define ZERO_API __attribute__((visibility("default")))
#else
#define ZERO_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------------------------
 * Status codes and errors. Values are append-only.
 * ------------------------------------------------------------------------------------------------------------- */
typedef enum zero_status {
  ZERO_OK = 0,
  ZERO_ERR_INVALID_ARGUMENT = 1, /* a NULL pointer, an unknown id, a size that does not fit */
  ZERO_ERR_INVALID_STATE = 2,    /* a call in the wrong order (e.g. zero_step before zero_engine_finalize) */
  ZERO_ERR_CONFIG = 3,           /* the JSON config is malformed, has an unknown key or a value of the wrong type */
  ZERO_ERR_UNSUPPORTED = 4,      /* a valid request this version does not support yet */
  ZERO_ERR_MISMATCH = 5,         /* ranks disagree (parameter registration, config) */
  ZERO_ERR_COMM = 6,             /* the communication backend failed */
  ZERO_ERR_OUT_OF_MEMORY = 7,
  ZERO_ERR_INTERNAL = 8,           /* a bug in libzero; please report it with zero_last_error()'s text */
  ZERO_ERR_CHECKPOINT_CORRUPT = 9, /* since 0.2: a checkpoint file is missing, truncated or fails its checksum */
  ZERO_ERR_IO = 10                 /* since 0.2: the file system refused (no space, permissions, ...) */
} zero_status_t;

/* A static, human-readable name for a status ("ZERO_ERR_CONFIG"). Never NULL; unknown values give "unknown". */
ZERO_API const char* zero_status_string(zero_status_t status);

/* The message of the last failed call on this thread. Never NULL ("" when no call has failed). The pointer stays
 * valid until the next libzero call on this thread. A successful call does not clear it: detect errors by status,
 * read this only to report them. */
ZERO_API const char* zero_last_error(void);

/* The runtime library version as ZERO_VERSION_NUMBER would spell it: major * 10000 + minor * 100 + patch. Compare
 * with the compile-time ZERO_VERSION_NUMBER to detect a header/library mismatch. */
ZERO_API uint32_t zero_get_version(void);

/* ---------------------------------------------------------------------------------------------------------------
 * Element types.
 * ------------------------------------------------------------------------------------------------------------- */
typedef enum zero_dtype { ZERO_DTYPE_FP32 = 0, ZERO_DTYPE_BF16 = 1, ZERO_DTYPE_FP16 = 2 } zero_dtype_t;

/* ---------------------------------------------------------------------------------------------------------------
 * Communicators.
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct zero_comm zero_comm_t;

/* Pass as `mpi_comm` to use MPI_COMM_WORLD without including mpi.h. */
#define ZERO_MPI_COMM_WORLD ((int64_t)-1)

/* A communicator over MPI. `mpi_comm` is the Fortran handle of any MPI communicator (MPI_Comm_c2f(comm), which
 * is portable across MPI implementations) or ZERO_MPI_COMM_WORLD. If MPI is not initialised yet, libzero
 * initialises it (MPI_THREAD_FUNNELED) and finalises it when the last communicator it created is destroyed; MPI
 * cannot be re-initialised after that. libzero duplicates the communicator, so its messages never match yours.
 * Collective over `mpi_comm`. */
ZERO_API zero_status_t zero_comm_create_mpi(zero_comm_t** out_comm, int64_t mpi_comm);

/* A one-rank communicator (no MPI involved). Every collective is a local copy. */
ZERO_API zero_status_t zero_comm_create_single(zero_comm_t** out_comm);

/* Releases the caller's reference. Engines created on the communicator keep it alive until they are destroyed,
 * so the order of destruction does not matter. Accepts NULL. */
ZERO_API void zero_comm_destroy(zero_comm_t* comm);

ZERO_API zero_status_t zero_comm_rank(int* out_rank, const zero_comm_t* comm);
ZERO_API zero_status_t zero_comm_size(int* out_size, const zero_comm_t* comm);

/* ---------------------------------------------------------------------------------------------------------------
 * Engine: creation and registration.
 *
 * Life cycle: zero_engine_create -> zero_engine_add_param_group* -> zero_engine_add_param+ ->
 * zero_engine_finalize -> training calls -> zero_engine_destroy.
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct zero_engine zero_engine_t;

/* Creates an engine from a DeepSpeed JSON config (the text of ds_config.json) on `comm`. Unknown keys, wrong
 * types and keys this version cannot honour yet are errors naming the key (ZERO_ERR_CONFIG, ZERO_ERR_UNSUPPORTED).
 * Tuning keys that never change results but have no effect yet are accepted with one warning on rank 0's stderr.
 * The engine takes its own reference to `comm`. Local (not collective). */
ZERO_API zero_status_t zero_engine_create(zero_engine_t** out_engine, const char* json_config, zero_comm_t* comm);

/* Destroys the engine and every buffer it owns; pointers from zero_param_data/zero_grad_data become invalid.
 * Local. Accepts NULL. */
ZERO_API void zero_engine_destroy(zero_engine_t* engine);

/* A hyper-parameter value meaning "inherit from the config's optimizer.params". */
#define ZERO_INHERIT (-1.0)

/* A parameter group: optimizer hyper-parameters shared by its params. Group 0 always exists and uses the config's
 * optimizer.params; added groups override what they set. */
typedef struct zero_param_group_desc {
  size_t struct_size;
  const char* name; /* for messages; may be NULL. Copied. */
  double lr;
  double weight_decay;
  double beta1;
  double beta2;
  double eps;
} zero_param_group_desc_t;

#define ZERO_PARAM_GROUP_DESC_INIT \
  { sizeof(zero_param_group_desc_t), NULL, ZERO_INHERIT, ZERO_INHERIT, ZERO_INHERIT, ZERO_INHERIT, ZERO_INHERIT }

/* Adds a param group; *out_group receives its id (1, 2, ... in call order). Before finalize only. Local. */
ZERO_API zero_status_t zero_engine_add_param_group(int32_t* out_group, zero_engine_t* engine,
                                                   const zero_param_group_desc_t* desc);

/* A parameter to register. */
typedef struct zero_param_desc {
  size_t struct_size;
  const char* name;     /* unique, non-empty; copied */
  int32_t ndim;         /* 0 (scalar) .. 8 */
  const int64_t* shape; /* ndim positive extents; copied */
  zero_dtype_t dtype;   /* must equal the engine's compute dtype (bf16.enabled / fp16.enabled, else fp32) */
  int32_t unit;         /* gather unit, >= 0; units are numbered 0..U-1 in forward order, none left empty */
  int32_t group;        /* 0 or an id from zero_engine_add_param_group */
  /* Initial values (ndim-shaped, row-major, elements of init_dtype), or NULL for zeros. Read during
   * zero_engine_finalize on rank 0 only, so it must stay valid until then; other ranks may pass NULL. */
  const void* init_data;
  /* Since 0.2: the zero_dtype_t of init_data, or -1 (the default) for `dtype`. Passing fp32 values while training
   * in bf16/fp16 starts the fp32 master weights exact. */
  int32_t init_dtype;
} zero_param_desc_t;

#define ZERO_PARAM_DESC_INIT \
  { sizeof(zero_param_desc_t), NULL, 0, NULL, ZERO_DTYPE_FP32, 0, 0, NULL, -1 }

/* Registers a parameter; *out_param receives its id (0, 1, ... in call order). Before finalize only. Local. */
ZERO_API zero_status_t zero_engine_add_param(int32_t* out_param, zero_engine_t* engine, const zero_param_desc_t* desc);

/* Collective. Checks that every rank registered the same params, groups and config (on a difference every rank
 * returns ZERO_ERR_MISMATCH naming the first differing param; nobody hangs), lays out the flat per-unit buffers,
 * allocates what this rank keeps for the configured stage, and broadcasts rank 0's initial values unit by unit. */
ZERO_API zero_status_t zero_engine_finalize(zero_engine_t* engine);

/* ---------------------------------------------------------------------------------------------------------------
 * Engine: the training step. See docs/architecture.md for what each stage does inside these calls.
 *
 * One micro-step: for each unit in forward order zero_gather, forward, zero_release; backward in reverse order:
 * zero_gather, add gradients into zero_grad_data, zero_grad_ready per param, zero_release; then
 * zero_backward_end. After gradient_accumulation_steps micro-steps: zero_step.
 * ------------------------------------------------------------------------------------------------------------- */

/* The parameter's values in the compute dtype (zero_engine_info_t.param_dtype), contiguous, row-major. Stages 0-2:
 * valid from finalize until destroy. Stage 3: valid between zero_gather and zero_release of its unit
 * (ZERO_ERR_INVALID_STATE otherwise). Values change only in zero_step. Writes outside zero_step are not preserved at
 * stage 3. Local. */
ZERO_API zero_status_t zero_param_data(void** out_data, zero_engine_t* engine, int32_t param);

/* Where the framework ADDS (+=) this rank's gradient of the param for the current micro-step, in the gradient
 * accumulation dtype (zero_engine_info_t.grad_dtype: data_types.grad_accum_dtype, fp32 by default even when the
 * params are bf16/fp16). The buffer holds zeros or the gradients accumulated so far in this accumulation window,
 * so always add, never overwrite. With fp16 the gradient must be of the loss multiplied by zero_loss_scale().
 * Valid until zero_grad_ready for this param (stages 2-3) or until the next zero_step (stages 0-1). Local. */
ZERO_API zero_status_t zero_grad_data(void** out_data, zero_engine_t* engine, int32_t param);

/* Makes a unit's full parameters available (stage 3: all-gathers them; a no-op otherwise). Collective at stage 3:
 * all ranks gather the same units in the same order. Fails if the unit is already gathered. */
ZERO_API zero_status_t zero_gather(zero_engine_t* engine, int32_t unit);

/* Gives a gathered unit's full parameters back (stage 3: frees them). Local. */
ZERO_API zero_status_t zero_release(zero_engine_t* engine, int32_t unit);

/* Declares the param's gradient for this micro-step complete. At stages 2-3 a gradient bucket is reduce-scattered
 * as soon as all its params are ready (collective then: call it in the same order on all ranks). At most once per
 * param per micro-step; params never declared are flushed by zero_backward_end. */
ZERO_API zero_status_t zero_grad_ready(zero_engine_t* engine, int32_t param);

/* Ends the micro-step: reduces every bucket still pending. Collective. */
ZERO_API zero_status_t zero_backward_end(zero_engine_t* engine);

/* What zero_step did. */
typedef struct zero_step_info {
  size_t struct_size;
  int64_t step;      /* optimizer steps taken so far, this one included */
  double loss_scale; /* the loss scale used for this step (1 without fp16) */
  double grad_norm;  /* global L2 norm of the averaged gradients, before clipping */
  int32_t skipped;   /* 1 if the step was skipped (overflow); 0 otherwise */
  double lr;         /* group 0's learning rate used for this step */
} zero_step_info_t;

#define ZERO_STEP_INFO_INIT \
  { sizeof(zero_step_info_t), 0, 0.0, 0.0, 0, 0.0 }

/* Collective. After exactly gradient_accumulation_steps micro-steps: averages the gradients (sum over ranks and
 * micro-steps, then one multiply by 1 / (world size x accumulation steps x loss scale) folded with the clip
 * factor), clips to gradient_clipping by global norm, runs the optimizer on this rank's shard (fp32 master,
 * writing the compute-dtype params) and makes the new parameters visible (stages 0-2) or leaves them sharded
 * (stage 3). A non-finite gradient anywhere (fp16 overflow) skips the step on every rank without touching weights
 * or optimizer state, lowers the loss scale and reports skipped = 1. All units must be released. `out_info` may
 * be NULL. */
ZERO_API zero_status_t zero_step(zero_engine_t* engine, zero_step_info_t* out_info);

/* The factor to multiply the loss by before backward: the current fp16 loss scale (2^initial_scale_power to
 * start, default 2^16), or 1.0 for fp32 and bf16. It changes only in zero_step. Local. */
ZERO_API zero_status_t zero_loss_scale(double* out_scale, const zero_engine_t* engine);

/* Sets a group's learning rate for the following steps; group -1 sets every group. Local (call it with the same
 * value on every rank, as a scheduler would). ZERO_ERR_INVALID_STATE when the config has a "scheduler". */
ZERO_API zero_status_t zero_set_lr(zero_engine_t* engine, int32_t group, double lr);

/* ---------------------------------------------------------------------------------------------------------------
 * Checkpoints (since 0.2). The format is specified in docs/checkpoint-format.md: safetensors shards plus a JSON
 * manifest with checksums; any rank count and stage can load what any other saved.
 * ------------------------------------------------------------------------------------------------------------- */

/* Collective, between steps (after zero_step, no unit gathered). Every rank writes its shard of the fp32 master
 * weights and of the optimizer state into `dir`/.tmp.`tag`, then rank 0 writes the manifest, renames the
 * directory to `dir`/`tag` and atomically points `dir`/latest at it. `dir` must be visible to every rank (a
 * shared file system for several nodes). An existing `tag` is never overwritten (ZERO_ERR_INVALID_ARGUMENT). On
 * any failure (ZERO_ERR_IO: no space, permissions) every rank returns the error and the previous checkpoint and
 * `latest` are untouched. */
ZERO_API zero_status_t zero_save_checkpoint(zero_engine_t* engine, const char* dir, const char* tag);

/* Collective, between steps. Loads `dir`/`tag` (or the tag in `dir`/latest when `tag` is NULL), whatever rank
 * count and stage saved it: each rank reads only the element ranges it now owns. Files are checked against the
 * manifest's sizes and checksums first; a missing, truncated or corrupted file gives ZERO_ERR_CHECKPOINT_CORRUPT
 * naming it, and params that differ from the registration give ZERO_ERR_MISMATCH — on every rank, with the
 * engine's state untouched. Restores weights, optimizer state, step count, loss scaler and group learning rates. */
ZERO_API zero_status_t zero_load_checkpoint(zero_engine_t* engine, const char* dir, const char* tag);

/* ---------------------------------------------------------------------------------------------------------------
 * Engine information (since 0.2).
 * ------------------------------------------------------------------------------------------------------------- */

/* The SIMD path the optimizer kernels run on (ZERO_SIMD=scalar|avx2|avx512 forces one). */
typedef enum zero_simd { ZERO_SIMD_SCALAR = 0, ZERO_SIMD_AVX2 = 1, ZERO_SIMD_AVX512 = 2 } zero_simd_t;

typedef struct zero_engine_info {
  size_t struct_size;
  int32_t rank;
  int32_t world_size;
  int32_t stage;
  int32_t gradient_accumulation_steps;
  zero_dtype_t param_dtype; /* what zero_param_data points to */
  zero_dtype_t grad_dtype;  /* what zero_grad_data points to (the gradient accumulation dtype) */
  zero_dtype_t comm_dtype;  /* what gradients are reduced in */
  zero_simd_t simd;
  int32_t num_params; /* registered so far */
  int32_t num_units;  /* 0 before zero_engine_finalize */
} zero_engine_info_t;

#define ZERO_ENGINE_INFO_INIT \
  { sizeof(zero_engine_info_t), 0, 0, 0, 0, ZERO_DTYPE_FP32, ZERO_DTYPE_FP32, ZERO_DTYPE_FP32, ZERO_SIMD_SCALAR, 0, 0 }

/* Local. Valid any time after zero_engine_create. */
ZERO_API zero_status_t zero_engine_info(const zero_engine_t* engine, zero_engine_info_t* out_info);

/* ---------------------------------------------------------------------------------------------------------------
 * Statistics.
 * ------------------------------------------------------------------------------------------------------------- */

/* Bytes this rank has allocated, per category, as allocated (padding included). */
typedef struct zero_memory_stats {
  size_t struct_size;
  uint64_t param_bytes;           /* compute-dtype params: full (stages 0-2) or shards + persistent units (3) */
  uint64_t grad_bytes;            /* full gradients (stages 0-1) or fp32 shard accumulators (stages 2-3) */
  uint64_t master_param_bytes;    /* separate fp32 master copy; 0 when params are fp32 (the master aliases them) */
  uint64_t optimizer_state_bytes; /* e.g. Adam's m and v */
  uint64_t bucket_bytes;          /* transient gradient buckets (stages 2-3) */
  uint64_t gathered_bytes;        /* buffers for gathered units (stage 3) */
  uint64_t total_bytes;           /* the sum of the above */
} zero_memory_stats_t;

#define ZERO_MEMORY_STATS_INIT \
  { sizeof(zero_memory_stats_t), 0, 0, 0, 0, 0, 0, 0 }

/* Local. Valid after finalize. */
ZERO_API zero_status_t zero_memory_stats(const zero_engine_t* engine, zero_memory_stats_t* out_stats);

/* Traffic of one collective kind since finalize started. `bytes` is the payload as nccl-tests counts "size" (the
 * full buffer of an all-gather / reduce-scatter / all-reduce, the message of a broadcast); `wire_bytes` is what
 * one rank sends in a bandwidth-optimal algorithm: size x (N-1)/N for all-gather and reduce-scatter,
 * size x 2(N-1)/N for all-reduce, size x (N-1)/N for broadcast. */
typedef struct zero_comm_kind_stats {
  uint64_t calls;
  uint64_t bytes;
  uint64_t wire_bytes;
} zero_comm_kind_stats_t;

typedef struct zero_comm_stats {
  size_t struct_size;
  uint64_t sequence; /* collectives issued by this engine so far; equal on all ranks when they agree */
  zero_comm_kind_stats_t all_gather;
  zero_comm_kind_stats_t reduce_scatter;
  zero_comm_kind_stats_t all_reduce;
  zero_comm_kind_stats_t broadcast;
} zero_comm_stats_t;

#define ZERO_COMM_STATS_INIT                                                   \
  {                                                                            \
    sizeof(zero_comm_stats_t), 0, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, { 0, 0, 0 } \
  }

/* Local. */
ZERO_API zero_status_t zero_comm_stats(const zero_engine_t* engine, zero_comm_stats_t* out_stats);

#ifdef __cplusplus
}
#endif

#endif /* ZERO_ZERO_H_ */
