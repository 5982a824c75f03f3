// The C API of zero.h: argument checks, struct translation and error translation around the engine. Nothing
// here knows about ZeRO.
#include <cstddef>
#include <cstring>

#include "comm/mpi_communicator.hpp"
#include "comm/single_communicator.hpp"
#include "config.hpp"
#include "guard.hpp"
#include "handles.hpp"

using zero::capi::CommHandle;
using zero::capi::copy_out;
using zero::capi::EngineHandle;
using zero::capi::guard;
using zero::capi::handle;
using zero::capi::opaque;
using zero::capi::read_struct;
using zero::capi::require_arg;

namespace zero {
namespace capi {
namespace {
thread_local std::string t_last_error;
}  // namespace

void set_last_error(const std::string& message) { t_last_error = message; }
const char* last_error() { return t_last_error.c_str(); }

}  // namespace capi
}  // namespace zero

extern "C" {

ZERO_API const char* zero_status_string(zero_status_t status) { return zero::status_name(status); }

ZERO_API const char* zero_last_error(void) { return zero::capi::last_error(); }

ZERO_API uint32_t zero_get_version(void) { return ZERO_VERSION_NUMBER; }

ZERO_API zero_status_t zero_comm_create_mpi(zero_comm_t** out_comm, int64_t mpi_comm) {
  return guard("zero_comm_create_mpi", [&] {
    require_arg(out_comm != nullptr, "zero_comm_create_mpi", "out_comm is NULL");
    auto h = std::make_unique<CommHandle>();
    h->impl = zero::make_mpi_communicator(mpi_comm);
    *out_comm = opaque(h.release());
  });
}

ZERO_API zero_status_t zero_comm_create_single(zero_comm_t** out_comm) {
  return guard("zero_comm_create_single", [&] {
    require_arg(out_comm != nullptr, "zero_comm_create_single", "out_comm is NULL");
    auto h = std::make_unique<CommHandle>();
    h->impl = zero::make_single_communicator();
    *out_comm = opaque(h.release());
  });
}

ZERO_API void zero_comm_destroy(zero_comm_t* comm) { delete handle(comm); }

ZERO_API zero_status_t zero_comm_rank(int* out_rank, const zero_comm_t* comm) {
  return guard("zero_comm_rank", [&] {
    require_arg(out_rank != nullptr, "zero_comm_rank", "out_rank is NULL");
    require_arg(comm != nullptr, "zero_comm_rank", "comm is NULL");
    *out_rank = handle(comm)->impl->rank();
  });
}

ZERO_API zero_status_t zero_comm_size(int* out_size, const zero_comm_t* comm) {
  return guard("zero_comm_size", [&] {
    require_arg(out_size != nullptr, "zero_comm_size", "out_size is NULL");
    require_arg(comm != nullptr, "zero_comm_size", "comm is NULL");
    *out_size = handle(comm)->impl->size();
  });
}

}  // extern "C"

namespace {

// Input structs as version 0.1 defined them: the smallest struct_size a caller may pass, forever.
constexpr size_t kParamGroupDescSizeV01 = offsetof(zero_param_group_desc_t, eps) + sizeof(double);
constexpr size_t kParamDescSizeV01 = offsetof(zero_param_desc_t, init_data) + sizeof(void*);

zero::Engine& engine_of(zero_engine_t* engine, const char* call) {
  require_arg(engine != nullptr, call, "engine is NULL");
  return *handle(engine)->impl;
}

const zero::Engine& engine_of(const zero_engine_t* engine, const char* call) {
  require_arg(engine != nullptr, call, "engine is NULL");
  return *handle(engine)->impl;
}

}  // namespace

