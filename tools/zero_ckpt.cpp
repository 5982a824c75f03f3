// zero-ckpt: inspect, verify and consolidate libzero checkpoints (docs/checkpoint-format.md), without MPI and
// without the engine. Consolidation streams: it never holds more than one I/O buffer of elements, whatever the
// model or param size.
//
//   zero-ckpt inspect DIR [--tag TAG]
//   zero-ckpt verify DIR [--tag TAG]
//   zero-ckpt consolidate DIR [--tag TAG] --dtype fp32|bf16|fp16 [--skip-frozen] -o OUT.safetensors
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/file_io.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/safetensors.hpp"
#include "numeric/convert.hpp"
#include "util/error.hpp"

namespace {

using namespace zero;

int usage(FILE* out) {
  std::fprintf(out,
               "usage:\n"
               "  zero-ckpt inspect DIR [--tag TAG]       layout, world size, step, sizes; checksums verified\n"
               "  zero-ckpt verify DIR [--tag TAG]        sizes and XXH64 checksums of every file\n"
               "  zero-ckpt consolidate DIR [--tag TAG] --dtype fp32|bf16|fp16 [--skip-frozen] -o OUT.safetensors\n"
               "                                          one safetensors file with every param by name (the\n"
               "                                          trained ones in --dtype, the frozen ones as they are;\n"
               "                                          --skip-frozen: the trained ones only)\n"
               "TAG defaults to the one named in DIR/latest. A checkpoint saved by a job with a model-parallel group\n"
               "holds one part per model-parallel rank (TAG/mp_rank_XX): inspect and verify go through every part,\n"
               "or the one --mp-rank R names; consolidate writes one part's params (--mp-rank R), as the job split\n"
               "them.\n");
  return out == stdout ? 0 : 2;
}

struct Checkpoint {
  std::string path;
  ckpt::Manifest manifest;
};

// The parts of checkpoint `dir`/`tag`, or of the one `dir`/latest names: the tag's directory, or one per
// model-parallel rank (all of them, or the `mp_rank`th); a tag that is no directory name of `dir` (a path out of it, a
// control character) is refused as the engine refuses it.
std::vector<Checkpoint> open_checkpoint(const std::string& dir, std::string tag, int mp_rank) {
  if (tag.empty()) {
    tag = ckpt::read_text_file(dir + "/latest");
    while (!tag.empty() && (tag.back() == '\n' || tag.back() == ' ')) tag.pop_back();
    const std::string problem = ckpt::tag_problem(tag);
    if (!problem.empty()) fail(ZERO_ERR_CHECKPOINT_CORRUPT, "'" + dir + "/latest' names no checkpoint: " + problem);
  }
  const std::string problem = ckpt::tag_problem(tag);
  if (!problem.empty()) fail(ZERO_ERR_INVALID_ARGUMENT, "--tag: " + problem);
  const std::string whole = dir + "/" + tag;
  if (ckpt::path_exists(whole + "/manifest.json") ||
      !ckpt::path_exists(whole + "/" + ckpt::model_parallel_dir_name(0) + "/manifest.json")) {
    if (mp_rank > 0)
      fail(ZERO_ERR_INVALID_ARGUMENT, "--mp-rank " + std::to_string(mp_rank) + ": '" + whole +
                                          "' was saved without a model-parallel group (one part)");
    return {Checkpoint{whole, ckpt::read_manifest(whole)}};
  }
  std::vector<Checkpoint> parts;
  const int size = ckpt::read_manifest(whole + "/" + ckpt::model_parallel_dir_name(0)).model_parallel_size;
  if (mp_rank >= size)
    fail(ZERO_ERR_INVALID_ARGUMENT, "--mp-rank " + std::to_string(mp_rank) + ": '" + whole + "' has " +
                                        std::to_string(size) + " model-parallel parts");
  for (int r = 0; r < size; ++r) {
    if (mp_rank >= 0 && r != mp_rank) continue;
    const std::string path = whole + "/" + ckpt::model_parallel_dir_name(r);
    parts.push_back(Checkpoint{path, ckpt::read_manifest(path)});
    const ckpt::Manifest& m = parts.back().manifest;
    if (m.model_parallel_size != size || m.model_parallel_rank != r)
      fail(ZERO_ERR_CHECKPOINT_CORRUPT, "'" + path + "/manifest.json' is model-parallel rank " +
                                            std::to_string(m.model_parallel_rank) + " of " +
                                            std::to_string(m.model_parallel_size) + ", expected " + std::to_string(r) +
                                            " of " + std::to_string(size));
  }
  return parts;
}

// Returns the number of bad files, printing each.
int verify(const Checkpoint& c, bool quiet) {
  int bad = 0;
  for (const auto& f : c.manifest.files) {
    const std::string path = c.path + "/" + f.name;
    std::string problem;
    if (!ckpt::path_exists(path)) {
      problem = "missing";
    } else {
      ckpt::FileDigest d = ckpt::digest_file(path);
      if (d.bytes != f.bytes)
        problem = std::to_string(d.bytes) + " bytes, manifest says " + std::to_string(f.bytes) + " (truncated?)";
      else if (d.xxh64 != f.xxh64)
        problem = "checksum " + ckpt::hex64(d.xxh64) + ", manifest says " + ckpt::hex64(f.xxh64);
    }
    if (!problem.empty()) {
      std::printf("CORRUPT  %s: %s\n", path.c_str(), problem.c_str());
      ++bad;
    } else if (!quiet) {
      std::printf("ok       %s (%llu bytes, xxh64 %s)\n", f.name.c_str(), static_cast<unsigned long long>(f.bytes),
                  ckpt::hex64(f.xxh64).c_str());
    }
  }
  return bad;
}

int inspect(const Checkpoint& c) {
  const ckpt::Manifest& m = c.manifest;
  uint64_t elements = 0, bytes = 0, frozen_params = 0, frozen_bytes = 0;
  for (const auto& p : m.params) {
    elements += p.numel;
    frozen_params += p.frozen ? 1 : 0;
    frozen_bytes += p.frozen ? p.bytes : 0;
  }
  for (const auto& f : m.files) bytes += f.bytes;
  std::printf("checkpoint  %s\n", c.path.c_str());
  std::printf("tag         %s (libzero %s)\n", m.tag.c_str(), m.library_version.c_str());
  std::printf("saved by    %d ranks at ZeRO stage %d, after step %lld\n", m.world_size, m.stage,
              static_cast<long long>(m.step));
  if (m.model_parallel_size > 1)
    std::printf("part        model-parallel rank %d of %d (its data-parallel group's files)\n", m.model_parallel_rank,
                m.model_parallel_size);
  std::printf("params      %zu tensors, %llu elements, trained in %s (fp32 master)\n", m.params.size(),
              static_cast<unsigned long long>(elements), m.param_dtype.c_str());
  if (frozen_params > 0)
    std::printf("frozen      %llu of them, %llu bytes, %s\n", static_cast<unsigned long long>(frozen_params),
                static_cast<unsigned long long>(frozen_bytes),
                m.frozen_saved ? "saved as they are" : "left out of this checkpoint (exclude_frozen)");
  std::printf("optimizer   %s, state:", m.optimizer.c_str());
  for (const auto& s : m.state_names) std::printf(" %s", s.c_str());
  std::printf("\nloss scale  %g\n", m.loss_scale);
  std::printf("units       %zu\n", m.units.size());
  std::printf("files       %zu, %llu bytes\n", m.files.size(), static_cast<unsigned long long>(bytes));
  std::printf("\n%-40s %-16s %6s %12s %s\n", "param", "shape", "unit", "elements", frozen_params ? " frozen" : "");
  for (const auto& p : m.params) {
    std::string shape = "[";
    for (size_t i = 0; i < p.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(p.shape[i]);
    shape += "]";
    std::printf("%-40s %-16s %6d %12llu %s\n", p.name.c_str(), shape.c_str(), p.unit,
                static_cast<unsigned long long>(p.numel), p.frozen ? (" " + p.dtype).c_str() : "");
  }
  std::printf("\n");
  int bad = verify(c, true);
  if (bad == 0) std::printf("checksums   all %zu files verified\n", m.files.size());
  return bad == 0 ? 0 : 1;
}

int consolidate(const Checkpoint& c, DType dtype, bool skip_frozen, const std::string& out) {
  const ckpt::Manifest& m = c.manifest;
  if (verify(c, true) != 0) {
    std::fprintf(stderr, "zero-ckpt: refusing to consolidate a corrupt checkpoint\n");
    return 1;
  }
  if (m.has_frozen() && !m.frozen_saved && !skip_frozen) {
    std::fprintf(stderr,
                 "zero-ckpt: this checkpoint was saved without its frozen params (exclude_frozen): the "
                 "consolidated file would lack them; pass --skip-frozen to write the trained params only\n");
    return 1;
  }
  std::vector<ckpt::TensorInfo> tensors;
  for (const auto& p : m.params) {
    if (p.frozen) {
      StoredType type = StoredType::kBytes;
      stored_from_name(p.dtype, &type);  // the manifest was validated
      if (!skip_frozen) tensors.push_back({p.name, stored_safetensors_dtype(type), p.shape, 0, p.bytes});
      continue;
    }
    tensors.push_back({p.name, ckpt::safetensors_dtype(dtype), p.shape, 0, p.numel * dtype_size(dtype)});
  }
  ckpt::SafetensorsWriter writer(out + ".tmp", tensors,
                                 {{"format", "pt"}, {"producer", "zero-ckpt"}, {"source", m.tag}});
  // One reader per master shard, opened on first use; one buffer of elements, whatever the param sizes.
  std::map<int, std::unique_ptr<ckpt::SafetensorsReader>> readers, frozen_readers;
  constexpr uint64_t kChunk = uint64_t{1} << 20;
  std::vector<float> in(kChunk);
  std::vector<char> converted(kChunk * 4);
  for (const auto& p : m.params) {
    const ckpt::ManifestUnit& u = m.units[static_cast<size_t>(p.unit)];
    if (p.frozen) {  // its bytes, from whichever frozen shards hold them
      if (skip_frozen) continue;
      for (uint64_t at = p.offset_in_unit, end = p.offset_in_unit + p.bytes; at < end;) {
        const int shard = static_cast<int>(at / u.frozen_shard_bytes);
        const uint64_t shard_end = (static_cast<uint64_t>(shard) + 1) * u.frozen_shard_bytes;
        const uint64_t n = std::min({end, shard_end, at + kChunk * 4}) - at;
        auto& reader = frozen_readers[shard];
        if (!reader) reader = std::make_unique<ckpt::SafetensorsReader>(c.path + "/" + m.file("frozen", shard)->name);
        reader->read("unit." + std::to_string(p.unit), at - shard * u.frozen_shard_bytes, converted.data(), n);
        writer.write(converted.data(), n);
        at += n;
      }
      continue;
    }
    uint64_t at = p.offset_in_unit;
    const uint64_t end = p.offset_in_unit + p.numel;
    while (at < end) {
      const int shard = static_cast<int>(at / u.shard_elems);
      const uint64_t shard_end = (static_cast<uint64_t>(shard) + 1) * u.shard_elems;
      const uint64_t n = std::min({end, shard_end, at + kChunk}) - at;
      auto& reader = readers[shard];
      if (!reader) reader = std::make_unique<ckpt::SafetensorsReader>(c.path + "/" + m.file("master", shard)->name);
      reader->read("unit." + std::to_string(p.unit), (at - shard * u.shard_elems) * 4, in.data(), n * 4);
      round_from_f32(converted.data(), dtype, in.data(), n);
      writer.write(converted.data(), n * dtype_size(dtype));
      at += n;
    }
  }
  writer.finish();
  ckpt::rename_path(out + ".tmp", out);
  std::printf("wrote %s: %zu tensors in %s from %s\n", out.c_str(), tensors.size(), dtype_name(dtype), c.path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage(stderr);
  const std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") return usage(stdout);
  std::string dir, tag, out, dtype_text;
  bool skip_frozen = false;
  int mp_rank = -1;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--skip-frozen") {
      skip_frozen = true;
    } else if (a == "--mp-rank" && i + 1 < argc) {
      char* end = nullptr;
      const long r = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || end == argv[i] || r < 0 || r > (1 << 24)) return usage(stderr);
      mp_rank = static_cast<int>(r);
    } else if (a == "--tag" && i + 1 < argc) {
      tag = argv[++i];
    } else if (a == "--dtype" && i + 1 < argc) {
      dtype_text = argv[++i];
    } else if ((a == "-o" || a == "--output") && i + 1 < argc) {
      out = argv[++i];
    } else if (dir.empty() && a[0] != '-') {
      dir = a;
    } else {
      return usage(stderr);
    }
  }
  if (dir.empty()) return usage(stderr);
  try {
    const std::vector<Checkpoint> parts = open_checkpoint(dir, tag, mp_rank);
    if (command == "inspect") {
      int rc = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        if (i > 0) std::printf("\n");
        rc |= inspect(parts[i]);
      }
      return rc;
    }
    if (command == "verify") {
      int bad = 0;
      size_t files = 0;
      for (const Checkpoint& c : parts) bad += verify(c, false), files += c.manifest.files.size();
      if (bad == 0)
        std::printf("all %zu files verified\n", files);
      else
        std::printf("%d corrupt file(s)\n", bad);
      return bad == 0 ? 0 : 1;
    }
    if (command == "consolidate") {
      if (out.empty() || dtype_text.empty()) return usage(stderr);
      const DType dtype = dtype_text == "fp32"   ? DType::kF32
                          : dtype_text == "bf16" ? DType::kBF16
                          : dtype_text == "fp16" ? DType::kF16
                                                 : static_cast<DType>(-1);
      if (static_cast<int>(dtype) < 0) {
        std::fprintf(stderr, "zero-ckpt: --dtype must be fp32, bf16 or fp16\n");
        return 2;
      }
      if (parts.size() != 1) {
        std::fprintf(stderr,
                     "zero-ckpt: '%s/%s' holds %zu model-parallel parts: consolidate one with --mp-rank R (its params "
                     "as that rank holds them; merging tensor-parallel splits needs the model's split dims)\n",
                     dir.c_str(), tag.empty() ? "<latest>" : tag.c_str(), parts.size());
        return 2;
      }
      return consolidate(parts[0], dtype, skip_frozen, out);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "zero-ckpt: %s: %s\n", status_name(e.status()), e.what());
    return 1;
  }
  return usage(stderr);
}
