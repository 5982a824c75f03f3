#include "nccl_library.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>

namespace zero {
namespace nccl {
namespace {

template <typename Fn>
void resolve(void* handle, const char* name, Fn& out, std::string& missing) {
  out = reinterpret_cast<Fn>(dlsym(handle, name));
  if (out == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
}

Library load() {
  const char* forced = std::getenv("ZERO_NCCL_LIBRARY");
  const std::string path = forced != nullptr && forced[0] != '\0' ? forced : "libnccl.so.2";
  // Never unloaded: NCCL's proxy threads outlive any one communicator.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error("NCCL could not be loaded (" + path + ": " + (why != nullptr ? why : "not found") +
                             "); install it (pip install nvidia-nccl-cu13, or the distribution's libnccl2) or set "
                             "ZERO_NCCL_LIBRARY to the path of libnccl.so.2");
  }
  Library lib{};
  std::string missing;
  resolve(handle, "ncclGetVersion", lib.GetVersion, missing);
  resolve(handle, "ncclGetUniqueId", lib.GetUniqueId, missing);
  resolve(handle, "ncclCommInitRankConfig", lib.CommInitRankConfig, missing);
  resolve(handle, "ncclCommFinalize", lib.CommFinalize, missing);
  resolve(handle, "ncclCommDestroy", lib.CommDestroy, missing);
  resolve(handle, "ncclCommAbort", lib.CommAbort, missing);
  resolve(handle, "ncclCommGetAsyncError", lib.CommGetAsyncError, missing);
  resolve(handle, "ncclGetErrorString", lib.GetErrorString, missing);
  resolve(handle, "ncclGetLastError", lib.GetLastError, missing);
  resolve(handle, "ncclAllGather", lib.AllGather, missing);
  resolve(handle, "ncclReduceScatter", lib.ReduceScatter, missing);
  resolve(handle, "ncclAllReduce", lib.AllReduce, missing);
  resolve(handle, "ncclBroadcast", lib.Broadcast, missing);
  resolve(handle, "ncclSend", lib.Send, missing);
  resolve(handle, "ncclRecv", lib.Recv, missing);
  resolve(handle, "ncclGroupStart", lib.GroupStart, missing);
  resolve(handle, "ncclGroupEnd", lib.GroupEnd, missing);
  if (!missing.empty())
    throw std::runtime_error(path + " lacks " + missing +
                             ": libzero needs NCCL 2.18 or later (non-blocking "
                             "communicators, ncclCommFinalize, ncclGetLastError)");
  return lib;
}

}  // namespace

const Library& library() {
  static std::mutex mutex;
  static Library* loaded = nullptr;  // kept for the process's life, like the library itself
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded == nullptr) loaded = new Library(load());
  return *loaded;
}

std::string version_text(int version) {
  // NCCL_VERSION(X, Y, Z): X * 10000 + Y * 100 + Z since 2.9 (X * 1000 + Y * 100 + Z before).
  const int major = version >= 10000 ? version / 10000 : version / 1000;
  const int minor = version >= 10000 ? version / 100 % 100 : version / 100 % 10;
  return "NCCL " + std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(version % 100);
}

}  // namespace nccl
}  // namespace zero
