// libzero-nccl.so.1: a device communicator over NCCL, as zero_backend.h's callback table.
//  - Every collective runs on the module's own stream, after an event recorded on the engine's stream (the work that
//    produced its input), and ends with an event; once wait() sees that event, the engine's stream is made to wait
//    for it (cudaStreamWaitEvent), so the result is used in stream order and compute queued meanwhile overlaps.
//  - The watchdog: wait() polls the event and ncclCommGetAsyncError in slices up to libzero's timeout; abort()
//    calls ncclCommAbort (any thread), which ends a collective whose peer never comes.
//  - Determinism: a floating-point reduce-scatter whose bits NCCL's algorithm would choose (three ranks or more, or
//    16-bit values at any count) runs as an exchange of blocks (grouped ncclSend/ncclRecv) and a rank-order fp32 sum
//    on the device (rank_order_sum.cu): the CPU engine's bits. NCCL's own reduce-scatter runs where one addition is
//    the whole sum (fp32 on two ranks) or the engine gave determinism up (ZERO_COLL_ANY_ORDER).
//  - Groups (group_begin/group_end) are NCCL groups; what must follow a grouped exchange (its sum, its event) is
//    queued at group_end.
#include "nccl_backend.h"

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "nccl_library.hpp"
#include "rank_order_sum.hpp"
#include "zero/zero_backend.h"

namespace zero {
namespace nccl {
namespace {

struct Failure {
  zero_status_t status;
  std::string text;
};

// The callbacks run on the caller's thread, whose current device may be another: the communicator's for the call.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

void check_cuda(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  throw Failure{e == cudaErrorMemoryAllocation ? ZERO_ERR_OUT_OF_MEMORY : ZERO_ERR_COMM,
                what + ": " + cudaGetErrorString(e)};
}

size_t element_bytes(int32_t dtype) {
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
      return 1;
    default:
      return 0;
  }
}

ncclDataType_t nccl_type(int32_t dtype) {
  switch (dtype) {
    case ZERO_DTYPE_FP32:
      return ncclFloat32;
    case ZERO_DTYPE_BF16:
      return ncclBfloat16;
    case ZERO_DTYPE_FP16:
      return ncclFloat16;
    case ZERO_DTYPE_FP64:
      return ncclFloat64;
    case ZERO_DTYPE_INT64:
      return ncclInt64;
    default:
      return ncclUint8;
  }
}

struct Request {
  Request(cudaStream_t consumer_stream, cudaStream_t module_stream)
      : consumer(consumer_stream), stream(module_stream) {}
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  // A request given up (a failure) frees its receive buffer in the module stream's order, after whatever used it.
  ~Request() {
    if (received != nullptr) cudaFreeAsync(received, stream);
  }
  cudaEvent_t done = nullptr;
  cudaStream_t consumer = nullptr, stream = nullptr;
  // The deterministic reduce-scatter: the blocks received from the others, summed into this rank's own block once
  // the exchange has run (queued at group_end when it is part of a group).
  bool sum_pending = false;
  SumType sum_type = SumType::kF32;
  void* own = nullptr;
  void* received = nullptr;
  size_t count = 0;
  bool tail_queued = false;
};

class Backend {
 public:
  Backend(int rank, int size, int device) : rank_(rank), size_(size), device_(device) {}
  ~Backend() {
    DeviceScope scope(device_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Not finalized (a failure, or destroyed early): abort rather than destroy, which would wait for the peers.
      if (comm_ != nullptr) lib().CommAbort(comm_), comm_ = nullptr;
    }
    for (Request* r : deferred_) delete r;
    deferred_.clear();
    // Returns at once; CUDA releases the stream when its work is done (never waited for: the device may be stuck).
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  }

  void open(const ncclUniqueId& id, double timeout_s) {
    DeviceScope scope(device_);
    timeout_s_ = timeout_s;
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; completion is polled with a deadline
    ncclComm_t comm = nullptr;
    ncclResult_t r = lib().CommInitRankConfig(&comm, size_, id, rank_, &config);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      comm_ = comm;
    }
    if (r != ncclSuccess && r != ncclInProgress) fail_nccl(r, "ncclCommInitRankConfig");
    settle("ncclCommInitRankConfig (waiting for every rank to join)");
  }

  zero_status_t start(void** out_request, const zero_collective_t* c) {
    return guarded([&] { *out_request = start_collective(*c); });
  }

