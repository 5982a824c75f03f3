#include "dlpack.hpp"

#define ZERO_EXPERIMENTAL_API
#include <zero/zero.h>

#include <stdexcept>

namespace py = pybind11;

namespace zero_py {
namespace {

constexpr const char* kName = "dltensor";
constexpr const char* kVersionedName = "dltensor_versioned";

// What a capsule owns: the tensor (in one of the two layouts), its shape, and a reference to the array whose
// memory it describes.
struct Export {
  DLManagedTensor managed{};
  DLManagedTensorVersioned versioned{};
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements
  PyObject* array = nullptr;
};

void release(Export* ex) {
  if (Py_IsInitialized()) {
    const PyGILState_STATE gil = PyGILState_Ensure();
    Py_XDECREF(ex->array);
    PyGILState_Release(gil);
  }
  delete ex;
}

// Called by the consumer when it is done with the memory, from any thread, with or without the GIL.
void delete_managed(DLManagedTensor* self) { release(static_cast<Export*>(self->manager_ctx)); }
void delete_versioned(DLManagedTensorVersioned* self) { release(static_cast<Export*>(self->manager_ctx)); }

// A capsule nobody consumed (still under its first name) frees its tensor; a consumed one was renamed
// "used_..." and belongs to the consumer.
void delete_capsule(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, kName) != 0) {
    auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kName));
    if (t != nullptr && t->deleter != nullptr) t->deleter(t);
  } else if (PyCapsule_IsValid(capsule, kVersionedName) != 0) {
    auto* t = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, kVersionedName));
    if (t != nullptr && t->deleter != nullptr) t->deleter(t);
  }
}

DLDataType dl_type(int32_t zero_dtype) {
  switch (zero_dtype) {
    case ZERO_DTYPE_FP32:
      return {2, 32, 1};
    case ZERO_DTYPE_BF16:
      return {4, 16, 1};
    case ZERO_DTYPE_FP16:
      return {2, 16, 1};
    case ZERO_DTYPE_FP64:
      return {2, 64, 1};
    case ZERO_DTYPE_INT64:
      return {0, 64, 1};
    case ZERO_DTYPE_UINT8:
    case ZERO_DTYPE_BYTES:
      return {1, 8, 1};
    case ZERO_DTYPE_INT8:
      return {0, 8, 1};
    default:
      throw std::invalid_argument("to_dlpack: unknown zero dtype " + std::to_string(zero_dtype));
  }
}

// `ex` carries the shape and strides; the capsule takes it over.
py::capsule export_tensor(Export* ex, void* data, DLDevice device, DLDataType type, bool versioned) {
  DLTensor& t = versioned ? ex->versioned.dl_tensor : ex->managed.dl_tensor;
  t.data = data;
  t.device = device;
  t.ndim = static_cast<int32_t>(ex->shape.size());
  t.dtype = type;
  t.shape = ex->shape.data();
  t.strides = ex->strides.data();
  t.byte_offset = 0;
  void* tensor = nullptr;
  if (versioned) {
    ex->versioned.version = {1, 0};
    ex->versioned.manager_ctx = ex;
    ex->versioned.deleter = delete_versioned;
    ex->versioned.flags = 0;
    tensor = &ex->versioned;
  } else {
    ex->managed.manager_ctx = ex;
    ex->managed.deleter = delete_managed;
    tensor = &ex->managed;
  }
  PyObject* capsule = PyCapsule_New(tensor, versioned ? kVersionedName : kName, delete_capsule);
  if (capsule == nullptr) {
    release(ex);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

}  // namespace

py::capsule to_dlpack(const py::array& array, int32_t zero_dtype, bool versioned) {
  const DLDataType type = dl_type(zero_dtype);
  // The item size as numpy reports it (pybind11 before 2.12 reads it from numpy 1's struct layout).
  const auto itemsize = array.attr("itemsize").cast<py::ssize_t>();
  if (static_cast<py::ssize_t>(type.bits / 8) != itemsize)
    throw std::invalid_argument("to_dlpack: the array's items are not the size of the zero dtype");
  auto* ex = new Export();
  ex->shape.assign(array.shape(), array.shape() + array.ndim());
  for (py::ssize_t d = 0; d < array.ndim(); ++d) {
    if (array.strides(d) % itemsize != 0) {
      delete ex;
      throw std::invalid_argument("to_dlpack: a stride is not a whole number of elements");
    }
    ex->strides.push_back(array.strides(d) / itemsize);
  }
  ex->array = array.ptr();
  Py_INCREF(ex->array);
  return export_tensor(ex, const_cast<void*>(array.data()), {1, 0}, type, versioned);
}

py::capsule to_dlpack_device(void* data, const std::vector<int64_t>& shape, int32_t zero_dtype, DLDevice device,
                             const py::object& owner, bool versioned) {
  const DLDataType type = dl_type(zero_dtype);
  auto* ex = new Export();
  ex->shape = shape;
  ex->strides.assign(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) ex->strides[d - 1] = ex->strides[d] * shape[d];
  ex->array = owner.ptr();
  Py_INCREF(ex->array);
  return export_tensor(ex, data, device, type, versioned);
}

}  // namespace zero_py
