// libzero._native: the C ABI (capi/include/zero/zero.h) as Python objects, and nothing more. Everything that makes
// it read like Python (dict configs, views that check their unit, context managers) is in the pure-Python package
// next to this file; this layer owns only what must be native: the handles' lifetimes, releasing the GIL around
// every call that may communicate, the custom-communicator trampoline, arrays over engine memory and DLPack
// capsules (numpy cannot export bf16 through DLPack).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#define ZERO_EXPERIMENTAL_API
#include <zero/zero.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "dlpack.hpp"

namespace py = pybind11;

namespace {

// A failed call: the status and the engine's message. Thrown while the GIL may be released; translated into the
// matching libzero.errors class by the translator registered below (which runs with the GIL held).
struct StatusError {
  zero_status_t status;
  std::string message;
};

void check(zero_status_t status) {
  if (status != ZERO_OK) throw StatusError{status, zero_last_error()};
}

void check(zero_status_t status, const zero_engine_t* engine) {
  if (status != ZERO_OK) throw StatusError{status, engine != nullptr ? zero_engine_last_error(engine) : ""};
}

using ReleaseGil = py::call_guard<py::gil_scoped_release>;

// ---- Communicators ------------------------------------------------------------------------------------------------

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case ZERO_DTYPE_FP32:
      return "fp32";
    case ZERO_DTYPE_BF16:
      return "bf16";
    case ZERO_DTYPE_FP16:
      return "fp16";
    case ZERO_DTYPE_FP64:
      return "fp64";
    case ZERO_DTYPE_INT64:
      return "int64";
    case ZERO_DTYPE_UINT8:
      return "uint8";
    case ZERO_DTYPE_INT8:
      return "int8";
    case ZERO_DTYPE_BYTES:
      return "bytes";
    case -1:
      return "none";  // a frozen param's gradient
    default:
      return "unknown";
  }
}

size_t dtype_size(int32_t dtype) {
  switch (dtype) {
    case ZERO_DTYPE_FP32:
      return 4;
    case ZERO_DTYPE_BF16:
    case ZERO_DTYPE_FP16:
      return 2;
    case ZERO_DTYPE_FP64:
    case ZERO_DTYPE_INT64:
      return 8;
    case ZERO_DTYPE_UINT8:
    case ZERO_DTYPE_INT8:
    case ZERO_DTYPE_BYTES:
      return 1;
    default:
      return 0;
  }
}

// The numpy dtype a buffer of `dtype` is shown as. bf16 has none of numpy's own: the caller passes the one to use
// (ml_dtypes.bfloat16 when installed, uint16 otherwise; libzero/_dtypes.py decides).
py::dtype numpy_dtype(int32_t dtype, const py::object& bf16) {
  switch (dtype) {
    case ZERO_DTYPE_FP32:
      return py::dtype::of<float>();
    case ZERO_DTYPE_BF16:
      return py::dtype::from_args(bf16);
    case ZERO_DTYPE_FP16:
      return py::dtype("float16");
    case ZERO_DTYPE_FP64:
      return py::dtype::of<double>();
    case ZERO_DTYPE_INT64:
      return py::dtype::of<int64_t>();
    case ZERO_DTYPE_UINT8:
    case ZERO_DTYPE_BYTES:
      return py::dtype::of<uint8_t>();
    case ZERO_DTYPE_INT8:
      return py::dtype::of<int8_t>();
    default:
      throw StatusError{ZERO_ERR_INTERNAL, std::string("unknown dtype ") + std::to_string(dtype)};
  }
}

// A framework's own transport, written in Python (libzero.Comm.custom). The object's run(collective) performs one
// collective to completion in place; the engine calls it with the GIL released, so the trampoline takes it.
struct PythonBackend {
  py::object transport;
  py::object bf16;  // the numpy dtype bf16 buffers are shown as
  int32_t size;     // as given to libzero at creation: the buffers are sized by it
  std::string last_error;
};

const char* kind_name(int32_t kind) {
  switch (kind) {
    case ZERO_COLL_ALL_GATHER:
      return "all_gather";
    case ZERO_COLL_REDUCE_SCATTER:
      return "reduce_scatter";
    case ZERO_COLL_ALL_REDUCE:
      return "all_reduce";
    case ZERO_COLL_BROADCAST:
      return "broadcast";
    default:
      return "unknown";
  }
}

