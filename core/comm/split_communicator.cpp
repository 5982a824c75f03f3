#include "comm/split_communicator.hpp"

#include "util/error.hpp"

namespace zero {
namespace {

class SplitCommunicator final : public Communicator {
 public:
  SplitCommunicator(std::shared_ptr<Communicator> control, std::shared_ptr<Communicator> data, bool owns_data)
      : Communicator(control->rank(), control->size(), control->local_size(), data->deterministic()),
        control_(std::move(control)),
        data_(std::move(data)),
        owns_data_(owns_data) {}

  Communicator& control_side() override { return *control_; }
  Communicator& data_side() override { return *data_; }
  std::shared_ptr<Allocator> shared_allocator() override { return data_->shared_allocator(); }
  bool can_time_out() const override { return control_->capabilities().timeouts && data_->capabilities().timeouts; }
  // Collectives started on the split itself (a model-parallel group's checks, zero_comm_finalize's agreement) are
  // control messages; each side numbers and completes its own.
  bool wait(Request request, double timeout_s) override { return control_->wait(request, timeout_s); }
  std::string diagnose(uint64_t sequence, double grace_s) override { return control_->diagnose(sequence, grace_s); }

 protected:
  Request do_start(const Collective& c) override {
    Collective on_control = c;
    return control_->start(on_control);
  }
  // Both sides, the data side first (a stuck device collective is what an abort most often interrupts); the control
  // side is still told if the data side's abort throws.
  void do_abort(const std::string& reason) override {
    struct AbortControl {
      Communicator& control;
      const std::string& reason;
      ~AbortControl() { control.abort(reason); }
    } control{*control_, reason};
    data_->abort(reason);
  }
  void do_finalize() override {
    if (owns_data_) data_->finalize();
  }
  bool accepts_device_buffers() const override { return data_->capabilities().device_buffers; }

 private:
  std::shared_ptr<Communicator> control_, data_;
  bool owns_data_;
};

}  // namespace

std::shared_ptr<Communicator> make_split_communicator(std::shared_ptr<Communicator> control,
                                                      std::shared_ptr<Communicator> data, bool owns_data,
                                                      const char* call) {
  if (control == nullptr || data == nullptr) fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": a side is NULL");
  if (control.get() == data.get())
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": control and data are the same communicator");
  if (&control->control_side() != control.get() || &data->data_side() != data.get())
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": a side is itself a split communicator");
  if (control->size() != data->size() || control->rank() != data->rank())
    fail(ZERO_ERR_INVALID_ARGUMENT,
         std::string(call) + ": the control communicator is rank " + std::to_string(control->rank()) + " of " +
             std::to_string(control->size()) + " and the data communicator rank " + std::to_string(data->rank()) +
             " of " + std::to_string(data->size()) + " on this rank: both must span the same ranks in the same order");
  if (control->capabilities().device_buffers)
    fail(ZERO_ERR_INVALID_ARGUMENT,
         std::string(call) +
             ": the control communicator takes device buffers; control messages are host memory "
             "(pass a host communicator: MPI, shared memory, a framework's gloo group)");
  if (control->finalized() || data->finalized())
    fail(ZERO_ERR_INVALID_STATE, std::string(call) + ": a side was already finalized (zero_comm_finalize)");
  return std::make_shared<SplitCommunicator>(std::move(control), std::move(data), owns_data);
}

}  // namespace zero
