/*
 * libzero — ZeRO (Zero Redundancy Optimizer) training engine, public C API (C99).
 *
 * This is the only public header. A training framework owns forward and backward; libzero owns where every
 * parameter, gradient and optimizer-state byte lives, the collectives that move them, and the optimizer step.
 *
 * Conventions (they hold for every call below unless its comment says otherwise):
 *  - Every fallible call returns zero_status_t. ZERO_OK is 0. On failure zero_last_error() (this thread) and
 *    zero_engine_last_error() (the engine's, whatever thread) describe what went wrong and how to fix it; outputs
 *    are left untouched and nothing leaks.
 *  - Output parameters come first and are named out_*. What comes back through T** belongs to the caller and has
 *    its own destroy function, which accepts NULL. Pointers returned by value are borrowed from their parent.
 *  - Every type that crosses the ABI has a fixed width: enumerations below only name int32_t constants, and
 *    structs hold int32_t, uint32_t (bit flags), int64_t, uint64_t, double, size_t and pointers, never an enum
 *    type. Ids, and counts of registered objects (params, units, groups), are int32_t like the ids themselves.
 *  - Structs lead with `size_t struct_size`. Initialise them with their init function (zero_*_init(&s,
 *    sizeof s), usable from any language) or, in C, their *_INIT macro. The library accepts a struct_size from
 *    the size the struct had when it appeared up to any larger size, provided every byte it does not know is
 *    zero (otherwise ZERO_ERR_UNSUPPORTED names the first unknown field's offset): a program built against an
 *    older header keeps working, and a newer program's settings are never silently dropped. Output structs are
 *    filled up to the smaller of the two sizes and their struct_size is set to the number of bytes filled.
 *    (Records nested inside a struct, like zero_comm_kind_stats_t, have no struct_size: they never grow; a new
 *    record becomes a new field of the struct that holds them.)
 *  - Counts in calls are size_t, in structs uint64_t; dimensions are int64_t; strings are UTF-8, NUL-terminated.
 *  - Thread safety: an engine (and the communicator it uses) is used by one thread at a time; separate engines
 *    are independent. The exceptions are zero_engine_abort() and the experimental
 *    zero_engine_recent_collectives(), which any thread may call at any time while the engine exists (never
 *    concurrently with zero_engine_destroy: a binding's finalizer must not destroy an engine another thread may
 *    still abort). Calls that have no engine (communicator creation, zero_engine_create, zero_config_check,
 *    zero_comm_finalize) report their message through zero_last_error() only, which is per OS thread: a Go
 *    binding locks the OS thread around them (runtime.LockOSThread), as git2go does.
 *  - "Collective" calls must be made by every rank of the communicator, in the same order, with matching
 *    arguments where stated. A collective call never waits forever: if another rank fails (even in its argument
 *    checks), diverges (calls a different collective), leaves (destroys its communicator, calls MPI_Finalize or
 *    exits) or stalls, every rank returns an error naming it (ZERO_ERR_REMOTE, ZERO_ERR_MISMATCH or, after the
 *    engine's timeout plus a few seconds of diagnosis, ZERO_ERR_TIMEOUT). This needs a backend that can wait with
 *    a timeout: the MPI and single-process ones, or a custom one with start/wait (a blocking custom backend gets
 *    every check but the timeout). Destroying only an engine tells no one. An error every rank learns of before
 *    data moves (a rank's failed checks, arguments that differ between ranks) leaves the engine as it was and
 *    usable; after a divergence, or a failure once data moved, the engine is unusable (destroy it). After
 *    ZERO_ERR_TIMEOUT or ZERO_ERR_ABORTED the communicator is unusable: only destroy calls remain. See
 *    docs/architecture.md, "Failure safety".
 *  - "Local" calls never communicate and never block on other ranks.
 *
 * The section guarded by ZERO_EXPERIMENTAL_API (at the end) holds calls that may still change between minor
 * releases; they are exported in their own version node, ZERO_EXPERIMENTAL, and not covered by the ABI promise
 * (docs/abi.md says how a call graduates).
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
typedef int32_t zero_status_t;
enum zero_status {
  ZERO_OK = 0,
  ZERO_ERR_INVALID_ARGUMENT = 1, /* a NULL pointer, an unknown id, a size that does not fit */
  ZERO_ERR_INVALID_STATE = 2,    /* a call in the wrong order (e.g. zero_step before zero_engine_finalize) */
  ZERO_ERR_CONFIG = 3,           /* the JSON config is malformed, has an unknown key or a value of the wrong type */
  ZERO_ERR_UNSUPPORTED = 4,      /* a valid request this version does not support */
  ZERO_ERR_MISMATCH = 5,         /* ranks disagree (registration, config, or which collective they call) */
  ZERO_ERR_COMM = 6,             /* the communication backend failed */
  ZERO_ERR_OUT_OF_MEMORY = 7,
  ZERO_ERR_INTERNAL = 8,           /* a bug in libzero; please report it with zero_last_error()'s text */
  ZERO_ERR_CHECKPOINT_CORRUPT = 9, /* a checkpoint file is missing, truncated or fails its checksum */
  ZERO_ERR_IO = 10,                /* the file system refused (no space, permissions, ...) */
  ZERO_ERR_REMOTE = 11,            /* another rank failed; the message names the rank and its error */
  ZERO_ERR_TIMEOUT = 12, /* a collective did not complete within the timeout; the message says who is missing */
  ZERO_ERR_ABORTED = 13  /* zero_engine_abort() was called on this engine (or another on its communicator) */
};

/* A static, human-readable name for a status ("ZERO_ERR_CONFIG"). Never NULL; unknown values give "unknown". */
ZERO_API const char* zero_status_string(zero_status_t status);

/* The message of the last failed call on this thread. Never NULL ("" when no call has failed). The pointer stays
 * valid until the next libzero call on this thread. A successful call does not clear it: detect errors by status,
 * read this only to report them. */
ZERO_API const char* zero_last_error(void);

/* The runtime library version as ZERO_VERSION_NUMBER would spell it: major * 10000 + minor * 100 + patch. Compare
 * with the compile-time ZERO_VERSION_NUMBER to detect a header/library mismatch. */
ZERO_API uint32_t zero_get_version(void);

/* Frees a string libzero returned through a char** (zero_config_check, ...). Accepts NULL. */
ZERO_API void zero_string_destroy(char* text);

/* ---------------------------------------------------------------------------------------------------------------
 * Logging. Warnings and informational messages go through one process-wide callback. Without one, warnings and
 * errors are printed to stderr by rank 0 (messages that concern one rank only, by that rank).
 * ------------------------------------------------------------------------------------------------------------- */
enum zero_log_level {
  ZERO_LOG_OFF = 0,
  ZERO_LOG_ERROR = 1,
  ZERO_LOG_WARNING = 2,
  ZERO_LOG_INFO = 3,
  ZERO_LOG_DEBUG = 4
};

/* `rank` is the rank of the engine or communicator the message concerns, or -1 if none. `message` is valid during
 * the call only. The callback may be invoked from any thread that calls libzero; it must not call libzero. */