extern "C" {

ZERO_API zero_status_t zero_engine_create(zero_engine_t** out_engine, const char* json_config, zero_comm_t* comm) {
  return guard("zero_engine_create", [&] {
    require_arg(out_engine != nullptr, "zero_engine_create", "out_engine is NULL");
    require_arg(json_config != nullptr, "zero_engine_create", "json_config is NULL");
    require_arg(comm != nullptr, "zero_engine_create", "comm is NULL");
    const auto& communicator = handle(comm)->impl;
    zero::Config config = zero::parse_config(json_config, communicator->size());
    auto h = std::make_unique<EngineHandle>();
    h->impl = std::make_unique<zero::Engine>(std::move(config), communicator);
    *out_engine = opaque(h.release());
  });
}

ZERO_API void zero_engine_destroy(zero_engine_t* engine) { delete handle(engine); }

ZERO_API zero_status_t zero_engine_add_param_group(int32_t* out_group, zero_engine_t* engine,
                                                   const zero_param_group_desc_t* desc) {
  const char* call = "zero_engine_add_param_group";
  return guard(call, [&] {
    require_arg(out_group != nullptr, call, "out_group is NULL");
    zero::Engine& e = engine_of(engine, call);
    const zero_param_group_desc_t defaults = ZERO_PARAM_GROUP_DESC_INIT;
    const zero_param_group_desc_t d = read_struct(desc, kParamGroupDescSizeV01, defaults, call,
                                                  "zero_param_group_desc_t", "ZERO_PARAM_GROUP_DESC_INIT");
    *out_group = e.add_param_group(d.name ? d.name : "", d.lr, d.weight_decay, d.beta1, d.beta2, d.eps);
  });
}

ZERO_API zero_status_t zero_engine_add_param(int32_t* out_param, zero_engine_t* engine, const zero_param_desc_t* desc) {
  const char* call = "zero_engine_add_param";
  return guard(call, [&] {
    require_arg(out_param != nullptr, call, "out_param is NULL");
    zero::Engine& e = engine_of(engine, call);
    const zero_param_desc_t defaults = ZERO_PARAM_DESC_INIT;
    const zero_param_desc_t d =
        read_struct(desc, kParamDescSizeV01, defaults, call, "zero_param_desc_t", "ZERO_PARAM_DESC_INIT");
    require_arg(d.name != nullptr, call, "desc->name is NULL");
    require_arg(d.ndim >= 0 && d.ndim <= 8, call, "desc->ndim must be in 0..8");
    require_arg(d.ndim == 0 || d.shape != nullptr, call, "desc->shape is NULL but desc->ndim > 0");
    const auto valid_dtype = [](int32_t t) {
      return t == ZERO_DTYPE_FP32 || t == ZERO_DTYPE_BF16 || t == ZERO_DTYPE_FP16;
    };
    // A C caller can put any integer in an enum field; read it as one before trusting it as a zero_dtype_t.
    int32_t dtype = 0;
    std::memcpy(&dtype, &d.dtype, sizeof dtype);
    require_arg(valid_dtype(dtype), call, "desc->dtype is not a zero_dtype_t value");
    require_arg(d.init_dtype == -1 || valid_dtype(d.init_dtype), call,
                "desc->init_dtype must be -1 (same as dtype) or a zero_dtype_t value");
    const zero::DType compute = e.config().compute_dtype;
    if (static_cast<zero::DType>(dtype) != compute)
      zero::fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": param '" + d.name + "' has dtype " +
                                                zero::dtype_name(static_cast<zero::DType>(dtype)) +
                                                " but the engine computes in " + zero::dtype_name(compute) +
                                                " (set by the config's bf16/fp16 blocks)");
    zero::ParamShape shape;
    shape.name = d.name;
    shape.dims.assign(d.shape, d.shape + d.ndim);
    shape.unit = d.unit;
    shape.group = d.group;
    zero::ParamInit init;
    init.data = d.init_data;
    init.dtype = static_cast<zero::DType>(d.init_dtype == -1 ? dtype : d.init_dtype);
    *out_param = e.add_param(std::move(shape), init);
  });
}

ZERO_API zero_status_t zero_engine_finalize(zero_engine_t* engine) {
  return guard("zero_engine_finalize", [&] { engine_of(engine, "zero_engine_finalize").finalize(); });
}

ZERO_API zero_status_t zero_param_data(void** out_data, zero_engine_t* engine, int32_t param) {
  return guard("zero_param_data", [&] {
    require_arg(out_data != nullptr, "zero_param_data", "out_data is NULL");
    *out_data = engine_of(engine, "zero_param_data").param_data(param);
  });
}

ZERO_API zero_status_t zero_grad_data(void** out_data, zero_engine_t* engine, int32_t param) {
  return guard("zero_grad_data", [&] {
    require_arg(out_data != nullptr, "zero_grad_data", "out_data is NULL");
    *out_data = engine_of(engine, "zero_grad_data").grad_data(param);
  });
}

ZERO_API zero_status_t zero_gather(zero_engine_t* engine, int32_t unit) {
  return guard("zero_gather", [&] { engine_of(engine, "zero_gather").gather(unit); });
}

ZERO_API zero_status_t zero_release(zero_engine_t* engine, int32_t unit) {
  return guard("zero_release", [&] { engine_of(engine, "zero_release").release(unit); });
}

ZERO_API zero_status_t zero_grad_ready(zero_engine_t* engine, int32_t param) {
  return guard("zero_grad_ready", [&] { engine_of(engine, "zero_grad_ready").grad_ready(param); });
}

ZERO_API zero_status_t zero_backward_end(zero_engine_t* engine) {
  return guard("zero_backward_end", [&] { engine_of(engine, "zero_backward_end").backward_end(); });
}

