// The checkpoint manifest (manifest.json): everything needed to read a checkpoint without libzero's code.
// docs/checkpoint-format.md is the specification; this is its one reader and writer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zero {
namespace ckpt {

constexpr const char* kFormatName = "libzero-checkpoint";
// 2: manifest.json has a checksum beside it (manifest.json.xxh64). 3: frozen params (their bytes in "frozen"
// files). A save writes 3 only when it has frozen params, 2 otherwise; versions 1 (libzero 0.2) to 3 load.
constexpr int kFormatVersion = 3;
constexpr int kFormatVersionWithoutFrozen = 2;

struct ManifestUnit {
  int index = 0;
  uint64_t padded_elems = 0, shard_elems = 0, global_offset = 0;
  uint64_t frozen_padded_bytes = 0, frozen_shard_bytes = 0;  // the unit's frozen params' bytes (format 3)
};

struct ManifestParam {
  std::string name;
  std::vector<int64_t> shape;
  int unit = 0, group = 0;
  uint64_t offset_in_unit = 0, numel = 0, global_offset = 0;
  // Format 3: a frozen param is `bytes` bytes of `dtype` elements at byte `offset_in_unit` of its unit's frozen bytes
  // (global_offset is 0: nothing is rounded).
  bool frozen = false;
  std::string dtype;  // a frozen param's ("fp32" ... "bytes"); empty for trained ones (the manifest's param_dtype)
  uint64_t bytes = 0;
};

struct ManifestFile {
  std::string name;  // relative to the checkpoint directory
  std::string kind;  // "master", "optimizer", "params", "frozen" or "consolidated"
  int rank = -1;     // -1 for files that are not one rank's shard
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};

struct ManifestGroup {
  std::string name;
  double lr = 0, weight_decay = 0, beta1 = 0, beta2 = 0, eps = 0;
};

struct Manifest {
  int format_version = kFormatVersion;
  std::string library_version, tag, config_json;
  int world_size = 1, stage = 0;
  int64_t step = 0;
  std::string param_dtype;               // compute dtype of the params: "fp32", "bf16", "fp16"
  std::string optimizer;                 // "AdamW", "Adam", "Adagrad", "Lion", "SGD"
  std::vector<std::string> state_names;  // optimizer state tensors per element
  double loss_scale = 1.0;
  int hysteresis_left = 0;
  int64_t scaler_iteration = 0, scaler_last_overflow = -1;
  std::vector<ManifestGroup> groups;
  std::vector<ManifestUnit> units;
  std::vector<ManifestParam> params;
  std::vector<ManifestFile> files;
  // Format 3 with frozen params: whether their bytes were saved ("frozen" files) or left out (exclude_frozen).
  bool frozen_saved = true;
  // A job with a model-parallel group saves one manifest per model-parallel rank, in TAG/mp_rank_XX; 1 and 0
  // otherwise (and not written then).
  int model_parallel_size = 1, model_parallel_rank = 0;

  bool has_frozen() const;

  std::string to_json() const;
  // Throws ZERO_ERR_CHECKPOINT_CORRUPT naming `path` if the text is not a valid manifest, including values no
  // save would write (a negative step, a zero loss scale, shards that do not tile their units, ...).
  static Manifest parse(const std::string& text, const std::string& path);
  const ManifestFile* file(const std::string& kind, int rank) const;
  void validate() const;  // throws std::runtime_error naming the first impossible value
};

// A tag names a directory (`DIR`/TAG, and `DIR`/.tmp.TAG while it is written) and is the one line of `DIR`/latest:
// 1 to kMaxTagBytes bytes, no control character (bytes 0x00-0x1f, 0x7f), no '/', not starting with '.' (hidden
// names, '.' and '..'), no space at either end (`latest` is read without them), not "latest". Returns what is
// wrong with `tag` (the tag itself printed with its control characters escaped), or "" when it is usable.
constexpr size_t kMaxTagBytes = 250;  // ".tmp." + the tag within a file name's 255 bytes
std::string tag_problem(const std::string& tag);

// File names inside a checkpoint directory.
std::string shard_file_name(const std::string& kind, int rank, int world_size);
// The directory of one model-parallel rank's part inside TAG: "mp_rank_00", "mp_rank_01", ...
std::string model_parallel_dir_name(int model_parallel_rank);

// Writes `dir`/manifest.json and its checksum, `dir`/manifest.json.xxh64 (the XXH64 of manifest.json's bytes, 16
// hex digits and a newline), each durably.
void write_manifest(const std::string& dir, const Manifest& m);
// Reads and checks `dir`/manifest.json: the checksum (required from format version 2 on), then parse(). Also
// returns the text (ranks compare digests of it). Throws ZERO_ERR_CHECKPOINT_CORRUPT.
Manifest read_manifest(const std::string& dir, std::string* text = nullptr);

}  // namespace ckpt
}  // namespace zero