typedef void (*zero_log_fn)(void* user_data, int32_t level, int32_t rank, const char* message);

/* Installs `callback` for messages up to `max_level` (ZERO_LOG_WARNING by default; ZERO_LOG_OFF silences
 * everything). A NULL callback restores the default printer. Not thread-safe with respect to other libzero calls:
 * call it before creating communicators. */
ZERO_API zero_status_t zero_set_log_callback(zero_log_fn callback, void* user_data, int32_t max_level);

/* ---------------------------------------------------------------------------------------------------------------
 * Element types.
 * ------------------------------------------------------------------------------------------------------------- */
typedef int32_t zero_dtype_t;
enum zero_dtype {
  ZERO_DTYPE_FP32 = 0,
  ZERO_DTYPE_BF16 = 1,
  ZERO_DTYPE_FP16 = 2,
  /* The types below are, besides a frozen param's storage (ZERO_PARAM_FROZEN: any of these), what communicator
   * callbacks carry: FP64 the squared gradient norm, INT64 agreement and divergence checks, UINT8 bytes (messages,
   * checkpoint records, frozen params). */
  ZERO_DTYPE_FP64 = 3,
  ZERO_DTYPE_INT64 = 4,
  ZERO_DTYPE_UINT8 = 5, /* also packed quantized weights (4-bit pairs, 8-bit codes) */
  ZERO_DTYPE_INT8 = 6,  /* a frozen param's storage only */
  /* A frozen param's storage only: bytes of any other element type (int32, bool, fp8...), one per element, never
   * interpreted. The param's shape counts bytes. */
  ZERO_DTYPE_BYTES = 7
};

/* ---------------------------------------------------------------------------------------------------------------
 * Communicators. Backends: MPI (a separate module, libzero-mpi.so.1, loaded on demand so that libzero.so itself
 * needs no MPI), a single process, or a custom one a framework provides as a table of callbacks (its own process
 * group: torch.distributed, mpi4py, a Java or Go transport).
 *
 * Teardown: zero_comm_destroy is local. zero_comm_finalize is the collective counterpart (frees the backend's
 * collective resources and, if libzero initialised MPI, finalises MPI).
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct zero_comm zero_comm_t;

/* Pass as `mpi_comm` to use MPI_COMM_WORLD without including mpi.h. */
#define ZERO_MPI_COMM_WORLD ((int64_t)-1)

/* A communicator over MPI. `mpi_comm` is the Fortran handle of any MPI communicator (MPI_Comm_c2f(comm), portable
 * across MPI implementations) or ZERO_MPI_COMM_WORLD. The MPI backend lives in libzero-mpi.so.1, found through
 * the ZERO_MPI_BACKEND environment variable (a path), then by SONAME (the dynamic linker's search path, or a copy
 * the program already loaded or linked), then next to libzero.so; ZERO_ERR_UNSUPPORTED says how to install it
 * when none loads.
 *
 * Threads: the engine runs OpenMP threads beside MPI, so MPI must provide at least MPI_THREAD_FUNNELED, and with
 * FUNNELED every libzero call on this communicator must come from the thread that initialised MPI (a clear error
 * otherwise); initialise MPI with MPI_THREAD_SERIALIZED to call libzero from any one thread at a time (Go, Java,
 * Python threads). If MPI is not initialised yet, libzero initialises it with MPI_THREAD_SERIALIZED; then
 * zero_comm_finalize finalises it (libzero also does it at exit if nobody did). libzero duplicates the
 * communicator, so its messages never match yours. Collective over `mpi_comm`. */
ZERO_API zero_status_t zero_comm_create_mpi(zero_comm_t** out_comm, int64_t mpi_comm);

/* A one-rank communicator (no MPI involved). Every collective is a local copy. Local. */
ZERO_API zero_status_t zero_comm_create_single(zero_comm_t** out_comm);

/* Custom communicators: a framework's own transport as a table of callbacks (zero_comm_create_custom), declared
 * in zero/zero_backend.h, which this header includes: a program that only trains with libzero need not read it. */
#include "zero/zero_backend.h"

/* Collective. Agrees with every rank that the communicator is done (returns an error, never hangs, if a rank
 * does not arrive), then frees the backend's collective resources (MPI: the duplicated communicators) and, if
 * libzero initialised MPI and this is its last MPI communicator, finalises MPI. Afterwards only
 * zero_comm_destroy is valid; engines on it fail with ZERO_ERR_INVALID_STATE. */
ZERO_API zero_status_t zero_comm_finalize(zero_comm_t* comm);

/* Releases the caller's reference. Engines created on the communicator keep it alive until they are destroyed,
 * so the order of destruction does not matter. Local: never communicates (an MPI communicator not finalised is
 * left to MPI_Finalize). Accepts NULL. */
ZERO_API void zero_comm_destroy(zero_comm_t* comm);

/* Local. */
ZERO_API zero_status_t zero_comm_rank(int32_t* out_rank, const zero_comm_t* comm);
ZERO_API zero_status_t zero_comm_size(int32_t* out_size, const zero_comm_t* comm);

/* ---------------------------------------------------------------------------------------------------------------
 * Configuration.
 * ------------------------------------------------------------------------------------------------------------- */

/* Checks a DeepSpeed JSON config as zero_engine_create would read it for `world_size` ranks, without creating
 * anything. On success *out_report is what libzero will do with it (the text `zero-config check` prints; free it
 * with zero_string_destroy). On failure: the status and message zero_engine_create would give. Local. */
ZERO_API zero_status_t zero_config_check(char** out_report, const char* json_config, int32_t world_size);

/* ---------------------------------------------------------------------------------------------------------------
 * Engine: creation and registration.
 *
 * Life cycle: zero_engine_create -> zero_engine_add_param_group* -> zero_engine_add_param+ ->
 * zero_engine_finalize -> training calls -> zero_engine_destroy.
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct zero_engine zero_engine_t;

/* Creates an engine from a DeepSpeed JSON config (the text of ds_config.json) on `comm`. Unknown keys, wrong
 * types and keys libzero cannot honour are errors naming the key (ZERO_ERR_CONFIG, ZERO_ERR_UNSUPPORTED). Keys
 * of DeepSpeed's that never change results but have no effect here are accepted with one warning (log callback).
 * libzero's own settings live in a "libzero" block: "timeout_s" (every collective's timeout, default 600; the
 * environment variable ZERO_TIMEOUT_S overrides it) and "optimizer_threads" (0: automatic). The engine takes its
 * own reference to `comm`. Local. */
ZERO_API zero_status_t zero_engine_create(zero_engine_t** out_engine, const char* json_config, zero_comm_t* comm);

/* Destroys the engine and every buffer it owns; pointers from zero_param_data/zero_grad_data become invalid.
 * Local, except that all-gathers still in flight (overlap_comm's after the last zero_step, zero_prefetch's) are
 * completed first, waiting up to 5 s for the other ranks (which do the same in theirs); so call it from a thread
 * that may use the communicator. After a timeout, buffers a backend may still write into are deliberately not
 * freed. Accepts NULL. */
