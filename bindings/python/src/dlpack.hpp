// DLPack export of host arrays (and of a device engine's memory, to_dlpack_device): the versioned capsule
// ("dltensor_versioned", DLPack 1.0) for consumers that ask for it (max_version >= 1: numpy 2, recent torch), the
// unversioned one ("dltensor") every older consumer accepts (numpy treats unversioned tensors as read-only). Written
// here because numpy refuses to export dtypes it does not own, and libzero's bf16 buffers are shown as
// ml_dtypes.bfloat16 or uint16: the capsule carries the engine's own element type.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

namespace zero_py {

// The DLPack ABI (dlpack.h, version 0.8: the layout of DLManagedTensor, unchanged since 0.2).
struct DLDevice {
  int32_t device_type;  // 1: kDLCPU, 2: kDLCUDA, 12: kDLExtDev
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // NULL: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
// DLPack 1.0.
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;  // 1: read-only, 2: a copy; neither here
  DLTensor dl_tensor;
};

pybind11::capsule to_dlpack(const pybind11::array& array, int32_t zero_dtype, bool versioned);
// A compact row-major tensor at `data` on `device` (a device engine's memory), kept alive by `owner`.
pybind11::capsule to_dlpack_device(void* data, const std::vector<int64_t>& shape, int32_t zero_dtype, DLDevice device,
                                   const pybind11::object& owner, bool versioned);

}  // namespace zero_py
