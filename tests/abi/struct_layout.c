/*
 * The size and field offsets of every public struct and enum, frozen for the x86_64 / aarch64 LP64 ABI. A change
 * here is an ABI break: structs only ever grow at the end (new fields after the last one, struct_size tells the
 * library which fields a caller knows), so existing offsets and the old sizes' prefixes must stay as they are.
 * Compiled as C11 for _Static_assert; the public header itself stays C99.
 */
#include <stddef.h>

#include "zero/zero.h"

#define OFFSET(type, field, value) _Static_assert(offsetof(type, field) == (value), #type "." #field " moved")
#define SIZE(type, value) _Static_assert(sizeof(type) == (value), "sizeof(" #type ") changed")

_Static_assert(sizeof(void*) == 8, "the frozen layout below is for LP64 targets");

SIZE(zero_status_t, 4);
SIZE(zero_dtype_t, 4);

SIZE(zero_param_group_desc_t, 56);
OFFSET(zero_param_group_desc_t, struct_size, 0);
OFFSET(zero_param_group_desc_t, name, 8);
OFFSET(zero_param_group_desc_t, lr, 16);
OFFSET(zero_param_group_desc_t, weight_decay, 24);
OFFSET(zero_param_group_desc_t, beta1, 32);
OFFSET(zero_param_group_desc_t, beta2, 40);
OFFSET(zero_param_group_desc_t, eps, 48);

SIZE(zero_param_desc_t, 64); /* 0.1: 56 bytes, ending with init_data */
OFFSET(zero_param_desc_t, struct_size, 0);
OFFSET(zero_param_desc_t, name, 8);
OFFSET(zero_param_desc_t, ndim, 16);
OFFSET(zero_param_desc_t, shape, 24);
OFFSET(zero_param_desc_t, dtype, 32);
OFFSET(zero_param_desc_t, unit, 36);
OFFSET(zero_param_desc_t, group, 40);
OFFSET(zero_param_desc_t, init_data, 48);
OFFSET(zero_param_desc_t, init_dtype, 56); /* 0.2 */

SIZE(zero_step_info_t, 48);
OFFSET(zero_step_info_t, struct_size, 0);
OFFSET(zero_step_info_t, step, 8);
OFFSET(zero_step_info_t, loss_scale, 16);
OFFSET(zero_step_info_t, grad_norm, 24);
OFFSET(zero_step_info_t, skipped, 32);
OFFSET(zero_step_info_t, lr, 40);

SIZE(zero_simd_t, 4); /* 0.2 */
SIZE(zero_engine_info_t, 48);
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

SIZE(zero_memory_stats_t, 64);
OFFSET(zero_memory_stats_t, struct_size, 0);
OFFSET(zero_memory_stats_t, param_bytes, 8);
OFFSET(zero_memory_stats_t, grad_bytes, 16);
OFFSET(zero_memory_stats_t, master_param_bytes, 24);
OFFSET(zero_memory_stats_t, optimizer_state_bytes, 32);
OFFSET(zero_memory_stats_t, bucket_bytes, 40);
OFFSET(zero_memory_stats_t, gathered_bytes, 48);
OFFSET(zero_memory_stats_t, total_bytes, 56);

SIZE(zero_comm_kind_stats_t, 24);
OFFSET(zero_comm_kind_stats_t, calls, 0);
OFFSET(zero_comm_kind_stats_t, bytes, 8);
OFFSET(zero_comm_kind_stats_t, wire_bytes, 16);

SIZE(zero_comm_stats_t, 112);
OFFSET(zero_comm_stats_t, struct_size, 0);
OFFSET(zero_comm_stats_t, sequence, 8);
OFFSET(zero_comm_stats_t, all_gather, 16);
OFFSET(zero_comm_stats_t, reduce_scatter, 40);
OFFSET(zero_comm_stats_t, all_reduce, 64);
OFFSET(zero_comm_stats_t, broadcast, 88);

/* Status codes and dtypes are append-only: their values never change. */
_Static_assert(ZERO_OK == 0 && ZERO_ERR_INVALID_ARGUMENT == 1 && ZERO_ERR_INVALID_STATE == 2 && ZERO_ERR_CONFIG == 3 &&
                   ZERO_ERR_UNSUPPORTED == 4 && ZERO_ERR_MISMATCH == 5 && ZERO_ERR_COMM == 6 &&
                   ZERO_ERR_OUT_OF_MEMORY == 7 && ZERO_ERR_INTERNAL == 8,
               "status codes changed");
_Static_assert(ZERO_DTYPE_FP32 == 0 && ZERO_DTYPE_BF16 == 1 && ZERO_DTYPE_FP16 == 2, "dtype values changed");
_Static_assert(ZERO_SIMD_SCALAR == 0 && ZERO_SIMD_AVX2 == 1 && ZERO_SIMD_AVX512 == 2, "simd values changed");

int zero_struct_layout_checked(void) { return 1; }
