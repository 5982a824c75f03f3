// Which device the CUDA build runs on.
#include <string>

#include "cuda/cuda_check.hpp"
#include "cuda/device_kernels.hpp"

namespace zero {
namespace cuda {

bool device_available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why) *why = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    cudaGetLastError();  // clear it: the runtime keeps the last error per thread
    return false;
  }
  if (count == 0) {
    if (why) *why = "the CUDA runtime reports no device";
    return false;
  }
  return true;
}

std::string device_name() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return prop.name;
}

}  // namespace cuda
}  // namespace zero
