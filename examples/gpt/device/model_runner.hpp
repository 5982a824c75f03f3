// What the device GPT's trainer asks of a model on a backend, without naming one: CUDA (device/cuda_backend.cu,
// built where the toolkit is) or the CPU (device/host_backend.hpp).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "../structure.hpp"
#include "runner.hpp"

namespace gpt {
namespace device {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // One micro-batch (DeviceRunner::step); tokens and targets are host arrays.
  virtual float step(ParamSource<float>& src, const int* tokens, const int* targets, bool backward) = 0;
  virtual void logits(std::vector<float>& out) = 0;
  virtual size_t activation_bytes() const = 0;
  // Everything the model holds in the backend's memory: activations, backward scratch, widened copies, workspace.
  virtual size_t model_bytes() const = 0;
  // An fp32 copy of a bf16 unit, in the backend's memory: scratch(unit, n) holds n floats, and widen_bf16 fills
  // part of it in the backend's order. Unit 0 has a copy of its own, the blocks share one (a block's copy is read
  // by the launches queued before the next block's widening, on the same stream or in program order).
  virtual float* scratch(int unit, size_t n) = 0;
  virtual void widen_bf16(float* dst, const void* bf16, size_t n) = 0;
  // The stream the model's work is queued on, for zero_engine_set_stream (a cudaStream_t; null on the CPU).
  virtual void* stream() = 0;
  virtual std::string describe() const = 0;
};

// A DeviceRunner and its backend as a ModelRunner.
template <class Backend>
class RunnerOn : public ModelRunner {
 public:
  template <class... BackendArgs>
  RunnerOn(const ModelConfig& c, int batch, bool checkpointing, BackendArgs&&... args)
      : backend_(std::forward<BackendArgs>(args)...), runner_(backend_, c, batch, checkpointing) {}
  float step(ParamSource<float>& src, const int* tokens, const int* targets, bool backward) override {
    return runner_.step(src, tokens, targets, backward);
  }
  void logits(std::vector<float>& out) override { runner_.logits(out); }
  size_t activation_bytes() const override { return runner_.activation_bytes(); }
  size_t model_bytes() const override { return backend_.bytes(); }
  float* scratch(int unit, size_t n) override {
    auto& slot = scratch_[unit == 0 ? 0 : 1];
    if (slot.second < n) slot = {backend_.template alloc<float>(n), n};  // blocks are all the same size
    return slot.first;
  }
  void widen_bf16(float* dst, const void* bf16, size_t n) override {
    backend_.each(n, WidenBf16{dst, static_cast<const uint16_t*>(bf16)});
  }
  void* stream() override { return backend_.stream(); }
  std::string describe() const override { return backend_.describe(); }

 private:
  Backend backend_;
  DeviceRunner<Backend, float> runner_;
  std::pair<float*, size_t> scratch_[2] = {{nullptr, 0}, {nullptr, 0}};
};

std::unique_ptr<ModelRunner> make_cpu_runner(const ModelConfig& c, int batch, bool checkpointing);
// Throws std::runtime_error naming the reason where no CUDA device can be used (or the build has no CUDA).
std::unique_ptr<ModelRunner> make_cuda_runner(const ModelConfig& c, int batch, bool checkpointing);
// Whether this process can use a CUDA device; if not, why.
bool cuda_available(std::string* why);

}  // namespace device
}  // namespace gpt