const char* op_name(int32_t op) {
  switch (op) {
    case ZERO_REDUCE_SUM:
      return "sum";
    case ZERO_REDUCE_MIN:
      return "min";
    case ZERO_REDUCE_MAX:
      return "max";
    default:
      return "unknown";
  }
}

zero_status_t python_run(void* user_data, const zero_collective_t* coll) {
  auto* backend = static_cast<PythonBackend*>(user_data);
  if (!Py_IsInitialized()) {
    backend->last_error = "the Python interpreter has shut down";
    return ZERO_ERR_COMM;
  }
  py::gil_scoped_acquire gil;
  try {
    const py::object transport = backend->transport;
    const uint64_t blocks = coll->kind == ZERO_COLL_ALL_GATHER || coll->kind == ZERO_COLL_REDUCE_SCATTER
                                ? static_cast<uint64_t>(transport.attr("size").cast<int64_t>())
                                : 1;
    const py::dtype dt = numpy_dtype(coll->dtype, backend->bf16);
    // A view of libzero's buffer, valid for this call only: the object that owns it is a capsule with no
    // destructor, so the array never frees it.
    const py::array buf(dt, std::vector<py::ssize_t>{static_cast<py::ssize_t>(coll->count * blocks)},
                        std::vector<py::ssize_t>{static_cast<py::ssize_t>(dtype_size(coll->dtype))}, coll->buf,
                        py::capsule(coll->buf, [](void*) {}));
    py::dict desc;
    desc["kind"] = kind_name(coll->kind);
    desc["dtype"] = dtype_name(coll->dtype);
    desc["op"] = op_name(coll->op);
    desc["root"] = coll->root;
    desc["count"] = coll->count;
    desc["sequence"] = coll->sequence;
    desc["label"] = coll->label != nullptr ? coll->label : "";
    desc["buf"] = buf;
    transport.attr("run")(desc);
    return ZERO_OK;
  } catch (py::error_already_set& e) {
    backend->last_error = e.what();
    return ZERO_ERR_COMM;
  } catch (StatusError& e) {
    backend->last_error = e.message;
    return e.status;
  } catch (std::exception& e) {
    backend->last_error = e.what();
    return ZERO_ERR_COMM;
  }
}

const char* python_error_message(void* user_data) {
  auto* backend = static_cast<PythonBackend*>(user_data);
  return backend->last_error.empty() ? nullptr : backend->last_error.c_str();
}

zero_status_t python_finalize(void* user_data) {
  auto* backend = static_cast<PythonBackend*>(user_data);
  if (!Py_IsInitialized()) return ZERO_OK;
  py::gil_scoped_acquire gil;
  try {
    if (py::hasattr(backend->transport, "finalize")) backend->transport.attr("finalize")();
    return ZERO_OK;
  } catch (py::error_already_set& e) {
    backend->last_error = e.what();
    return ZERO_ERR_COMM;
  }
}

void python_destroy(void* user_data) {
  auto* backend = static_cast<PythonBackend*>(user_data);
  // At interpreter shutdown the objects are gone with it; the C++ shell is all that is left to free.
  if (!Py_IsInitialized()) {
    backend->transport.release();
    backend->bf16.release();
    delete backend;
    return;
  }
  py::gil_scoped_acquire gil;
  delete backend;
}

// This rank's TCP listener for a communicator across machines: made first, its address gathered by the bootstrap.
class Listener {
 public:
  explicit Listener(const std::string& host) {
    const char* address = nullptr;
    check(zero_listener_create(&listener_, &address, host.c_str()));
    address_ = address;
  }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  ~Listener() { zero_listener_destroy(listener_); }
  const std::string& address() const { return address_; }
  zero_listener_t* get() { return listener_; }

 private:
  zero_listener_t* listener_ = nullptr;
  std::string address_;
};

class Comm {
 public:
  explicit Comm(zero_comm_t* comm) : comm_(comm) {}
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm() { zero_comm_destroy(comm_); }

