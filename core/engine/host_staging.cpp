#include "engine/host_staging.hpp"

#include "util/error.hpp"

namespace zero {
namespace device {

PinnedStaging::~PinnedStaging() {
  // A buffer still in use belongs to a collective left in flight (or a copy that stopped): the backend or the
  // device may write or read it yet, so it stays, and so does the runtime that would free it with itself (the
  // emulator frees its pinned memory when it goes), reachable from here for the life of the process.
  bool kept = false;
  for (const Buffer& b : buffers_) {
    if (b.in_use)
      kept = true;
    else
      context_->runtime().release_pinned(b.host);
  }
  if (kept) {
    static std::mutex mutex;
    static auto* const contexts = new std::vector<std::shared_ptr<DeviceContext>>();
    std::lock_guard<std::mutex> lock(mutex);
    contexts->push_back(context_);
  }
}

void* PinnedStaging::acquire(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  // The smallest free buffer that fits; else a new one (a step's collectives come in a few sizes: bucket, unit).
  Buffer* best = nullptr;
  for (Buffer& b : buffers_)
    if (!b.in_use && b.bytes >= bytes && (best == nullptr || b.bytes < best->bytes)) best = &b;
  if (best == nullptr) {
    buffers_.push_back({context_->runtime().allocate_pinned(bytes == 0 ? 1 : bytes), bytes, false});
    best = &buffers_.back();
  }
  best->in_use = true;
  return best->host;
}

void PinnedStaging::give_back(void* host) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Buffer& b : buffers_)
    if (b.host == host) {
      b.in_use = false;
      return;
    }
  fail(ZERO_ERR_INTERNAL, "a staging buffer that was never handed out came back");
}

void PinnedStaging::to_host(void* host, const void* device, size_t bytes, const std::string& what) {
  context_->runtime().copy(host, device, bytes, context_->stream());
  context_->finish(what);
  context_->runtime().host_access(host, bytes, false);  // the backend reads it (the emulator checks the order)
}

void PinnedStaging::to_device(void* device, const void* host, size_t bytes, const std::string& what) {
  context_->runtime().host_access(host, bytes, true);  // the backend wrote it
  context_->runtime().copy(device, host, bytes, context_->stream());
  context_->finish(what);
}

}  // namespace device
}  // namespace zero
