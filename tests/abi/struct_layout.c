/*
 * The size and field offsets of every public struct and the values of the named constants, frozen for the x86_64 /
 * aarch64 LP64 ABI of generation 1 (libzero.so.1, release 0.3). A change here is an ABI break: structs only ever
 * grow at the end (new fields after the last one; struct_size tells the library which fields a caller knows), so
 * existing offsets and sizes stay as they are. Compiled as C11 for _Static_assert; the public header stays C99.
 */
#include <stddef.h>

#include "zero/zero.h"

#define OFFSET(type, field, value) _Static_assert(offsetof(type, field) == (value), #type "." #field " moved")
#define SIZE(type, value) _Static_assert(sizeof(type) == (value), "sizeof(" #type ") changed")

_Static_assert(sizeof(void*) == 8, "the frozen layout below is for LP64 targets");

/* Every type that crosses the ABI has a fixed width: no enum-typed fields, parameters or results. */
SIZE(zero_status_t, 4);
SIZE(zero_dtype_t, 4);

SIZE(zero_collective_t, 72);
OFFSET(zero_collective_t, struct_size, 0);
OFFSET(zero_collective_t, kind, 8);
OFFSET(zero_collective_t, dtype, 12);
OFFSET(zero_collective_t, op, 16);
OFFSET(zero_collective_t, root, 20);
OFFSET(zero_collective_t, buf, 24);
OFFSET(zero_collective_t, count, 32);
OFFSET(zero_collective_t, sequence, 40);
OFFSET(zero_collective_t, label, 48);
OFFSET(zero_collective_t, stream, 56); /* 0.4 */
OFFSET(zero_collective_t, flags, 64);  /* 0.4 */

SIZE(zero_comm_ops_t, 104);
OFFSET(zero_comm_ops_t, struct_size, 0);
OFFSET(zero_comm_ops_t, rank, 8);
OFFSET(zero_comm_ops_t, size, 12);
OFFSET(zero_comm_ops_t, local_size, 16);
OFFSET(zero_comm_ops_t, flags, 20);
OFFSET(zero_comm_ops_t, run, 24);
OFFSET(zero_comm_ops_t, start, 32);
OFFSET(zero_comm_ops_t, wait, 40);
OFFSET(zero_comm_ops_t, error_message, 48);
OFFSET(zero_comm_ops_t, abort, 56);
OFFSET(zero_comm_ops_t, diagnose, 64);
OFFSET(zero_comm_ops_t, finalize, 72);
OFFSET(zero_comm_ops_t, destroy, 80);
OFFSET(zero_comm_ops_t, group_begin, 88); /* 0.4 */
OFFSET(zero_comm_ops_t, group_end, 96);   /* 0.4 */

SIZE(zero_param_group_desc_t, 56);
OFFSET(zero_param_group_desc_t, struct_size, 0);
OFFSET(zero_param_group_desc_t, name, 8);
OFFSET(zero_param_group_desc_t, lr, 16);
OFFSET(zero_param_group_desc_t, weight_decay, 24);
OFFSET(zero_param_group_desc_t, beta1, 32);
OFFSET(zero_param_group_desc_t, beta2, 40);
OFFSET(zero_param_group_desc_t, eps, 48);

SIZE(zero_param_desc_t, 72);
OFFSET(zero_param_desc_t, struct_size, 0);
OFFSET(zero_param_desc_t, name, 8);
OFFSET(zero_param_desc_t, ndim, 16);
OFFSET(zero_param_desc_t, shape, 24);
OFFSET(zero_param_desc_t, dtype, 32);
OFFSET(zero_param_desc_t, unit, 36);
OFFSET(zero_param_desc_t, group, 40);
OFFSET(zero_param_desc_t, init_data, 48);
OFFSET(zero_param_desc_t, init_dtype, 56);
OFFSET(zero_param_desc_t, reserved, 60);
OFFSET(zero_param_desc_t, flags, 64); /* 0.4 */
OFFSET(zero_param_desc_t, reserved2, 68);

SIZE(zero_param_info_t, 136);
OFFSET(zero_param_info_t, struct_size, 0);
OFFSET(zero_param_info_t, name, 8);
OFFSET(zero_param_info_t, ndim, 16);
OFFSET(zero_param_info_t, unit, 20);
OFFSET(zero_param_info_t, shape, 24);
OFFSET(zero_param_info_t, numel, 88);
OFFSET(zero_param_info_t, param_dtype, 96);
OFFSET(zero_param_info_t, grad_dtype, 100);
OFFSET(zero_param_info_t, group, 104);
OFFSET(zero_param_info_t, reserved, 108);
OFFSET(zero_param_info_t, param_bytes, 112);
OFFSET(zero_param_info_t, grad_bytes, 120);
OFFSET(zero_param_info_t, flags, 128); /* 0.4 */
OFFSET(zero_param_info_t, reserved2, 132);

SIZE(zero_unit_info_t, 32);
OFFSET(zero_unit_info_t, struct_size, 0);
OFFSET(zero_unit_info_t, gathered, 8);
OFFSET(zero_unit_info_t, num_params, 12);
OFFSET(zero_unit_info_t, generation, 16);
OFFSET(zero_unit_info_t, numel, 24);

SIZE(zero_step_info_t, 48);
OFFSET(zero_step_info_t, struct_size, 0);
OFFSET(zero_step_info_t, step, 8);
OFFSET(zero_step_info_t, loss_scale, 16);
OFFSET(zero_step_info_t, grad_norm, 24);
OFFSET(zero_step_info_t, skipped, 32);
OFFSET(zero_step_info_t, reserved, 36);
OFFSET(zero_step_info_t, lr, 40);

