// ZeRO-Offload's pipeline on one rank (docs/architecture.md, "ZeRO-Offload"): a GPU engine reduces the
// gradients on the device; their shards come to host memory piece by piece as the reductions complete, the CPU's
// kernels step the fp32 master and the optimizer state there, and the new params go back to the device. Two
// staging slots each way (the plan's cpu_offload_grad_slots and cpu_offload_param_slots) keep the bus and the CPU busy
// at once: while the CPU adds piece p's gradients into their accumulators or steps piece p, piece p + 1 crosses
// the bus. A piece is one reduction's shard (a bucket's at stages 2-3, a unit's at stage 1); its segments are runs
// of one param group's elements, packed one after another in a slot.
//
// The bits are the non-offloaded step's: the copies move bytes unchanged, the gradients are accumulated with the
// same element operations, and every element is stepped by the same kernel with the same scalars — in whatever
// order the caller makes the pieces ready and steps them.
#pragma once

#include <cstddef>
#include <vector>

#include "cpu_offload/transfer_queue.hpp"
#include "kernels/kernels.hpp"
#include "memory/ops.hpp"
#include "numeric/dtype.hpp"

namespace zero {

struct OffloadSegment {
  const void* device_grad = nullptr;  // the reduced gradients on the device, in the transfer dtype
  void* host_grad = nullptr;          // their accumulator in host memory, in the gradient dtype
  // Where the new params go on the device (compute dtype); null when they live in host memory (offload_param at
  // stage 3: args.copy points at them; with fp32 params the master is copied there) or there is no copy.
  void* device_params = nullptr;
  int group = 0;    // the param group whose StepScalars it is stepped with
  KernelArgs args;  // master, state0/1, n, first_index on the host; grad, copy (with device_params) and s are set here
};

struct OffloadPiece {
  std::vector<OffloadSegment> segments;
  size_t elems() const;
};

struct OffloadBuffers {
  void* grad_slots[2] = {nullptr, nullptr};  // host memory, each at least the largest piece in the transfer dtype
  // host memory, each at least the largest piece in the compute dtype (none with fp32 params: they are sent from
  // the updated master)
  void* param_slots[2] = {nullptr, nullptr};
  size_t grad_slot_bytes = 0, param_slot_bytes = 0;
};

class OffloadPipeline {
 public:
  // `transfer`: the dtype the reduced gradients cross the bus in; `grad`: the accumulators'; `compute`: the params'.
  // Throws ZERO_ERR_INTERNAL when a piece does not fit its slots.
  OffloadPipeline(std::vector<OffloadPiece> pieces, DType transfer, DType grad, DType compute,
                  const OffloadBuffers& buffers, TransferQueue& to_host, TransferQueue& to_device);
  // Waits (each within the queue's timeout) for the copies still in flight, so that none writes a slot or an
  // accumulator after the pipeline is gone; errors were the caller's already.
  ~OffloadPipeline();
  OffloadPipeline(OffloadPipeline&&) = default;

  // A micro-step begins: its gradients are written into the accumulators (first) or added to them.
  void begin_micro_step(bool first);
  // Piece p's reduction has completed on the device: its gradients start for the host, into the next slot (when
  // both are taken, the older piece is waited for and accumulated first). Once per piece per micro-step. Returns
  // the ticket of its last copy on `to_host`: the device's reduced gradients may be overwritten once it is done.
  TransferQueue::Ticket gradients_ready(size_t p);
  // Every piece made ready so far is accumulated (the micro-step's end; the step's norm reads the accumulators).
  void finish_gradients();
  // Steps piece p (accumulating it first if it is still on its way) with `kernel` and each group's scalars; its
  // new params go into the next param slot and from there to the device. Once per piece per step.
  void step(size_t p, StepKernel kernel, const std::vector<StepScalars>& per_group, int threads);
  // Every new param has reached the device (before the device uses them: the all-gather or the next forward).
  void finish_params();

  size_t pieces() const { return pieces_.size(); }

 private:
  struct Slot {
    long piece = -1;                 // the piece in it, -1 when free
    TransferQueue::Ticket last = 0;  // its last copy
  };
  void accumulate(size_t slot);

  std::vector<OffloadPiece> pieces_;
  DType transfer_, grad_, compute_;
  OffloadBuffers buffers_;
  TransferQueue& to_host_;
  TransferQueue& to_device_;
  const ElementOps& ops_;
  bool first_micro_step_ = true;
  Slot grad_slots_[2], param_slots_[2];
  size_t next_grad_slot_ = 0, next_param_slot_ = 0;
  std::vector<int> state_;  // per piece: 0 not ready, 1 on its way (in a slot), 2 accumulated
  std::vector<bool> stepped_;
};

}  // namespace zero
