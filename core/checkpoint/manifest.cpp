#include "checkpoint/manifest.hpp"

#define XXH_INLINE_ALL  // header-only, as in file_io.cpp
#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/file_io.hpp"
#include "numeric/dtype.hpp"
#include "util/error.hpp"

namespace zero {
namespace ckpt {

using json = nlohmann::json;

std::string model_parallel_dir_name(int model_parallel_rank) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "mp_rank_%02d", model_parallel_rank);
  return buffer;
}

std::string shard_file_name(const std::string& kind, int rank, int world_size) {
  char buffer[96];
  std::snprintf(buffer, sizeof buffer, "%s.rank%05d-of-%05d.safetensors", kind.c_str(), rank, world_size);
  return buffer;
}

std::string tag_problem(const std::string& tag) {
  std::string shown;
  size_t control_at = std::string::npos;
  for (size_t i = 0; i < tag.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(tag[i]);
    if (c < 0x20 || c == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      shown += escaped;
      if (control_at == std::string::npos) control_at = i;
    } else {
      shown += tag[i];
    }
  }
  std::string why;
  if (tag.empty())
    why = "it is empty";
  else if (control_at != std::string::npos)
    why = "it contains a control character at byte " + std::to_string(control_at);
  else if (tag.find('/') != std::string::npos)
    why = "it contains '/'";
  else if (tag[0] == '.')
    why = "it starts with '.'";
  else if (tag.front() == ' ' || tag.back() == ' ')
    why = "it starts or ends with a space (the line in 'latest' is read without them)";
  else if (tag == "latest")
    why = "'latest' names the file that points at the newest checkpoint";
  else if (tag.size() > kMaxTagBytes)
    why = "it is " + std::to_string(tag.size()) + " bytes long";
  if (why.empty()) return "";
  return "tag '" + shown + "' is not usable as a checkpoint directory name: " + why + " (a tag is 1 to " +
         std::to_string(kMaxTagBytes) +
         " bytes, without control characters or '/', not starting with '.', not starting or ending with a space, and "
         "not 'latest')";
}

bool Manifest::has_frozen() const {
  for (const auto& p : params)
    if (p.frozen) return true;
  return false;
}

const ManifestFile* Manifest::file(const std::string& kind, int rank) const {
  for (const auto& f : files)
    if (f.kind == kind && f.rank == rank) return &f;
  return nullptr;
}

std::string Manifest::to_json() const {
  json j;
  j["format"] = kFormatName;
  const bool frozen = has_frozen();
  j["format_version"] = frozen ? kFormatVersion : kFormatVersionWithoutFrozen;
  j["library_version"] = library_version;
  j["tag"] = tag;
  j["world_size"] = world_size;
  j["stage"] = stage;
  j["step"] = step;
  j["param_dtype"] = param_dtype;
  j["master_dtype"] = "fp32";
  j["optimizer"] = {{"type", optimizer}, {"state_names", state_names}, {"state_dtype", "fp32"}};
  j["loss_scaler"] = {{"scale", loss_scale},
                      {"hysteresis_left", hysteresis_left},
                      {"iteration", scaler_iteration},
                      {"last_overflow_iteration", scaler_last_overflow}};
  j["groups"] = json::array();
  for (const auto& g : groups)
    j["groups"].push_back({{"name", g.name},
                           {"lr", g.lr},
                           {"weight_decay", g.weight_decay},
                           {"beta1", g.beta1},
                           {"beta2", g.beta2},
                           {"eps", g.eps}});
  if (frozen) j["frozen_params"] = frozen_saved ? "saved" : "excluded";
  if (model_parallel_size > 1) j["model_parallel"] = {{"size", model_parallel_size}, {"rank", model_parallel_rank}};
  j["units"] = json::array();
  for (const auto& u : units) {
    json entry = {{"index", u.index},
                  {"padded_elems", u.padded_elems},
                  {"shard_elems", u.shard_elems},
                  {"global_offset", u.global_offset}};
    if (frozen) {
      entry["frozen_padded_bytes"] = u.frozen_padded_bytes;
      entry["frozen_shard_bytes"] = u.frozen_shard_bytes;
    }
    j["units"].push_back(entry);
  }
  j["params"] = json::array();
  for (const auto& p : params) {
    json entry = {{"name", p.name},
                  {"shape", p.shape},
                  {"dtype", p.frozen ? p.dtype : param_dtype},
                  {"unit", p.unit},
                  {"group", p.group},
                  {"offset_in_unit", p.offset_in_unit},
                  {"numel", p.numel},
                  {"global_offset", p.global_offset}};
    if (p.frozen) {
      entry["frozen"] = true;
      entry["bytes"] = p.bytes;
    }
    j["params"].push_back(entry);
  }
  j["files"] = json::array();
  for (const auto& f : files) {
    json entry = {{"name", f.name}, {"kind", f.kind}, {"rank", f.rank}, {"bytes", f.bytes}, {"xxh64", hex64(f.xxh64)}};
    if (f.rank >= 0) {
      // What this shard holds of each unit, [unit, first, end): elements, or the frozen bytes of a "frozen" file.
      json ranges = json::array();
      for (const auto& u : units) {
        const uint64_t shard = f.kind == "frozen" ? u.frozen_shard_bytes : u.shard_elems;
        if (shard > 0) ranges.push_back({u.index, f.rank * shard, (f.rank + 1) * shard});
      }
      entry["unit_ranges"] = ranges;
    }
    j["files"].push_back(entry);
  }
  j["config"] = config_json;
  return j.dump(1) + "\n";
}

