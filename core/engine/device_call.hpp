// Engine::DeviceCall: how one C API call's device work is ordered with the framework's (engine.cpp, engine_step.cpp).
#pragma once

#include <string>

#include "engine/engine.hpp"

namespace zero {

// A call's device work, ordered after what the framework queued on its stream, and the framework's next work after
// the call's (or the host after it, without a stream from the framework). A call that fails on the way orders the
// framework's stream after what it queued all the same, without a host wait.
class Engine::DeviceCall {
 public:
  explicit DeviceCall(Engine& engine) : engine_(engine) {
    if (!engine_.device_ || !engine_.framework_stream_) return;
    device::Runtime& rt = engine_.device_->runtime();
    rt.record(*engine_.call_begin_, *engine_.framework_stream_);
    rt.wait(engine_.device_->stream(), *engine_.call_begin_);
  }
  ~DeviceCall() {
    if (ended_ || !engine_.device_ || !engine_.framework_stream_) return;
    try {
      order_framework_after();
    } catch (...) {  // the device failed: the error the call throws says so
    }
  }
  void end(const char* call) {
    ended_ = true;
    if (!engine_.device_) return;
    if (engine_.framework_stream_) return order_framework_after();
    engine_.device_->finish(std::string("the device work of ") + call);
  }

 private:
  void order_framework_after() {
    device::Runtime& rt = engine_.device_->runtime();
    rt.record(*engine_.call_end_, engine_.device_->stream());
    rt.wait(*engine_.framework_stream_, *engine_.call_end_);
  }
  Engine& engine_;
  bool ended_ = false;
};

}  // namespace zero
