#include "config/config_keys.hpp"

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "config/config.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

using json = nlohmann::json;
constexpr KeyUse H = KeyUse::kHonoured, N = KeyUse::kNoEffect, R = KeyUse::kRefused;

const char* const kRemoved = "DeepSpeed 0.19.8 itself has removed this feature";

}  // namespace

const std::vector<KeyRule>& deepspeed_key_rules() {
  static const std::vector<KeyRule> rules = {
      // ---- Top level
      {"train_batch_size", H, nullptr, ""},
      {"train_micro_batch_size_per_gpu", H, nullptr, ""},
      {"gradient_accumulation_steps", H, nullptr, ""},
      {"gradient_clipping", H, nullptr, ""},
      {"optimizer", H, nullptr, ""},
      {"scheduler", H, nullptr, ""},
      {"fp16", H, nullptr, ""},
      {"bf16", H, nullptr, ""},
      {"zero_optimization", H, nullptr, ""},
      {"communication_data_type", H, nullptr, ""},
      {"data_types", H, nullptr, ""},
      {"prescale_gradients", R, "false", "gradients are summed over ranks, then averaged once"},
      {"gradient_predivide_factor", R, "1|1.0", "gradients are summed over ranks, then averaged once"},
      {"gradient_allreduce_op", R, "\"mean\"", "libzero averages gradients over ranks (DeepSpeed's \"mean\")"},
      {"managed_gradient_accumulation", R, "true", "libzero manages gradient accumulation itself"},
      {"sequence_parallel_size", R, "1", "sequence parallelism is not implemented"},
      {"seq_parallel_communication_data_type", N, nullptr, "no sequence parallelism"},
      {"expert_parallel", R, "@enabled?=false", "expert (MoE) parallelism is not implemented"},
      {"tensor_parallel", R, "@autotp_size?=0|1", "tensor parallelism is not implemented"},
      {"hybrid_engine", R, "@enabled?=false", "the hybrid (RLHF) engine is not implemented"},
      {"compile", R, "@deepcompile?=false", "DeepCompile is not implemented (torch.compile is the framework's)"},
      {"torch_autocast", R, "@enabled?=false", "autocasting is the framework's business; libzero trains in bf16/fp16"},
      {"weight_quantization", R, "@enabled=false", "weight quantization is not implemented"},
      {"data_efficiency", R, "@enabled?=false", "data sampling and routing are the framework's business"},
      {"pipeline", N, nullptr, "pipeline parallelism is the framework's"},
      {"activation_checkpointing", N, nullptr, "activation checkpointing is the framework's (forward and backward)"},
      {"aio", H, nullptr, ""},
      {"checkpoint", N, nullptr, "libzero writes its own checkpoint format (docs/checkpoint-format.md)"},
      {"datastates_ckpt", N, nullptr, "libzero writes its own checkpoint format"},
      {"dataloader_drop_last", N, nullptr, "the data loader is the framework's"},
      {"disable_allgather", N, nullptr, "libzero always all-gathers"},
      {"disable_python_gc", N, nullptr, "there is no Python in libzero"},
      {"use_data_before_expert_parallelism", N, nullptr, "no expert parallelism"},
      {"vocabulary_size", N, nullptr, "the model is the framework's"},
      {"steps_per_print", N, nullptr, "logging"},
      {"log_level", N, nullptr, "logging goes through zero_set_log_callback"},
      {"wall_clock_breakdown", N, nullptr, "profiling"},
      {"memory_breakdown", N, nullptr, "profiling; see zero_memory_stats"},
      {"dump_state", N, nullptr, "logging"},
      {"timers", N, nullptr, "profiling"},
      {"flops_profiler", N, nullptr, "profiling"},
      {"comms_logger", N, nullptr, "profiling; see zero_comm_stats"},
      {"autotuning", N, nullptr, "tuning"},
      {"tensorboard", N, nullptr, "monitoring"},
      {"wandb", N, nullptr, "monitoring"},
      {"csv_monitor", N, nullptr, "monitoring"},
      {"comet", N, nullptr, "monitoring"},
      {"zero_allow_untested_optimizer", N, nullptr, "every libzero optimizer is tested with every stage"},
      {"zero_force_ds_cpu_optimizer", N, nullptr, "libzero runs its own optimizers"},
      {"amp", R, "{\"enabled\":false}", kRemoved},
      {"compression_training", R, nullptr, kRemoved},
      {"curriculum_learning", R, "{\"enabled\":false}", kRemoved},
      {"eigenvalue", R, nullptr, kRemoved},
      {"elasticity", R, "{\"enabled\":false}", kRemoved},
      {"graph_harvesting", R, "false", kRemoved},
      {"nebula", R, nullptr, kRemoved},
      {"progressive_layer_drop", R, "{\"enabled\":false}", kRemoved},
      {"quantize_training", R, "{\"enabled\":false}", kRemoved},
      {"sparse_attention", R, nullptr, kRemoved},
      {"sparse_gradients", R, "false", kRemoved},
      {"libzero", H, nullptr, ""},

      // ---- zero_optimization
      {"zero_optimization.stage", H, nullptr, ""},
      {"zero_optimization.reduce_bucket_size", H, nullptr, ""},
      {"zero_optimization.param_persistence_threshold", H, nullptr, ""},
      {"zero_optimization.gather_16bit_weights_on_model_save", H, nullptr, ""},
      {"zero_optimization.offload_param", H, nullptr, ""},
      {"zero_optimization.offload_optimizer", H, nullptr, ""},
      {"zero_optimization.contiguous_gradients", N, nullptr, "libzero's gradients are always contiguous"},
      {"zero_optimization.allgather_bucket_size", N, nullptr, "all-gathers are per unit"},
      {"zero_optimization.overlap_comm", H, nullptr, ""},
      {"zero_optimization.reduce_scatter", N, nullptr, "libzero always reduce-scatters"},
      {"zero_optimization.allgather_partitions", N, nullptr, "libzero always all-gathers"},
      {"zero_optimization.prefetch_bucket_size", H, nullptr, ""},
      {"zero_optimization.max_live_parameters", H, nullptr, ""},
      {"zero_optimization.max_reuse_distance", H, nullptr, ""},
      {"zero_optimization.model_persistence_threshold", N, nullptr, "persistence is decided per unit"},
      {"zero_optimization.module_granularity_threshold", N, nullptr, "units are the framework's"},
      {"zero_optimization.use_all_reduce_for_fetch_params", N, nullptr, "gathers are all-gathers"},
      {"zero_optimization.allgather_sequential", N, nullptr, "gathers are per unit"},
      {"zero_optimization.sub_group_size", H, nullptr, ""},
      {"zero_optimization.round_robin_gradients", N, nullptr, "buckets are reduced in order"},
      {"zero_optimization.elastic_checkpoint", N, nullptr, "every checkpoint loads at any rank count"},
      {"zero_optimization.ignore_unused_parameters", N, nullptr, "unused params are always allowed"},
      {"zero_optimization.memory_efficient_linear", N, nullptr, "layers are the framework's"},
      {"zero_optimization.use_multi_rank_bucket_allreduce", N, nullptr, "buckets are reduce-scattered"},
      {"zero_optimization.compute_grad_norm", H, nullptr, ""},
      {"zero_optimization.enable_sanity_checks", N, nullptr, "libzero always checks (failure safety)"},
      {"zero_optimization.leaf_module", N, nullptr, "modules are the framework's"},
      {"zero_optimization.legacy_stage1", N, nullptr, "one implementation of every stage"},
      {"zero_optimization.log_trace_cache_warnings", N, nullptr, "logging"},
      {"zero_optimization.override_module_apply", N, nullptr, "modules are the framework's"},
      {"zero_optimization.parameter_alignment", N, nullptr, "params are aligned to 64 elements"},
      {"zero_optimization.pipeline_loading_checkpoint", N, nullptr, "no pipeline parallelism"},
      {"zero_optimization.save_muon_momentum_buffer_in_memory", N, nullptr, "no Muon optimizer"},
      {"zero_optimization.cpu_offload_use_pin_memory", N, nullptr, "host memory needs no pinning without a GPU"},
      {"zero_optimization.load_from_fp32_weights", R, "true",
       "libzero always restores the fp32 master weights from a checkpoint"},
      {"zero_optimization.cpu_offload", R, "false", "DeepSpeed's old spelling; use offload_optimizer"},
      {"zero_optimization.cpu_offload_param", R, "false", "DeepSpeed's old spelling; use offload_param"},
      {"zero_optimization.zero_hpz_partition_size", R, "1", "hierarchical partitioning (ZeRO++) is not implemented"},
      {"zero_optimization.zero_quantized_weights", R, "false", "quantized communication is not implemented"},
      {"zero_optimization.zero_quantized_gradients", R, "false", "quantized communication is not implemented"},
      {"zero_optimization.zero_quantized_nontrainable_weights", R, "false", "quantized weights are not implemented"},
      {"zero_optimization.zenflow", R, nullptr, "ZenFlow is not implemented"},
      {"zero_optimization.mics_shard_size", R, "-1", kRemoved},
      {"zero_optimization.mics_hierarchical_params_gather", R, "false", kRemoved},
      {"zero_optimization.zeropp_loco_param", R, nullptr, kRemoved},

      // ---- offload blocks: to "cpu" (where everything is already) or "nvme"
      {"zero_optimization.offload_param.device", H, nullptr, ""},
      {"zero_optimization.offload_param.nvme_path", H, nullptr, ""},
      {"zero_optimization.offload_param.pin_memory", N, nullptr, "host memory needs no pinning without a GPU"},
      {"zero_optimization.offload_param.buffer_count", N, nullptr, "shards are read one at a time, through one buffer"},
      {"zero_optimization.offload_param.buffer_size", H, nullptr, ""},
      {"zero_optimization.offload_param.max_in_cpu", N, nullptr,
       "resident units (the persistence threshold) stay in memory"},
      {"zero_optimization.offload_optimizer.device", H, nullptr, ""},
      {"zero_optimization.offload_optimizer.nvme_path", H, nullptr, ""},
      {"zero_optimization.offload_optimizer.pin_memory", N, nullptr, "host memory needs no pinning without a GPU"},
      {"zero_optimization.offload_optimizer.buffer_count", H, nullptr, ""},
      {"zero_optimization.offload_optimizer.fast_init", N, nullptr,
       "the state starts as the pre-allocated file's zeros; only the master is written"},
      {"zero_optimization.offload_optimizer.pipeline_read", N, nullptr, "reads, updates and writes always overlap"},
      {"zero_optimization.offload_optimizer.pipeline_write", N, nullptr, "reads, updates and writes always overlap"},
      {"zero_optimization.offload_optimizer.ratio", R, "1|1.0", "partial offload (ratio < 1) is not implemented"},
      {"zero_optimization.offload_optimizer.cpuadam_cores_perc", N, nullptr,
       "libzero.optimizer_threads sets the threads"},
      {"zero_optimization.offload_optimizer.super_offload", R, "false", "SuperOffload is not implemented"},

      // ---- fp16, bf16
      {"fp16.enabled", H, nullptr, ""},
      {"fp16.loss_scale", H, nullptr, ""},
      {"fp16.initial_scale_power", H, nullptr, ""},
      {"fp16.loss_scale_window", H, nullptr, ""},
      {"fp16.hysteresis", H, nullptr, ""},
      {"fp16.consecutive_hysteresis", H, nullptr, ""},
      {"fp16.min_loss_scale", H, nullptr, ""},
      {"fp16.auto_cast", R, "false", "casting inputs is the framework's business"},
      {"fp16.fp16_master_weights_and_grads", R, "false", "the master weights are always fp32"},
      {"bf16.enabled", H, nullptr, ""},
      {"bf16.stochastic_rounding", H, nullptr, ""},       // libzero's own
      {"bf16.stochastic_rounding_seed", H, nullptr, ""},  // libzero's own
      {"bf16.immediate_grad_update", N, nullptr, "gradients are accumulated in their own buffers"},
      {"bf16.check_grad_overflow", H, nullptr, ""},
      {"bf16.bf16_master_weights_and_grads", R, "false", "the master weights are always fp32"},
      {"bf16.bf16_optimizer_states", R, "false", "the optimizer state is always fp32"},

      // ---- data types
      {"data_types.grad_accum_dtype", H, nullptr, ""},
      {"data_types.param_dtype", R, "null", "the compute dtype comes from the bf16/fp16 blocks"},
      {"data_types.buffer_dtype", R, "null", "buffers are the framework's"},
      {"data_types.keep_in_fp32_modules", R, "null|[]", "modules are the framework's"},

      // ---- optimizer, scheduler (their params depend on the type: config.cpp)
      {"optimizer.type", H, nullptr, ""},
      {"optimizer.params", H, nullptr, ""},
      {"optimizer.legacy_fusion", N, nullptr, "libzero's kernels are always fused"},
      {"scheduler.type", H, nullptr, ""},
      {"scheduler.params", H, nullptr, ""},

      // ---- libzero's own
      {"libzero.timeout_s", H, nullptr, ""},
      {"libzero.optimizer_threads", H, nullptr, ""},
      {"libzero.deterministic", H, nullptr, ""},

      // ---- activation_checkpointing: valid keys, no effect (the block is listed above); aio: NVMe offload's I/O
      {"activation_checkpointing.partition_activations", N, nullptr, ""},
      {"activation_checkpointing.contiguous_memory_optimization", N, nullptr, ""},
      {"activation_checkpointing.cpu_checkpointing", N, nullptr, ""},
      {"activation_checkpointing.number_checkpoints", N, nullptr, ""},
      {"activation_checkpointing.synchronize_checkpoint_boundary", N, nullptr, ""},
      {"activation_checkpointing.profile", N, nullptr, ""},
      {"aio.block_size", H, nullptr, ""},
      {"aio.queue_depth", H, nullptr, ""},
      {"aio.intra_op_parallelism", N, nullptr, "one thread submits every request"},
      {"aio.single_submit", N, nullptr, "requests are submitted in batches"},
      {"aio.overlap_events", N, nullptr, "completions are reaped as they come"},
      {"aio.use_gds", R, "false", "GPUDirect Storage needs the GPU engine"},
  };
  return rules;
}

