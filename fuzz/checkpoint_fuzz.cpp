// libFuzzer target: checkpoint loading from hostile bytes. The first input byte picks what the rest replaces:
//   0: the text of a manifest, parsed and validated on its own (ckpt::Manifest::parse);
//   1: a safetensors file, opened on its own (header parsed, every tensor's first bytes read);
//   2: manifest.json of a real checkpoint, its checksum file rewritten to match so that the parser and the load's
//      cross-checks are reached, then zero_load_checkpoint into a fresh engine;
//   3: one of the real checkpoint's safetensors files (the next byte picks which), with its size and XXH64 updated in
//      the manifest and the manifest's checksum rewritten, then zero_load_checkpoint.
// Any input must give ZERO_OK or a clear error (ZERO_ERR_CHECKPOINT_CORRUPT, ...); a crash, a sanitizer report, a
// leak or a hang is a bug. The real checkpoint is saved once, at start-up, by a one-rank engine (bf16 with
// stochastic rounding and Adam, so it has master, optimizer and params files; and frozen params, one beside trained
// ones and one in a unit of its own, so it is format 3 with a frozen file).
#include <unistd.h>
#define XXH_INLINE_ALL  // header-only, as libzero uses it
#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/file_io.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/safetensors.hpp"
#include "util/error.hpp"
#include "zero/zero.h"

namespace {

using json = nlohmann::json;

const char* const kConfig =
    R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "bf16": {"enabled": true, "stochastic_rounding": true},
        "zero_optimization": {"stage": 2}})";

struct Template {
  std::string dir;       // the checkpoint directory (DIR/t)
  std::string root;      // DIR
  std::string manifest;  // manifest.json's original text
  std::string checksum;  // manifest.json.xxh64's original text
  std::vector<std::string> shard_names;
  std::vector<std::string> shard_bytes;
};
Template* g_template = nullptr;
std::string g_scratch;  // mode 1's file

void quiet(void*, int32_t, int32_t, const char*) {}

void must(zero_status_t s, const char* what) {
  if (s != ZERO_OK) {
    std::fprintf(stderr, "fuzz set-up: %s failed: %s\n", what, zero_last_error());
    std::abort();
  }
}

zero_engine_t* make_engine(zero_comm_t* comm) {
  zero_engine_t* e = nullptr;
  must(zero_engine_create(&e, kConfig, comm), "zero_engine_create");
  static const int64_t kShapes[3][2] = {{9, 5}, {3, 1}, {17, 2}};
  for (int p = 0; p < 3; ++p) {
    zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
    const char* names[3] = {"layer.w", "layer.b", "head.w"};
    d.name = names[p];
    d.ndim = 2;
    d.shape = kShapes[p];
    d.unit = p == 2 ? 1 : 0;
    d.dtype = ZERO_DTYPE_BF16;
    int32_t id = -1;
    must(zero_engine_add_param(&id, e, &d), "zero_engine_add_param");
  }
  static const int64_t kFrozenShapes[2][2] = {{11, 1}, {4, 3}};
  static const unsigned char kPacked[11] = {0x0f, 0xf0, 0xa5, 1, 2, 3, 4, 5, 6, 7, 8};
  static const uint16_t kWords[12] = {0x7f81, 0xffc3, 0x3f80, 0, 1, 2, 3, 4, 5, 6, 7, 8};
  for (int q = 0; q < 2; ++q) {
    zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
    d.name = q == 0 ? "layer.packed" : "embed.frozen";
    d.ndim = 2;
    d.shape = kFrozenShapes[q];
    d.unit = q == 0 ? 0 : 2;
    d.dtype = q == 0 ? ZERO_DTYPE_UINT8 : ZERO_DTYPE_BF16;
    d.flags = ZERO_PARAM_FROZEN;
    d.init_data = q == 0 ? static_cast<const void*>(kPacked) : static_cast<const void*>(kWords);
    int32_t id = -1;
    must(zero_engine_add_param(&id, e, &d), "zero_engine_add_param (frozen)");
  }
  must(zero_engine_finalize(e), "zero_engine_finalize");
  return e;
}

std::string read_file(const std::string& path) { return zero::ckpt::read_text_file(path); }

void write_file(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
}

std::string checksum_of(const std::string& text) {
  return zero::ckpt::hex64(XXH64(text.data(), text.size(), 0)) + "\n";
}

Template* make_template() {
  char root[] = "/tmp/libzero-fuzz-ckpt.XXXXXX";
  if (mkdtemp(root) == nullptr) std::abort();
  zero_comm_t* comm = nullptr;
  must(zero_comm_create_single(&comm), "zero_comm_create_single");
  zero_engine_t* e = make_engine(comm);
  zero_engine_info_t info = ZERO_ENGINE_INFO_INIT;
  must(zero_engine_info(&info, e), "zero_engine_info");
  for (int u = 1; u >= 0; --u) {
    must(zero_gather(e, u), "zero_gather");
    for (int p = 0; p < 3; ++p) {
      if ((p == 2 ? 1 : 0) != u) continue;
      void* g = nullptr;
      must(zero_grad_data(&g, e, p), "zero_grad_data");
      static_cast<float*>(g)[0] = 0.5f;
      must(zero_grad_ready(e, p), "zero_grad_ready");
    }
    must(zero_release(e, u), "zero_release");
  }
  must(zero_backward_end(e), "zero_backward_end");
  zero_step_info_t step = ZERO_STEP_INFO_INIT;
  must(zero_step(&step, e), "zero_step");
  must(zero_save_checkpoint(e, root, "t"), "zero_save_checkpoint");
  zero_engine_destroy(e);
  zero_comm_destroy(comm);

  auto* t = new Template;
  t->root = root;
  t->dir = t->root + "/t";
  t->manifest = read_file(t->dir + "/manifest.json");
  t->checksum = read_file(t->dir + "/manifest.json.xxh64");
  const json manifest = json::parse(t->manifest);
  for (const json& f : manifest.at("files")) {
    t->shard_names.push_back(f.at("name").get<std::string>());
    t->shard_bytes.push_back(read_file(t->dir + "/" + t->shard_names.back()));
  }
  g_scratch = t->root + "/scratch.safetensors";
  return t;
}

