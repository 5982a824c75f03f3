// The safetensors format, written and read from its specification: an 8-byte little-endian header length N, N
// bytes of JSON (tensor name -> {dtype, shape, data_offsets: [begin, end)} relative to the data section, plus an
// optional "__metadata__" string map), then the raw little-endian data. We pad the header with spaces to a
// multiple of 8 bytes so the data section is aligned, as the specification allows.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/file_io.hpp"
#include "numeric/dtype.hpp"

namespace zero {
namespace ckpt {

const char* safetensors_dtype(DType t);  // "F32", "BF16", "F16"
DType dtype_from_safetensors(const std::string& s, const std::string& context);

struct TensorInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range inside the data section
};

// Writes a header for `tensors` (their byte ranges are assigned in order), then exactly their bytes, in order.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<TensorInfo> tensors,
                    const std::map<std::string, std::string>& metadata);
  void write(const void* data, size_t n_bytes);
  // Checks that every tensor's bytes were written, then fsyncs and closes.
  void finish();
  const FileWriter& file() const { return file_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

 private:
  FileWriter file_;
  std::vector<TensorInfo> tensors_;
  uint64_t data_bytes_ = 0, expected_ = 0;
};

// An open safetensors file: its parsed header, and reads of byte ranges of its tensors.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const TensorInfo& tensor(const std::string& name) const;
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  // Reads bytes [offset, offset + n_bytes) of tensor `name`.
  void read(const std::string& name, uint64_t offset, void* out, size_t n_bytes) const;
  uint64_t header_bytes() const { return data_start_; }

 private:
  void read_header(const std::string& path);
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
};

}  // namespace ckpt
}  // namespace zero
