// The engine's life cycle and training calls: argument checks and struct translation around zero::Engine.
#define ZERO_EXPERIMENTAL_API
#include <cstddef>
#include <cstring>

#include "config/config.hpp"
#include "device/select.hpp"
#include "guard.hpp"
#include "util/struct_io.hpp"

using zero::capi::EngineHandle;
using zero::capi::guard;
using zero::capi::handle;
using zero::capi::opaque;
using zero::capi::require_arg;

namespace {

zero::Engine& engine_of(zero_engine_t* engine, const char* call) {
  require_arg(engine != nullptr, call, "engine is NULL");
  return *handle(engine)->impl;
}

const EngineHandle* handle_or_null(const zero_engine_t* engine) { return engine != nullptr ? handle(engine) : nullptr; }

bool valid_param_dtype(int32_t t) { return t == ZERO_DTYPE_FP32 || t == ZERO_DTYPE_BF16 || t == ZERO_DTYPE_FP16; }

}  // namespace

extern "C" {

ZERO_API zero_status_t zero_engine_create(zero_engine_t** out_engine, const char* json_config, zero_comm_t* comm) {
  return guard("zero_engine_create", [&] {
    require_arg(out_engine != nullptr, "zero_engine_create", "out_engine is NULL");
    require_arg(json_config != nullptr, "zero_engine_create", "json_config is NULL");
    require_arg(comm != nullptr, "zero_engine_create", "comm is NULL");
    const auto& communicator = handle(comm)->impl;
    if (communicator->finalized())
      zero::fail(ZERO_ERR_INVALID_STATE, "zero_engine_create: the communicator was finalized (zero_comm_finalize)");
    if (communicator->aborted())
      zero::fail(ZERO_ERR_ABORTED,
                 "zero_engine_create: the communicator was aborted (" + communicator->abort_reason() + ")");
    zero::Config config = zero::parse_config(json_config, communicator->size());
    auto h = std::make_unique<EngineHandle>();
    h->impl = std::make_unique<zero::Engine>(std::move(config), communicator);
    *out_engine = opaque(h.release());
  });
}

ZERO_API void zero_engine_destroy(zero_engine_t* engine) {
  if (engine == nullptr) return;
  { std::lock_guard<std::recursive_mutex> wait_for_abort(handle(engine)->abort_mutex); }
  delete handle(engine);
}

ZERO_API const char* zero_engine_last_error(const zero_engine_t* engine) {
  if (engine == nullptr) return "zero_engine_last_error: engine is NULL";
  return handle(engine)->last_error.c_str();
}

ZERO_API void zero_engine_abort(zero_engine_t* engine) {
  if (engine == nullptr) return;
  std::lock_guard<std::recursive_mutex> lock(handle(engine)->abort_mutex);
  try {
    handle(engine)->impl->abort();
  } catch (...) {  // abort must not fail; the engine is unusable either way
  }
}

ZERO_API zero_status_t zero_engine_set_num_threads(zero_engine_t* engine, int32_t threads) {
  const char* call = "zero_engine_set_num_threads";
  return guard(call, handle_or_null(engine), [&] { engine_of(engine, call).set_num_threads(threads); });
}

ZERO_API zero_status_t zero_engine_set_model_parallel(zero_engine_t* engine, zero_comm_t* mp_comm) {
  const char* call = "zero_engine_set_model_parallel";
  return guard(call, handle_or_null(engine), [&] {
    zero::Engine& e = engine_of(engine, call);
    e.set_model_parallel(mp_comm != nullptr ? handle(mp_comm)->impl : nullptr);
  });
}

ZERO_API zero_status_t zero_engine_add_param_group(int32_t* out_group, zero_engine_t* engine,
                                                   const zero_param_group_desc_t* desc) {
  const char* call = "zero_engine_add_param_group";
  return guard(call, handle_or_null(engine), [&] {
    require_arg(out_group != nullptr, call, "out_group is NULL");
    zero::Engine& e = engine_of(engine, call);
    const zero_param_group_desc_t defaults = ZERO_PARAM_GROUP_DESC_INIT;
    const zero_param_group_desc_t d = zero::read_input_struct(desc, sizeof(zero_param_group_desc_t), defaults, call,
                                                              "zero_param_group_desc_t", "zero_param_group_desc_init");
    *out_group = e.add_param_group(d.name ? d.name : "", d.lr, d.weight_decay, d.beta1, d.beta2, d.eps);
  });
}

ZERO_API zero_status_t zero_engine_add_param(int32_t* out_param, zero_engine_t* engine, const zero_param_desc_t* desc) {
  const char* call = "zero_engine_add_param";
  return guard(call, handle_or_null(engine), [&] {
    require_arg(out_param != nullptr, call, "out_param is NULL");
    zero::Engine& e = engine_of(engine, call);
    const zero_param_desc_t defaults = ZERO_PARAM_DESC_INIT;
    const zero_param_desc_t d = zero::read_input_struct(desc, offsetof(zero_param_desc_t, flags), defaults, call,
                                                        "zero_param_desc_t", "zero_param_desc_init");
    require_arg(d.name != nullptr, call, "desc->name is NULL");
    if (d.reserved != 0 || d.reserved2 != 0)
      zero::fail(ZERO_ERR_UNSUPPORTED, std::string(call) + ": desc->" + (d.reserved != 0 ? "reserved" : "reserved2") +
                                           " is not 0 (a field this libzero does not know; initialise the struct "
                                           "with zero_param_desc_init)");
    const uint32_t known = ZERO_PARAM_FROZEN | ZERO_PARAM_MODEL_PARALLEL_DUPLICATE;
    if ((d.flags & ~known) != 0)
      zero::fail(ZERO_ERR_UNSUPPORTED, std::string(call) + ": desc->flags has bits this libzero does not know (" +
                                           std::to_string(d.flags) +
                                           "; ZERO_PARAM_FROZEN is 1, ZERO_PARAM_MODEL_PARALLEL_DUPLICATE 2)");
    require_arg(d.ndim >= 0 && d.ndim <= ZERO_MAX_NDIM, call, "desc->ndim must be in 0..ZERO_MAX_NDIM (8)");
    require_arg(d.ndim == 0 || d.shape != nullptr, call, "desc->shape is NULL but desc->ndim > 0");
    const bool frozen = (d.flags & ZERO_PARAM_FROZEN) != 0;
    zero::ParamShape shape;
    shape.name = d.name;
    shape.dims.assign(d.shape, d.shape + d.ndim);
    shape.unit = d.unit;
    shape.group = d.group;
    shape.model_parallel_duplicate = (d.flags & ZERO_PARAM_MODEL_PARALLEL_DUPLICATE) != 0;
    zero::ParamInit init;
    init.data = d.init_data;
    if (frozen) {
      require_arg(d.dtype == -1 || zero::stored_type_valid(d.dtype), call,
                  "desc->dtype of a frozen param must be -1 (the engine's compute dtype) or a zero_dtype_t");
      const int32_t dtype = d.dtype == -1 ? static_cast<int32_t>(e.config().compute_dtype) : d.dtype;
      if (d.init_dtype != -1 && d.init_dtype != dtype)
        zero::fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": param '" + d.name +
                                                  "' is frozen: its initial values are copied as they are, so "
                                                  "desc->init_dtype must be -1 or its dtype");
      shape.frozen = true;
      shape.stored = static_cast<zero::StoredType>(dtype);
      *out_param = e.add_param(std::move(shape), init);
      return;
    }
    require_arg(d.dtype == -1 || valid_param_dtype(d.dtype), call,
                "desc->dtype must be -1 (the engine's compute dtype) or ZERO_DTYPE_FP32, _BF16 or _FP16 (other "
                "dtypes only for a frozen param: ZERO_PARAM_FROZEN)");
    const int32_t dtype = d.dtype == -1 ? static_cast<int32_t>(e.config().compute_dtype) : d.dtype;
    require_arg(d.init_dtype == -1 || valid_param_dtype(d.init_dtype), call,
                "desc->init_dtype must be -1 (same as dtype) or ZERO_DTYPE_FP32, _BF16 or _FP16");
    const zero::DType compute = e.config().compute_dtype;
    if (static_cast<zero::DType>(dtype) != compute)
      zero::fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": param '" + d.name + "' has dtype " +
                                                zero::dtype_name(static_cast<zero::DType>(dtype)) +
                                                " but the engine computes in " + zero::dtype_name(compute) +
                                                " (set by the config's bf16/fp16 blocks; a param the optimizer "
                                                "does not train may keep its own dtype: ZERO_PARAM_FROZEN)");
    init.dtype = static_cast<zero::DType>(d.init_dtype == -1 ? dtype : d.init_dtype);
    *out_param = e.add_param(std::move(shape), init);
  });
}