Manifest Manifest::parse(const std::string& text, const std::string& path) {
  Manifest m;
  try {
    json j = json::parse(text);
    if (j.at("format").get<std::string>() != kFormatName) throw std::runtime_error("not a libzero checkpoint");
    m.format_version = j.at("format_version").get<int>();
    if (m.format_version < 1 || m.format_version > kFormatVersion)
      throw std::runtime_error("format_version " + std::to_string(m.format_version) +
                               " is not supported by this library");
    m.library_version = j.at("library_version").get<std::string>();
    m.tag = j.at("tag").get<std::string>();
    m.world_size = j.at("world_size").get<int>();
    m.stage = j.at("stage").get<int>();
    m.step = j.at("step").get<int64_t>();
    m.param_dtype = j.at("param_dtype").get<std::string>();
    m.optimizer = j.at("optimizer").at("type").get<std::string>();
    m.state_names = j.at("optimizer").at("state_names").get<std::vector<std::string>>();
    const json& ls = j.at("loss_scaler");
    m.loss_scale = ls.at("scale").get<double>();
    m.hysteresis_left = ls.at("hysteresis_left").get<int>();
    m.scaler_iteration = ls.at("iteration").get<int64_t>();
    m.scaler_last_overflow = ls.at("last_overflow_iteration").get<int64_t>();
    for (const json& g : j.at("groups"))
      m.groups.push_back({g.at("name").get<std::string>(), g.at("lr").get<double>(), g.at("weight_decay").get<double>(),
                          g.at("beta1").get<double>(), g.at("beta2").get<double>(), g.at("eps").get<double>()});
    for (const json& u : j.at("units")) {
      ManifestUnit unit;
      unit.index = u.at("index").get<int>();
      unit.padded_elems = u.at("padded_elems").get<uint64_t>();
      unit.shard_elems = u.at("shard_elems").get<uint64_t>();
      unit.global_offset = u.at("global_offset").get<uint64_t>();
      unit.frozen_padded_bytes = u.value("frozen_padded_bytes", uint64_t{0});
      unit.frozen_shard_bytes = u.value("frozen_shard_bytes", uint64_t{0});
      m.units.push_back(unit);
    }
    for (const json& p : j.at("params")) {
      ManifestParam param;
      param.name = p.at("name").get<std::string>();
      param.shape = p.at("shape").get<std::vector<int64_t>>();
      param.unit = p.at("unit").get<int>();
      param.group = p.at("group").get<int>();
      param.offset_in_unit = p.at("offset_in_unit").get<uint64_t>();
      param.numel = p.at("numel").get<uint64_t>();
      param.global_offset = p.at("global_offset").get<uint64_t>();
      param.frozen = p.value("frozen", false);
      if (param.frozen) {
        param.dtype = p.at("dtype").get<std::string>();
        param.bytes = p.at("bytes").get<uint64_t>();
      }
      m.params.push_back(param);
    }
    if (m.has_frozen()) {
      if (m.format_version < 3) throw std::runtime_error("frozen params in a format_version below 3");
      const std::string saved = j.at("frozen_params").get<std::string>();
      if (saved != "saved" && saved != "excluded") throw std::runtime_error("frozen_params is '" + saved + "'");
      m.frozen_saved = saved == "saved";
    }
    if (j.contains("model_parallel")) {
      m.model_parallel_size = j.at("model_parallel").at("size").get<int>();
      m.model_parallel_rank = j.at("model_parallel").at("rank").get<int>();
    }
    for (const json& f : j.at("files")) {
      ManifestFile file;
      file.name = f.at("name").get<std::string>();
      file.kind = f.at("kind").get<std::string>();
      file.rank = f.at("rank").get<int>();
      file.bytes = f.at("bytes").get<uint64_t>();
      file.xxh64 = std::stoull(f.at("xxh64").get<std::string>(), nullptr, 16);
      m.files.push_back(file);
    }
    m.config_json = j.at("config").get<std::string>();
    m.validate();
  } catch (const std::exception& e) {
    fail(ZERO_ERR_CHECKPOINT_CORRUPT, "checkpoint manifest '" + path + "' is invalid: " + e.what());
  }
  return m;
}