namespace {

// DeepSpeed's stage3_ spellings: each is an alias of the short name (both are accepted, not both at once).
const std::map<std::string, std::string>& stage3_aliases() {
  static const std::map<std::string, std::string> aliases = {
      {"stage3_prefetch_bucket_size", "prefetch_bucket_size"},
      {"stage3_param_persistence_threshold", "param_persistence_threshold"},
      {"stage3_model_persistence_threshold", "model_persistence_threshold"},
      {"stage3_max_live_parameters", "max_live_parameters"},
      {"stage3_max_reuse_distance", "max_reuse_distance"},
      {"stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save"},
      {"stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save"},
      {"stage3_module_granularity_threshold", "module_granularity_threshold"},
      {"stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params"},
      {"stage3_allgather_sequential", "allgather_sequential"},
  };
  return aliases;
}

// Moves `from` to `to` inside `obj`; both present is an error unless they say the same.
void rename_key(json& obj, const std::string& path, const std::string& from, const std::string& to,
                std::map<std::string, std::string>& spelled_as) {
  if (!obj.is_object() || !obj.contains(from)) return;
  const std::string where = path.empty() ? "" : path + ".";
  spelled_as[where + to] = where + from;
  if (obj.contains(to) && obj.at(to) != obj.at(from))
    fail(ZERO_ERR_CONFIG, "config keys '" + where + from + "' and '" + where + to +
                              "' are two names of one setting and disagree (" + obj.at(from).dump() + " and " +
                              obj.at(to).dump() + "); keep one");
  obj[to] = obj.at(from);
  obj.erase(from);
}

std::string nearest(const std::string& key, const std::vector<std::string>& known) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const auto& k : known) {
    const size_t d = edit_distance(key, k);
    if (d < best_distance) best_distance = d, best = k;
  }
  return best;
}

