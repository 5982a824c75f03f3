// The checkpoint files' readers and writers on their own: no descriptor leaks on corrupt files, cleanup that never
// follows a symbolic link, no temporary file left by a failed write, and a manifest whose impossible values and
// changed bytes are refused as corruption.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/file_io.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/safetensors.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

std::string make_temp_dir() {
  char name[] = "/tmp/zero-ckpt-io.XXXXXX";
  const char* dir = ::mkdtemp(name);
  EXPECT_NE(dir, nullptr);
  return dir != nullptr ? dir : "";
}

void write_file(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

size_t open_descriptors() {
  size_t n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

template <typename F>
zero_status_t status_of(F&& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message != nullptr) *message = e.what();
    return e.status();
  }
  return ZERO_OK;
}

TEST(CheckpointIo, CorruptSafetensorsHeadersLeakNoDescriptor) {
  const std::string dir = make_temp_dir();
  const std::string bad = dir + "/bad.safetensors";
  // A header length that fits the file, then text that is not JSON: the reader fails after opening the file.
  write_file(bad, std::string("\x08\x00\x00\x00\x00\x00\x00\x00not json", 16));
  const size_t before = open_descriptors();
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(status_of([&] { ckpt::SafetensorsReader r(bad); }), ZERO_ERR_CHECKPOINT_CORRUPT);
  EXPECT_EQ(open_descriptors(), before);
  ckpt::remove_tree(dir);
}

TEST(CheckpointIo, RemovingATreeNeverFollowsSymbolicLinks) {
  const std::string dir = make_temp_dir(), precious = make_temp_dir();
  write_file(precious + "/weights.bin", "keep me");
  ASSERT_EQ(::mkdir((dir + "/.tmp.tag").c_str(), 0755), 0);
  ASSERT_EQ(::symlink(precious.c_str(), (dir + "/.tmp.tag/link-to-dir").c_str()), 0);
  ASSERT_EQ(::symlink((precious + "/weights.bin").c_str(), (dir + "/.tmp.tag/link-to-file").c_str()), 0);
  ckpt::remove_tree(dir + "/.tmp.tag");
  EXPECT_FALSE(ckpt::path_exists(dir + "/.tmp.tag"));
  EXPECT_TRUE(ckpt::path_exists(precious + "/weights.bin"));
  // A temporary directory that is itself a link: the link goes, not what it points to.
  ASSERT_EQ(::symlink(precious.c_str(), (dir + "/.tmp.other").c_str()), 0);
  ckpt::remove_tree(dir + "/.tmp.other");
  EXPECT_TRUE(ckpt::path_exists(precious + "/weights.bin"));
  struct stat st;
  EXPECT_NE(::lstat((dir + "/.tmp.other").c_str(), &st), 0);
  ckpt::remove_tree(dir);
  ckpt::remove_tree(precious);
}

TEST(CheckpointIo, AFailedAtomicWriteLeavesNoTemporaryFile) {
  const std::string dir = make_temp_dir();
  // The rename fails: the target is a non-empty directory.
  ASSERT_EQ(::mkdir((dir + "/latest").c_str(), 0755), 0);
  write_file(dir + "/latest/x", "x");
  EXPECT_EQ(status_of([&] { ckpt::write_text_file_atomically(dir + "/latest", "tag\n"); }), ZERO_ERR_IO);
  DIR* d = ::opendir(dir.c_str());
  while (dirent* e = ::readdir(d)) EXPECT_EQ(std::string(e->d_name).find(".tmp."), std::string::npos) << e->d_name;
  ::closedir(d);
  ckpt::remove_tree(dir);
}

ckpt::Manifest valid_manifest() {
  ckpt::Manifest m;
  m.library_version = "test";
  m.tag = "t";
  m.world_size = 2;
  m.stage = 1;
  m.step = 3;
  m.param_dtype = "fp32";
  m.optimizer = "AdamW";
  m.state_names = {"exp_avg", "exp_avg_sq"};
  m.loss_scale = 1.0;
  m.hysteresis_left = 2;
  m.groups.push_back({"default", 0.001, 0.01, 0.9, 0.999, 1e-8});
  ckpt::ManifestUnit unit;
  unit.padded_elems = 64;
  unit.shard_elems = 32;
  m.units.push_back(unit);
  ckpt::ManifestParam w;
  w.name = "w";
  w.shape = {7, 5};
  w.numel = 35;
  m.params.push_back(w);
  for (int r = 0; r < 2; ++r)
    for (const char* kind : {"master", "optimizer"})
      m.files.push_back({ckpt::shard_file_name(kind, r, 2), kind, r, 100, 1});
  m.config_json = "{}";
  return m;
}

