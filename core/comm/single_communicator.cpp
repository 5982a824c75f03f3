#include "comm/single_communicator.hpp"

namespace zero {
namespace {

class SingleCommunicator final : public Communicator {
 public:
  SingleCommunicator() : Communicator(0, 1, 1, true) {}
  bool can_time_out() const override { return true; }  // nothing can keep it waiting
  bool wait(Request, double) override { return true; }

 private:
  // With one rank the single block already sits where every collective would put it.
  Request do_start(const Collective&) override { return nullptr; }
};

}  // namespace

std::shared_ptr<Communicator> make_single_communicator() { return std::make_shared<SingleCommunicator>(); }

}  // namespace zero
