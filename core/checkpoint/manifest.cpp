#include "checkpoint/manifest.hpp"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "checkpoint/file_io.hpp"
#include "error.hpp"

namespace zero {
namespace ckpt {

using json = nlohmann::json;

std::string shard_file_name(const std::string& kind, int rank, int world_size) {
  char buffer[96];
  std::snprintf(buffer, sizeof buffer, "%s.rank%05d-of-%05d.safetensors", kind.c_str(), rank, world_size);
  return buffer;
}

const ManifestFile* Manifest::file(const std::string& kind, int rank) const {
  for (const auto& f : files)
    if (f.kind == kind && f.rank == rank) return &f;
  return nullptr;
}

std::string Manifest::to_json() const {
  json j;
  j["format"] = kFormatName;
  j["format_version"] = kFormatVersion;
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
  j["units"] = json::array();
  for (const auto& u : units)
    j["units"].push_back({{"index", u.index},
                          {"padded_elems", u.padded_elems},
                          {"shard_elems", u.shard_elems},
                          {"global_offset", u.global_offset}});
  j["params"] = json::array();
  for (const auto& p : params)
    j["params"].push_back({{"name", p.name},
                           {"shape", p.shape},
                           {"dtype", param_dtype},
                           {"unit", p.unit},
                           {"group", p.group},
                           {"offset_in_unit", p.offset_in_unit},
                           {"numel", p.numel},
                           {"global_offset", p.global_offset}});
  j["files"] = json::array();
  for (const auto& f : files) {
    json entry = {{"name", f.name}, {"kind", f.kind}, {"rank", f.rank}, {"bytes", f.bytes}, {"xxh64", hex64(f.xxh64)}};
    if (f.rank >= 0) {
      // The element ranges this shard holds: [unit, first, end) of each unit, end exclusive.
      json ranges = json::array();
      for (const auto& u : units) ranges.push_back({u.index, f.rank * u.shard_elems, (f.rank + 1) * u.shard_elems});
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
    if (j.at("format_version").get<int>() != kFormatVersion)
      throw std::runtime_error("format_version " + std::to_string(j.at("format_version").get<int>()) +
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
    for (const json& u : j.at("units"))
      m.units.push_back({u.at("index").get<int>(), u.at("padded_elems").get<uint64_t>(),
                         u.at("shard_elems").get<uint64_t>(), u.at("global_offset").get<uint64_t>()});
    for (const json& p : j.at("params"))
      m.params.push_back({p.at("name").get<std::string>(), p.at("shape").get<std::vector<int64_t>>(),
                          p.at("unit").get<int>(), p.at("group").get<int>(), p.at("offset_in_unit").get<uint64_t>(),
                          p.at("numel").get<uint64_t>(), p.at("global_offset").get<uint64_t>()});
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
  } catch (const std::exception& e) {
    fail(ZERO_ERR_CHECKPOINT_CORRUPT, "checkpoint manifest '" + path + "' is invalid: " + e.what());
  }
  return m;
}

}  // namespace ckpt
}  // namespace zero