ZERO_API zero_status_t zero_engine_finalize(zero_engine_t* engine) {
  const char* call = "zero_engine_finalize";
  return guard(call, handle_or_null(engine), [&] { engine_of(engine, call).finalize(); });
}

ZERO_API zero_status_t zero_param_data(void** out_data, zero_engine_t* engine, int32_t param) {
  const char* call = "zero_param_data";
  return guard(call, handle_or_null(engine), [&] {
    require_arg(out_data != nullptr, call, "out_data is NULL");
    *out_data = engine_of(engine, call).param_data(param);
  });
}

ZERO_API zero_status_t zero_grad_data(void** out_data, zero_engine_t* engine, int32_t param) {
  const char* call = "zero_grad_data";
  return guard(call, handle_or_null(engine), [&] {
    require_arg(out_data != nullptr, call, "out_data is NULL");
    *out_data = engine_of(engine, call).grad_data(param);
  });
}

ZERO_API zero_status_t zero_gather(zero_engine_t* engine, int32_t unit) {
  const char* call = "zero_gather";
  return guard(call, handle_or_null(engine), [&] { engine_of(engine, call).gather(unit); });
}

ZERO_API zero_status_t zero_release(zero_engine_t* engine, int32_t unit) {
  const char* call = "zero_release";
  return guard(call, handle_or_null(engine), [&] { engine_of(engine, call).release(unit); });
}