zero_status_t load_into_fresh_engine() {
  zero_comm_t* comm = nullptr;
  must(zero_comm_create_single(&comm), "zero_comm_create_single");
  zero_engine_t* e = make_engine(comm);
  // OK or a clear error; ZERO_ERR_INTERNAL is an exception libzero did not expect: a bug.
  const zero_status_t status = zero_load_checkpoint(e, g_template->root.c_str(), "t");
  if (status == ZERO_ERR_INTERNAL) {
    std::fprintf(stderr, "ZERO_ERR_INTERNAL: %s\n", zero_last_error());
    __builtin_trap();
  }
  zero_engine_destroy(e);
  zero_comm_destroy(comm);
  return status;
}

void restore() {
  write_file(g_template->dir + "/manifest.json", g_template->manifest);
  write_file(g_template->dir + "/manifest.json.xxh64", g_template->checksum);
  for (size_t i = 0; i < g_template->shard_names.size(); ++i)
    write_file(g_template->dir + "/" + g_template->shard_names[i], g_template->shard_bytes[i]);
}

void remove_template() {
  if (g_template != nullptr) zero::ckpt::remove_tree(g_template->root);
}

// ZERO_FUZZ_WRITE_SEEDS=DIR writes the seed corpus (fuzz/corpus/checkpoint) from the real checkpoint: each file of
// it behind each mode byte that takes it.
void write_seeds(const std::string& dir) {
  const Template& t = *g_template;
  write_file(dir + "/manifest-parse", std::string(1, '\0') + t.manifest);
  write_file(dir + "/manifest-load", std::string(1, '\2') + t.manifest);
  for (size_t k = 0; k < t.shard_names.size(); ++k) {
    const std::string kind = t.shard_names[k].substr(0, t.shard_names[k].find('.'));
    write_file(dir + "/" + kind + "-parse", std::string(1, '\1') + t.shard_bytes[k]);
    write_file(dir + "/" + kind + "-load",
               std::string(1, '\3') + std::string(1, static_cast<char>(k)) + t.shard_bytes[k]);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zero_set_log_callback(quiet, nullptr, ZERO_LOG_DEBUG);
  g_template = make_template();
  std::atexit(remove_template);
  // The harness itself: the untouched checkpoint loads (so inputs that break it are seen as such).
  must(load_into_fresh_engine(), "zero_load_checkpoint of the untouched checkpoint");
  if (const char* seeds = std::getenv("ZERO_FUZZ_WRITE_SEEDS")) write_seeds(seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 4;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (mode) {
    case 0:
      try {
        zero::ckpt::Manifest::parse(rest, "fuzz/manifest.json");
      } catch (const zero::Error& e) {
        if (e.status() == ZERO_ERR_INTERNAL) __builtin_trap();
      }
      break;
    case 1:
      write_file(g_scratch, rest);
      try {
        zero::ckpt::SafetensorsReader reader(g_scratch);
        for (const auto& [name, t] : reader.tensors()) {
          char buf[64];
          const uint64_t n = t.end - t.begin < sizeof buf ? t.end - t.begin : sizeof buf;
          reader.read(name, 0, buf, n);
        }
      } catch (const zero::Error& e) {
        if (e.status() == ZERO_ERR_INTERNAL) __builtin_trap();
      }
      break;
    case 2:
      write_file(g_template->dir + "/manifest.json", rest);
      write_file(g_template->dir + "/manifest.json.xxh64", checksum_of(rest));
      load_into_fresh_engine();
      restore();
      break;
    case 3: {
      if (rest.empty()) break;
      const size_t k = static_cast<unsigned char>(rest[0]) % g_template->shard_names.size();
      const std::string bytes = rest.substr(1);
      json m = json::parse(g_template->manifest);
      for (json& f : m.at("files"))
        if (f.at("name") == g_template->shard_names[k]) {
          f["bytes"] = bytes.size();
          f["xxh64"] = zero::ckpt::hex64(XXH64(bytes.data(), bytes.size(), 0));
        }
      const std::string manifest = m.dump(1) + "\n";
      write_file(g_template->dir + "/" + g_template->shard_names[k], bytes);
      write_file(g_template->dir + "/manifest.json", manifest);
      write_file(g_template->dir + "/manifest.json.xxh64", checksum_of(manifest));
      load_into_fresh_engine();
      restore();
      break;
    }
  }
  return 0;
}