  zero_status_t wait(int32_t* out_done, void* request, double timeout_s) {
    return guarded([&] { *out_done = wait_collective(static_cast<Request*>(request), timeout_s) ? 1 : 0; });
  }

  zero_status_t group_begin() {
    return guarded([&] {
      check_nccl(call([](ncclComm_t) { return lib().GroupStart(); }), "ncclGroupStart");
      ++group_depth_;
    });
  }

  zero_status_t group_end() {
    return guarded([&] {
      --group_depth_;
      check_nccl(call([](ncclComm_t) { return lib().GroupEnd(); }), "ncclGroupEnd");
      if (group_depth_ == 0) {
        std::vector<Request*> deferred;
        deferred.swap(deferred_);
        for (Request* r : deferred) queue_tail(*r);
      }
    });
  }

  // Any thread. Waits fail at once (the flag); ncclCommAbort itself runs once the call in progress on the
  // communicator, if any, returns (each is non-blocking), and may take a moment: it joins NCCL's proxy threads, and
  // the collectives it ends let their events fire, which the waits then report as aborted, not done.
  void abort(const char* reason) {
    {
      std::lock_guard<std::mutex> lock(reason_mutex_);
      if (abort_reason_.empty()) abort_reason_ = reason != nullptr && reason[0] != '\0' ? reason : "aborted";
    }
    aborted_.store(true);
    std::lock_guard<std::mutex> lock(mutex_);
    if (comm_ == nullptr) return;
    DeviceScope scope(device_);
    lib().CommAbort(comm_);
    comm_ = nullptr;
  }

  zero_status_t finalize() {
    return guarded([&] {
      check_nccl(call([](ncclComm_t comm) { return lib().CommFinalize(comm); }), "ncclCommFinalize");
      settle("ncclCommFinalize");
      std::lock_guard<std::mutex> lock(mutex_);
      if (comm_ != nullptr) lib().CommDestroy(comm_);
      comm_ = nullptr;
    });
  }

  const char* error_message() const { return error_.c_str(); }

 private:
  static const Library& lib() { return library(); }

  template <typename Fn>
  zero_status_t guarded(Fn&& fn) {
    try {
      DeviceScope scope(device_);
      fn();
      return ZERO_OK;
    } catch (const Failure& f) {
      error_ = f.text;
      return f.status;
    } catch (const std::bad_alloc&) {
      error_ = "out of host memory";
      return ZERO_ERR_OUT_OF_MEMORY;
    } catch (const std::exception& e) {
      error_ = e.what();
      return ZERO_ERR_COMM;
    }
  }

  Failure aborted_failure() const {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    return Failure{ZERO_ERR_ABORTED, "the NCCL communicator was aborted on this rank" +
                                         (abort_reason_.empty() ? std::string() : " (" + abort_reason_ + ")")};
  }

  // One NCCL call on the communicator, under the lock: an abort from another thread frees it.
  template <typename Fn>
  ncclResult_t call(Fn&& fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (comm_ == nullptr || aborted_.load()) throw aborted_failure();
    return fn(comm_);
  }

  [[noreturn]] void fail_nccl(ncclResult_t r, const std::string& what) {
    std::string text = what + ": " + lib().GetErrorString(r);
    const char* last = lib().GetLastError(nullptr);
    if (last != nullptr && last[0] != '\0') text += std::string(" (") + last + ")";
    throw Failure{ZERO_ERR_COMM, text};
  }