// Values no save writes are corruption, not settings: a manifest is loaded into a running engine, so a negative
// step, an lr of 1e300 or a zero loss scale must not get that far.
void Manifest::validate() const {
  auto bad = [](const std::string& what) { throw std::runtime_error(what); };
  auto finite_in = [&](double v, double lo, double hi, const std::string& what) {
    if (!(std::isfinite(v) && v >= lo && v < hi)) bad(what + " is " + std::to_string(v));
  };
  if (world_size < 1 || world_size > (1 << 24)) bad("world_size is " + std::to_string(world_size));
  if (model_parallel_size < 1 || model_parallel_size > (1 << 24))
    bad("model_parallel.size is " + std::to_string(model_parallel_size));
  if (model_parallel_rank < 0 || model_parallel_rank >= model_parallel_size)
    bad("model_parallel.rank is " + std::to_string(model_parallel_rank) + " of " + std::to_string(model_parallel_size));
  if (stage < 0 || stage > 3) bad("stage is " + std::to_string(stage));
  if (step < 0) bad("step is " + std::to_string(step));
  if (param_dtype != "fp32" && param_dtype != "bf16" && param_dtype != "fp16") bad("param_dtype is " + param_dtype);
  const size_t states = optimizer == "AdamW" || optimizer == "Adam" ? 2 : optimizer == "SGD" ? state_names.size() : 1;
  if (optimizer != "AdamW" && optimizer != "Adam" && optimizer != "Adagrad" && optimizer != "Lion" &&
      optimizer != "SGD")
    bad("optimizer is " + optimizer);
  if (state_names.size() != states || state_names.size() > (optimizer == "SGD" ? 1u : 2u))
    bad("the optimizer's state_names do not fit it");
  finite_in(loss_scale, 1e-38, 1e38, "loss_scaler.scale");
  if (hysteresis_left < 0) bad("loss_scaler.hysteresis_left is negative");
  if (scaler_iteration < 0 || scaler_last_overflow < -1) bad("loss_scaler's iterations are negative");
  for (const auto& g : groups) {
    finite_in(g.lr, 0, 1e6, "group '" + g.name + "' lr");
    finite_in(g.weight_decay, 0, 1e6, "group '" + g.name + "' weight_decay");
    finite_in(g.beta1, 0, 1, "group '" + g.name + "' beta1");
    finite_in(g.beta2, 0, 1, "group '" + g.name + "' beta2");
    finite_in(g.eps, 0, 1, "group '" + g.name + "' eps");
  }
  if (groups.empty()) bad("there are no groups");
  uint64_t offset = 0;
  const uint64_t most_per_rank = (uint64_t{1} << 56) / static_cast<uint64_t>(world_size);
  for (size_t u = 0; u < units.size(); ++u) {
    const ManifestUnit& mu = units[u];
    if (mu.index != static_cast<int>(u)) bad("unit #" + std::to_string(u) + " has index " + std::to_string(mu.index));
    // A unit of frozen params only has no elements to train (and so no shard of them).
    if ((mu.shard_elems == 0 && mu.frozen_shard_bytes == 0) || mu.shard_elems > most_per_rank ||
        mu.shard_elems * static_cast<uint64_t>(world_size) != mu.padded_elems ||
        mu.frozen_shard_bytes > most_per_rank ||
        mu.frozen_shard_bytes * static_cast<uint64_t>(world_size) != mu.frozen_padded_bytes)
      bad("unit " + std::to_string(u) + "'s shards do not tile it");
    if (mu.global_offset != offset) bad("unit " + std::to_string(u) + "'s global_offset does not follow the units");
    offset += mu.padded_elems;
  }
  for (const auto& p : params) {
    if (p.unit < 0 || p.unit >= static_cast<int>(units.size())) bad("param '" + p.name + "' is in no unit");
    if (p.group < 0 || p.group >= static_cast<int>(groups.size())) bad("param '" + p.name + "' is in no group");
    uint64_t numel = 1;
    for (int64_t d : p.shape) {
      if (d <= 0 || static_cast<uint64_t>(d) > (uint64_t{1} << 56) / numel)
        bad("param '" + p.name + "' has a bad shape");
      numel *= static_cast<uint64_t>(d);
    }
    if (p.frozen) {
      StoredType type;
      if (!stored_from_name(p.dtype, &type)) bad("param '" + p.name + "' has dtype '" + p.dtype + "'");
      const uint64_t space = units[p.unit].frozen_padded_bytes;
      if (numel != p.numel || p.bytes != numel * stored_size(type) || p.offset_in_unit > space ||
          p.bytes > space - p.offset_in_unit)
        bad("param '" + p.name + "' does not fit its unit's frozen bytes");
      continue;
    }
    if (numel != p.numel || p.offset_in_unit > units[p.unit].padded_elems ||
        p.numel > units[p.unit].padded_elems - p.offset_in_unit)
      bad("param '" + p.name + "' does not fit its unit");
  }
  for (const auto& f : files)
    if (f.rank < -1 || f.rank >= world_size || f.name.empty() || f.name.find('/') != std::string::npos)
      bad("file entry '" + f.name + "' is not a file of this checkpoint");
  // Every rank's shard of every kind, once: master and optimizer always, params for all ranks or none.
  std::map<std::string, std::vector<int>> shards;  // kind -> how many files each rank has
  for (const auto& f : files)
    if (f.rank >= 0) {
      auto& count = shards[f.kind];
      count.resize(static_cast<size_t>(world_size), 0);
      count[static_cast<size_t>(f.rank)] += 1;
    }
  const bool frozen_files = has_frozen() && frozen_saved;
  if (!frozen_files && shards.count("frozen") != 0) bad("frozen files, but no frozen params saved");
  for (const char* kind : {"master", "optimizer", "params", "frozen"}) {
    const auto it = shards.find(kind);
    if (it == shards.end()) {
      if (std::string(kind) == "frozen" ? frozen_files : std::string(kind) != "params")
        bad(std::string("no ") + kind + " files");
      continue;
    }
    for (int r = 0; r < world_size; ++r)
      if (it->second[static_cast<size_t>(r)] != 1)
        bad(std::to_string(it->second[static_cast<size_t>(r)]) + " " + kind + " files for rank " + std::to_string(r));
  }
}

