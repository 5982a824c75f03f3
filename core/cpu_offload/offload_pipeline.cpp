#include "cpu_offload/offload_pipeline.hpp"

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
  for (const Slot* slots : {grad_slots_, param_slots_})
    for (size_t i = 0; i < 2; ++i) {
      if (slots[i].piece < 0 || slots[i].last == 0) continue;
      try {
        (slots == grad_slots_ ? to_host_ : to_device_).wait(slots[i].last);
      } catch (const Error&) {  // stalled or failed: reported when it happened
      }
    }
}

void OffloadPipeline::begin_micro_step(bool first) {
  finish_gradients();
  first_micro_step_ = first;
  for (int& s : state_) s = kNotReady;
  if (first)
    for (size_t p = 0; p < stepped_.size(); ++p) stepped_[p] = false;
}

void OffloadPipeline::accumulate(size_t slot) {
  Slot& s = grad_slots_[slot];
  to_host_.wait(s.last);
  const char* src = static_cast<const char*>(buffers_.grad_slots[slot]);
  const auto add = first_micro_step_ ? ops_.accumulate_into_zero : ops_.accumulate;
  for (const OffloadSegment& seg : pieces_[static_cast<size_t>(s.piece)].segments) {
    add(seg.host_grad, grad_, src, transfer_, seg.args.n);
    src += seg.args.n * dtype_size(transfer_);
  }
  state_[static_cast<size_t>(s.piece)] = kAccumulated;
  s.piece = -1;
}

TransferQueue::Ticket OffloadPipeline::gradients_ready(size_t p) {
  if (p >= pieces_.size() || state_[p] != kNotReady)
    fail(ZERO_ERR_INTERNAL, "offload piece " + std::to_string(p) + " made ready twice in one micro-step");
  const size_t slot = next_grad_slot_;
  if (grad_slots_[slot].piece >= 0) accumulate(slot);  // the older piece in it goes first (may throw: nothing moved)
  next_grad_slot_ = (next_grad_slot_ + 1) % 2;
  char* dst = static_cast<char*>(buffers_.grad_slots[slot]);
  const std::string what = "the gradients of offload piece " + std::to_string(p) + " to the host";
  TransferQueue::Ticket last = 0;
  for (const OffloadSegment& seg : pieces_[p].segments) {
    const size_t bytes = seg.args.n * dtype_size(transfer_);
    if (bytes > 0) last = to_host_.copy(dst, seg.device_grad, bytes, what);
    dst += bytes;
  }
  grad_slots_[slot] = Slot{static_cast<long>(p), last};
  state_[p] = kOnItsWay;
  return last;
}

void OffloadPipeline::finish_gradients() {
  // In the order they were made ready: the slot after the newest holds the older one.
  for (size_t i = 0; i < 2; ++i) {
    const size_t slot = (next_grad_slot_ + i) % 2;
    if (grad_slots_[slot].piece >= 0) accumulate(slot);
  }
}

void OffloadPipeline::step(size_t p, StepKernel kernel, const std::vector<StepScalars>& per_group, int threads) {
  if (p >= pieces_.size() || stepped_[p])
    fail(ZERO_ERR_INTERNAL, "offload piece " + std::to_string(p) + " stepped twice in one step");
  if (state_[p] == kOnItsWay) {
    for (size_t slot = 0; slot < 2; ++slot)
      if (grad_slots_[slot].piece == static_cast<long>(p)) accumulate(slot);
  }
  if (state_[p] != kAccumulated)
    fail(ZERO_ERR_INTERNAL, "offload piece " + std::to_string(p) + " stepped before its gradients were ready");
  for (const OffloadSegment& seg : pieces_[p].segments)
    if (seg.group < 0 || static_cast<size_t>(seg.group) >= per_group.size())
      fail(ZERO_ERR_INTERNAL, "offload segment of group " + std::to_string(seg.group) + " without step scalars");
  const size_t slot = next_param_slot_;
  Slot& ps = param_slots_[slot];
  if (ps.piece >= 0) to_device_.wait(ps.last);  // its new params have left the slot
  next_param_slot_ = (next_param_slot_ + 1) % 2;
  char* out = static_cast<char*>(buffers_.param_slots[slot]);
  const std::string what = "the new params of offload piece " + std::to_string(p) + " to the device";
  TransferQueue::Ticket last = 0;
  for (const OffloadSegment& seg : pieces_[p].segments) {
    KernelArgs a = seg.args;
    a.grad = seg.host_grad;
    a.s = per_group[static_cast<size_t>(seg.group)];
    // 16-bit params on the device are written into the slot; fp32 params are the updated master itself, which
    // stays unchanged until the next step (finish_params comes first), so it goes to the device from where it is.
    const bool staged = seg.device_params != nullptr && compute_ != DType::kF32;
    if (staged) a.copy = out;
    parallel_step(kernel, a, threads);
    const size_t bytes = seg.args.n * dtype_size(compute_);
    if (seg.device_params != nullptr && bytes > 0)
      last = to_device_.copy(seg.device_params, staged ? static_cast<const void*>(out) : a.master, bytes, what);
    // fp32 params in host memory apart from the master (the kernel writes no copy in fp32): copied here.
    if (seg.device_params == nullptr && compute_ == DType::kF32 && seg.args.copy != nullptr && bytes > 0)
      std::memcpy(seg.args.copy, a.master, bytes);
    if (staged) out += bytes;
  }
  ps = Slot{static_cast<long>(p), last};
  stepped_[p] = true;
}

void OffloadPipeline::finish_params() {
  for (Slot& s : param_slots_) {
    if (s.piece >= 0) to_device_.wait(s.last);
    s.piece = -1;
  }
}

}  // namespace zero