std::string lowercase_copy(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Whether `value` is one of the '|'-separated JSON values of `list` (strings case-insensitively).
bool one_of(const json& value, const std::string& list) {
  std::stringstream entries(list);
  std::string entry;
  while (std::getline(entries, entry, '|')) {
    const json want = json::parse(entry);
    if (want == value) return true;
    if (want.is_string() && value.is_string() &&
        lowercase_copy(want.get<std::string>()) == lowercase_copy(value.get<std::string>()))
      return true;
  }
  return false;
}

bool harmless(const json& value, const char* rule) {
  if (rule == nullptr) return false;
  const std::string r = rule;
  if (r[0] != '@') return one_of(value, r);
  // A block judged by one of its keys.
  const size_t eq = r.find('=');
  const bool absent_ok = r[eq - 1] == '?';
  const std::string key = r.substr(1, eq - 1 - (absent_ok ? 1 : 0));
  if (!value.is_object()) return false;
  if (!value.contains(key) || value.at(key).is_null()) return absent_ok;
  return one_of(value.at(key), r.substr(eq + 1));
}

}  // namespace

std::string as_written(const std::map<std::string, std::string>& spelled_as, const std::string& path) {
  for (size_t end = path.size(); end != std::string::npos && end > 0; end = path.rfind('.', end - 1)) {
    const auto it = spelled_as.find(path.substr(0, end));
    if (it != spelled_as.end()) return it->second + path.substr(end);
    if (end == 0) break;
  }
  return path;
}