ZERO_API void zero_engine_destroy(zero_engine_t* engine);

/* The message of the last failed call on this engine, from whichever thread made it. Never NULL ("" if none).
 * Valid until the next failed call on the engine or its destruction. Go, whose goroutines move between OS
 * threads, reads errors here rather than through zero_last_error(). */
ZERO_API const char* zero_engine_last_error(const zero_engine_t* engine);

/* Makes the engine unusable now: a call blocked in a collective on another thread returns ZERO_ERR_ABORTED
 * promptly, every later call fails with ZERO_ERR_ABORTED, and other ranks learn of it (their collectives fail
 * with ZERO_ERR_REMOTE naming this rank). Aborts the engine's communicator, so every engine on it, as
 * ncclCommAbort does. For a job that must go down now. Local (it waits for no other rank), callable from any
 * thread (not from a signal handler). zero_engine_destroy waits for a zero_engine_abort that is already running
 * on another thread, so the engine may be destroyed as soon as a call returns ZERO_ERR_ABORTED; an abort that
 * starts after the destroy began is a use after free, as for any call. Accepts NULL. */
ZERO_API void zero_engine_abort(zero_engine_t* engine);

/* Optimizer threads of this rank: `threads` > 0 uses that many (e.g. the framework's torch.get_num_threads()),
 * 0 restores the automatic choice (OMP_NUM_THREADS if set, else the node's cores divided by the ranks on it).
 * Results do not depend on it. Local. */
ZERO_API zero_status_t zero_engine_set_num_threads(zero_engine_t* engine, int32_t threads);

/* Since 0.4. ZeRO beside tensor or pipeline parallelism (docs/architecture.md, "ZeRO with tensor and pipeline
 * parallelism"): the engine's own communicator is this rank's data-parallel group, and `mp_comm` its model-parallel
 * group, the ranks holding the other parts of the same model replica (the same data-parallel rank in every tensor
 * and pipeline position; Megatron's model-parallel group). With it, zero_step sums the gradient norm's squares over
 * both groups and takes the same clip factor and the same non-finite skip on every rank of the job;
 * zero_engine_finalize checks that the group's ranks have the same config, param groups, data-parallel size and
 * data-parallel rank (the groups form a grid: every model-parallel group has one rank of every data-parallel group);
 * the agreements of finalize, zero_step and checkpoints span both groups, so a failure on any rank before data moves
 * is an error on every rank of the job, and a failure after data moved aborts both communicators (the failed rank's
 * groups fail at once, the other ranks in their next call that spans them; an abort also reaches every other engine
 * and user of `mp_comm`, as it does of the engine's own communicator); checkpoints keep each model-parallel rank's
 * part apart (TAG/mp_rank_XX, docs/checkpoint-format.md). A param that several model-parallel ranks hold whole is
 * marked ZERO_PARAM_MODEL_PARALLEL_DUPLICATE on every rank but the one that counts it. A group of one rank, or NULL,
 * means none. Every rank of the job calls it before zero_engine_finalize. The engine keeps its own reference to
 * `mp_comm`, which may be shared with other engines and the framework. Local. */
ZERO_API zero_status_t zero_engine_set_model_parallel(zero_engine_t* engine, zero_comm_t* mp_comm);

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

/* Sets every field to its default (ZERO_INHERIT, no name) and struct_size to `struct_size`, zeroing any tail a
 * newer header added. */
ZERO_API zero_status_t zero_param_group_desc_init(zero_param_group_desc_t* desc, size_t struct_size);

/* Adds a param group; *out_group receives its id (1, 2, ... in call order). Before finalize only. Local. */
ZERO_API zero_status_t zero_engine_add_param_group(int32_t* out_group, zero_engine_t* engine,
                                                   const zero_param_group_desc_t* desc);

/* At most this many dimensions per param. */
#define ZERO_MAX_NDIM 8

/* zero_param_desc_t.flags. */
enum zero_param_flag {
  /* A param the optimizer does not train (a pretrained base under LoRA, quantized weights): it has no gradient, no
   * fp32 master, no optimizer state and no part in the gradient norm, and keeps its own dtype (any zero_dtype_t but
   * -1), its bytes never converted. It lives in its unit beside the trained params: whole on every rank at stages
   * 0-2 (as DeepSpeed keeps it), sharded at stage 3 and all-gathered with its unit by zero_gather. Checkpoints store
   * its bytes once (zero_save_options_t.exclude_frozen leaves them out). Whether a param is frozen is fixed at
   * registration: to train it later, register it again in a new engine and load a checkpoint. */
  ZERO_PARAM_FROZEN = 1,
  /* Since 0.4. This rank's copy of a trained param that several model-parallel ranks hold whole and equal (a
   * LayerNorm or a row-parallel linear's bias, held by every tensor-parallel rank of its pipeline stage), on every
   * rank but the one that counts it: left out of the gradient norm here, so that the whole job's norm counts it once
   * (zero_engine_set_model_parallel), and still checked for non-finite values. Megatron-LM's rule marks the params
   * without `tensor_model_parallel` on tensor-parallel ranks other than 0. The flag is per rank, not per param: only
   * the caller knows which ranks hold a copy (a pipeline stage's ranks, not the whole group). Without a
   * model-parallel group it changes nothing. */
  ZERO_PARAM_MODEL_PARALLEL_DUPLICATE = 2
};

/* A parameter to register. */
typedef struct zero_param_desc {
  size_t struct_size;
  const char* name;     /* unique, non-empty, valid UTF-8; copied */
  int32_t ndim;         /* 0 (scalar) .. ZERO_MAX_NDIM */
  const int64_t* shape; /* ndim positive extents; copied */
  /* zero_dtype_t; -1 (the default): the engine's compute dtype. A trained param's must equal it; a frozen param's
   * is any zero_dtype_t. */
  int32_t dtype;
  int32_t unit;  /* gather unit, >= 0; units are numbered 0..U-1 in forward order, none left empty */
  int32_t group; /* 0 or an id from zero_engine_add_param_group (a frozen param's is not used) */
  /* Initial values (ndim-shaped, row-major, elements of init_dtype), or NULL for zeros. Read during
   * zero_engine_finalize on rank 0 only, so it must stay valid until then; other ranks may pass NULL. */
  const void* init_data;
  /* The zero_dtype_t of init_data, or -1 (the default) for the param's dtype. fp32 values while training in
   * bf16/fp16 start the fp32 master weights exact. A frozen param's bytes are copied as they are: its init_dtype
   * must be its dtype (or -1). */
  int32_t init_dtype;
  int32_t reserved; /* 0: keeps a future field from landing in padding the library would not see */
  /* Since 0.4. */
  uint32_t flags;    /* zero_param_flag bits; 0: a trained param */
  int32_t reserved2; /* 0 */
} zero_param_desc_t;

#define ZERO_PARAM_DESC_INIT \
  { sizeof(zero_param_desc_t), NULL, 0, NULL, -1, 0, 0, NULL, -1, 0, 0, 0 }

ZERO_API zero_status_t zero_param_desc_init(zero_param_desc_t* desc, size_t struct_size);

