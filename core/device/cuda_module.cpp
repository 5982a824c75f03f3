#include "device/cuda_module.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "util/error.hpp"

namespace zero {
namespace device {
namespace {

std::string own_directory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&open_cuda_runtime), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// Loaded once and never unloaded (the CUDA runtime it links cannot be unloaded safely either).
zero_cuda_runtime_open_fn load_module() {
  static zero_cuda_runtime_open_fn entry = nullptr;
  if (entry != nullptr) return entry;
  std::vector<std::string> candidates;
  const char* forced = std::getenv("ZERO_CUDA_MODULE");
  if (forced != nullptr && forced[0] != '\0') {
    candidates.push_back(forced);
  } else {
    candidates.push_back(ZERO_CUDA_MODULE_SONAME);
    const std::string dir = own_directory();
    if (!dir.empty()) candidates.push_back(dir + "/" + ZERO_CUDA_MODULE_SONAME);
  }
  std::string tried;
  for (const std::string& c : candidates) {
    void* handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried += "\n  " + c + ": " + (why != nullptr ? why : "not found");
      continue;
    }
    void* symbol = dlsym(handle, ZERO_CUDA_MODULE_ENTRY);
    if (symbol == nullptr) {
      tried += "\n  " + c + ": has no " + ZERO_CUDA_MODULE_ENTRY + " (not libzero's CUDA module?)";
      continue;
    }
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