void check_config_keys(json& root, std::vector<std::string>& no_effect,
                       std::map<std::string, std::string>& spelled_as) {
  if (!root.is_object())
    fail(ZERO_ERR_CONFIG, "the config must be a JSON object, got " + std::string(root.type_name()));
  // Aliases first, so that every later check sees one spelling.
  rename_key(root, "", "bfloat16", "bf16", spelled_as);
  if (root.contains("zero_optimization") && root.at("zero_optimization").is_boolean())
    root["zero_optimization"] = json{{"stage", root.at("zero_optimization").get<bool>() ? 1 : 0}};
  if (root.contains("zero_optimization") && root.at("zero_optimization").is_object())
    for (const auto& alias : stage3_aliases())
      rename_key(root["zero_optimization"], "zero_optimization", alias.first, alias.second, spelled_as);

  // The sections whose keys are checked one by one, and what each may hold.
  std::map<std::string, std::vector<std::string>> known;  // section path ("" = top) -> keys
  std::map<std::string, const KeyRule*> rule_of;
  for (const KeyRule& r : deepspeed_key_rules()) {
    const std::string path = r.path;
    const size_t dot = path.rfind('.');
    known[dot == std::string::npos ? "" : path.substr(0, dot)].push_back(
        dot == std::string::npos ? path : path.substr(dot + 1));
    rule_of[path] = &r;
  }

  // 1. Unknown keys, everywhere, all reported at once.
  std::vector<std::string> unknown;
  std::vector<std::pair<std::string, const json*>> present;  // path, value
  std::function<void(const json&, const std::string&)> walk = [&](const json& obj, const std::string& section) {
    const std::vector<std::string>& keys = known[section];
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      const std::string path = section.empty() ? it.key() : section + "." + it.key();
      if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) {
        // DeepSpeed's aio block ignores keys it does not know (older configs carry thread_count): so does libzero,
        // with the no-effect warning.
        if (section == "aio") {
          no_effect.push_back(path);
          continue;
        }
        const std::string best = nearest(it.key(), keys);
        unknown.push_back(
            "'" + as_written(spelled_as, path) + "'" +
            (best.empty()
                 ? ""
                 : " (did you mean '" + as_written(spelled_as, section.empty() ? best : section + "." + best) + "'?)"));
        continue;
      }
      present.emplace_back(path, &it.value());
      // A block with no effect is not looked into: DeepSpeed ignores unknown keys in those old-style sections
      // (aio's thread_count, ...), and nothing in them can change what libzero trains.
      if (it.value().is_object() && known.count(path) != 0 && rule_of.at(path)->use != KeyUse::kNoEffect)
        walk(it.value(), path);
    }
  };
  walk(root, "");
  if (!unknown.empty()) {
    std::string message = unknown.size() == 1 ? "unknown config key " : "unknown config keys: ";
    for (size_t i = 0; i < unknown.size(); ++i) message += (i ? ", " : "") + unknown[i];
    fail(ZERO_ERR_CONFIG, message +
                              ". These are not DeepSpeed's keys (libzero's own settings go in the \"libzero\" "
                              "block)");
  }

  // 2. Keys that would change what is trained in ways libzero does not implement; 3. keys with no effect here.
  for (const auto& [path, value] : present) {
    const KeyRule& r = *rule_of.at(path);
    if (r.use == KeyUse::kRefused && !value->is_null() && !harmless(*value, r.harmless))
      fail(ZERO_ERR_UNSUPPORTED, "config key '" + as_written(spelled_as, path) + "' is not supported: " + r.why +
                                     " (it is " + value->dump() + ")");
    // Named once: a no-effect key inside a no-effect block is covered by the block's name.
    bool inside_no_effect_block = false;
    for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', dot + 1))
      inside_no_effect_block |= rule_of.at(path.substr(0, dot))->use == KeyUse::kNoEffect;
    if (r.use == KeyUse::kNoEffect && !inside_no_effect_block) no_effect.push_back(as_written(spelled_as, path));
  }
}