/* Registers a parameter; *out_param receives its id (0, 1, ... in call order). Before finalize only. Local. */
ZERO_API zero_status_t zero_engine_add_param(int32_t* out_param, zero_engine_t* engine, const zero_param_desc_t* desc);

/* Collective. Checks that every rank registered the same params and groups and parsed the same config (every
 * setting that changes results; on a difference every rank returns ZERO_ERR_MISMATCH naming the first differing
 * param, group or config key with both values), lays out the flat per-unit buffers, allocates everything this
 * rank keeps for the configured stage (including one gathered-unit buffer and one gradient bucket: no collective
 * allocates; a program that holds more at once — several units gathered, gradients of several buckets written
 * before they are reduced — gets more, allocated by local calls before any agreement), agrees that every rank
 * succeeded, and broadcasts rank 0's initial values (in pieces of at most 2^24 elements, so units of any size
 * need no more memory than that beyond what the stage keeps; values given in the compute dtype, and frozen params'
 * values, cross as their bytes, never through fp32). */
ZERO_API zero_status_t zero_engine_finalize(zero_engine_t* engine);

/* ---------------------------------------------------------------------------------------------------------------
 * Engine: what bindings need to build zero-copy views.
 * ------------------------------------------------------------------------------------------------------------- */

typedef struct zero_param_info {
  size_t struct_size;
  const char* name; /* borrowed from the engine, valid until it is destroyed */
  int32_t ndim;
  int32_t unit;
  int64_t shape[ZERO_MAX_NDIM]; /* the first ndim entries; the rest 0 */
  uint64_t numel;
  int32_t param_dtype; /* what zero_param_data points to (a frozen param's own dtype) */
  int32_t grad_dtype;  /* what zero_grad_data points to; -1 for a frozen param, which has no gradient */
  int32_t group;
  int32_t reserved;     /* 0 */
  uint64_t param_bytes; /* numel x the size of param_dtype */
  uint64_t grad_bytes;  /* numel x the size of grad_dtype; 0 for a frozen param */
  /* Since 0.4. */
  uint32_t flags; /* as registered (zero_param_flag bits) */
  int32_t reserved2;
} zero_param_info_t;

#define ZERO_PARAM_INFO_INIT \
  { sizeof(zero_param_info_t), NULL, 0, 0, {0, 0, 0, 0, 0, 0, 0, 0}, 0, 0, 0, 0, 0, 0, 0, 0, 0 }

ZERO_API zero_status_t zero_param_info_init(zero_param_info_t* info, size_t struct_size);

/* Describes a registered param (any time after zero_engine_add_param). Local. */
ZERO_API zero_status_t zero_param_info(zero_param_info_t* out_info, const zero_engine_t* engine, int32_t param);

typedef struct zero_unit_info {
  size_t struct_size;
  int32_t gathered;   /* 1 between zero_gather and zero_release */
  int32_t num_params; /* registered in this unit */
  /* Changes on every zero_gather and zero_release of the unit (never repeats). A view that recorded it when it
   * was made is valid exactly while gathered == 1 and the generation is unchanged. */
  uint64_t generation;
  uint64_t numel; /* the params' elements, padding excluded */
} zero_unit_info_t;

#define ZERO_UNIT_INFO_INIT \
  { sizeof(zero_unit_info_t), 0, 0, 0, 0 }

ZERO_API zero_status_t zero_unit_info_init(zero_unit_info_t* info, size_t struct_size);

/* After finalize. Local. */
ZERO_API zero_status_t zero_unit_info(zero_unit_info_t* out_info, const zero_engine_t* engine, int32_t unit);

/* ---------------------------------------------------------------------------------------------------------------
 * Engine: the training step. See docs/architecture.md for what each stage does inside these calls.
 *
 * One micro-step: for each unit in forward order zero_gather, forward, zero_release; backward in reverse order:
 * zero_gather, add gradients into zero_grad_data, zero_grad_ready per param, zero_release; then
 * zero_backward_end. After gradient_accumulation_steps micro-steps: zero_step.
 * ------------------------------------------------------------------------------------------------------------- */

/* The parameter's values in the compute dtype (zero_engine_info_t.param_dtype; a frozen param's in its own dtype),
 * contiguous, row-major, valid between zero_gather and zero_release of its unit — at every stage, so that code
 * written for one stage or model size works at every other (ZERO_ERR_INVALID_STATE when the unit is not gathered).
 * Values change only in zero_step and zero_release_modified. Do not write through it except on the modifier rank of
 * a zero_release_modified: what a write does otherwise depends on the stage and dtype (it may be lost at the next
 * zero_gather or zero_step, or reach this rank's master weights only and make the ranks diverge). Local. */
ZERO_API zero_status_t zero_param_data(void** out_data, zero_engine_t* engine, int32_t param);

/* Where the framework ADDS (+=) this rank's gradient of the param for the current micro-step, in the gradient
 * accumulation dtype (zero_engine_info_t.grad_dtype: data_types.grad_accum_dtype, fp32 by default even when the
 * params are bf16/fp16). The buffer holds zeros or the gradients accumulated so far in this accumulation window,
 * so always add, never overwrite. With fp16 the gradient must be of the loss multiplied by zero_loss_scale().
 * Valid until zero_grad_ready for this param. A frozen param has none (ZERO_ERR_INVALID_ARGUMENT). Local. */
ZERO_API zero_status_t zero_grad_data(void** out_data, zero_engine_t* engine, int32_t param);

/* Makes a unit's full parameters available. Stage 3: all-gathers them (collective: all ranks gather the same
 * units in the same order; a rank gathering another unit is ZERO_ERR_MISMATCH on every rank), except units
 * small enough to stay resident (stage3_param_persistence_threshold); a unit prefetched or kept since its last
 * release is taken without communicating. Otherwise local, recording the unit as in use — but with overlap_comm
 * the new params of the last zero_step may still be arriving (an all-gather started by zero_step): this call
 * waits for the unit's, and so can fail as a collective does (ZERO_ERR_REMOTE, ZERO_ERR_TIMEOUT). Fails if the
 * unit is already gathered. */
ZERO_API zero_status_t zero_gather(zero_engine_t* engine, int32_t unit);

/* Gives a gathered unit back (stage 3: its full parameters' buffer returns to the engine's pool, or is kept for
 * the unit's next zero_gather when stage3_max_reuse_distance says so; views of it are invalid either way). Local. */
ZERO_API zero_status_t zero_release(zero_engine_t* engine, int32_t unit);

/* Since 0.4. Releases a gathered unit after rank `modifier_rank` wrote new values into its params through
 * zero_param_data (weights loaded from a file, weight surgery; DeepSpeed's GatheredParameters with a
 * modifier_rank): every rank's copy takes that rank's values, trained and frozen params alike — the params (whole
 * or this rank's shard), and the fp32 master widened from them (with bf16/fp16 params the master so holds the
 * 16-bit values; the optimizer state is kept). What other ranks wrote into their views is discarded. Collective:
 * every rank calls it for the same unit and modifier rank, with the unit gathered (differences are
 * ZERO_ERR_MISMATCH on every rank, before anything moves). What was fetched ahead for later gathers is given back
 * first (it holds the old values). Then the unit is released as zero_release does. Between micro-steps: not after
 * zero_grad_data or zero_grad_ready until zero_backward_end. An error every rank learns before anything moves leaves
 * the unit gathered and unpublished; where the params are whole (stages 0-2, persistent units) the view is the
 * params themselves, so the modifier rank's writes stay in its own copy: call it again to publish them. */