SIZE(zero_engine_info_t, 64);
OFFSET(zero_engine_info_t, struct_size, 0);
OFFSET(zero_engine_info_t, rank, 8);
OFFSET(zero_engine_info_t, world_size, 12);
OFFSET(zero_engine_info_t, stage, 16);
OFFSET(zero_engine_info_t, gradient_accumulation_steps, 20);
OFFSET(zero_engine_info_t, param_dtype, 24);
OFFSET(zero_engine_info_t, grad_dtype, 28);
OFFSET(zero_engine_info_t, comm_dtype, 32);
OFFSET(zero_engine_info_t, simd, 36);
OFFSET(zero_engine_info_t, num_params, 40);
OFFSET(zero_engine_info_t, num_units, 44);
OFFSET(zero_engine_info_t, optimizer_threads, 48);
OFFSET(zero_engine_info_t, deterministic, 52);
OFFSET(zero_engine_info_t, timeout_s, 56);

SIZE(zero_memory_stats_t, 72);
OFFSET(zero_memory_stats_t, struct_size, 0);
OFFSET(zero_memory_stats_t, param_bytes, 8);
OFFSET(zero_memory_stats_t, grad_bytes, 16);
OFFSET(zero_memory_stats_t, master_param_bytes, 24);
OFFSET(zero_memory_stats_t, optimizer_state_bytes, 32);
OFFSET(zero_memory_stats_t, bucket_bytes, 40);
OFFSET(zero_memory_stats_t, gathered_bytes, 48);
OFFSET(zero_memory_stats_t, total_bytes, 56);
OFFSET(zero_memory_stats_t, frozen_param_bytes, 64); /* 0.4 */

SIZE(zero_save_options_t, 16); /* 0.4 */
OFFSET(zero_save_options_t, struct_size, 0);
OFFSET(zero_save_options_t, exclude_frozen, 8);
OFFSET(zero_save_options_t, reserved, 12);
SIZE(zero_step_options_t, 16); /* 0.4 */
OFFSET(zero_step_options_t, struct_size, 0);
OFFSET(zero_step_options_t, partial_window, 8);
OFFSET(zero_step_options_t, loss_averaged, 12);

SIZE(zero_comm_kind_stats_t, 24);
OFFSET(zero_comm_kind_stats_t, calls, 0);
OFFSET(zero_comm_kind_stats_t, bytes, 8);
OFFSET(zero_comm_kind_stats_t, wire_bytes, 16);

SIZE(zero_comm_stats_t, 136);
OFFSET(zero_comm_stats_t, struct_size, 0);
OFFSET(zero_comm_stats_t, sequence, 8);
OFFSET(zero_comm_stats_t, all_gather, 16);
OFFSET(zero_comm_stats_t, reduce_scatter, 40);
OFFSET(zero_comm_stats_t, all_reduce, 64);
OFFSET(zero_comm_stats_t, broadcast, 88);
OFFSET(zero_comm_stats_t, control, 112);

/* Named constants are append-only: their values never change. */
_Static_assert(ZERO_OK == 0 && ZERO_ERR_INVALID_ARGUMENT == 1 && ZERO_ERR_INVALID_STATE == 2 && ZERO_ERR_CONFIG == 3 &&
                   ZERO_ERR_UNSUPPORTED == 4 && ZERO_ERR_MISMATCH == 5 && ZERO_ERR_COMM == 6 &&
                   ZERO_ERR_OUT_OF_MEMORY == 7 && ZERO_ERR_INTERNAL == 8 && ZERO_ERR_CHECKPOINT_CORRUPT == 9 &&
                   ZERO_ERR_IO == 10 && ZERO_ERR_REMOTE == 11 && ZERO_ERR_TIMEOUT == 12 && ZERO_ERR_ABORTED == 13,
               "status codes changed");
_Static_assert(ZERO_DTYPE_FP32 == 0 && ZERO_DTYPE_BF16 == 1 && ZERO_DTYPE_FP16 == 2 && ZERO_DTYPE_FP64 == 3 &&
                   ZERO_DTYPE_INT64 == 4 && ZERO_DTYPE_UINT8 == 5 && ZERO_DTYPE_INT8 == 6 && ZERO_DTYPE_BYTES == 7,
               "dtype values changed");
_Static_assert(ZERO_PARAM_FROZEN == 1, "param flags changed");
_Static_assert(ZERO_SIMD_SCALAR == 0 && ZERO_SIMD_AVX2 == 1 && ZERO_SIMD_AVX512 == 2, "simd values changed");
_Static_assert(ZERO_LOG_OFF == 0 && ZERO_LOG_ERROR == 1 && ZERO_LOG_WARNING == 2 && ZERO_LOG_INFO == 3 &&
                   ZERO_LOG_DEBUG == 4,
               "log levels changed");
_Static_assert(ZERO_COLL_ALL_GATHER == 0 && ZERO_COLL_REDUCE_SCATTER == 1 && ZERO_COLL_ALL_REDUCE == 2 &&
                   ZERO_COLL_BROADCAST == 3,
               "collective kinds changed");
_Static_assert(ZERO_REDUCE_SUM == 0 && ZERO_REDUCE_MIN == 1 && ZERO_REDUCE_MAX == 2, "reduce ops changed");
_Static_assert(ZERO_COMM_DETERMINISTIC == 1, "communicator flags changed");
_Static_assert(ZERO_MAX_NDIM == 8, "ZERO_MAX_NDIM changed");

int zero_struct_layout_checked(void) { return 1; }
