#include "device/transfer_stream.hpp"

#include "util/error.hpp"

namespace zero {
namespace device {

DeviceTransferQueue::DeviceTransferQueue(Runtime& runtime, Stream& engine, const std::string& name, double timeout_s)
    : runtime_(runtime),
      engine_(engine),
      stream_(runtime.create_stream(name)),
      engine_point_(runtime.create_event()),
      timeout_s_(timeout_s) {}

DeviceTransferQueue::~DeviceTransferQueue() {
  if (copies_.empty() || failed()) return;
  try {
    wait(submitted_);
  } catch (const Error&) {  // a copy that stalled or failed was the caller's error already
  }
}

TransferQueue::Ticket DeviceTransferQueue::copy(void* dst, const void* src, size_t bytes, const std::string& what) {
  if (failed()) fail(failure_status_, what + " not started: an earlier copy failed: " + failure_);
  forget_done();
  Copy c{submitted_ + 1, runtime_.create_event(), what};  // before the copy: nothing queued goes untracked
  runtime_.copy(dst, src, bytes, *stream_);
  runtime_.record(*c.done, *stream_);
  copies_.push_back(std::move(c));
  return ++submitted_;
}

const DeviceTransferQueue::Copy* DeviceTransferQueue::find(Ticket t) const {
  if (t == 0 || t > submitted_) {
    if (t == 0) return nullptr;
    fail(ZERO_ERR_INTERNAL, "transfer ticket " + std::to_string(t) + " was never handed out");
  }
  if (copies_.empty() || t < copies_.front().ticket) return nullptr;
  return &copies_[static_cast<size_t>(t - copies_.front().ticket)];
}

// Only beyond a window of recent copies: asking whether a copy is done tells the host it is (the emulator's checker
// then counts it as ordered), so the recent ones are left to the waits and events that order them.
void DeviceTransferQueue::forget_done() {
  constexpr size_t kRecent = 64;
  while (copies_.size() > kRecent && runtime_.done(*copies_.front().done)) copies_.pop_front();
}

bool DeviceTransferQueue::done(Ticket t) {
  const Copy* c = find(t);
  return c == nullptr || runtime_.done(*c->done);
}

void DeviceTransferQueue::wait(Ticket t) {
  const Copy* c = find(t);
  if (c == nullptr) return;
  if (failed()) fail(failure_status_, c->what + " not waited for: an earlier copy failed: " + failure_);
  try {
    runtime_.synchronize(*c->done, timeout_s_, c->what);
  } catch (const Error& e) {
    failure_ = e.what(), failure_status_ = e.status();
    throw;
  }
  while (!copies_.empty() && copies_.front().ticket <= t) copies_.pop_front();  // the host saw them done
}

void DeviceTransferQueue::after_engine() {
  runtime_.record(*engine_point_, engine_);
  runtime_.wait(*stream_, *engine_point_);
}

// A copy already seen done needs no wait: the host saw it complete before it queues what follows.
void DeviceTransferQueue::engine_after(Ticket t) {
  const Copy* c = find(t);
  if (c != nullptr) runtime_.wait(engine_, *c->done);
}

OffloadTransfers::OffloadTransfers(std::shared_ptr<DeviceContext> context, const OffloadBuffers& buffers)
    : context_(std::move(context)),
      to_host_(context_->runtime(), context_->stream(), "ZeRO-Offload: gradients to the host", context_->timeout_s()),
      to_device_(context_->runtime(), context_->stream(), "ZeRO-Offload: params to the device", context_->timeout_s()),
      pipeline_(buffers, to_host_, to_device_) {}

}  // namespace device
}  // namespace zero