void write_manifest(const std::string& dir, const Manifest& m) {
  const std::string text = m.to_json();
  write_text_file_atomically(dir + "/manifest.json", text);
  write_text_file_atomically(dir + "/manifest.json.xxh64", hex64(XXH64(text.data(), text.size(), 0)) + "\n");
}

Manifest read_manifest(const std::string& dir, std::string* text_out) {
  const std::string path = dir + "/manifest.json", sum_path = path + ".xxh64";
  if (!path_exists(path)) fail(ZERO_ERR_CHECKPOINT_CORRUPT, "'" + path + "' does not exist");
  const std::string text = read_text_file(path);
  const bool has_sum = path_exists(sum_path);
  if (has_sum) {
    std::string sum = read_text_file(sum_path);
    while (!sum.empty() && (sum.back() == '\n' || sum.back() == ' ')) sum.pop_back();
    const std::string actual = hex64(XXH64(text.data(), text.size(), 0));
    if (sum != actual)
      fail(ZERO_ERR_CHECKPOINT_CORRUPT, "checkpoint manifest '" + path + "' fails its checksum (xxh64 " + actual +
                                            ", " + sum_path + " says " + sum + ")");
  }
  Manifest m = Manifest::parse(text, path);
  if (!has_sum && m.format_version >= 2)
    fail(ZERO_ERR_CHECKPOINT_CORRUPT, "'" + sum_path + "' is missing (format version 2 requires it)");
  if (text_out != nullptr) *text_out = text;
  return m;
}

}  // namespace ckpt
}  // namespace zero
