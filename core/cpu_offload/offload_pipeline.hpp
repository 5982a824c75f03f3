// ZeRO-Offload's pipeline on one rank (docs/architecture.md, "ZeRO-Offload"): a GPU engine reduces the
// gradients on the device; their shards come to host memory piece by piece as the reductions complete, the CPU's
// kernels step the fp32 master and the optimizer state there, and the new params go back to the device. Two
// staging slots each way (the plan's cpu_offload_grad_slots and cpu_offload_param_slots) keep the bus and the CPU busy
// at once: while the CPU adds piece p's gradients into their accumulators or steps piece p, piece p + 1 crosses
// the bus. The engine's piece is one unit's shard: its reduced gradients (stages 2-3, as each bucket completes;
// stage 1, in zero_step, stepped as they arrive) and its new params. It stages them itself (stage_gradients,
// send_params); whole pieces of segments — runs of one param group's elements, packed one after another in a
// slot — are built on those (gradients_ready, step).
//
// The bits are the non-offloaded step's: the copies move bytes unchanged, the gradients are accumulated with the
// same element operations, and every element is stepped by the same kernel with the same scalars — in whatever
// order the caller makes the pieces ready and steps them.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
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
  // Runs on the host with the slot a staged transfer arrived in, once it is there.
  using Arrived = std::function<void(const char* host)>;
  struct ToDevice {
    void* device;      // where the bytes go
    const void* host;  // in the param slot, or host memory left unchanged until finish_params
    size_t bytes;
  };
  // Writes a piece's new params into `slot` (null when the pipeline has no param slots) and says what goes to the
  // device in `copies`.
  using Fill = std::function<void(char* slot, std::vector<ToDevice>& copies)>;

  // A pipeline for the engine, which stages its own transfers (stage_gradients, send_params).
  OffloadPipeline(const OffloadBuffers& buffers, TransferQueue& to_host, TransferQueue& to_device);
  // A pipeline of whole pieces (begin_micro_step, gradients_ready, step). `transfer`: the dtype the reduced gradients
  // cross the bus in; `grad`: the accumulators'; `compute`: the params'. Throws ZERO_ERR_INTERNAL when a piece does
  // not fit its slots.
  OffloadPipeline(std::vector<OffloadPiece> pieces, DType transfer, DType grad, DType compute,
                  const OffloadBuffers& buffers, TransferQueue& to_host, TransferQueue& to_device);
  // Waits (each within the queue's timeout) for the copies still in flight, so that none writes a slot or an
  // accumulator after the pipeline is gone; errors were the caller's already. Transfers staged and not arrived
  // are dropped.
  ~OffloadPipeline();
  // Transfers in flight hold callbacks into the pipeline: it stays where it was made.
  OffloadPipeline(const OffloadPipeline&) = delete;
  OffloadPipeline& operator=(const OffloadPipeline&) = delete;

  // ---- What the engine drives.
  // `bytes` from device memory (written by the engine's work queued so far) into the next gradient slot; when both
  // are taken, the older transfer is waited for and its `arrived` run first. Returns the copy's ticket: the device
  // memory may be overwritten once reuse_after(ticket) ordered the engine's work after it.
  TransferQueue::Ticket stage_gradients(const void* device, size_t bytes, Arrived arrived, const std::string& what);
  // The engine's work queued from now on comes after copy `t` of stage_gradients.
  void reuse_after(TransferQueue::Ticket t) { to_host_.engine_after(t); }
  // Every transfer staged so far has arrived and its `arrived` has run, in the order they were staged.
  void finish_gradients();
  // Transfers staged and not arrived are waited for and dropped (their `arrived` does not run): after an error.
  void drop_gradients();
  // The next param slot, once its earlier copies are done, is filled by `fill` on the host, and its copies go to
  // the device after the engine's work queued so far (which may still read the old params).
  void send_params(const Fill& fill, const std::string& what);
  // Every new param has reached the device (before the device uses them: the all-gather or the next forward) and
  // the host memory the copies read may change.
  void finish_params();

  // ---- Whole pieces.
  // A micro-step begins: its gradients are written into the accumulators (first) or added to them.
  void begin_micro_step(bool first);
  // Piece p's reduction has completed on the device: its gradients start for the host. Once per piece per
  // micro-step. Returns the ticket of its last copy: the device's reduced gradients may be overwritten once it is done.
  TransferQueue::Ticket gradients_ready(size_t p);
  // Steps piece p (its gradients arrived first if they are still on their way) with `kernel` and each group's
  // scalars; its new params go into the next param slot and from there to the device. Once per piece per step.
  void step(size_t p, StepKernel kernel, const std::vector<StepScalars>& per_group, int threads);

  size_t pieces() const { return pieces_.size(); }
  size_t param_slot_bytes() const { return buffers_.param_slot_bytes; }

 private:
  struct GradSlot {
    bool taken = false;
    TransferQueue::Ticket last = 0;  // its last copy
    size_t bytes = 0;
    Arrived arrived;
  };
  struct ParamSlot {
    TransferQueue::Ticket last = 0;  // its last copy, 0 when none is pending
  };
  size_t take_grad_slot();
  void arrive(size_t slot);

  std::vector<OffloadPiece> pieces_;
  DType transfer_ = DType::kF32, grad_ = DType::kF32, compute_ = DType::kF32;
  OffloadBuffers buffers_;
  TransferQueue& to_host_;
  TransferQueue& to_device_;
  const ElementOps& ops_;
  bool first_micro_step_ = true;
  GradSlot grad_slots_[2];
  ParamSlot param_slots_[2];
  size_t next_grad_slot_ = 0, next_param_slot_ = 0;
  std::vector<int> state_;  // per piece: 0 not ready, 1 on its way (in a slot), 2 accumulated
  std::vector<bool> stepped_;
};

}  // namespace zero