  // A non-blocking communicator's call may return before NCCL has taken it (ncclInProgress): it must settle before
  // the next one. Bounded by the timeout, so a peer that never joins cannot hold this rank.
  void settle(const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = call([&](ncclComm_t comm) { return lib().CommGetAsyncError(comm, &state); });
      if (r != ncclSuccess) fail_nccl(r, what);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail_nccl(state, what);
      if (std::chrono::steady_clock::now() > deadline) {
        abort("timed out");
        throw Failure{ZERO_ERR_TIMEOUT, what + " did not complete within " + std::to_string(timeout_s_) + " s"};
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  void check_nccl(ncclResult_t r, const std::string& what) {
    if (r == ncclSuccess) return;
    if (r == ncclInProgress) return settle(what);
    fail_nccl(r, what);
  }

  cudaEvent_t take_event() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return e;
  }

  // NCCL's reduce-scatter adds in its algorithm's order; a rank-order sum is needed wherever that could differ from
  // 0 + 1 + ... in the last bit.
  bool needs_rank_order(const zero_collective_t& c) const {
    const bool any_order = c.struct_size > offsetof(zero_collective_t, flags) && (c.flags & ZERO_COLL_ANY_ORDER) != 0;
    if (any_order || size_ == 1) return false;
    return !(c.dtype == ZERO_DTYPE_FP32 && size_ == 2);
  }

  Request* start_collective(const zero_collective_t& c) {
    if (aborted_.load()) throw aborted_failure();
    const size_t elem = element_bytes(c.dtype);
    if (elem == 0) throw Failure{ZERO_ERR_UNSUPPORTED, "dtype " + std::to_string(c.dtype) + " is not one NCCL carries"};
    const bool has_stream = c.struct_size > offsetof(zero_collective_t, stream);
    const auto producer = static_cast<cudaStream_t>(has_stream ? c.stream : nullptr);
    if (producer == nullptr)
      throw Failure{ZERO_ERR_UNSUPPORTED, std::string(c.label != nullptr ? c.label : "a collective") +
                                              ": no stream: the NCCL communicator carries a device engine's data "
                                              "(host memory goes over the control communicator)"};
    auto request = std::make_unique<Request>(producer, stream_);
    // After the work that produced the input; the engine's stream is not held meanwhile.
    cudaEvent_t produced = take_event();
    check_cuda(cudaEventRecord(produced, producer), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, produced, 0), "cudaStreamWaitEvent");
    free_events_.push_back(produced);  // re-recording later is fine: the wait above keeps this point
    char* buf = static_cast<char*>(c.buf);
    const size_t n = static_cast<size_t>(c.count);
    const ncclDataType_t type = nccl_type(c.dtype);
    switch (c.kind) {
      case ZERO_COLL_ALL_GATHER:
        check_nccl(call([&](ncclComm_t comm) {
                     return lib().AllGather(buf + static_cast<size_t>(rank_) * n * elem, buf, n, type, comm, stream_);
                   }),
                   "ncclAllGather");
        break;
      case ZERO_COLL_REDUCE_SCATTER:
        if (needs_rank_order(c))
          exchange_blocks(c, *request);
        else
          check_nccl(call([&](ncclComm_t comm) {
                       return lib().ReduceScatter(buf, buf + static_cast<size_t>(rank_) * n * elem, n, type, ncclSum,
                                                  comm, stream_);
                     }),
                     "ncclReduceScatter");
        break;
      case ZERO_COLL_ALL_REDUCE: {
        const ncclRedOp_t op = c.op == ZERO_REDUCE_MIN ? ncclMin : c.op == ZERO_REDUCE_MAX ? ncclMax : ncclSum;
        check_nccl(call([&](ncclComm_t comm) { return lib().AllReduce(buf, buf, n, type, op, comm, stream_); }),
                   "ncclAllReduce");
        break;
      }
      case ZERO_COLL_BROADCAST:
        check_nccl(call([&](ncclComm_t comm) { return lib().Broadcast(buf, buf, n, type, c.root, comm, stream_); }),
                   "ncclBroadcast");
        break;
      default:
        throw Failure{ZERO_ERR_INVALID_ARGUMENT, "unknown collective kind " + std::to_string(c.kind)};
    }
    Request* r = request.release();
    if (group_depth_ > 0)
      deferred_.push_back(r);
    else
      queue_tail(*r);
    return r;
  }

  // Every other rank's block `rank_` into scratch (block r from rank r), this rank's block r to rank r: one group.
  void exchange_blocks(const zero_collective_t& c, Request& request) {
    const size_t elem = element_bytes(c.dtype), n = static_cast<size_t>(c.count), block = n * elem;
    char* buf = static_cast<char*>(c.buf);
    void* received = nullptr;
    check_cuda(cudaMallocAsync(&received, block * static_cast<size_t>(size_), stream_),
               "the deterministic reduce-scatter's receive buffer");
    request.received = received;  // freed with the request if anything below fails
    const ncclDataType_t type = nccl_type(c.dtype);
    // A failure between GroupStart and GroupEnd must still close the group: this thread's later NCCL calls would
    // otherwise all be deferred into it.
    struct OpenGroup {
      bool open = false;
      ~OpenGroup() {
        if (open) lib().GroupEnd();
      }
    } group;
    check_nccl(call([](ncclComm_t) { return lib().GroupStart(); }), "ncclGroupStart");
    group.open = true;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      const size_t at = static_cast<size_t>(peer) * block;
      check_nccl(call([&](ncclComm_t comm) { return lib().Send(buf + at, n, type, peer, comm, stream_); }), "ncclSend");
      check_nccl(call([&](ncclComm_t comm) {
                   return lib().Recv(static_cast<char*>(received) + at, n, type, peer, comm, stream_);
                 }),
                 "ncclRecv");
    }
    group.open = false;
    check_nccl(call([](ncclComm_t) { return lib().GroupEnd(); }), "ncclGroupEnd");
    request.sum_pending = true;
    request.sum_type = c.dtype == ZERO_DTYPE_BF16   ? SumType::kBF16
                       : c.dtype == ZERO_DTYPE_FP16 ? SumType::kF16
                                                    : SumType::kF32;
    request.own = buf + static_cast<size_t>(rank_) * block;
    request.count = n;
  }