// A small scanner over text that is already valid JSON: strings (with escapes) and nesting are all it needs.
void check_duplicate_keys(const std::string& text) {
  struct Frame {
    bool object;
    bool expect_key;
    std::string current;  // the key whose value is being read
    std::set<std::string> keys;
  };
  std::vector<Frame> stack;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '{' || c == '[') {
      stack.push_back(Frame{c == '{', c == '{', "", {}});
      ++i;
    } else if (c == '}' || c == ']') {
      if (!stack.empty()) stack.pop_back();
      ++i;
    } else if (c == ',') {
      if (!stack.empty() && stack.back().object) stack.back().expect_key = true;
      ++i;
    } else if (c == '"') {
      std::string s;
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\' && i + 1 < text.size()) s += text[i++];
        s += text[i];
      }
      ++i;
      if (!stack.empty() && stack.back().object && stack.back().expect_key) {
        Frame& f = stack.back();
        if (!f.keys.insert(s).second) {
          std::string where;
          for (size_t k = 0; k + 1 < stack.size(); ++k)
            if (stack[k].object) where += stack[k].current + ".";
          fail(ZERO_ERR_CONFIG, "config key '" + where + s + "' appears twice in one object; keep one");
        }
        f.current = s;
        f.expect_key = false;
      }
    } else {
      ++i;
    }
  }
}

}  // namespace zero