ZERO_API zero_status_t zero_release_modified(zero_engine_t* engine, int32_t unit, int32_t modifier_rank);

/* Declares the param's gradient for this micro-step complete. At stages 2-3 a gradient bucket is reduce-scattered
 * as soon as every param it expects is ready (collective then: declare params ready in the same order on all
 * ranks). A bucket expects the params that had a gradient on any rank in the previous micro-step (all of them in
 * the first), so unused or frozen params do not hold it back; a gradient written into a bucket after its
 * reduction is reduced again by zero_backward_end. At most once per param per micro-step; params never declared
 * are flushed by zero_backward_end. */
ZERO_API zero_status_t zero_grad_ready(zero_engine_t* engine, int32_t param);

/* Ends the micro-step: reduces every bucket still pending. Collective. */
ZERO_API zero_status_t zero_backward_end(zero_engine_t* engine);

/* What zero_step did. */
typedef struct zero_step_info {
  size_t struct_size;
  int64_t step;      /* optimizer steps taken so far, this one included (skipped steps not counted) */
  double loss_scale; /* the loss scale used for this step (1 without fp16) */
  double grad_norm;  /* global L2 norm of the averaged gradients, before clipping */
  int32_t skipped;   /* 1 if the step was skipped (overflow); 0 otherwise */
  int32_t reserved;  /* 0 */
  double lr;         /* group 0's learning rate for this step (the one it would have used, if skipped) */
} zero_step_info_t;

#define ZERO_STEP_INFO_INIT \
  { sizeof(zero_step_info_t), 0, 0.0, 0.0, 0, 0, 0.0 }

ZERO_API zero_status_t zero_step_info_init(zero_step_info_t* info, size_t struct_size);

/* Collective. After exactly gradient_accumulation_steps micro-steps: averages the gradients (their sum over ranks
 * and micro-steps divided once by world size x accumulation steps x loss scale, a correctly rounded division),
 * clips them to gradient_clipping by global norm (a separate multiply), runs the optimizer on this rank's shard
 * (fp32 master, writing the compute-dtype params) and makes the new parameters visible (stages 0-2) or leaves
 * them sharded (stage 3). A non-finite gradient anywhere (fp16 overflow) skips the step on every rank without
 * touching weights or optimizer state, lowers the loss scale and reports skipped = 1. All units must be
 * released. `out_info` may be NULL. */
ZERO_API zero_status_t zero_step(zero_step_info_t* out_info, zero_engine_t* engine);

/* Since 0.4. How zero_step_with averages the window's gradients. */
typedef struct zero_step_options {
  size_t struct_size;
  /* 1: step after the micro-steps ended since the last step, however many (1 to gradient_accumulation_steps: the
   * remainder of an epoch whose length is not a multiple of the window), averaging over those k micro-steps: the
   * same bits as an engine configured with gradient_accumulation_steps = k. 0: exactly gradient_accumulation_steps
   * must have ended, as zero_step asks. */
  int32_t partial_window;
  /* 1: each micro-step's loss was already divided by the number of micro-steps averaged (DeepSpeed's
   * backward(scale_wrt_gas=False), which the Hugging Face Trainer uses): the gradients are summed over micro-steps
   * and averaged over ranks only (divided by world size x loss scale). 0: divided by world size x micro-steps x
   * loss scale. */
  int32_t loss_averaged;
} zero_step_options_t;

#define ZERO_STEP_OPTIONS_INIT \
  { sizeof(zero_step_options_t), 0, 0 }

ZERO_API zero_status_t zero_step_options_init(zero_step_options_t* options, size_t struct_size);

/* Since 0.4. zero_step with options (NULL: the defaults, which zero_step uses). Every rank must pass the same
 * options after the same number of micro-steps (ZERO_ERR_MISMATCH on every rank otherwise, before anything moves).
 * Collective. */
ZERO_API zero_status_t zero_step_with(zero_step_info_t* out_info, zero_engine_t* engine,
                                      const zero_step_options_t* options);

/* The factor to multiply the loss by before backward: the current fp16 loss scale (2^initial_scale_power to
 * start, default 2^16), or 1.0 for fp32 and bf16. It changes only in zero_step. Local. */
ZERO_API zero_status_t zero_loss_scale(double* out_scale, const zero_engine_t* engine);

/* Sets a group's learning rate for the following steps; group -1 sets every group. ZERO_ERR_INVALID_STATE when
 * the config has a "scheduler". Local; every rank must set the same value — the next zero_step checks that they
 * did (ZERO_ERR_MISMATCH on every rank otherwise). */
ZERO_API zero_status_t zero_set_lr(zero_engine_t* engine, int32_t group, double lr);

/* Since 0.4. The learning rate the next zero_step gives a group: the config's "scheduler" evaluated at that step
 * where there is one (a skipped step does not advance it), else the rate the group was created with or last set by
 * zero_set_lr (DeepSpeed's get_lr()). After finalize. Local. */
ZERO_API zero_status_t zero_get_lr(double* out_lr, const zero_engine_t* engine, int32_t group);

/* ---------------------------------------------------------------------------------------------------------------
 * Checkpoints. The format is specified in docs/checkpoint-format.md: safetensors shards plus a JSON manifest with
 * checksums; any rank count and stage can load what any other saved.
 * ------------------------------------------------------------------------------------------------------------- */

/* Collective, between steps (after zero_step, no unit gathered, no gradient asked for since). Every rank writes its
 * shard of the fp32 master weights and of the optimizer state into `dir`/.tmp.`tag`, then rank 0 writes the manifest,
 * renames the directory to `dir`/`tag` and atomically points `dir`/latest at it. `tag` is a directory name: 1 to
 * 250 bytes, no control characters or '/', not starting with '.', no space at either end, not "latest"
 * (ZERO_ERR_INVALID_ARGUMENT otherwise).
 * `dir` must be visible to every rank (a shared file system for several nodes). An existing `tag` is never
 * overwritten (ZERO_ERR_INVALID_ARGUMENT). On any failure (ZERO_ERR_IO: no space, permissions) every rank returns
 * the error and the previous checkpoint and `latest` are untouched. */
ZERO_API zero_status_t zero_save_checkpoint(zero_engine_t* engine, const char* dir, const char* tag);

/* Since 0.4. How zero_save_checkpoint_with saves. */
typedef struct zero_save_options {
  size_t struct_size;
  /* 1: leave the frozen params' bytes out (DeepSpeed's exclude_frozen_parameters; a fine-tuning job whose base
   * weights are loaded anew saves only what it trains). Loading such a checkpoint keeps the engine's own frozen
   * params. */
  int32_t exclude_frozen;
  int32_t reserved; /* 0 */
} zero_save_options_t;

