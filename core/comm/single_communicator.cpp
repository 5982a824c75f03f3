#include "comm/single_communicator.hpp"

namespace zero {
namespace {

class SingleCommunicator final : public Communicator {
 public:
  SingleCommunicator() : Communicator(0, 1) {}

 public:
  // With one rank the single block already sits where every collective would put it.
  void all_gather_inplace(void*, size_t, ElemType) override {}
  void reduce_scatter_sum_inplace(void*, size_t, ElemType) override {}
  void all_reduce_inplace(void*, size_t, ElemType, ReduceOp) override {}
  void broadcast(void*, size_t, int) override {}
};

}  // namespace

std::shared_ptr<Communicator> make_single_communicator() { return std::make_shared<SingleCommunicator>(); }

}  // namespace zero
