#include "checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "util/error.hpp"

namespace zero {
namespace ckpt {

using json = nlohmann::json;

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kU8:
      return "U8";
  }
  return "?";
}

DType dtype_from_safetensors(const std::string& s, const std::string& context) {
  if (s == "F32") return DType::kF32;
  if (s == "BF16") return DType::kBF16;
  if (s == "F16") return DType::kF16;
  fail(ZERO_ERR_CHECKPOINT_CORRUPT, context + ": unsupported tensor dtype '" + s + "'");
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<TensorInfo> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : file_(path), tensors_(std::move(tensors)) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (TensorInfo& t : tensors_) {
    const uint64_t size = t.end - t.begin;  // callers give each tensor's byte size as [0, size)
    t.begin = offset;
    t.end = offset + size;
    offset = t.end;
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  expected_ = offset;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  file_.write(length, 8);
  file_.write(text.data(), text.size());
}

void SafetensorsWriter::write(const void* data, size_t n_bytes) {
  file_.write(data, n_bytes);
  data_bytes_ += n_bytes;
}

void SafetensorsWriter::finish() {
  if (data_bytes_ != expected_)
    fail(ZERO_ERR_INTERNAL, "safetensors writer for '" + file_.path() + "': wrote " + std::to_string(data_bytes_) +
                                " data bytes, header promised " + std::to_string(expected_));
  file_.close_and_sync();
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    fail(err == ENOENT ? ZERO_ERR_CHECKPOINT_CORRUPT : ZERO_ERR_IO,
         "cannot open checkpoint file '" + path + "': " + std::strerror(err));
  }
  // A constructor that throws runs no destructor: close the file here, or every corrupt file read leaks a
  // descriptor.
  try {
    read_header(path);
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

void SafetensorsReader::read_header(const std::string& path) {
  struct stat st;
  if (::fstat(fd_, &st) != 0) fail(ZERO_ERR_IO, "cannot stat '" + path + "'");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  auto corrupt = [&](const std::string& why) {
    fail(ZERO_ERR_CHECKPOINT_CORRUPT, "checkpoint file '" + path + "' is not valid safetensors: " + why);
  };
  if (file_size < 8) corrupt("shorter than the 8-byte header length");
  uint8_t length[8];
  read_at(fd_, 0, length, 8, path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length[i];
  if (n > file_size - 8 || n > (uint64_t{100} << 20)) corrupt("header length " + std::to_string(n) + " is too large");
  std::string text(static_cast<size_t>(n), '\0');
  read_at(fd_, 8, &text[0], text.size(), path);
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    corrupt(std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) corrupt("header is not a JSON object");
  data_start_ = 8 + n;
  uint64_t max_end = 0;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const json& t = it.value();
    try {
      TensorInfo info;
      info.name = it.key();
      info.dtype = t.at("dtype").get<std::string>();
      info.shape = t.at("shape").get<std::vector<int64_t>>();
      info.begin = t.at("data_offsets").at(0).get<uint64_t>();
      info.end = t.at("data_offsets").at(1).get<uint64_t>();
      if (info.end < info.begin) corrupt("tensor '" + info.name + "' has a negative size");
      max_end = std::max(max_end, info.end);
      tensors_[info.name] = info;
    } catch (const json::exception& e) {
      corrupt("tensor '" + it.key() + "': " + e.what());
    }
  }
  if (data_start_ + max_end != file_size)
    corrupt("the header describes " + std::to_string(data_start_ + max_end) + " bytes but the file has " +
            std::to_string(file_size));
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo& SafetensorsReader::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    fail(ZERO_ERR_CHECKPOINT_CORRUPT, "checkpoint file '" + path_ + "' has no tensor '" + name + "'");
  return it->second;
}

void SafetensorsReader::read(const std::string& name, uint64_t offset, void* out, size_t n_bytes) const {
  const TensorInfo& t = tensor(name);
  if (offset + n_bytes > t.end - t.begin)
    fail(ZERO_ERR_CHECKPOINT_CORRUPT, "checkpoint file '" + path_ + "': tensor '" + name + "' is too short");
  read_at(fd_, data_start_ + t.begin + offset, out, n_bytes, path_);
}

}  // namespace ckpt
}  // namespace zero