  static std::unique_ptr<Comm> mpi(int64_t fortran_handle) {
    zero_comm_t* comm = nullptr;
    check(zero_comm_create_mpi(&comm, fortran_handle));
    return std::make_unique<Comm>(comm);
  }
  static std::unique_ptr<Comm> shm(const std::string& name, int32_t rank, int32_t size, double join_timeout_s) {
    zero_comm_t* comm = nullptr;
    check(zero_comm_create_shm(&comm, name.c_str(), rank, size, join_timeout_s));
    return std::make_unique<Comm>(comm);
  }
  static std::unique_ptr<Comm> shm_nodes(Listener& listener, const std::string& name, int32_t rank, int32_t size,
                                         int32_t ranks_per_node, const std::vector<std::string>& addresses,
                                         double join_timeout_s) {
    std::vector<const char*> pointers;
    for (const std::string& a : addresses) pointers.push_back(a.c_str());
    if (pointers.size() != static_cast<size_t>(size))
      throw py::value_error("shm_nodes: one address per rank expected, got " + std::to_string(pointers.size()));
    zero_comm_t* comm = nullptr;
    check(zero_comm_create_shm_nodes(&comm, listener.get(), name.c_str(), rank, size, ranks_per_node, pointers.data(),
                                     join_timeout_s));
    return std::make_unique<Comm>(comm);
  }
  static std::unique_ptr<Comm> single() {
    zero_comm_t* comm = nullptr;
    check(zero_comm_create_single(&comm));
    return std::make_unique<Comm>(comm);
  }
  static std::unique_ptr<Comm> split(const Comm& control, const Comm& data) {
    zero_comm_t* comm = nullptr;
    check(zero_comm_create_split(&comm, control.get(), data.get()));
    return std::make_unique<Comm>(comm);
  }
  static std::unique_ptr<Comm> nccl(const Comm& control, int32_t device, double timeout_s) {
    zero_comm_t* comm = nullptr;
    check(zero_comm_create_nccl(&comm, control.get(), device, timeout_s));
    return std::make_unique<Comm>(comm);
  }
  static std::unique_ptr<Comm> custom(py::object transport, py::object bf16) {
    zero_comm_ops_t ops;
    check(zero_comm_ops_init(&ops, sizeof ops));
    ops.rank = transport.attr("rank").cast<int32_t>();
    ops.size = transport.attr("size").cast<int32_t>();
    ops.local_size = py::hasattr(transport, "local_size") ? transport.attr("local_size").cast<int32_t>() : 0;
    ops.flags = py::hasattr(transport, "deterministic") && transport.attr("deterministic").cast<bool>()
                    ? static_cast<uint32_t>(ZERO_COMM_DETERMINISTIC)
                    : 0u;
    ops.run = python_run;
    ops.error_message = python_error_message;
    ops.finalize = python_finalize;
    ops.destroy = python_destroy;
    auto* backend = new PythonBackend{std::move(transport), std::move(bf16), ops.size, {}};
    zero_comm_t* comm = nullptr;
    const zero_status_t status = zero_comm_create_custom(&comm, &ops, backend);
    if (status != ZERO_OK) {
      delete backend;  // not taken: libzero calls destroy only for a communicator it created
      check(status);
    }
    return std::make_unique<Comm>(comm);
  }

  zero_comm_t* get() const {
    if (comm_ == nullptr) throw StatusError{ZERO_ERR_INVALID_STATE, "the communicator was closed"};
    return comm_;
  }
  int32_t rank() const {
    int32_t r = 0;
    check(zero_comm_rank(&r, get()));
    return r;
  }
  int32_t size() const {
    int32_t s = 0;
    check(zero_comm_size(&s, get()));
    return s;
  }
  void finalize() { check(zero_comm_finalize(get())); }
  // Drops this handle's reference (engines on it keep the communicator alive).
  void close() {
    zero_comm_destroy(comm_);
    comm_ = nullptr;
  }

 private:
  zero_comm_t* comm_;
};

// ---- Engines ------------------------------------------------------------------------------------------------------