  // What follows the collective on the module's stream: the deterministic sum, then the event the waits poll.
  void queue_tail(Request& r) {
    if (r.sum_pending) {
      check_cuda(sum_received_in_rank_order(r.sum_type, r.own, r.received, r.count, size_, rank_, stream_),
                 "the rank-order sum");
      check_cuda(cudaFreeAsync(r.received, stream_), "cudaFreeAsync");
      r.received = nullptr;
      r.sum_pending = false;
    }
    r.done = take_event();
    check_cuda(cudaEventRecord(r.done, stream_), "cudaEventRecord");
    r.tail_queued = true;
  }

  // Done, still running (false), or failed (throws). The request is gone unless it is still running.
  bool wait_collective(Request* request, double timeout_s) {
    // Still in its open group (its tail not queued): the group owns it until group_end.
    if (!request->tail_queued) throw Failure{ZERO_ERR_INVALID_STATE, "a collective was waited for inside its group"};
    std::unique_ptr<Request> r(request);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    auto pause = std::chrono::microseconds(2);
    for (;;) {
      // An abort ends NCCL's kernels early and lets the event fire: never report that as done.
      if (aborted_.load()) throw aborted_failure();
      const cudaError_t e = cudaEventQuery(r->done);
      if (e == cudaSuccess) {
        if (aborted_.load()) throw aborted_failure();
        break;
      }
      if (e != cudaErrorNotReady) check_cuda(e, "the collective on the device");
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = call([&](ncclComm_t comm) { return lib().CommGetAsyncError(comm, &state); });
      if (q != ncclSuccess || (state != ncclSuccess && state != ncclInProgress))
        fail_nccl(q != ncclSuccess ? q : state, "the collective");
      if (std::chrono::steady_clock::now() >= deadline) {
        r.release();  // still in flight: libzero waits again, or gives it up and keeps its buffer
        return false;
      }
      std::this_thread::sleep_for(pause);
      if (pause < std::chrono::microseconds(500)) pause *= 2;
    }
    // The engine's stream uses the result after the collective, in stream order.
    const cudaError_t ordered = cudaStreamWaitEvent(r->consumer, r->done, 0);
    free_events_.push_back(r->done);
    check_cuda(ordered, "cudaStreamWaitEvent");
    return true;
  }

  const int rank_, size_, device_;
  double timeout_s_ = 600.0;
  mutable std::mutex mutex_;  // comm_ and every call on it: abort() may come from another thread
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};
  mutable std::mutex reason_mutex_;
  std::string abort_reason_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> free_events_;
  int group_depth_ = 0;
  std::vector<Request*> deferred_;
  std::string error_;
};

Backend* backend(void* user_data) { return static_cast<Backend*>(user_data); }

zero_status_t op_start(void** out_request, void* user_data, const zero_collective_t* coll) {
  return backend(user_data)->start(out_request, coll);
}
zero_status_t op_wait(int32_t* out_done, void* user_data, void* request, double timeout_s) {
  return backend(user_data)->wait(out_done, request, timeout_s);
}
zero_status_t op_group_begin(void* user_data) { return backend(user_data)->group_begin(); }
zero_status_t op_group_end(void* user_data) { return backend(user_data)->group_end(); }
const char* op_error_message(void* user_data) { return backend(user_data)->error_message(); }
void op_abort(void* user_data, const char* reason) { backend(user_data)->abort(reason); }
zero_status_t op_finalize(void* user_data) { return backend(user_data)->finalize(); }
void op_destroy(void* user_data) { delete backend(user_data); }

