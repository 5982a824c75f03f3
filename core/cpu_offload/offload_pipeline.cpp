#include "cpu_offload/offload_pipeline.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "util/error.hpp"

namespace zero {
namespace {

enum PieceState { kNotReady = 0, kOnItsWay = 1, kAccumulated = 2 };

}  // namespace

size_t OffloadPiece::elems() const {
  size_t n = 0;
  for (const OffloadSegment& s : segments) n += s.args.n;
  return n;
}

OffloadPipeline::OffloadPipeline(const OffloadBuffers& buffers, TransferQueue& to_host, TransferQueue& to_device)
    : buffers_(buffers), to_host_(to_host), to_device_(to_device), ops_(element_ops(MemorySpace::kHost)) {}

OffloadPipeline::OffloadPipeline(std::vector<OffloadPiece> pieces, DType transfer, DType grad, DType compute,
                                 const OffloadBuffers& buffers, TransferQueue& to_host, TransferQueue& to_device)
    : pieces_(std::move(pieces)),
      transfer_(transfer),
      grad_(grad),
      compute_(compute),
      buffers_(buffers),
      to_host_(to_host),
      to_device_(to_device),
      ops_(element_ops(MemorySpace::kHost)),
      state_(pieces_.size(), kNotReady),
      stepped_(pieces_.size(), false) {
  for (size_t p = 0; p < pieces_.size(); ++p) {
    size_t staged = 0;  // elements whose new params go through a slot: 16-bit params on the device
    for (const OffloadSegment& seg : pieces_[p].segments)
      staged += seg.device_params != nullptr && compute_ != DType::kF32 ? seg.args.n : 0;
    const size_t n = pieces_[p].elems();
    if (n * dtype_size(transfer_) > buffers_.grad_slot_bytes ||
        staged * dtype_size(compute_) > buffers_.param_slot_bytes)
      fail(ZERO_ERR_INTERNAL, "offload piece " + std::to_string(p) + " (" + std::to_string(n) +
                                  " elements) does not fit the staging slots the plan allocated");
  }
}

OffloadPipeline::~OffloadPipeline() {
  for (size_t i = 0; i < 2; ++i) {
    try {
      if (grad_slots_[i].taken) to_host_.wait(grad_slots_[i].last);
      if (param_slots_[i].last != 0) to_device_.wait(param_slots_[i].last);
    } catch (const Error&) {  // stalled or failed: reported when it happened
    }
  }
}

// ---- The engine's transfers.

void OffloadPipeline::arrive(size_t slot) {
  GradSlot& s = grad_slots_[slot];
  to_host_.wait(s.last);
  to_host_.host_access(buffers_.grad_slots[slot], s.bytes, false);
  Arrived arrived = std::move(s.arrived);
  s = GradSlot{};  // free before `arrived` runs: it may throw, and the slot's copy is done
  if (arrived) arrived(static_cast<const char*>(buffers_.grad_slots[slot]));
}

size_t OffloadPipeline::take_grad_slot() {
  const size_t slot = next_grad_slot_;
  if (grad_slots_[slot].taken) arrive(slot);  // the older transfer in it goes first (may throw: nothing moved)
  next_grad_slot_ = (next_grad_slot_ + 1) % 2;
  return slot;
}

TransferQueue::Ticket OffloadPipeline::stage_gradients(const void* device, size_t bytes, Arrived arrived,
                                                       const std::string& what) {
  if (bytes > buffers_.grad_slot_bytes)
    fail(ZERO_ERR_INTERNAL, what + ": " + std::to_string(bytes) + " bytes do not fit the " +
                                std::to_string(buffers_.grad_slot_bytes) + "-byte gradient slots the plan allocated");
  const size_t slot = take_grad_slot();
  to_host_.after_engine();
  const TransferQueue::Ticket t = bytes > 0 ? to_host_.copy(buffers_.grad_slots[slot], device, bytes, what) : 0;
  grad_slots_[slot] = GradSlot{true, t, bytes, std::move(arrived)};
  return t;
}

void OffloadPipeline::finish_gradients() {
  // In the order they were staged: the slot after the newest holds the older one.
  for (size_t i = 0; i < 2; ++i) {
    const size_t slot = (next_grad_slot_ + i) % 2;
    if (grad_slots_[slot].taken) arrive(slot);
  }
}

void OffloadPipeline::drop_gradients() {
  TransferQueue::Ticket last = 0;  // the later copy: waiting for it waits for both
  for (GradSlot& s : grad_slots_) {
    if (s.taken) last = std::max(last, s.last);
    s = GradSlot{};
  }
  if (last != 0) to_host_.wait(last);
}

void OffloadPipeline::send_params(const Fill& fill, const std::string& what) {
  const size_t slot = next_param_slot_;
  ParamSlot& ps = param_slots_[slot];
  if (ps.last != 0) to_device_.wait(ps.last);  // its earlier params have left the slot
  ps.last = 0;
  next_param_slot_ = (next_param_slot_ + 1) % 2;
  char* out = static_cast<char*>(buffers_.param_slots[slot]);
  if (out != nullptr) to_host_.host_access(out, buffers_.param_slot_bytes, true);
  std::vector<ToDevice> copies;
  fill(out, copies);
  to_device_.after_engine();  // what the engine's work queued so far reads of the old params comes first
  for (const ToDevice& c : copies) {
    if (c.bytes == 0) continue;
    const char* host = static_cast<const char*>(c.host);
    if (out != nullptr && host >= out && host < out + buffers_.param_slot_bytes &&
        host + c.bytes > out + buffers_.param_slot_bytes)
      fail(ZERO_ERR_INTERNAL, what + " overruns its " + std::to_string(buffers_.param_slot_bytes) + "-byte slot");
    ps.last = to_device_.copy(c.device, c.host, c.bytes, what);
  }
}

void OffloadPipeline::finish_params() {
  for (ParamSlot& s : param_slots_) {
    if (s.last != 0) to_device_.wait(s.last);
    s.last = 0;
  }
}

// ---- Whole pieces.

void OffloadPipeline::begin_micro_step(bool first) {
  finish_gradients();
  first_micro_step_ = first;
  for (int& s : state_) s = kNotReady;
  if (first)
    for (size_t p = 0; p < stepped_.size(); ++p) stepped_[p] = false;
}

TransferQueue::Ticket OffloadPipeline::gradients_ready(size_t p) {
  if (p >= pieces_.size() || state_[p] != kNotReady)
    fail(ZERO_ERR_INTERNAL, "offload piece " + std::to_string(p) + " made ready twice in one micro-step");
  const size_t slot = take_grad_slot();
  char* dst = static_cast<char*>(buffers_.grad_slots[slot]);
  const std::string what = "the gradients of offload piece " + std::to_string(p) + " to the host";
  TransferQueue::Ticket last = 0;
  size_t staged = 0;
  to_host_.after_engine();
  for (const OffloadSegment& seg : pieces_[p].segments) {
    const size_t bytes = seg.args.n * dtype_size(transfer_);
    if (bytes > 0) last = to_host_.copy(dst + staged, seg.device_grad, bytes, what);
    staged += bytes;
  }
  const bool first = first_micro_step_;
  grad_slots_[slot] = GradSlot{true, last, staged, [this, p, first](const char* src) {
                                 const auto add = first ? ops_.accumulate_into_zero : ops_.accumulate;
                                 for (const OffloadSegment& seg : pieces_[p].segments) {
                                   add(seg.host_grad, grad_, src, transfer_, seg.args.n);
                                   src += seg.args.n * dtype_size(transfer_);
                                 }
                                 state_[p] = kAccumulated;
                               }};
  state_[p] = kOnItsWay;
  return last;
}

void OffloadPipeline::step(size_t p, StepKernel kernel, const std::vector<StepScalars>& per_group, int threads) {
  if (p >= pieces_.size() || stepped_[p])
    fail(ZERO_ERR_INTERNAL, "offload piece " + std::to_string(p) + " stepped twice in one step");
  if (state_[p] == kOnItsWay) finish_gradients();
  if (state_[p] != kAccumulated)
    fail(ZERO_ERR_INTERNAL, "offload piece " + std::to_string(p) + " stepped before its gradients were ready");
  for (const OffloadSegment& seg : pieces_[p].segments)
    if (seg.group < 0 || static_cast<size_t>(seg.group) >= per_group.size())
      fail(ZERO_ERR_INTERNAL, "offload segment of group " + std::to_string(seg.group) + " without step scalars");
  send_params(
      [&](char* out, std::vector<ToDevice>& copies) {
        for (const OffloadSegment& seg : pieces_[p].segments) {
          KernelArgs a = seg.args;
          a.grad = seg.host_grad;
          a.s = per_group[static_cast<size_t>(seg.group)];
          // 16-bit params on the device are written into the slot; fp32 params are the updated master itself,
          // which stays unchanged until the next step (finish_params comes first), so it goes from where it is.
          const bool staged = seg.device_params != nullptr && compute_ != DType::kF32;
          if (staged) a.copy = out;
          parallel_step(kernel, a, threads);
          const size_t bytes = seg.args.n * dtype_size(compute_);
          if (seg.device_params != nullptr)
            copies.push_back({seg.device_params, staged ? static_cast<const void*>(out) : a.master, bytes});
          // fp32 params in host memory apart from the master (the kernel writes no copy in fp32): copied here.
          if (seg.device_params == nullptr && compute_ == DType::kF32 && seg.args.copy != nullptr && bytes > 0)
            std::memcpy(seg.args.copy, a.master, bytes);
          if (staged) out += bytes;
        }
      },
      "the new params of offload piece " + std::to_string(p) + " to the device");
  stepped_[p] = true;
}

}  // namespace zero
