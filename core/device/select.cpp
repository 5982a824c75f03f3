#include "device/select.hpp"

#include <cstdlib>
#include <functional>
#include <mutex>

#include "device/cuda_module.hpp"
#include "device/emulator.hpp"
#include "util/error.hpp"

namespace zero {
namespace device {
namespace {

// Kept while an engine holds it; the next engine after the last one went opens a fresh one.
std::shared_ptr<Runtime> shared(std::weak_ptr<Runtime>& slot, std::mutex& mu,
                                const std::function<std::shared_ptr<Runtime>()>& open) {
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<Runtime> runtime = slot.lock();
  if (!runtime) slot = runtime = open();
  return runtime;
}

}  // namespace

std::shared_ptr<Runtime> runtime_named(const std::string& name) {
  static std::mutex mu;
  static std::weak_ptr<Runtime> cuda, emulator;
  if (name == "cuda") return shared(cuda, mu, [] { return std::shared_ptr<Runtime>(open_cuda_runtime()); });
  if (name == "emulator")
    return shared(emulator, mu, [] {
      EmulatorOptions options;
      if (const char* seed = std::getenv("ZERO_EMULATOR_SEED")) options.seed = std::strtoull(seed, nullptr, 10);
      return std::shared_ptr<Runtime>(make_emulator(options));
    });
  fail(ZERO_ERR_INVALID_ARGUMENT, "no device named '" + name +
                                      "' (\"cuda\": the current CUDA device; \"emulator\": libzero's host emulator, a "
                                      "test tool)");
}

}  // namespace device
}  // namespace zero
