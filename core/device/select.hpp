// Which device runtime an engine asks for by name (zero_engine_set_device): one runtime of each kind per process,
// shared by its engines, as CUDA's current device is.
#pragma once

#include <memory>
#include <string>

#include "device/runtime.hpp"

namespace zero {
namespace device {

// "cuda": the current CUDA device, through the libzero-cuda.so.1 module. "emulator": libzero's host emulator, a test
// tool that runs the device engine on the CPU and checks its stream ordering (not a device); ZERO_EMULATOR_SEED
// seeds its random delays. Anything else is ZERO_ERR_INVALID_ARGUMENT.
std::shared_ptr<Runtime> runtime_named(const std::string& name);

}  // namespace device
}  // namespace zero