#define ZERO_SAVE_OPTIONS_INIT \
  { sizeof(zero_save_options_t), 0, 0 }

ZERO_API zero_status_t zero_save_options_init(zero_save_options_t* options, size_t struct_size);

/* Since 0.4. zero_save_checkpoint with options (NULL: the defaults, which zero_save_checkpoint uses). Every rank
 * must pass the same options (ZERO_ERR_MISMATCH otherwise). Collective. */
ZERO_API zero_status_t zero_save_checkpoint_with(zero_engine_t* engine, const char* dir, const char* tag,
                                                 const zero_save_options_t* options);

/* Collective, between steps. Loads `dir`/`tag` (or the tag in `dir`/latest when `tag` is NULL), whatever rank
 * count and stage saved it: each rank reads only the element ranges it now owns. Files are checked against the
 * manifest's sizes and checksums first; a missing, truncated or corrupted file gives ZERO_ERR_CHECKPOINT_CORRUPT
 * naming it, and params that differ from the registration give ZERO_ERR_MISMATCH — on every rank, with the
 * engine's state untouched and the engine usable (another checkpoint may be loaded, or training go on). Restores
 * weights, optimizer state, step count, loss scaler and group learning rates, and the frozen params' bytes unless
 * the checkpoint was saved without them (the engine's own are kept then). */
ZERO_API zero_status_t zero_load_checkpoint(zero_engine_t* engine, const char* dir, const char* tag);

/* ---------------------------------------------------------------------------------------------------------------
 * Engine information and statistics. Local.
 * ------------------------------------------------------------------------------------------------------------- */

/* The SIMD path the optimizer kernels run on (ZERO_SIMD=scalar|avx2|avx512 forces one). */
enum zero_simd { ZERO_SIMD_SCALAR = 0, ZERO_SIMD_AVX2 = 1, ZERO_SIMD_AVX512 = 2 };

typedef struct zero_engine_info {
  size_t struct_size;
  int32_t rank;
  int32_t world_size;
  int32_t stage;
  int32_t gradient_accumulation_steps;
  int32_t param_dtype; /* zero_dtype_t: what zero_param_data points to */
  int32_t grad_dtype;  /* what zero_grad_data points to (the gradient accumulation dtype) */
  int32_t comm_dtype;  /* what gradients are reduced in */
  int32_t simd;        /* zero_simd */
  int32_t num_params;  /* registered so far */
  int32_t num_units;   /* 0 before zero_engine_finalize */
  int32_t optimizer_threads;
  int32_t deterministic; /* 1 when the communicator sums in rank order (ZERO_COMM_DETERMINISTIC) */
  double timeout_s;      /* every collective's timeout */
} zero_engine_info_t;

#define ZERO_ENGINE_INFO_INIT \
  { sizeof(zero_engine_info_t), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0 }

ZERO_API zero_status_t zero_engine_info_init(zero_engine_info_t* info, size_t struct_size);

/* Valid any time after zero_engine_create. */
ZERO_API zero_status_t zero_engine_info(zero_engine_info_t* out_info, const zero_engine_t* engine);

/* Bytes this rank has allocated, per category, as allocated (padding included). */
typedef struct zero_memory_stats {
  size_t struct_size;
  uint64_t param_bytes;           /* compute-dtype params: full (stages 0-2) or shards + persistent units (3) */
  uint64_t grad_bytes;            /* full gradients (stages 0-1) or fp32 shard accumulators (stages 2-3) */
  uint64_t master_param_bytes;    /* separate fp32 master copy; 0 when params are fp32 (the CPU engine's master
                                   * aliases them) */
  uint64_t optimizer_state_bytes; /* e.g. Adam's m and v */
  uint64_t bucket_bytes;          /* gradient buckets (stages 2-3) */
  uint64_t gathered_bytes;        /* buffers for gathered units (stage 3), their frozen params included */
  uint64_t total_bytes;           /* the sum of every kind, frozen_param_bytes included */
  /* Since 0.4. */
  uint64_t frozen_param_bytes; /* frozen params (ZERO_PARAM_FROZEN): whole (stages 0-2, persistent units) or shards */
} zero_memory_stats_t;

#define ZERO_MEMORY_STATS_INIT \
  { sizeof(zero_memory_stats_t), 0, 0, 0, 0, 0, 0, 0, 0 }

ZERO_API zero_status_t zero_memory_stats_init(zero_memory_stats_t* stats, size_t struct_size);

/* After finalize (ZERO_ERR_INVALID_STATE before: nothing is planned yet). Local. */
ZERO_API zero_status_t zero_memory_stats(zero_memory_stats_t* out_stats, const zero_engine_t* engine);

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
  uint64_t sequence; /* collectives issued by this engine so far, control messages included (an all-reduce of
                      * gradients is issued as a reduce-scatter and an all-gather: two) */
  zero_comm_kind_stats_t all_gather;
  zero_comm_kind_stats_t reduce_scatter;
  zero_comm_kind_stats_t all_reduce;
  zero_comm_kind_stats_t broadcast;
  /* The engine's small bookkeeping messages, counted here only: the failure-safety mechanism's (the agreement
   * before each collective call, a failed rank's message, the divergence checks) and, at stages 2-3, each
   * micro-step's exchange of which params had gradients. The four kinds above are the data: the ZeRO formulas'
   * traffic plus the gradient norm's sum, one 8-byte all_reduce per step. */
  zero_comm_kind_stats_t control;
} zero_comm_stats_t;

#define ZERO_COMM_STATS_INIT                                                              \
  {                                                                                       \
    sizeof(zero_comm_stats_t), 0, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, { 0, 0, 0 } \
  }

ZERO_API zero_status_t zero_comm_stats_init(zero_comm_stats_t* stats, size_t struct_size);

ZERO_API zero_status_t zero_comm_stats(zero_comm_stats_t* out_stats, const zero_engine_t* engine);

/* ---------------------------------------------------------------------------------------------------------------
 * Experimental: may change in any release; exported in the version node ZERO_EXPERIMENTAL. Define
 * ZERO_EXPERIMENTAL_API before including this header to use them.
 * ------------------------------------------------------------------------------------------------------------- */
#ifdef ZERO_EXPERIMENTAL_API

/* A communicator for ranks that share one machine, over shared memory alone (no MPI): for jobs started by a
 * launcher that is not MPI's (torchrun, a scheduler), which gives every process its `rank`, the job's `size` and a
 * `name` every rank of the job passes alike and no other job uses (up to 199 characters without '/'; a POSIX
 * shared-memory object of that name exists while the ranks join). Collectives are the MPI module's shared-memory
 * ones (the same bits), with the same failure safety: a rank that stops or dies is named in every other rank's
 * next wait, a collective that does not complete times out with a diagnosis. Collective: returns once every rank has
 * joined, or ZERO_ERR_TIMEOUT after `join_timeout_s` seconds naming who did not. An engine's gradient buckets live
 * in the node's shared arena, so that the peers sum them in place (ZERO_SHM_ARENA_BYTES, each rank's share of
 * address space; 0 turns it off). Environment: ZERO_SHM_HALF_BYTES, ZERO_SHM_SINGLE_COPY, ZERO_SHM_ARENA_BYTES,
 * ZERO_SHM_DIRECT_MIN_BYTES, ZERO_SHM_PROGRESS_THREAD (docs/architecture.md, "Communicators"). */
