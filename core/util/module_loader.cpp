#include "util/module_loader.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

namespace zero {
namespace {

// The directory this library was loaded from.
std::string own_directory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&find_module_entry), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

}  // namespace

void* find_module_entry(const char* env_var, const char* soname, const char* entry, const char* what,
                        std::string& tried) {
  std::vector<std::string> candidates;
  const char* forced = std::getenv(env_var);
  if (forced != nullptr && forced[0] != '\0') {
    candidates.push_back(forced);
  } else {
    candidates.push_back(soname);
    const std::string dir = own_directory();
    if (!dir.empty()) candidates.push_back(dir + "/" + soname);
  }
  for (const std::string& c : candidates) {
    // Never unloaded: neither MPI nor the CUDA runtime can be unloaded safely.
    void* handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried += "\n  " + c + ": " + (why != nullptr ? why : "not found");
      continue;
    }
    void* symbol = dlsym(handle, entry);
    if (symbol == nullptr) {
      tried += "\n  " + c + ": has no " + entry + " (not " + what + "?)";
      continue;
    }
    return symbol;
  }
  return nullptr;
}

}  // namespace zero