TEST(CheckpointIo, ManifestValuesNoSaveWritesAreCorruption) {
  EXPECT_EQ(status_of([&] { ckpt::Manifest::parse(valid_manifest().to_json(), "m"); }), ZERO_OK);
  struct Case {
    const char* what;
    void (*edit)(ckpt::Manifest&);
  };
  const Case cases[] = {
      {"step", [](ckpt::Manifest& m) { m.step = -1; }},
      {"world_size", [](ckpt::Manifest& m) { m.world_size = 0; }},
      {"loss_scaler.scale", [](ckpt::Manifest& m) { m.loss_scale = 0.0; }},
      {"lr", [](ckpt::Manifest& m) { m.groups[0].lr = 1e300; }},
      {"beta1", [](ckpt::Manifest& m) { m.groups[0].beta1 = 1.5; }},
      {"stage", [](ckpt::Manifest& m) { m.stage = 7; }},
      {"tile", [](ckpt::Manifest& m) { m.units[0].shard_elems = 31; }},
      {"does not fit its unit",
       [](ckpt::Manifest& m) {
         m.params[0].shape = {13, 5}, m.params[0].numel = 65;
       }},
      {"bad shape",
       [](ckpt::Manifest& m) {
         m.params[0].shape = {int64_t{1} << 40, int64_t{1} << 40};
       }},
      {"optimizer is", [](ckpt::Manifest& m) { m.optimizer = "Shampoo"; }},
      {"not a file of this checkpoint", [](ckpt::Manifest& m) { m.files[0].name = "../../etc/passwd"; }},
      // Every rank's shard of every kind (a loader must never look up a file the manifest lacks).
      {"0 optimizer files for rank 1", [](ckpt::Manifest& m) { m.files.pop_back(); }},
      {"2 master files for rank 0", [](ckpt::Manifest& m) { m.files[2] = m.files[0]; }},
      {"0 params files for rank 1",
       [](ckpt::Manifest& m) {
         m.files.push_back({ckpt::shard_file_name("params", 0, 2), "params", 0, 10, 1});
       }},
  };
  for (const Case& c : cases) {
    ckpt::Manifest m = valid_manifest();
    c.edit(m);
    std::string message;
    EXPECT_EQ(status_of([&] { ckpt::Manifest::parse(m.to_json(), "m"); }, &message), ZERO_ERR_CHECKPOINT_CORRUPT)
        << c.what;
    EXPECT_NE(message.find(c.what), std::string::npos) << message;
  }
}

// valid_manifest() with a frozen uint8 param in a unit of its own (format 3), its bytes saved.
ckpt::Manifest frozen_manifest() {
  ckpt::Manifest m = valid_manifest();
  ckpt::ManifestUnit unit;
  unit.index = 1;
  unit.global_offset = 64;
  unit.frozen_padded_bytes = 128;
  unit.frozen_shard_bytes = 64;
  m.units.push_back(unit);
  ckpt::ManifestParam q;
  q.name = "q";
  q.shape = {3, 30};
  q.unit = 1;
  q.numel = 90;
  q.frozen = true;
  q.dtype = "uint8";
  q.bytes = 90;
  m.params.push_back(q);
  for (int r = 0; r < 2; ++r) m.files.push_back({ckpt::shard_file_name("frozen", r, 2), "frozen", r, 100, 1});
  return m;
}

