// Every key of DeepSpeed's config (0.19.8: its config classes and the keys its engine looks up, recorded in
// tests/deepspeed/fixtures.json), sorted into what libzero does with it:
//  - honoured: libzero reads it and does what DeepSpeed does (config.cpp parses it);
//  - no effect: valid, cannot change what is trained here (logging, profiling, framework-side or tuning knobs);
//    accepted, and named in one warning;
//  - refused: it would change what is trained in a way libzero does not implement; present with any value but the
//    one that asks for nothing (false, 1, "none", ...), it is ZERO_ERR_UNSUPPORTED saying why.
// A key in none of the three is not DeepSpeed's: ZERO_ERR_CONFIG naming the nearest key. The "libzero" block holds
// libzero's own settings. tests/unit/config_keys_test.cpp checks this table against DeepSpeed's list.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zero {

enum class KeyUse { kHonoured, kNoEffect, kRefused };

struct KeyRule {
  const char* path;  // "zero_optimization.overlap_comm"; a block without dotted entries is taken whole
  KeyUse use;
  // kRefused: the values that ask for nothing, '|'-separated JSON values (strings compare case-insensitively), or
  // "@key=v1|v2" (a block whose `key` is one of the values) or "@key?=v1|v2" (the same, or `key` absent: DeepSpeed's
  // default asks for nothing). nullptr: any value is refused.
  const char* harmless;
  const char* why;  // what libzero does instead (refused and no-effect keys)
};

const std::vector<KeyRule>& deepspeed_key_rules();

// The first pass over a config, before any value is read: DeepSpeed's aliases resolved in place (bfloat16 -> bf16,
// "zero_optimization": true/false -> stage 1/0, each stage3_ alias to its short name's place), every unknown key
// reported at once (ZERO_ERR_CONFIG, with the nearest valid key for each), then refused keys
// (ZERO_ERR_UNSUPPORTED). Fills `no_effect` with the no-effect keys present, and `spelled_as` with the alias each
// resolved key was written as (canonical path -> written path), so that messages name what the user wrote.
void check_config_keys(nlohmann::json& root, std::vector<std::string>& no_effect,
                       std::map<std::string, std::string>& spelled_as);

// `path` as the config wrote it: the alias it used for the key or one of its blocks (bfloat16.enabled for
// bf16.enabled), else `path` itself.
std::string as_written(const std::map<std::string, std::string>& spelled_as, const std::string& path);

// Duplicate keys in one JSON object of the text (the JSON parser keeps the last silently): ZERO_ERR_CONFIG naming
// the key. The text must already be valid JSON.
void check_duplicate_keys(const std::string& json_text);

}  // namespace zero
