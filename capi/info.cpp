// Struct init functions, what bindings need for zero-copy views, engine information and statistics, the config
// check, and the experimental flight recorder.
#define ZERO_EXPERIMENTAL_API
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "config/config.hpp"
#include "guard.hpp"
#include "util/struct_io.hpp"

using zero::capi::guard;
using zero::capi::handle;
using zero::capi::require_arg;

namespace {

const zero::Engine& engine_of(const zero_engine_t* engine, const char* call) {
  require_arg(engine != nullptr, call, "engine is NULL");
  return *handle(engine)->impl;
}

const zero::capi::EngineHandle* handle_or_null(const zero_engine_t* engine) {
  return engine != nullptr ? handle(engine) : nullptr;
}

// A string for the caller to free with zero_string_destroy (malloc, so that any allocator's free matches).
char* give_string(const std::string& text) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (out == nullptr) throw std::bad_alloc();
  std::memcpy(out, text.c_str(), text.size() + 1);
  return out;
}

// `first_size`: the struct's size when it appeared (what a program built against that header passes).
template <typename T>
zero_status_t init(const char* call, const char* type, T* s, size_t struct_size, const T& defaults,
                   size_t first_size = sizeof(T)) {
  return guard(call, [&] { zero::init_struct(s, struct_size, first_size, defaults, call, type); });
}

}  // namespace