class Engine {
 public:
  Engine(const std::string& config, const Comm& comm) {
    zero_comm_t* c = comm.get();
    zero_engine_t* e = nullptr;
    {
      py::gil_scoped_release release;
      const zero_status_t status = zero_engine_create(&e, config.c_str(), c);
      if (status != ZERO_OK) throw StatusError{status, zero_last_error()};
    }
    engine_ = e;
  }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  // Every use of the handle below happens with the GIL held, except the C call inside call(), which counts itself
  // in in_flight_: close() from another thread (a watchdog's abort(); close()) then leaves the destruction to that
  // call's thread, which does it when the call returns. zero_engine_destroy completes all-gathers still in flight
  // (up to 5 s) with the GIL held, so that no abort() can run beside it (zero.h forbids that pair); a custom
  // communicator's callbacks take the GIL again on this same thread.
  ~Engine() { zero_engine_destroy(engine_ != nullptr ? engine_ : closing_); }

  zero_engine_t* get() const {
    if (engine_ == nullptr) throw StatusError{ZERO_ERR_INVALID_STATE, "the engine was closed"};
    return engine_;
  }
  bool closed() const { return engine_ == nullptr; }
  void close() {
    if (engine_ == nullptr) return;
    if (in_flight_ > 0) {  // another thread is inside a call on it: that thread destroys it when the call returns
      closing_ = engine_;
      engine_ = nullptr;
      return;
    }
    zero_engine_t* e = engine_;
    engine_ = nullptr;
    zero_engine_destroy(e);
  }
  void abort() { zero_engine_abort(engine_ != nullptr ? engine_ : closing_); }
  void set_num_threads(int32_t threads) { check(zero_engine_set_num_threads(get(), threads), engine_); }