ZERO_API zero_status_t zero_comm_create_shm(zero_comm_t** out_comm, const char* name, int32_t rank, int32_t size,
                                            double join_timeout_s);

/* A TCP listening socket for zero_comm_create_shm_nodes, made before the job's bootstrap hands out the ranks'
 * addresses. `host`: the address to bind and give the other machines (the IP of the interface they reach this one
 * by); "" binds every interface and gives the machine's name. *out_address ("host:port", with a port the kernel
 * chose) lives as long as the listener. One listener serves one communicator: destroy it once that is made (or
 * the job gave up). */
typedef struct zero_listener zero_listener_t;
ZERO_API zero_status_t zero_listener_create(zero_listener_t** out_listener, const char** out_address, const char* host);
ZERO_API void zero_listener_destroy(zero_listener_t* listener);

/* zero_comm_create_shm for a job over several machines, without MPI: node k holds the `ranks_per_node` consecutive
 * ranks k * ranks_per_node .. (torchrun's placement, the same count on every node); each node's ranks share memory
 * (a segment named after `name` and the node) and the ranks with the same place on every node talk over TCP. The
 * reduce-scatter continues one rank-order sum across the nodes, so every collective gives the bits of the one-node
 * paths. `addresses`: every rank's listener's address, in rank order (what each rank's zero_listener_create gave,
 * gathered by the job's bootstrap: torch.distributed's store under torchrun); `listener`: this rank's. Failure
 * safety as zero_comm_create_shm's: a rank that stops tells its node (shared memory) and its counterparts on the
 * other nodes (its last words, then its connections close), so every rank's next wait fails naming it. Collective:
 * returns once every rank has joined and connected, or ZERO_ERR_TIMEOUT after `join_timeout_s` naming who did not;
 * ZERO_ERR_MISMATCH if the nodes' ZERO_SHM_HALF_BYTES differ. With ranks_per_node == size it is
 * zero_comm_create_shm. */
ZERO_API zero_status_t zero_comm_create_shm_nodes(zero_comm_t** out_comm, zero_listener_t* listener, const char* name,
                                                  int32_t rank, int32_t size, int32_t ranks_per_node,
                                                  const char* const* addresses, double join_timeout_s);

/* One communicator over two: an engine on it sends its control messages (the agreement before every collective
 * call, checks, the step's small sums: host memory, a few bytes) over `control` and its data collectives (gradients,
 * parameters) over `data` — a host communicator (MPI, shared memory, a framework's gloo group) beside a device one
 * (NCCL, a framework's NCCL group: ZERO_COMM_DEVICE_BUFFERS), so that a device engine never drains its stream for an
 * agreement. Both must span the same ranks in the same order. Failure safety holds for both: a collective that
 * fails or times out on either side is an error on every rank, and an abort reaches both. The split keeps both alive
 * (their handles may be destroyed at once); both stay the caller's to finalize: zero_comm_finalize of the split
 * agrees over `control` and finalizes neither. Local. */
ZERO_API zero_status_t zero_comm_create_split(zero_comm_t** out_comm, zero_comm_t* control, zero_comm_t* data);

/* A communicator for a device engine over NCCL: data collectives (gradients, parameters) over an NCCL communicator on
 * CUDA device `device`, control messages over `control` (a host communicator: MPI, shared memory), as
 * zero_comm_create_split makes them. NCCL is bootstrapped over `control` (rank 0's unique id) and loaded at run time
 * (libzero's NCCL module libzero-nccl.so.1, then ZERO_NCCL_LIBRARY or libnccl.so.2: a system NCCL or the pip
 * nvidia-nccl wheel). Collectives run on the module's stream after the engine's stream's work, and the engine's stream
 * waits for them; reduce-scatters keep zero.h's rank-order sums (an exchange of blocks and a device sum in fp32 where
 * NCCL's own order could change a bit), unless the config sets libzero.deterministic to false. Several processes on
 * one GPU: give each a distinct NCCL_HOSTID (NCCL then joins them over its socket transport). Collective over
 * `control`: every rank gets the communicator or the same error (a rank without NCCL, a GPU or a peer within
 * `timeout_s` seconds is named). zero_comm_finalize finalizes the NCCL side; `control` stays the caller's. */
ZERO_API zero_status_t zero_comm_create_nccl(zero_comm_t** out_comm, zero_comm_t* control, int32_t device,
                                             double timeout_s);

/* The engine's last collectives (up to 64, oldest first) as a JSON array: sequence, side ("control": the agreement,
 * checks and host-memory broadcasts; "data"), kind, label, element count, dtype, state ("done", "waiting",
 * "failed"), start time and duration. Sequences count each side's collectives on a split communicator
 * (zero_comm_create_split, zero_comm_create_nccl), one count otherwise. For a framework's own hang reports. Free
 * with zero_string_destroy. Any thread, any time (also while the engine's thread is blocked in a collective). */
ZERO_API zero_status_t zero_engine_recent_collectives(char** out_json, const zero_engine_t* engine);

/* Memory spaces of the engine's buffers (docs/architecture.md, "Placement plan"). The CPU engine places
 * everything in host memory; pinned host and device memory come with the CUDA build. */
typedef int32_t zero_memory_space_t;
enum zero_memory_space { ZERO_MEMORY_HOST = 0, ZERO_MEMORY_PINNED_HOST = 1, ZERO_MEMORY_DEVICE = 2 };

/* An allocator a framework hands to an engine (ONNX Runtime's OrtAllocator in spirit), so that the engine's
 * buffers in one memory space come from the framework's pool and show in its accounting. `alloc` returns
 * `bytes` aligned to `alignment` (a power of two, 64 or 2 MiB; `bytes` is a multiple of it), or NULL when it
 * cannot: finalize then fails with ZERO_ERR_OUT_OF_MEMORY on this rank and ZERO_ERR_REMOTE naming it on the
 * others. libzero zeroes the memory itself.
 * `free` gets each pointer back with the byte count `alloc` was called with, at the latest when the engine is
 * destroyed (never, for buffers a collective that timed out may still write). Both are called from threads that
 * call libzero, one at a time per engine. `user_data` must stay valid until every engine given the allocator is
 * destroyed. */
typedef struct zero_allocator {
  size_t struct_size;
  void* (*alloc)(void* user_data, size_t bytes, size_t alignment);
  void (*free)(void* user_data, void* ptr, size_t bytes);
  void* user_data;
} zero_allocator_t;

#define ZERO_ALLOCATOR_INIT \
  { sizeof(zero_allocator_t), NULL, NULL, NULL }

ZERO_API zero_status_t zero_allocator_init(zero_allocator_t* allocator, size_t struct_size);