ZERO_API zero_status_t zero_step(zero_engine_t* engine, zero_step_info_t* out_info) {
  const char* call = "zero_step";
  return guard(call, [&] {
    zero::Engine& e = engine_of(engine, call);
    if (out_info != nullptr && out_info->struct_size < sizeof(size_t) * 2)
      zero::fail(ZERO_ERR_INVALID_ARGUMENT, "zero_step: out_info->struct_size is too small; use ZERO_STEP_INFO_INIT");
    zero::StepResult r = e.step();
    if (out_info == nullptr) return;
    zero_step_info_t info = ZERO_STEP_INFO_INIT;
    info.step = r.step;
    info.loss_scale = r.loss_scale;
    info.grad_norm = r.grad_norm;
    info.skipped = r.skipped ? 1 : 0;
    info.lr = r.lr;
    copy_out(out_info, info, call, "ZERO_STEP_INFO_INIT");
  });
}

ZERO_API zero_status_t zero_loss_scale(double* out_scale, const zero_engine_t* engine) {
  return guard("zero_loss_scale", [&] {
    require_arg(out_scale != nullptr, "zero_loss_scale", "out_scale is NULL");
    *out_scale = engine_of(engine, "zero_loss_scale").loss_scale();
  });
}

ZERO_API zero_status_t zero_set_lr(zero_engine_t* engine, int32_t group, double lr) {
  return guard("zero_set_lr", [&] { engine_of(engine, "zero_set_lr").set_lr(group, lr); });
}

ZERO_API zero_status_t zero_save_checkpoint(zero_engine_t* engine, const char* dir, const char* tag) {
  const char* call = "zero_save_checkpoint";
  return guard(call, [&] {
    zero::Engine& e = engine_of(engine, call);
    require_arg(dir != nullptr, call, "dir is NULL");
    require_arg(tag != nullptr, call, "tag is NULL");
    e.save_checkpoint(dir, tag);
  });
}

ZERO_API zero_status_t zero_load_checkpoint(zero_engine_t* engine, const char* dir, const char* tag) {
  const char* call = "zero_load_checkpoint";
  return guard(call, [&] {
    zero::Engine& e = engine_of(engine, call);
    require_arg(dir != nullptr, call, "dir is NULL");
    e.load_checkpoint(dir, tag != nullptr ? tag : "");
  });
}

ZERO_API zero_status_t zero_engine_info(const zero_engine_t* engine, zero_engine_info_t* out_info) {
  const char* call = "zero_engine_info";
  return guard(call, [&] {
    const zero::Engine& e = engine_of(engine, call);
    const zero::Config& c = e.config();
    zero_engine_info_t info = ZERO_ENGINE_INFO_INIT;
    info.rank = e.rank();
    info.world_size = e.world_size();
    info.stage = c.stage;
    info.gradient_accumulation_steps = static_cast<int32_t>(c.gradient_accumulation_steps);
    info.param_dtype = static_cast<zero_dtype_t>(c.compute_dtype);
    info.grad_dtype = static_cast<zero_dtype_t>(c.grad_accum_dtype);
    info.comm_dtype = static_cast<zero_dtype_t>(c.comm_dtype);
    info.simd = static_cast<zero_simd_t>(e.isa());
    info.num_params = e.num_params();
    info.num_units = e.num_units();
    copy_out(out_info, info, call, "ZERO_ENGINE_INFO_INIT");
  });
}

ZERO_API zero_status_t zero_memory_stats(const zero_engine_t* engine, zero_memory_stats_t* out_stats) {
  const char* call = "zero_memory_stats";
  return guard(call, [&] {
    const zero::Engine& e = engine_of(engine, call);
    zero::MemoryStats m = e.memory_stats();
    zero_memory_stats_t s = ZERO_MEMORY_STATS_INIT;
    s.param_bytes = m.param_bytes;
    s.grad_bytes = m.grad_bytes;
    s.master_param_bytes = m.master_param_bytes;
    s.optimizer_state_bytes = m.optimizer_state_bytes;
    s.bucket_bytes = m.bucket_bytes;
    s.gathered_bytes = m.gathered_bytes;
    s.total_bytes = m.total();
    copy_out(out_stats, s, call, "ZERO_MEMORY_STATS_INIT");
  });
}

ZERO_API zero_status_t zero_comm_stats(const zero_engine_t* engine, zero_comm_stats_t* out_stats) {
  const char* call = "zero_comm_stats";
  return guard(call, [&] {
    const zero::CommStats& c = engine_of(engine, call).comm_stats();
    zero_comm_stats_t s = ZERO_COMM_STATS_INIT;
    auto kind = [](const zero::CommKindStats& k) { return zero_comm_kind_stats_t{k.calls, k.bytes, k.wire_bytes}; };
    s.sequence = c.sequence;
    s.all_gather = kind(c.all_gather);
    s.reduce_scatter = kind(c.reduce_scatter);
    s.all_reduce = kind(c.all_reduce);
    s.broadcast = kind(c.broadcast);
    copy_out(out_stats, s, call, "ZERO_COMM_STATS_INIT");
  });
}

}  // extern "C"