  // ---- A device engine (zero.h's experimental section). Streams and addresses cross as integers.
  void set_device(const std::string& device) { check(zero_engine_set_device(get(), device.c_str()), engine_); }
  void set_stream(uintptr_t stream) { check(zero_engine_set_stream(get(), reinterpret_cast<void*>(stream)), engine_); }
  void order_stream(uintptr_t stream) {
    check(zero_engine_order_stream(get(), reinterpret_cast<void*>(stream)), engine_);
  }
  py::tuple device() const {
    int32_t type = 0, id = 0;
    check(zero_engine_device(&type, &id, get()), engine_);
    return py::make_tuple(type, id);
  }
  void copy(uintptr_t dst, uintptr_t src, size_t bytes) {
    call([=](zero_engine_t* e) {
      return zero_engine_copy(e, reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
    });
  }
  uintptr_t address(int32_t param, bool grad) const {
    void* data = nullptr;
    check(grad ? zero_grad_data(&data, get(), param) : zero_param_data(&data, get(), param), engine_);
    return reinterpret_cast<uintptr_t>(data);
  }
  // A DLPack capsule over the param's values (`grad`: its gradient buffer) in the engine's device memory, owned by
  // `owner` (which keeps this engine alive).
  py::capsule device_dlpack(int32_t param, bool grad, bool versioned, const py::object& owner) const {
    zero_param_info_t info;
    check(zero_param_info_init(&info, sizeof info));
    check(zero_param_info(&info, get(), param), engine_);
    int32_t type = 0, id = 0;
    check(zero_engine_device(&type, &id, get()), engine_);
    return zero_py::to_dlpack_device(
        reinterpret_cast<void*>(address(param, grad)), std::vector<int64_t>(info.shape, info.shape + info.ndim),
        grad ? info.grad_dtype : info.param_dtype, zero_py::DLDevice{type, id}, owner, versioned);
  }
  // zero_engine_set_model_parallel; None: no model-parallel group.
  void set_model_parallel(const Comm* group) {
    check(zero_engine_set_model_parallel(get(), group != nullptr ? group->get() : nullptr), engine_);
  }

  int32_t add_param_group(const std::optional<std::string>& name, double lr, double weight_decay, double beta1,
                          double beta2, double eps) {
    zero_param_group_desc_t desc;
    check(zero_param_group_desc_init(&desc, sizeof desc));
    desc.name = name ? name->c_str() : nullptr;
    desc.lr = lr;
    desc.weight_decay = weight_decay;
    desc.beta1 = beta1;
    desc.beta2 = beta2;
    desc.eps = eps;
    int32_t id = -1;
    check(zero_engine_add_param_group(&id, get(), &desc), engine_);
    return id;
  }

  // `init`: a C-contiguous array of the values (any of the engine's dtypes, named by init_dtype), or None. It is
  // read in finalize on rank 0, so the caller keeps it alive until then (libzero.Engine does).
  // `frozen_dtype`: -2 for a trained param; otherwise the param is frozen (ZERO_PARAM_FROZEN) and kept in that
  // zero_dtype_t (-1: the compute dtype). `duplicate`: ZERO_PARAM_MODEL_PARALLEL_DUPLICATE.
  int32_t add_param(const std::string& name, const std::vector<int64_t>& shape, int32_t unit, int32_t group,
                    const py::object& init, int32_t init_dtype, int32_t frozen_dtype, bool duplicate) {
    zero_param_desc_t desc;
    check(zero_param_desc_init(&desc, sizeof desc));
    desc.name = name.c_str();
    desc.ndim = static_cast<int32_t>(shape.size());
    desc.shape = shape.data();
    desc.unit = unit;
    desc.group = group;
    if (frozen_dtype != -2) {
      desc.flags = ZERO_PARAM_FROZEN;
      desc.dtype = frozen_dtype;
    }
    if (duplicate) desc.flags |= ZERO_PARAM_MODEL_PARALLEL_DUPLICATE;
    if (!init.is_none()) {
      const py::buffer_info info = init.cast<py::buffer>().request();
      desc.init_data = info.ptr;
      desc.init_dtype = init_dtype;
    }
    int32_t id = -1;
    check(zero_engine_add_param(&id, get(), &desc), engine_);
    return id;
  }

  void finalize() {
    call([](zero_engine_t* e) { return zero_engine_finalize(e); });
  }
  void gather(int32_t unit) {
    call([unit](zero_engine_t* e) { return zero_gather(e, unit); });
  }
  void release(int32_t unit) { check(zero_release(get(), unit), engine_); }
  void release_modified(int32_t unit, int32_t modifier_rank) {
    call([unit, modifier_rank](zero_engine_t* e) { return zero_release_modified(e, unit, modifier_rank); });
  }
  void prefetch(int32_t unit) {
    call([unit](zero_engine_t* e) { return zero_prefetch(e, unit); });
  }
  void grad_ready(int32_t param) {
    call([param](zero_engine_t* e) { return zero_grad_ready(e, param); });
  }
  void backward_end() {
    call([](zero_engine_t* e) { return zero_backward_end(e); });
  }

  py::dict step(bool partial_window, bool loss_averaged) {
    zero_step_info_t info;
    check(zero_step_info_init(&info, sizeof info));
    zero_step_options_t options;
    check(zero_step_options_init(&options, sizeof options));
    options.partial_window = partial_window ? 1 : 0;
    options.loss_averaged = loss_averaged ? 1 : 0;
    call([&](zero_engine_t* e) { return zero_step_with(&info, e, &options); });
    py::dict d;
    d["step"] = info.step;
    d["loss_scale"] = info.loss_scale;
    d["grad_norm"] = info.grad_norm;
    d["skipped"] = info.skipped != 0;
    d["lr"] = info.lr;
    return d;
  }

  double loss_scale() const {
    double scale = 0;
    check(zero_loss_scale(&scale, get()), engine_);
    return scale;
  }
  void set_lr(int32_t group, double lr) { check(zero_set_lr(get(), group, lr), engine_); }
  double get_lr(int32_t group) const {
    double lr = 0;
    check(zero_get_lr(&lr, get(), group), engine_);
    return lr;
  }

  void save_checkpoint(const std::string& dir, const std::string& tag, bool exclude_frozen) {
    zero_save_options_t options;
    check(zero_save_options_init(&options, sizeof options));
    options.exclude_frozen = exclude_frozen ? 1 : 0;
    call([&](zero_engine_t* e) { return zero_save_checkpoint_with(e, dir.c_str(), tag.c_str(), &options); });
  }
  void load_checkpoint(const std::string& dir, const std::optional<std::string>& tag) {
    call([&](zero_engine_t* e) { return zero_load_checkpoint(e, dir.c_str(), tag ? tag->c_str() : nullptr); });
  }

  py::dict info() const {
    zero_engine_info_t info;
    check(zero_engine_info_init(&info, sizeof info));
    check(zero_engine_info(&info, get()), engine_);
    static const char* simd[] = {"scalar", "avx2", "avx512"};
    py::dict d;
    d["rank"] = info.rank;
    d["world_size"] = info.world_size;
    d["stage"] = info.stage;
    d["gradient_accumulation_steps"] = info.gradient_accumulation_steps;
    d["param_dtype"] = dtype_name(info.param_dtype);
    d["grad_dtype"] = dtype_name(info.grad_dtype);
    d["comm_dtype"] = dtype_name(info.comm_dtype);
    d["simd"] = info.simd >= 0 && info.simd <= 2 ? simd[info.simd] : "unknown";
    d["num_params"] = info.num_params;
    d["num_units"] = info.num_units;
    d["optimizer_threads"] = info.optimizer_threads;
    d["deterministic"] = info.deterministic != 0;
    d["timeout_s"] = info.timeout_s;
    return d;
  }

  py::dict param_info(int32_t param) const {
    zero_param_info_t info;
    check(zero_param_info_init(&info, sizeof info));
    check(zero_param_info(&info, get(), param), engine_);
    py::dict d;
    d["name"] = info.name;
    d["shape"] = py::tuple(py::cast(std::vector<int64_t>(info.shape, info.shape + info.ndim)));
    d["unit"] = info.unit;
    d["group"] = info.group;
    d["numel"] = info.numel;
    d["param_dtype"] = dtype_name(info.param_dtype);
    d["grad_dtype"] = dtype_name(info.grad_dtype);
    d["frozen"] = (info.flags & ZERO_PARAM_FROZEN) != 0;
    d["model_parallel_duplicate"] = (info.flags & ZERO_PARAM_MODEL_PARALLEL_DUPLICATE) != 0;
    return d;
  }

  // (gathered, generation): what a view checks before every use. Kept apart from unit_info for speed.
  std::pair<bool, uint64_t> unit_state(int32_t unit) const {
    zero_unit_info_t info;
    check(zero_unit_info_init(&info, sizeof info));
    check(zero_unit_info(&info, get(), unit), engine_);
    return {info.gathered != 0, info.generation};
  }

  py::dict unit_info(int32_t unit) const {
    zero_unit_info_t info;
    check(zero_unit_info_init(&info, sizeof info));
    check(zero_unit_info(&info, get(), unit), engine_);
    py::dict d;
    d["gathered"] = info.gathered != 0;
    d["num_params"] = info.num_params;
    d["generation"] = info.generation;
    d["numel"] = info.numel;
    return d;
  }

  // A numpy array over the param's values (`grad`: its gradient buffer), owned by `base` (which keeps this engine
  // alive). The caller (libzero/views.py) wraps it in a view that checks the unit before every use.
  py::array array(int32_t param, bool grad, const py::object& bf16, const py::object& base) {
    zero_param_info_t info;
    check(zero_param_info_init(&info, sizeof info));
    check(zero_param_info(&info, get(), param), engine_);
    void* data = nullptr;
    check(grad ? zero_grad_data(&data, engine_, param) : zero_param_data(&data, engine_, param), engine_);
    const int32_t dtype = grad ? info.grad_dtype : info.param_dtype;
    // Row-major strides, spelled out: an empty stride list is not read as "contiguous" by every pybind11.
    std::vector<py::ssize_t> shape(info.shape, info.shape + info.ndim);
    std::vector<py::ssize_t> strides(shape.size());
    py::ssize_t stride = static_cast<py::ssize_t>(dtype_size(dtype));
    for (size_t d = shape.size(); d-- > 0;) {
      strides[d] = stride;
      stride *= shape[d];
    }
    return py::array(numpy_dtype(dtype, bf16), shape, strides, data, base);
  }

  py::dict memory_stats() const {
    zero_memory_stats_t s;
    check(zero_memory_stats_init(&s, sizeof s));
    check(zero_memory_stats(&s, get()), engine_);
    py::dict d;
    d["param_bytes"] = s.param_bytes;
    d["grad_bytes"] = s.grad_bytes;
    d["master_param_bytes"] = s.master_param_bytes;
    d["optimizer_state_bytes"] = s.optimizer_state_bytes;
    d["bucket_bytes"] = s.bucket_bytes;
    d["gathered_bytes"] = s.gathered_bytes;
    d["frozen_param_bytes"] = s.frozen_param_bytes;
    d["total_bytes"] = s.total_bytes;
    return d;
  }

  py::dict memory_placement() const {
    zero_memory_placement_t s;
    check(zero_memory_placement_init(&s, sizeof s));
    check(zero_memory_placement(&s, get()), engine_);
    py::dict d;
    d["host_bytes"] = s.host_bytes;
    d["nvme_bytes"] = s.nvme_bytes;
    d["staging_bytes"] = s.staging_bytes;
    return d;
  }

  py::dict window() const {
    zero_window_info_t s;
    check(zero_window_info_init(&s, sizeof s));
    check(zero_engine_window(&s, get()), engine_);
    py::dict d;
    d["micro_steps"] = s.micro_steps;
    d["accumulation_steps"] = s.accumulation_steps;
    d["total_micro_steps"] = s.total_micro_steps;
    d["steps"] = s.steps;
    return d;
  }

  py::dict comm_stats() const {
    zero_comm_stats_t s;
    check(zero_comm_stats_init(&s, sizeof s));
    check(zero_comm_stats(&s, get()), engine_);
    auto kind = [](const zero_comm_kind_stats_t& k) {
      py::dict d;
      d["calls"] = k.calls;
      d["bytes"] = k.bytes;
      d["wire_bytes"] = k.wire_bytes;
      return d;
    };
    py::dict d;
    d["sequence"] = s.sequence;
    d["all_gather"] = kind(s.all_gather);
    d["reduce_scatter"] = kind(s.reduce_scatter);
    d["all_reduce"] = kind(s.all_reduce);
    d["broadcast"] = kind(s.broadcast);
    d["control"] = kind(s.control);
    return d;
  }

  std::string recent_collectives() const {
    char* text = nullptr;
    check(zero_engine_recent_collectives(&text, get()), engine_);
    std::string out = text;
    zero_string_destroy(text);
    return out;
  }

 private:
  // A call that may communicate: without the GIL, so that other Python threads (and a custom communicator's
  // transport) run while this one waits on the other ranks.
  template <typename F>
  void call(F&& f) {
    zero_engine_t* e = get();
    zero_status_t status;
    ++in_flight_;
    {
      py::gil_scoped_release release;
      status = f(e);
    }
    --in_flight_;
    const std::string message = status != ZERO_OK ? zero_engine_last_error(e) : "";
    if (closing_ == e && in_flight_ == 0) {  // closed by another thread meanwhile
      closing_ = nullptr;
      zero_engine_destroy(e);
    }
    if (status != ZERO_OK) throw StatusError{status, message};
  }

  zero_engine_t* engine_ = nullptr;
  zero_engine_t* closing_ = nullptr;  // closed while a call was in flight; destroyed by the last such call
  int in_flight_ = 0;                 // calls running without the GIL (changed only with the GIL held)
};

std::string config_check(const std::string& config, int32_t world_size) {
  char* report = nullptr;
  check(zero_config_check(&report, config.c_str(), world_size));
  std::string out = report;
  zero_string_destroy(report);
  return out;
}

// ---- Logging ------------------------------------------------------------------------------------------------------

py::object* log_sink = nullptr;  // a callable(level, rank, message), kept for the life of the process

void log_trampoline(void*, int32_t level, int32_t rank, const char* message) {
  if (log_sink == nullptr || !Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  try {
    (*log_sink)(level, rank, message);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("libzero: the log callback");
  }
}

void set_log_callback(py::object sink, int32_t max_level) {
  if (sink.is_none()) {
    check(zero_set_log_callback(nullptr, nullptr, max_level));
    return;
  }
  // Never freed: libzero may log from its exit hook, after this module's globals are gone.
  if (log_sink == nullptr) log_sink = new py::object();
  *log_sink = std::move(sink);
  check(zero_set_log_callback(log_trampoline, nullptr, max_level));
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "libzero's C ABI as Python objects (use the libzero package, not this module)";

  // Status errors become libzero.errors classes (imported lazily: libzero/__init__.py imports this module first).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const py::object make = py::module_::import("libzero.errors").attr("_from_status");
      const py::object error = make(e.status, e.message);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
    }
  });

  m.def("version", []() {  // zero_get_version(): major * 10000 + minor * 100 + patch (ZERO_VERSION_NUMBER)
    const uint32_t v = zero_get_version();
    return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  });
  m.def("status_string", [](int32_t status) { return std::string(zero_status_string(status)); });
  m.def("config_check", &config_check, py::arg("config"), py::arg("world_size"));
  m.def("set_log_callback", &set_log_callback, py::arg("sink"), py::arg("max_level"));
  m.def("dtype_size", &dtype_size);
  m.def("to_dlpack", &zero_py::to_dlpack, py::arg("array"), py::arg("zero_dtype"), py::arg("versioned"),
        "A DLPack capsule over a C-contiguous host array ('dltensor_versioned' when versioned, else 'dltensor'); "
        "the capsule keeps the array alive. zero_dtype names the element type (bf16 whatever numpy dtype shows it).");

  py::class_<Listener>(m, "Listener")
      .def(py::init<const std::string&>(), py::arg("host"))
      .def_property_readonly("address", &Listener::address);

  py::class_<Comm>(m, "Comm")
      .def_static("mpi", &Comm::mpi, py::arg("fortran_handle"), ReleaseGil())
      .def_static("shm", &Comm::shm, py::arg("name"), py::arg("rank"), py::arg("size"), py::arg("join_timeout_s"),
                  ReleaseGil())
      .def_static("shm_nodes", &Comm::shm_nodes, py::arg("listener"), py::arg("name"), py::arg("rank"), py::arg("size"),
                  py::arg("ranks_per_node"), py::arg("addresses"), py::arg("join_timeout_s"), ReleaseGil())
      .def_static("single", &Comm::single)
      .def_static("split", &Comm::split, py::arg("control"), py::arg("data"))
      .def_static("nccl", &Comm::nccl, py::arg("control"), py::arg("device"), py::arg("timeout_s"), ReleaseGil())
      .def_static("custom", &Comm::custom, py::arg("transport"), py::arg("bf16"))
      .def_property_readonly("rank", &Comm::rank)
      .def_property_readonly("size", &Comm::size)
      .def("finalize", &Comm::finalize, ReleaseGil())
      .def("close", &Comm::close);

  py::class_<Engine>(m, "Engine")
      .def(py::init<const std::string&, const Comm&>(), py::arg("config"), py::arg("comm"))
      .def_property_readonly("closed", &Engine::closed)
      .def("close", &Engine::close)
      .def("abort", &Engine::abort)
      .def("set_num_threads", &Engine::set_num_threads)
      .def("set_device", &Engine::set_device)
      .def("set_stream", &Engine::set_stream)
      .def("order_stream", &Engine::order_stream)
      .def("device", &Engine::device)
      .def("copy", &Engine::copy)
      .def("address", &Engine::address)
      .def("device_dlpack", &Engine::device_dlpack)
      .def("set_model_parallel", &Engine::set_model_parallel, py::arg("group").none(true))
      .def("add_param_group", &Engine::add_param_group)
      .def("add_param", &Engine::add_param)
      .def("finalize", &Engine::finalize)
      .def("gather", &Engine::gather)
      .def("release", &Engine::release)
      .def("release_modified", &Engine::release_modified)
      .def("prefetch", &Engine::prefetch)
      .def("grad_ready", &Engine::grad_ready)
      .def("backward_end", &Engine::backward_end)
      .def("step", &Engine::step, py::arg("partial_window") = false, py::arg("loss_averaged") = false)
      .def("loss_scale", &Engine::loss_scale)
      .def("set_lr", &Engine::set_lr)
      .def("get_lr", &Engine::get_lr)
      .def("save_checkpoint", &Engine::save_checkpoint)
      .def("load_checkpoint", &Engine::load_checkpoint)
      .def("info", &Engine::info)
      .def("param_info", &Engine::param_info)
      .def("unit_state", &Engine::unit_state)
      .def("unit_info", &Engine::unit_info)
      .def("array", &Engine::array)
      .def("memory_stats", &Engine::memory_stats)
      .def("memory_placement", &Engine::memory_placement)
      .def("comm_stats", &Engine::comm_stats)
      .def("recent_collectives", &Engine::recent_collectives)
      .def("window", &Engine::window);
}