/* The engine's buffers in `space` come from `allocator` (copied; NULL restores the default: libzero's own for host
 * memory, none for the others). Before zero_engine_finalize. Local. */
ZERO_API zero_status_t zero_engine_set_allocator(zero_engine_t* engine, zero_memory_space_t space,
                                                 const zero_allocator_t* allocator);

/* Stage 3: starts the all-gather of `unit` now, so that it moves while the framework computes; the unit's next
 * zero_gather takes it without communicating (until zero_step, which discards what was fetched and not gathered).
 * Collective, like zero_gather: every rank calls it for the same unit at the same point; a unit already fetched
 * ahead is left as it is. Units with full params (stages 0-2, resident stage-3 units): nothing to do, local.
 * The engine also prefetches by itself, in the order of the previous micro-step's zero_gather calls, as the
 * zero_optimization keys stage3_prefetch_bucket_size, stage3_max_live_parameters and stage3_max_reuse_distance
 * say (on by default with overlap_comm; docs/config.md). The buffers count in zero_memory_stats' gathered_bytes. */
ZERO_API zero_status_t zero_prefetch(zero_engine_t* engine, int32_t unit);

/* Where one rank's model states live, beside zero_memory_stats' kinds (which count each kind wherever it is). With
 * zero_optimization.offload_optimizer {device: "nvme"} the fp32 master (when the params train in bf16/fp16) and the
 * optimizer state are in one file per rank under nvme_path and stream through a window of host memory during
 * zero_step; with offload_param {device: "nvme"} (stage 3) the param shards of non-resident units are in another
 * (docs/architecture.md, "NVMe offload"). Without offload, host_bytes is zero_memory_stats' total_bytes
 * and the others are 0. After finalize (ZERO_ERR_INVALID_STATE before); local. Both equal what `zero-config estimate`
 * predicts. */
typedef struct zero_memory_placement {
  size_t struct_size;
  uint64_t host_bytes;    /* the kinds held in host memory, plus staging_bytes */
  uint64_t nvme_bytes;    /* the NVMe files: the offloaded kinds (offload_optimizer's master and state, offload_param's
                             param shards), each unit's range padded to 4 KiB */
  uint64_t staging_bytes; /* host memory offloading uses: the window the optimizer state streams through
                             (buffer_count chunks of every array), and offload_param's buffer and one shard */
} zero_memory_placement_t;

#define ZERO_MEMORY_PLACEMENT_INIT \
  { sizeof(zero_memory_placement_t), 0, 0, 0 }

ZERO_API zero_status_t zero_memory_placement_init(zero_memory_placement_t* placement, size_t struct_size);
ZERO_API zero_status_t zero_memory_placement(zero_memory_placement_t* out_placement, const zero_engine_t* engine);

/* Where the engine is in its accumulation window, so that a binding or a training loop need not count micro-steps
 * itself: the micro-steps ended (zero_backward_end) since the last zero_step, of gradient_accumulation_steps
 * (zero_step's turn when they are equal); every micro-step ended since finalize; the optimizer steps taken
 * (skipped ones excluded). Valid any time after zero_engine_create (all 0 before finalize). Local. */
typedef struct zero_window_info {
  size_t struct_size;
  int64_t micro_steps;        /* ended in this window */
  int64_t accumulation_steps; /* gradient_accumulation_steps */
  int64_t total_micro_steps;  /* ended since finalize */
  int64_t steps;              /* optimizer steps taken */
} zero_window_info_t;

#define ZERO_WINDOW_INFO_INIT \
  { sizeof(zero_window_info_t), 0, 0, 0, 0 }

ZERO_API zero_status_t zero_window_info_init(zero_window_info_t* info, size_t struct_size);
ZERO_API zero_status_t zero_engine_window(zero_window_info_t* out_info, const zero_engine_t* engine);

/* A device engine: the engine's model states (params, gradients, fp32 master, optimizer state, buckets, gathered
 * units) in device memory, and its gradient norm and optimizer step on the device, with the CPU engine's bits.
 * `device` is "cuda" (the current CUDA device, through the libzero-cuda.so.1 module of a -DZERO_CUDA=ON build), or
 * "emulator" (libzero's host emulator of a device: a test tool, not a device, that runs the device engine on the
 * CPU, faults when the host touches device memory and fails on an access no stream order or event orders). Before
 * zero_engine_finalize. At more than one rank the collectives go through pinned host memory over the engine's
 * communicator (host-staged: MPI, shared memory or a framework's host process group). finalize refuses, on the rank
 * that has it, what the device engine does not run yet (a model-parallel group, offload to NVMe). With a device,
 * zero_param_data and zero_grad_data return device memory: read and write it with zero_engine_copy, or on the
 * framework's stream given with zero_engine_set_stream. Local. */
ZERO_API zero_status_t zero_engine_set_device(zero_engine_t* engine, const char* device);

/* The framework's stream for a device engine: a cudaStream_t of the engine's device (NULL is CUDA's legacy default
 * stream, which PyTorch's default stream is). From then on each call's device work is ordered after the work the
 * framework queued on that stream so far, and the work it queues there afterwards after the call's, through events:
 * no call waits for the device (zero_step waits once for the gradient norm's sums). Without a stream set, every
 * call's device work is complete when it returns. Any time after zero_engine_set_device (a later call replaces the
 * stream); the stream must outlive the engine (zero_engine_destroy orders its frees after the stream's work).
 * Local. */
ZERO_API zero_status_t zero_engine_set_stream(zero_engine_t* engine, void* stream);

/* Copies `n_bytes` from `src` to `dst`, each in host memory or in the engine's memory (for a "cuda" engine, any
 * memory of its device, a framework's tensors included), ordered after the engine's work and complete on return;
 * the ranges must not overlap. Local. */
ZERO_API zero_status_t zero_engine_copy(zero_engine_t* engine, void* dst, const void* src, size_t n_bytes);

/* Where the engine's memory is, as DLPack numbers devices (DLDeviceType, device id): (1, 0) kDLCPU for the CPU
 * engine, (2, ordinal) kDLCUDA for "cuda", (12, 0) kDLExtDev for "emulator" (memory no consumer may read: the host
 * must not touch it). What a binding exporting zero_param_data's memory through DLPack says. Local. */
ZERO_API zero_status_t zero_engine_device(int32_t* out_device_type, int32_t* out_device_id,
                                          const zero_engine_t* engine);

/* Work queued on `stream` from now on runs after the engine's device work queued so far, with no host wait: what a
 * consumer of the engine's memory on a stream other than zero_engine_set_stream's calls before using it (DLPack's
 * __dlpack__(stream=) handshake). `stream` is a cudaStream_t of the engine's device, including CUDA's special
 * handles as DLPack consumers pass them (1: the legacy default stream, 2: the per-thread one); on the emulator, a
 * stream it made. ZERO_ERR_INVALID_STATE for an engine without a device. Local. */
ZERO_API zero_status_t zero_engine_order_stream(zero_engine_t* engine, void* stream);

#endif /* ZERO_EXPERIMENTAL_API */

#ifdef __cplusplus
}
#endif

#endif /* ZERO_ZERO_H_ */