void write_error(char* out, size_t capacity, const std::string& text) {
  if (out != nullptr && capacity > 0) std::snprintf(out, capacity, "%s", text.c_str());
}

// Loads NCCL and checks the device; the first failure as (status, text).
zero_status_t check_ready(int device, int32_t* out_version, char* error_text, size_t capacity) {
  try {
    const Library& lib = library();
    int version = 0;
    if (lib.GetVersion(&version) != ncclSuccess) version = 0;
    if (out_version != nullptr) *out_version = version;
  } catch (const std::exception& e) {
    write_error(error_text, capacity, e.what());
    return ZERO_ERR_UNSUPPORTED;
  }
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) {
    write_error(error_text, capacity, std::string("no CUDA device: ") + cudaGetErrorString(e));
    return ZERO_ERR_UNSUPPORTED;
  }
  if (device < 0 || device >= devices) {
    write_error(error_text, capacity,
                "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(devices) + " visible)");
    return ZERO_ERR_INVALID_ARGUMENT;
  }
  return ZERO_OK;
}

}  // namespace
}  // namespace nccl
}  // namespace zero

extern "C" {

ZERO_API zero_status_t zero_nccl_backend_prepare(int32_t* out_version, void* out_unique_id, int32_t device,
                                                 char* error_text, size_t capacity) {
  using namespace zero::nccl;
  const zero_status_t ready = check_ready(device, out_version, error_text, capacity);
  if (ready != ZERO_OK || out_unique_id == nullptr) return ready;
  ncclUniqueId id;
  const ncclResult_t r = library().GetUniqueId(&id);
  if (r != ncclSuccess) {
    write_error(error_text, capacity, std::string("ncclGetUniqueId: ") + library().GetErrorString(r));
    return ZERO_ERR_COMM;
  }
  static_assert(sizeof id == ZERO_NCCL_UNIQUE_ID_BYTES, "ncclUniqueId's size");
  std::memcpy(out_unique_id, &id, sizeof id);
  return ZERO_OK;
}

ZERO_API zero_status_t zero_nccl_backend_open(zero_comm_ops_t* out_ops, void** out_user_data, int32_t rank,
                                              int32_t size, int32_t device, const void* unique_id, double timeout_s,
                                              char* error_text, size_t capacity) {
  using namespace zero::nccl;
  if (out_ops == nullptr || out_user_data == nullptr || unique_id == nullptr || size < 1 || rank < 0 || rank >= size ||
      !(timeout_s > 0)) {
    write_error(error_text, capacity, "zero_nccl_backend_open: bad arguments");
    return ZERO_ERR_INVALID_ARGUMENT;
  }
  if (out_ops->struct_size < offsetof(zero_comm_ops_t, group_begin) + 2 * sizeof(void*)) {
    write_error(error_text, capacity, "zero_nccl_backend_open: libzero's zero_comm_ops_t is older than the module's");
    return ZERO_ERR_UNSUPPORTED;
  }
  const zero_status_t ready = check_ready(device, nullptr, error_text, capacity);
  if (ready != ZERO_OK) return ready;
  auto* b = new (std::nothrow) Backend(rank, size, device);
  if (b == nullptr) return ZERO_ERR_OUT_OF_MEMORY;
  try {
    ncclUniqueId id;
    std::memcpy(&id, unique_id, sizeof id);
    b->open(id, timeout_s);
  } catch (const Failure& f) {
    write_error(error_text, capacity, f.text);
    delete b;
    return f.status;
  } catch (const std::exception& e) {
    write_error(error_text, capacity, e.what());
    delete b;
    return ZERO_ERR_COMM;
  }
  const size_t struct_size = out_ops->struct_size < sizeof *out_ops ? out_ops->struct_size : sizeof *out_ops;
  std::memset(static_cast<void*>(out_ops), 0, struct_size);
  out_ops->struct_size = struct_size;
  out_ops->rank = rank;
  out_ops->size = size;
  out_ops->local_size = 0;
  out_ops->flags = ZERO_COMM_DETERMINISTIC | ZERO_COMM_DEVICE_BUFFERS;
  out_ops->start = op_start;
  out_ops->wait = op_wait;
  out_ops->error_message = op_error_message;
  out_ops->abort = op_abort;
  out_ops->finalize = op_finalize;
  out_ops->destroy = op_destroy;
  out_ops->group_begin = op_group_begin;
  out_ops->group_end = op_group_end;
  *out_user_data = b;
  return ZERO_OK;
}

}  // extern "C"