ZERO_API zero_status_t zero_prefetch(zero_engine_t* engine, int32_t unit) {
  const char* call = "zero_prefetch";
  return guard(call, handle_or_null(engine), [&] { engine_of(engine, call).prefetch(unit); });
}

ZERO_API zero_status_t zero_release_modified(zero_engine_t* engine, int32_t unit, int32_t modifier_rank) {
  const char* call = "zero_release_modified";
  return guard(call, handle_or_null(engine), [&] { engine_of(engine, call).release_modified(unit, modifier_rank); });
}

ZERO_API zero_status_t zero_grad_ready(zero_engine_t* engine, int32_t param) {
  const char* call = "zero_grad_ready";
  return guard(call, handle_or_null(engine), [&] { engine_of(engine, call).grad_ready(param); });
}

ZERO_API zero_status_t zero_backward_end(zero_engine_t* engine) {
  const char* call = "zero_backward_end";
  return guard(call, handle_or_null(engine), [&] { engine_of(engine, call).backward_end(); });
}

ZERO_API zero_status_t zero_step(zero_step_info_t* out_info, zero_engine_t* engine) {
  return zero_step_with(out_info, engine, nullptr);
}

ZERO_API zero_status_t zero_step_with(zero_step_info_t* out_info, zero_engine_t* engine,
                                      const zero_step_options_t* options) {
  const char* call = "zero_step";
  return guard(call, handle_or_null(engine), [&] {
    zero::Engine& e = engine_of(engine, call);
    if (out_info != nullptr)
      zero::check_output_struct(out_info, sizeof(zero_step_info_t), call, "zero_step_info_t", "zero_step_info_init");
    zero_step_options_t o = ZERO_STEP_OPTIONS_INIT;
    if (options != nullptr)
      o = zero::read_input_struct(options, sizeof(zero_step_options_t), o, "zero_step_with", "zero_step_options_t",
                                  "zero_step_options_init");
    zero::StepOptions step_options;  // checked inside, where a rank's bad value reaches the others
    step_options.partial_window = o.partial_window;
    step_options.loss_averaged = o.loss_averaged;
    zero::StepResult r = e.step(step_options);
    if (out_info == nullptr) return;
    zero_step_info_t info = ZERO_STEP_INFO_INIT;
    info.step = r.step;
    info.loss_scale = r.loss_scale;
    info.grad_norm = r.grad_norm;
    info.skipped = r.skipped ? 1 : 0;
    info.lr = r.lr;
    zero::write_output_struct(out_info, info);
  });
}

ZERO_API zero_status_t zero_loss_scale(double* out_scale, const zero_engine_t* engine) {
  const char* call = "zero_loss_scale";
  return guard(call, handle_or_null(engine), [&] {
    require_arg(out_scale != nullptr, call, "out_scale is NULL");
    require_arg(engine != nullptr, call, "engine is NULL");
    *out_scale = handle(engine)->impl->loss_scale();
  });
}

ZERO_API zero_status_t zero_set_lr(zero_engine_t* engine, int32_t group, double lr) {
  const char* call = "zero_set_lr";
  return guard(call, handle_or_null(engine), [&] { engine_of(engine, call).set_lr(group, lr); });
}

ZERO_API zero_status_t zero_get_lr(double* out_lr, const zero_engine_t* engine, int32_t group) {
  const char* call = "zero_get_lr";
  return guard(call, handle_or_null(engine), [&] {
    require_arg(out_lr != nullptr, call, "out_lr is NULL");
    require_arg(engine != nullptr, call, "engine is NULL");
    *out_lr = handle(engine)->impl->next_lr(group);
  });
}

