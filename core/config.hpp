// The DeepSpeed JSON config, parsed and validated. A user's existing ds_config.json should load as is: every key
// DeepSpeed documents is either honoured, accepted as a tuning knob that cannot change results (and reported as
// having no effect yet), or refused with ZERO_ERR_UNSUPPORTED. Unknown keys are errors naming the nearest key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zero {

struct OptimizerConfig {
  enum class Kind { kAdamW, kAdamL2 };
  Kind kind = Kind::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
};

struct Config {
  int stage = 0;
  int64_t reduce_bucket_size = 500000000;     // elements
  int64_t allgather_bucket_size = 500000000;  // elements
  bool contiguous_gradients = true;
  bool overlap_comm = false;
  int64_t param_persistence_threshold = 100000;  // elements; stage 3 units smaller than this stay resident
  int64_t gradient_accumulation_steps = 1;
  int64_t train_micro_batch_size_per_gpu = 0;  // 0: not given and not derivable
  int64_t train_batch_size = 0;                // 0: not given and not derivable
  double gradient_clipping = 0.0;              // 0: off
  OptimizerConfig optimizer;
  // Keys present in the config that are valid but change nothing yet (for the one warning on rank 0).
  std::vector<std::string> no_effect_keys;
};

// Throws zero::Error (ZERO_ERR_CONFIG or ZERO_ERR_UNSUPPORTED) naming the offending key.
Config parse_config(const std::string& json_text, int world_size);

// Levenshtein distance, for "did you mean" suggestions.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace zero