TEST(CheckpointIo, FrozenParamsNeedFormatThreeAndTheirFiles) {
  const ckpt::Manifest parsed = ckpt::Manifest::parse(frozen_manifest().to_json(), "m");
  EXPECT_EQ(parsed.format_version, 3);
  ASSERT_EQ(parsed.params.size(), 2u);
  EXPECT_TRUE(parsed.params[1].frozen);
  EXPECT_EQ(parsed.params[1].dtype, "uint8");
  EXPECT_EQ(parsed.params[1].bytes, 90u);
  EXPECT_EQ(parsed.units[1].frozen_shard_bytes, 64u);
  EXPECT_TRUE(parsed.frozen_saved);
  // Without frozen params nothing changes: format 2, no frozen keys.
  EXPECT_EQ(valid_manifest().to_json().find("frozen"), std::string::npos);
  EXPECT_NE(valid_manifest().to_json().find("\"format_version\": 2"), std::string::npos);
  // Left out: no frozen files, and the manifest says so.
  ckpt::Manifest excluded = frozen_manifest();
  excluded.frozen_saved = false;
  excluded.files.resize(excluded.files.size() - 2);
  EXPECT_FALSE(ckpt::Manifest::parse(excluded.to_json(), "m").frozen_saved);

  struct Case {
    const char* what;
    void (*edit)(ckpt::Manifest&);
  };
  const Case cases[] = {
      {"has dtype 'int4'", [](ckpt::Manifest& m) { m.params[1].dtype = "int4"; }},
      {"does not fit its unit's frozen bytes", [](ckpt::Manifest& m) { m.params[1].bytes = 91; }},
      {"does not fit its unit's frozen bytes", [](ckpt::Manifest& m) { m.params[1].offset_in_unit = 64; }},
      {"shards do not tile it", [](ckpt::Manifest& m) { m.units[1].frozen_shard_bytes = 63; }},
      {"0 frozen files for rank 1", [](ckpt::Manifest& m) { m.files.pop_back(); }},
      {"frozen files, but no frozen params saved", [](ckpt::Manifest& m) { m.frozen_saved = false; }},
  };
  for (const Case& c : cases) {
    ckpt::Manifest m = frozen_manifest();
    c.edit(m);
    std::string message;
    EXPECT_EQ(status_of([&] { ckpt::Manifest::parse(m.to_json(), "m"); }, &message), ZERO_ERR_CHECKPOINT_CORRUPT)
        << c.what;
    EXPECT_NE(message.find(c.what), std::string::npos) << message;
  }
  // A version-2 manifest cannot have frozen params.
  std::string text = frozen_manifest().to_json();
  text.replace(text.find("\"format_version\": 3"), 19, "\"format_version\": 2");
  std::string message;
  EXPECT_EQ(status_of([&] { ckpt::Manifest::parse(text, "m"); }, &message), ZERO_ERR_CHECKPOINT_CORRUPT);
  EXPECT_NE(message.find("below 3"), std::string::npos) << message;
}

TEST(CheckpointIo, TheManifestHasAChecksum) {
  const std::string dir = make_temp_dir();
  ckpt::write_manifest(dir, valid_manifest());
  EXPECT_EQ(status_of([&] { ckpt::read_manifest(dir); }), ZERO_OK);
  // One changed byte.
  std::string text = ckpt::read_text_file(dir + "/manifest.json");
  text[text.find("\"step\": 3")] = ' ';
  write_file(dir + "/manifest.json", text);
  std::string message;
  EXPECT_EQ(status_of([&] { ckpt::read_manifest(dir); }, &message), ZERO_ERR_CHECKPOINT_CORRUPT);
  EXPECT_NE(message.find("fails its checksum"), std::string::npos) << message;
  // No checksum at all (format version 2 requires one).
  ckpt::write_manifest(dir, valid_manifest());
  ::unlink((dir + "/manifest.json.xxh64").c_str());
  EXPECT_EQ(status_of([&] { ckpt::read_manifest(dir); }, &message), ZERO_ERR_CHECKPOINT_CORRUPT);
  EXPECT_NE(message.find("manifest.json.xxh64' is missing"), std::string::npos) << message;
  ckpt::remove_tree(dir);
}

// A tag is a directory name of the checkpoint directory and the line in `latest`: nothing that leaves the
// directory, hides, or breaks the line.
TEST(CheckpointIo, TagsAreDirectoryNamesOnOneLine) {
  for (const std::string& good :
       std::vector<std::string>{"step1000", "epoch-2_final", "a", "with space", "ünïcode", std::string(250, 't')})
    EXPECT_EQ(ckpt::tag_problem(good), "") << good;
  const std::pair<std::string, std::string> bad[] = {
      {"", "it is empty"},
      {"step\n2", "control character at byte 4"},
      {std::string("a\0b", 3), "control character at byte 1"},
      {"tab\there", "control character at byte 3"},
      {"del\x7f", "control character at byte 3"},
      {"../escape", "contains '/'"},
      {"..", "starts with '.'"},
      {".hidden", "starts with '.'"},
      {"a/b", "contains '/'"},
      {"latest", "'latest' names the file"},
      {"run1 ", "ends with a space"},
      {" run1", "starts or ends with a space"},
      {std::string(251, 't'), "251 bytes long"},
  };
  for (const auto& [tag, why] : bad) {
    const std::string problem = ckpt::tag_problem(tag);
    EXPECT_NE(problem.find(why), std::string::npos) << problem;
    EXPECT_NE(problem.find("1 to 250 bytes"), std::string::npos) << problem;  // says what is allowed
    EXPECT_EQ(problem.find('\n'), std::string::npos) << problem;              // the message stays one line
  }
  EXPECT_NE(ckpt::tag_problem("step\n2").find("'step\\x0a2'"), std::string::npos) << ckpt::tag_problem("step\n2");
}

}  // namespace
}  // namespace zero