extern "C" {

// ---- Init functions: every struct that crosses the ABI, for languages without C's brace initialisers.

ZERO_API zero_status_t zero_param_group_desc_init(zero_param_group_desc_t* desc, size_t struct_size) {
  const zero_param_group_desc_t d = ZERO_PARAM_GROUP_DESC_INIT;
  return init("zero_param_group_desc_init", "zero_param_group_desc_t", desc, struct_size, d);
}

ZERO_API zero_status_t zero_param_desc_init(zero_param_desc_t* desc, size_t struct_size) {
  const zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
  return init("zero_param_desc_init", "zero_param_desc_t", desc, struct_size, d, offsetof(zero_param_desc_t, flags));
}

ZERO_API zero_status_t zero_param_info_init(zero_param_info_t* info, size_t struct_size) {
  const zero_param_info_t d = ZERO_PARAM_INFO_INIT;
  return init("zero_param_info_init", "zero_param_info_t", info, struct_size, d, offsetof(zero_param_info_t, flags));
}

ZERO_API zero_status_t zero_unit_info_init(zero_unit_info_t* info, size_t struct_size) {
  const zero_unit_info_t d = ZERO_UNIT_INFO_INIT;
  return init("zero_unit_info_init", "zero_unit_info_t", info, struct_size, d);
}

ZERO_API zero_status_t zero_step_info_init(zero_step_info_t* info, size_t struct_size) {
  const zero_step_info_t d = ZERO_STEP_INFO_INIT;
  return init("zero_step_info_init", "zero_step_info_t", info, struct_size, d);
}

ZERO_API zero_status_t zero_engine_info_init(zero_engine_info_t* info, size_t struct_size) {
  const zero_engine_info_t d = ZERO_ENGINE_INFO_INIT;
  return init("zero_engine_info_init", "zero_engine_info_t", info, struct_size, d);
}

ZERO_API zero_status_t zero_allocator_init(zero_allocator_t* allocator, size_t struct_size) {
  const zero_allocator_t d = ZERO_ALLOCATOR_INIT;
  return init("zero_allocator_init", "zero_allocator_t", allocator, struct_size, d);
}

ZERO_API zero_status_t zero_memory_stats_init(zero_memory_stats_t* stats, size_t struct_size) {
  const zero_memory_stats_t d = ZERO_MEMORY_STATS_INIT;
  return init("zero_memory_stats_init", "zero_memory_stats_t", stats, struct_size, d,
              offsetof(zero_memory_stats_t, frozen_param_bytes));
}

ZERO_API zero_status_t zero_save_options_init(zero_save_options_t* options, size_t struct_size) {
  const zero_save_options_t d = ZERO_SAVE_OPTIONS_INIT;
  return init("zero_save_options_init", "zero_save_options_t", options, struct_size, d);
}

ZERO_API zero_status_t zero_step_options_init(zero_step_options_t* options, size_t struct_size) {
  const zero_step_options_t d = ZERO_STEP_OPTIONS_INIT;
  return init("zero_step_options_init", "zero_step_options_t", options, struct_size, d);
}

ZERO_API zero_status_t zero_memory_placement_init(zero_memory_placement_t* placement, size_t struct_size) {
  const zero_memory_placement_t d = ZERO_MEMORY_PLACEMENT_INIT;
  return init("zero_memory_placement_init", "zero_memory_placement_t", placement, struct_size, d);
}

ZERO_API zero_status_t zero_window_info_init(zero_window_info_t* info, size_t struct_size) {
  const zero_window_info_t d = ZERO_WINDOW_INFO_INIT;
  return init("zero_window_info_init", "zero_window_info_t", info, struct_size, d);
}

ZERO_API zero_status_t zero_comm_stats_init(zero_comm_stats_t* stats, size_t struct_size) {
  const zero_comm_stats_t d = ZERO_COMM_STATS_INIT;
  return init("zero_comm_stats_init", "zero_comm_stats_t", stats, struct_size, d);
}

ZERO_API zero_status_t zero_comm_ops_init(zero_comm_ops_t* ops, size_t struct_size) {
  zero_comm_ops_t d;
  std::memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.size = 1;
  return init("zero_comm_ops_init", "zero_comm_ops_t", ops, struct_size, d, offsetof(zero_comm_ops_t, group_begin));
}

ZERO_API zero_status_t zero_collective_init(zero_collective_t* coll, size_t struct_size) {
  zero_collective_t d;
  std::memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  return init("zero_collective_init", "zero_collective_t", coll, struct_size, d, offsetof(zero_collective_t, stream));
}

// ---- Views

ZERO_API zero_status_t zero_param_info(zero_param_info_t* out_info, const zero_engine_t* engine, int32_t param) {
  const char* call = "zero_param_info";
  return guard(call, handle_or_null(engine), [&] {
    zero::check_output_struct(out_info, offsetof(zero_param_info_t, flags), call, "zero_param_info_t",
                              "zero_param_info_init");
    const zero::Engine& e = engine_of(engine, call);
    const zero::ParamShape& p = e.param_shape(param);
    zero_param_info_t info = ZERO_PARAM_INFO_INIT;
    info.name = p.name.c_str();
    info.ndim = static_cast<int32_t>(p.dims.size());
    for (size_t d = 0; d < p.dims.size(); ++d) info.shape[d] = p.dims[d];
    info.numel = p.numel();
    info.unit = p.unit;
    info.group = p.group;
    if (p.model_parallel_duplicate) info.flags |= ZERO_PARAM_MODEL_PARALLEL_DUPLICATE;
    if (p.frozen) {
      info.flags |= ZERO_PARAM_FROZEN;
      info.param_dtype = static_cast<int32_t>(p.stored);
      info.grad_dtype = -1;
      info.param_bytes = info.numel * zero::stored_size(p.stored);
      info.grad_bytes = 0;
    } else {
      info.param_dtype = static_cast<int32_t>(e.config().compute_dtype);
      info.grad_dtype = static_cast<int32_t>(e.config().grad_accum_dtype);
      info.param_bytes = info.numel * zero::dtype_size(e.config().compute_dtype);
      info.grad_bytes = info.numel * zero::dtype_size(e.config().grad_accum_dtype);
    }
    zero::write_output_struct(out_info, info);
  });
}

ZERO_API zero_status_t zero_unit_info(zero_unit_info_t* out_info, const zero_engine_t* engine, int32_t unit) {
  const char* call = "zero_unit_info";
  return guard(call, handle_or_null(engine), [&] {
    zero::check_output_struct(out_info, sizeof(zero_unit_info_t), call, "zero_unit_info_t", "zero_unit_info_init");
    const zero::UnitInfo u = engine_of(engine, call).unit_info(unit);
    zero_unit_info_t info = ZERO_UNIT_INFO_INIT;
    info.gathered = u.gathered ? 1 : 0;
    info.num_params = u.num_params;
    info.generation = u.generation;
    info.numel = u.numel;
    zero::write_output_struct(out_info, info);
  });
}

// ---- Information and statistics

ZERO_API zero_status_t zero_engine_info(zero_engine_info_t* out_info, const zero_engine_t* engine) {
  const char* call = "zero_engine_info";
  return guard(call, handle_or_null(engine), [&] {
    zero::check_output_struct(out_info, sizeof(zero_engine_info_t), call, "zero_engine_info_t",
                              "zero_engine_info_init");
    const zero::Engine& e = engine_of(engine, call);
    const zero::Config& c = e.config();
    zero_engine_info_t info = ZERO_ENGINE_INFO_INIT;
    info.rank = e.rank();
    info.world_size = e.world_size();
    info.stage = c.stage;
    info.gradient_accumulation_steps = static_cast<int32_t>(c.gradient_accumulation_steps);
    info.param_dtype = static_cast<int32_t>(c.compute_dtype);
    info.grad_dtype = static_cast<int32_t>(c.grad_accum_dtype);
    info.comm_dtype = static_cast<int32_t>(c.comm_dtype);
    info.simd = static_cast<int32_t>(e.isa());
    info.num_params = e.num_params();
    info.num_units = e.num_units();
    info.optimizer_threads = e.optimizer_threads();
    info.deterministic = e.deterministic() ? 1 : 0;
    info.timeout_s = e.timeout();
    zero::write_output_struct(out_info, info);
  });
}

ZERO_API zero_status_t zero_memory_stats(zero_memory_stats_t* out_stats, const zero_engine_t* engine) {
  const char* call = "zero_memory_stats";
  return guard(call, handle_or_null(engine), [&] {
    zero::check_output_struct(out_stats, offsetof(zero_memory_stats_t, frozen_param_bytes), call, "zero_memory_stats_t",
                              "zero_memory_stats_init");
    const zero::MemoryStats m = engine_of(engine, call).memory_report();
    zero_memory_stats_t s = ZERO_MEMORY_STATS_INIT;
    s.param_bytes = m.param_bytes;
    s.grad_bytes = m.grad_bytes;
    s.master_param_bytes = m.master_param_bytes;
    s.optimizer_state_bytes = m.optimizer_state_bytes;
    s.bucket_bytes = m.bucket_bytes;
    s.gathered_bytes = m.gathered_bytes;
    s.frozen_param_bytes = m.frozen_param_bytes;
    s.total_bytes = m.total();
    zero::write_output_struct(out_stats, s);
  });
}

ZERO_API zero_status_t zero_memory_placement(zero_memory_placement_t* out_placement, const zero_engine_t* engine) {
  const char* call = "zero_memory_placement";
  return guard(call, handle_or_null(engine), [&] {
    zero::check_output_struct(out_placement, sizeof(zero_memory_placement_t), call, "zero_memory_placement_t",
                              "zero_memory_placement_init");
    const zero::MemoryStats m = engine_of(engine, call).placement_report();
    zero_memory_placement_t p = ZERO_MEMORY_PLACEMENT_INIT;
    p.host_bytes = m.host_bytes;
    p.nvme_bytes = m.nvme_bytes;
    p.staging_bytes = m.staging_bytes;
    zero::write_output_struct(out_placement, p);
  });
}

ZERO_API zero_status_t zero_engine_window(zero_window_info_t* out_info, const zero_engine_t* engine) {
  const char* call = "zero_engine_window";
  return guard(call, handle_or_null(engine), [&] {
    zero::check_output_struct(out_info, sizeof(zero_window_info_t), call, "zero_window_info_t",
                              "zero_window_info_init");
    const zero::Engine& e = engine_of(engine, call);
    zero_window_info_t w = ZERO_WINDOW_INFO_INIT;
    w.micro_steps = e.window().ended();
    w.accumulation_steps = e.window().accumulation_steps();
    w.total_micro_steps = e.window().total_ended();
    w.steps = e.steps();
    zero::write_output_struct(out_info, w);
  });
}

ZERO_API zero_status_t zero_comm_stats(zero_comm_stats_t* out_stats, const zero_engine_t* engine) {
  const char* call = "zero_comm_stats";
  return guard(call, handle_or_null(engine), [&] {
    zero::check_output_struct(out_stats, sizeof(zero_comm_stats_t), call, "zero_comm_stats_t", "zero_comm_stats_init");
    const zero::CommStats& c = engine_of(engine, call).comm_stats();
    zero_comm_stats_t s = ZERO_COMM_STATS_INIT;
    auto kind = [](const zero::CommKindStats& k) { return zero_comm_kind_stats_t{k.calls, k.bytes, k.wire_bytes}; };
    s.sequence = c.sequence;
    s.all_gather = kind(c.all_gather);
    s.reduce_scatter = kind(c.reduce_scatter);
    s.all_reduce = kind(c.all_reduce);
    s.broadcast = kind(c.broadcast);
    s.control = kind(c.control);
    zero::write_output_struct(out_stats, s);
  });
}

ZERO_API zero_status_t zero_config_check(char** out_report, const char* json_config, int32_t world_size) {
  const char* call = "zero_config_check";
  return guard(call, [&] {
    require_arg(out_report != nullptr, call, "out_report is NULL");
    require_arg(json_config != nullptr, call, "json_config is NULL");
    require_arg(world_size >= 1, call, "world_size must be at least 1");
    const zero::Config c = zero::parse_config(json_config, world_size);
    *out_report = give_string(zero::config_report(c, world_size));
  });
}

// ---- Experimental

ZERO_API zero_status_t zero_engine_recent_collectives(char** out_json, const zero_engine_t* engine) {
  const char* call = "zero_engine_recent_collectives";
  return guard(call, [&] {
    require_arg(out_json != nullptr, call, "out_json is NULL");
    *out_json = give_string(engine_of(engine, call).recent_collectives());
  });
}

ZERO_API zero_status_t zero_engine_device(int32_t* out_device_type, int32_t* out_device_id,
                                          const zero_engine_t* engine) {
  const char* call = "zero_engine_device";
  return guard(call, handle_or_null(engine), [&] {
    require_arg(out_device_type != nullptr && out_device_id != nullptr, call, "an out-parameter is NULL");
    const auto [type, id] = engine_of(engine, call).dlpack_device();
    *out_device_type = type;
    *out_device_id = id;
  });
}

}  // extern "C"
