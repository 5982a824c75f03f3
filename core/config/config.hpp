// The DeepSpeed JSON config, parsed and validated. A user's existing ds_config.json should load as is: every key
// DeepSpeed documents is either honoured, accepted as a tuning knob that cannot change results (and reported as
// having no effect yet), or refused with ZERO_ERR_UNSUPPORTED. Unknown keys are errors naming the nearest key.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/optimizer.hpp"
#include "numeric/dtype.hpp"

namespace zero {

// fp16 loss scaling, with DeepSpeed's keys and defaults (fp16 block).
struct LossScaleConfig {
  double static_scale = 0.0;  // loss_scale: 0 means dynamic
  int initial_scale_power = 16;
  int64_t window = 1000;  // loss_scale_window
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_scale = 1.0;  // min_loss_scale
};

// Learning-rate schedules, with DeepSpeed's names and parameters (scheduler block).
struct SchedulerConfig {
  enum class Kind { kNone, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
  Kind kind = Kind::kNone;
  double warmup_min_lr = 0.0, warmup_max_lr = 0.001;  // WarmupLR, WarmupDecayLR
  bool warmup_max_lr_given = true;                    // false: WarmupLR warms each group up to its own lr
  int64_t warmup_num_steps = 1000;
  bool warmup_log = true;                                 // warmup_type "log" (default) or "linear"
  int64_t total_num_steps = 0;                            // WarmupDecayLR, WarmupCosineLR
  double warmup_min_ratio = 0.0, cos_min_ratio = 0.0001;  // WarmupCosineLR
};

// zero_optimization.offload_optimizer and the aio block: where the fp32 master and the optimizer state live.
// With device nvme they are in one file per rank under nvme_path and stream through a window of buffer_count
// chunks of chunk_elems elements in host memory (docs/architecture.md, "NVMe offload").
struct OffloadConfig {
  enum class Device { kNone, kCpu, kNvme };
  Device optimizer = Device::kNone;
  std::string nvme_path;             // a directory; the file is created at finalize, removed with the engine
  int buffer_count = 4;              // DeepSpeed's default; at least 3 (read ahead, update, write behind)
  int64_t chunk_elems = 0;           // zero_optimization.sub_group_size when given, else kDefaultChunkElems
  int64_t aio_block_size = 1 << 20;  // aio.block_size: bytes per request
  int aio_queue_depth = 8;           // aio.queue_depth: requests in flight
  // 4 Mi elements: 16 MiB transfers per array (bench/README.md, "NVMe offload": larger chunks gain little).
  static constexpr int64_t kDefaultChunkElems = int64_t{1} << 22;
  bool nvme() const { return optimizer == Device::kNvme; }
  // offload_param with device "nvme" (stage 3, bf16/fp16 params): the 16-bit param shards of the units that do not
  // stay resident are in a file under param_nvme_path, read through a buffer of param_buffer_size elements.
  Device params = Device::kNone;
  std::string param_nvme_path;
  int64_t param_buffer_size = 100000000;  // DeepSpeed's default (1e8 elements)
  bool params_nvme() const { return params == Device::kNvme; }
  // pin_memory of either block: on a GPU engine, state offloaded to "cpu" lives in page-locked host memory, which
  // the copy engines read and write without a bounce through pageable memory (the CPU engine has nothing to pin).
  bool pin_optimizer = false, pin_params = false;
};

struct Config {
  int stage = 0;
  int64_t reduce_bucket_size = 500000000;     // elements
  int64_t allgather_bucket_size = 500000000;  // elements
  bool contiguous_gradients = true;
  bool overlap_comm = false;
  // Stage 3 (DeepSpeed's stage3_ keys, elements): all-gathers started ahead of zero_gather in the order recorded
  // on the previous micro-step, at most this many elements ahead; at most max_live_parameters gathered at once
  // by libzero's own choice (prefetched or kept); a released unit kept gathered when the recorded order needs it
  // again within max_reuse_distance elements. Absent keys: DeepSpeed's defaults (5e7, 1e9, 1e9) with
  // overlap_comm, 0 (no prefetch, nothing kept) without it.
  int64_t prefetch_bucket_size = 0;
  int64_t max_live_parameters = 1000000000;
  int64_t max_reuse_distance = 0;
  int64_t param_persistence_threshold = 100000;  // elements; stage 3 units smaller than this stay resident
  int64_t gradient_accumulation_steps = 1;
  int64_t train_micro_batch_size_per_gpu = 0;  // 0: not given and not derivable
  int64_t train_batch_size = 0;                // 0: not given and not derivable
  double gradient_clipping = 1.0;              // 0: off. DeepSpeed's default is 1.0, so it is libzero's too
  // A step whose gradient norm is not finite is skipped (DeepSpeed ZeRO 1-2's rule): always with fp16; with bf16
  // unless bf16.check_grad_overflow is false; with fp32 unless zero_optimization.compute_grad_norm is false. Off,
  // and without clipping, nothing needs the norm before the update: the optimizer pass computes it as it reads the
  // gradients (one pass fewer) and zero_step still reports it.
  bool skip_nonfinite_steps = true;
  OptimizerHyper optimizer;
  DType compute_dtype = DType::kF32;     // bf16.enabled / fp16.enabled
  DType comm_dtype = DType::kF32;        // communication_data_type (default: the compute dtype)
  DType grad_accum_dtype = DType::kF32;  // data_types.grad_accum_dtype (default fp32)
  bool stochastic_rounding = false;      // bf16.stochastic_rounding (libzero extension)
  uint32_t stochastic_rounding_seed = 0;
  LossScaleConfig loss_scale;  // used when compute_dtype is fp16
  SchedulerConfig scheduler;
  bool gather_16bit_weights_on_save = false;  // stage3_gather_16bit_weights_on_model_save
  double timeout_s = 600.0;                   // libzero.timeout_s (ZERO_TIMEOUT_S overrides): every collective's
  int optimizer_threads = 0;                  // libzero.optimizer_threads; 0: automatic
  bool require_deterministic = false;  // libzero.deterministic: finalize fails on a backend without rank-order sums
  // libzero.deterministic set to false: a backend may reduce gradients in any order (NCCL's own reduce-scatter).
  // Absent: rank-order sums wherever the backend has them, not required.
  bool allow_any_order = false;
  OffloadConfig offload;
  std::string source_json;  // the config as given, stored in checkpoints
  // Keys present in the config that are valid but change nothing here (for the one warning on rank 0).
  std::vector<std::string> no_effect_keys;
  // What DeepSpeed would warn about too (a schedule whose total is shorter than its warmup): logged by rank 0.
  std::vector<std::string> warnings;
  // Keys the config wrote with one of DeepSpeed's aliases: canonical path -> path as written (for messages).
  std::map<std::string, std::string> spelled_as;
};

// Throws zero::Error (ZERO_ERR_CONFIG or ZERO_ERR_UNSUPPORTED) naming the offending key.
Config parse_config(const std::string& json_text, int world_size);

// Every parsed setting that changes what is trained or which collectives run, as "'key' = value" strings in a
// fixed order (numbers in decimal, exactly): finalize compares them across ranks and names the first difference.
std::vector<std::string> result_settings(const Config& config);

// What libzero will do with a config: the text of `zero-config check` and zero_config_check().
std::string config_report(const Config& config, int world_size);

// The collective timeout: ZERO_TIMEOUT_S when set (a ZERO_ERR_CONFIG error if it is not a number of seconds in
// [0.001, 1e9]), else `fallback`.
double timeout_from_environment(double fallback);

// Levenshtein distance, for "did you mean" suggestions.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace zero
