#include "comm/custom_communicator.hpp"

#include <cstddef>
#include <cstring>
#include <vector>

#include "util/error.hpp"
#include "util/struct_io.hpp"

namespace zero {
namespace {

class CustomCommunicator final : public Communicator {
 public:
  CustomCommunicator(const zero_comm_ops_t& ops, void* user_data)
      : Communicator(ops.rank, ops.size, ops.local_size, (ops.flags & ZERO_COMM_DETERMINISTIC) != 0),
        ops_(ops),
        user_data_(user_data) {}

  ~CustomCommunicator() override {
    if (ops_.destroy != nullptr) ops_.destroy(user_data_);
  }

  bool can_time_out() const override { return ops_.start != nullptr; }

  void group_begin() override {
    if (ops_.group_begin != nullptr) check(ops_.group_begin(user_data_), "group_begin");
  }
  void group_end() override {
    if (ops_.group_end != nullptr) check(ops_.group_end(user_data_), "group_end");
  }

  bool wait(Request request, double timeout_s) override {
    Pending* p = static_cast<Pending*>(request);
    int32_t done = 0;
    try {
      check(ops_.wait(&done, user_data_, p->backend_request, timeout_s), "wait");
    } catch (...) {
      pending_.erase(p);  // a failure ends the request
      throw;
    }
    if (done) pending_.erase(p);
    return done != 0;
  }

  std::string diagnose(uint64_t sequence, double grace_s) override {
    if (ops_.diagnose == nullptr) return "";
    std::vector<char> text(8192, '\0');
    if (ops_.diagnose(text.data(), text.size(), user_data_, sequence, grace_s) != ZERO_OK) return "";
    text.back() = '\0';
    return text.data();
  }

 private:
  // What the backend sees of a started collective must outlive start(): the descriptor and its label.
  struct Pending {
    zero_collective_t coll;
    std::string label;
    void* backend_request = nullptr;
  };
  class PendingSet {
   public:
    Pending* add() {
      items_.push_back(std::make_unique<Pending>());
      return items_.back().get();
    }
    void erase(Pending* p) {
      for (size_t i = 0; i < items_.size(); ++i)
        if (items_[i].get() == p) {
          items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(i));
          return;
        }
    }

   private:
    std::vector<std::unique_ptr<Pending>> items_;
  };

  Request do_start(const Collective& c) override {
    zero_collective_t d;
    std::memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.kind = static_cast<int32_t>(c.kind);
    d.dtype = static_cast<int32_t>(c.type);
    d.op = static_cast<int32_t>(c.op);
    d.root = c.root;
    d.buf = c.buf;
    d.count = c.count;
    d.sequence = c.sequence;
    d.stream = accepts_device_buffers() ? c.queue : nullptr;
    d.flags = c.any_order ? static_cast<uint32_t>(ZERO_COLL_ANY_ORDER) : 0u;
    if (ops_.start == nullptr) {
      d.label = c.label.c_str();
      check(ops_.run(user_data_, &d), "run");
      return nullptr;
    }
    Pending* p = pending_.add();
    p->label = c.label;
    p->coll = d;
    p->coll.label = p->label.c_str();
    void* backend_request = nullptr;
    try {
      check(ops_.start(&backend_request, user_data_, &p->coll), "start");
    } catch (...) {
      pending_.erase(p);
      throw;
    }
    if (backend_request == nullptr) {  // the backend finished it at once
      pending_.erase(p);
      return nullptr;
    }
    p->backend_request = backend_request;
    return p;
  }

  void do_abort(const std::string& reason) override {
    if (ops_.abort != nullptr) ops_.abort(user_data_, reason.c_str());
  }

  void do_finalize() override {
    if (ops_.finalize != nullptr) check(ops_.finalize(user_data_), "finalize");
  }

  bool accepts_device_buffers() const override { return (ops_.flags & ZERO_COMM_DEVICE_BUFFERS) != 0; }

  void check(zero_status_t status, const char* what) {
    if (status == ZERO_OK) return;
    const char* message = ops_.error_message != nullptr ? ops_.error_message(user_data_) : nullptr;
    std::string text = message != nullptr && message[0] != '\0'
                           ? std::string(message)
                           : std::string("the communicator's ") + what + " callback returned " + status_name(status);
    if (!(status == ZERO_ERR_REMOTE || status == ZERO_ERR_TIMEOUT || status == ZERO_ERR_ABORTED ||
          status == ZERO_ERR_OUT_OF_MEMORY || status == ZERO_ERR_INVALID_STATE || status == ZERO_ERR_MISMATCH ||
          status == ZERO_ERR_COMM))
      text += std::string(" (the backend returned ") + status_name(status) + ")";
    // A backend may report any status; keep the ones that mean something to the caller.
    fail(status == ZERO_ERR_REMOTE || status == ZERO_ERR_TIMEOUT || status == ZERO_ERR_ABORTED ||
                 status == ZERO_ERR_OUT_OF_MEMORY || status == ZERO_ERR_INVALID_STATE || status == ZERO_ERR_MISMATCH
             ? status
             : ZERO_ERR_COMM,
         text);
  }

  zero_comm_ops_t ops_;
  void* user_data_;
  PendingSet pending_;
};

}  // namespace

std::shared_ptr<Communicator> make_custom_communicator(const zero_comm_ops_t* ops_in, void* user_data) {
  const zero_comm_ops_t ops = read_input_struct(ops_in, offsetof(zero_comm_ops_t, group_begin), zero_comm_ops_t{},
                                                "zero_comm_create_custom", "zero_comm_ops_t", "zero_comm_ops_init");
  const char* call = "zero_comm_create_custom";
  if (ops.size < 1) fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": ops->size must be >= 1");
  if (ops.rank < 0 || ops.rank >= ops.size)
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": ops->rank must be in [0, size)");
  if (ops.local_size < 0 || ops.local_size > ops.size)
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": ops->local_size must be in [0, size]");
  if ((ops.start == nullptr) != (ops.wait == nullptr))
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": ops->start and ops->wait go together (set both or neither)");
  if (ops.run == nullptr && ops.start == nullptr)
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": ops->run is NULL and there is no start/wait pair");
  if ((ops.group_begin == nullptr) != (ops.group_end == nullptr))
    fail(ZERO_ERR_INVALID_ARGUMENT,
         std::string(call) + ": ops->group_begin and ops->group_end go together (set both or neither)");
  if ((ops.flags & ~static_cast<uint32_t>(ZERO_COMM_DETERMINISTIC | ZERO_COMM_DEVICE_BUFFERS)) != 0)
    fail(ZERO_ERR_UNSUPPORTED, std::string(call) + ": ops->flags has bits this version does not know");
  return std::make_shared<CustomCommunicator>(ops, user_data);
}

}  // namespace zero