ZERO_API zero_status_t zero_save_checkpoint(zero_engine_t* engine, const char* dir, const char* tag) {
  const char* call = "zero_save_checkpoint";
  return guard(call, handle_or_null(engine), [&] {
    // NULL arguments are checked inside, where a failing rank still tells the others.
    engine_of(engine, call).save_checkpoint(dir != nullptr ? dir : "", tag != nullptr ? tag : "");
  });
}

ZERO_API zero_status_t zero_save_checkpoint_with(zero_engine_t* engine, const char* dir, const char* tag,
                                                 const zero_save_options_t* options) {
  const char* call = "zero_save_checkpoint";
  return guard(call, handle_or_null(engine), [&] {
    zero_save_options_t o = ZERO_SAVE_OPTIONS_INIT;
    if (options != nullptr)
      o = zero::read_input_struct(options, sizeof(zero_save_options_t), o, "zero_save_checkpoint_with",
                                  "zero_save_options_t", "zero_save_options_init");
    if (o.reserved != 0 || (o.exclude_frozen != 0 && o.exclude_frozen != 1))
      zero::fail(ZERO_ERR_INVALID_ARGUMENT,
                 "zero_save_checkpoint_with: options->exclude_frozen must be 0 or 1 and options->reserved 0");
    engine_of(engine, call)
        .save_checkpoint(dir != nullptr ? dir : "", tag != nullptr ? tag : "", o.exclude_frozen != 0);
  });
}

ZERO_API zero_status_t zero_load_checkpoint(zero_engine_t* engine, const char* dir, const char* tag) {
  const char* call = "zero_load_checkpoint";
  return guard(call, handle_or_null(engine),
               [&] { engine_of(engine, call).load_checkpoint(dir != nullptr ? dir : "", tag != nullptr ? tag : ""); });
}

// ---- Experimental

ZERO_API zero_status_t zero_engine_set_allocator(zero_engine_t* engine, zero_memory_space_t space,
                                                 const zero_allocator_t* allocator) {
  const char* call = "zero_engine_set_allocator";
  return guard(call, handle_or_null(engine), [&] {
    zero::Engine& e = engine_of(engine, call);
    if (space != ZERO_MEMORY_HOST && space != ZERO_MEMORY_PINNED_HOST && space != ZERO_MEMORY_DEVICE)
      zero::fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": space " + std::to_string(space) +
                                                " is not a zero_memory_space_t (HOST, PINNED_HOST or DEVICE)");
    const auto s = static_cast<zero::MemorySpace>(space);
    if (allocator == nullptr) {
      // The default: libzero's own host allocator; no allocator for the other spaces in a CPU build.
      e.set_allocator(s, s == zero::MemorySpace::kHost
                             ? std::shared_ptr<zero::Allocator>(&zero::host_allocator(), [](zero::Allocator*) {})
                             : nullptr);
      return;
    }
    const zero_allocator_t defaults = ZERO_ALLOCATOR_INIT;
    const zero_allocator_t a = zero::read_input_struct(allocator, sizeof(zero_allocator_t), defaults, call,
                                                       "zero_allocator_t", "zero_allocator_init");
    require_arg(a.alloc != nullptr && a.free != nullptr, call, "the allocator's alloc or free callback is NULL");
    e.set_allocator(s, std::make_shared<zero::CallbackAllocator>(s, a.alloc, a.free, a.user_data));
  });
}

ZERO_API zero_status_t zero_engine_set_device(zero_engine_t* engine, const char* device) {
  const char* call = "zero_engine_set_device";
  return guard(call, handle_or_null(engine), [&] {
    zero::Engine& e = engine_of(engine, call);
    require_arg(device != nullptr, call, "device is NULL");
    e.set_device(zero::device::runtime_named(device));
  });
}

ZERO_API zero_status_t zero_engine_set_stream(zero_engine_t* engine, void* stream) {
  const char* call = "zero_engine_set_stream";
  return guard(call, handle_or_null(engine), [&] { engine_of(engine, call).set_stream(stream); });
}

ZERO_API zero_status_t zero_engine_copy(zero_engine_t* engine, void* dst, const void* src, size_t n_bytes) {
  const char* call = "zero_engine_copy";
  return guard(call, handle_or_null(engine), [&] {
    zero::Engine& e = engine_of(engine, call);
    require_arg(n_bytes == 0 || (dst != nullptr && src != nullptr), call, "dst or src is NULL");
    e.copy(dst, src, n_bytes);
  });
}

ZERO_API zero_status_t zero_engine_order_stream(zero_engine_t* engine, void* stream) {
  const char* call = "zero_engine_order_stream";
  return guard(call, handle_or_null(engine), [&] { engine_of(engine, call).order_stream(stream); });
}

}  // extern "C"
