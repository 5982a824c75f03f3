#include "device/cuda_module.hpp"

#include <string>

#include "util/error.hpp"
#include "util/module_loader.hpp"

namespace zero {
namespace device {
namespace {

// ZERO_CUDA_MODULE (a path), then the SONAME, then next to libzero.so (util/module_loader.hpp).
zero_cuda_runtime_open_fn load_module() {
  static zero_cuda_runtime_open_fn entry = nullptr;
  if (entry != nullptr) return entry;
  std::string tried;
  if (void* symbol = find_module_entry("ZERO_CUDA_MODULE", ZERO_CUDA_MODULE_SONAME, ZERO_CUDA_MODULE_ENTRY,
                                       "libzero's CUDA module", tried)) {
    entry = reinterpret_cast<zero_cuda_runtime_open_fn>(symbol);
    return entry;
  }
  fail(ZERO_ERR_UNSUPPORTED, std::string("libzero's CUDA module could not be loaded; tried:") + tried +
                                 "\nBuild libzero with -DZERO_CUDA=ON (it is built beside libzero.so), or set "
                                 "ZERO_CUDA_MODULE to the path of " ZERO_CUDA_MODULE_SONAME);
}

}  // namespace

std::unique_ptr<Runtime> open_cuda_runtime() {
  zero_cuda_runtime_open_fn open = load_module();
  Runtime* runtime = nullptr;
  char error[1024] = {};
  const zero_status_t status =
      open(&runtime, kRuntimeInterfaceVersion, runtime_interface_layout(), error, sizeof error);
  if (status != ZERO_OK) fail(status, std::string("the CUDA runtime: ") + error);
  return std::unique_ptr<Runtime>(runtime);
}

}  // namespace device
}  // namespace zero
