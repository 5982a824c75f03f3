#include "config/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config/config_keys.hpp"
#include "util/error.hpp"

namespace zero {

using json = nlohmann::json;

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t subst = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, subst});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace {

// A config written for the Hugging Face Trainer: how its "auto" values become numbers outside transformers.
constexpr char kAutoAdvice[] =
    "replace it with a value, or resolve the config's \"auto\" values from the training arguments and the model "
    "as transformers does for DeepSpeed: libzero.config.resolve_auto(config, training_args, model, "
    "num_training_steps) in Python";

// One JSON object of the config, with its dotted path for messages.
class Section {
 public:
  Section(const json& obj, std::string path, Config& cfg) : obj_(obj), path_(std::move(path)), cfg_(cfg) {
    if (!obj_.is_object()) fail(ZERO_ERR_CONFIG, "'" + path_ + "' must be a JSON object, got " + obj_.type_name());
  }

  // Every key must be in `known`; the unknown ones are one error naming each with the nearest known key (the
  // format of config_keys.cpp's check of the other sections).
  void require_known(const std::vector<std::string>& known) const {
    std::vector<std::string> unknown;
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (std::find(known.begin(), known.end(), it.key()) != known.end()) continue;
      std::string best;
      size_t best_distance = SIZE_MAX;
      for (const auto& k : known) {
        size_t d = edit_distance(it.key(), k);
        if (d < best_distance) best_distance = d, best = k;
      }
      unknown.push_back("'" + qualified(it.key()) + "'" +
                        (best.empty() ? "" : " (did you mean '" + qualified(best) + "'?)"));
    }
    if (unknown.empty()) return;
    std::string message = unknown.size() == 1 ? "unknown config key " : "unknown config keys: ";
    for (size_t i = 0; i < unknown.size(); ++i) message += (i ? ", " : "") + unknown[i];
    fail(ZERO_ERR_CONFIG, message);
  }

  bool has(const std::string& key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  std::string qualified(const std::string& key) const {
    return as_written(cfg_.spelled_as, path_.empty() ? key : path_ + "." + key);
  }
  Section child(const std::string& key) const { return Section(obj_.at(key), qualified(key), cfg_); }
  const json& raw(const std::string& key) const { return obj_.at(key); }

  bool get_bool(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = value(key);
    if (!v.is_boolean()) type_error(key, "a boolean");
    return v.get<bool>();
  }

  double get_number(const std::string& key, double fallback, double lo, double hi) const {
    if (!has(key)) return fallback;
    const json& v = value(key);
    if (!v.is_number()) type_error(key, "a number");
    double d = v.get<double>();
    if (!(d >= lo && d <= hi)) range_error(key, d, lo, hi);
    return d;
  }

  // Integers may be written as 5e8, as DeepSpeed configs often do, as long as the value is integral.
  int64_t get_int(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const {
    if (!has(key)) return fallback;
    const json& v = value(key);
    if (!v.is_number()) type_error(key, "an integer");
    double d = v.get<double>();
    if (v.is_number_integer()) d = static_cast<double>(v.get<int64_t>());
    if (d != std::floor(d)) type_error(key, "an integer");
    if (!(d >= static_cast<double>(lo) && d <= static_cast<double>(hi))) {
      std::ostringstream os;
      os << "config key '" << qualified(key) << "' is " << v.dump() << "; it must be an integer in [" << lo << ", "
         << hi << "]";
      fail(ZERO_ERR_CONFIG, os.str());
    }
    return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(d);
  }

  std::string get_string(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& v = value(key);
    if (!v.is_string()) type_error(key, "a string");
    return v.get<std::string>();
  }

  // A valid key whose presence cannot change results; remembered for the "no effect yet" warning.
  void no_effect(const std::string& key) const {
    if (obj_.contains(key)) cfg_.no_effect_keys.push_back(qualified(key));
  }

  [[noreturn]] void unsupported(const std::string& key, const std::string& why) const {
    fail(ZERO_ERR_UNSUPPORTED, "config key '" + qualified(key) + "' is not supported yet: " + why);
  }

 private:
  const json& value(const std::string& key) const {
    const json& v = obj_.at(key);
    if (v.is_string() && v.get<std::string>() == "auto")
      fail(ZERO_ERR_CONFIG, "config key '" + qualified(key) + "' is \"auto\"; " + kAutoAdvice);
    return v;
  }
  [[noreturn]] void type_error(const std::string& key, const char* expected) const {
    fail(ZERO_ERR_CONFIG, "config key '" + qualified(key) + "' must be " + expected + ", got " + obj_.at(key).dump() +
                              " (" + obj_.at(key).type_name() + ")");
  }
  [[noreturn]] void range_error(const std::string& key, double v, double lo, double hi) const {
    std::ostringstream os;
    os << "config key '" << qualified(key) << "' is " << v << "; it must be in [" << lo << ", " << hi << "]";
    fail(ZERO_ERR_CONFIG, os.str());
  }

  const json& obj_;
  std::string path_;
  Config& cfg_;
};

constexpr int64_t kMaxInt = INT64_C(1) << 53;  // beyond this a JSON number may not be exact

// The honoured keys of zero_optimization (config_keys.cpp has already checked every key, resolved the stage3_
// aliases, and refused what libzero does not implement).
void parse_offload(const Section& z, int64_t sub_group_size, Config& cfg);

void parse_zero_optimization(const Section& z, Config& cfg) {
  cfg.stage = static_cast<int>(z.get_int("stage", 0, 0, 3));
  cfg.reduce_bucket_size = z.get_int("reduce_bucket_size", cfg.reduce_bucket_size, 1, kMaxInt);
  cfg.param_persistence_threshold =
      z.get_int("param_persistence_threshold", cfg.param_persistence_threshold, 0, kMaxInt);
  cfg.gather_16bit_weights_on_save = z.get_bool("gather_16bit_weights_on_model_save", false);
  // Valid, no effect here: still type-checked, so that a typo in a value is caught.
  cfg.allgather_bucket_size = z.get_int("allgather_bucket_size", cfg.allgather_bucket_size, 1, kMaxInt);
  cfg.contiguous_gradients = z.get_bool("contiguous_gradients", true);
  cfg.overlap_comm = z.get_bool("overlap_comm", false);
  cfg.prefetch_bucket_size = z.get_int("prefetch_bucket_size", cfg.overlap_comm ? 50000000 : 0, 0, kMaxInt);
  cfg.max_live_parameters = z.get_int("max_live_parameters", cfg.max_live_parameters, 0, kMaxInt);
  cfg.max_reuse_distance = z.get_int("max_reuse_distance", cfg.overlap_comm ? 1000000000 : 0, 0, kMaxInt);
  if (!z.get_bool("compute_grad_norm", true)) {
    if (cfg.gradient_clipping > 0.0)
      fail(ZERO_ERR_CONFIG,
           "zero_optimization.compute_grad_norm = false needs gradient_clipping = 0 (clipping needs "
           "the norm; DeepSpeed refuses the same), got gradient_clipping = " +
               exact_decimal(cfg.gradient_clipping) + " (libzero's default is 1.0, as DeepSpeed's)");
    cfg.skip_nonfinite_steps = false;  // fp32's rule; bf16 and fp16 have their own (parse_precision)
  }
  for (const char* k : {"reduce_scatter", "allgather_partitions", "round_robin_gradients", "elastic_checkpoint",
                        "ignore_unused_parameters", "memory_efficient_linear", "use_multi_rank_bucket_allreduce",
                        "cpu_offload_use_pin_memory", "use_all_reduce_for_fetch_params", "allgather_sequential"})
    z.get_bool(k, false);
  for (const char* k : {"model_persistence_threshold", "module_granularity_threshold"}) z.get_int(k, 0, 0, kMaxInt);
  const int64_t sub_group_size = z.get_int("sub_group_size", 0, 0, kMaxInt);
  parse_offload(z, sub_group_size, cfg);
}

// offload_optimizer: "cpu" is where the CPU engine keeps the state already; "nvme" puts the fp32 master (with
// 16-bit params) and the optimizer state in a file per rank. offload_param: "cpu" likewise; "nvme" (stage 3, 16-bit
// params) puts the param shards of non-resident units in a file per rank.
void parse_offload(const Section& z, int64_t sub_group_size, Config& cfg) {
  auto device_of = [&](const char* block) {
    if (!z.has(block)) return OffloadConfig::Device::kNone;
    const Section off = z.child(block);
    const std::string device = off.get_string("device", "none");
    if (device == "none") return OffloadConfig::Device::kNone;
    if (device == "cpu") {
      off.no_effect("device");  // the CPU engine's model states are in host memory already
      return OffloadConfig::Device::kCpu;
    }
    if (device == "nvme") return OffloadConfig::Device::kNvme;
    fail(ZERO_ERR_CONFIG, "config key '" + off.qualified("device") + "' is \"" + device +
                              "\"; valid values: \"none\", \"cpu\", \"nvme\"");
  };
  OffloadConfig& o = cfg.offload;
  o.params = device_of("offload_param");
  if (z.has("offload_param")) {
    const Section off = z.child("offload_param");
    o.param_nvme_path = off.get_string("nvme_path", "");
    o.param_buffer_size = off.get_int("buffer_size", o.param_buffer_size, 1, kMaxInt);
    off.get_int("buffer_count", 5, 1, 1 << 20);
    off.get_int("max_in_cpu", 1000000000, 0, kMaxInt);
    o.pin_params = off.get_bool("pin_memory", false);
    if (o.params_nvme()) {
      if (o.param_nvme_path.empty())
        fail(ZERO_ERR_CONFIG, "config key '" + off.qualified("device") + "' is \"nvme\" but '" +
                                  off.qualified("nvme_path") +
                                  "' is not set; give the directory (on a fast local disk) for each rank's param file");
      if (cfg.stage != 3)
        fail(ZERO_ERR_CONFIG, "config key '" + off.qualified("device") + "' is \"nvme\" at zero_optimization.stage " +
                                  std::to_string(cfg.stage) +
                                  "; offloading the params needs ZeRO stage 3 (as in DeepSpeed), where each rank keeps "
                                  "only its shard of them");
    }
  }
  o.optimizer = device_of("offload_optimizer");
  if (z.has("offload_optimizer")) {
    const Section off = z.child("offload_optimizer");
    o.nvme_path = off.get_string("nvme_path", "");
    o.buffer_count = static_cast<int>(off.get_int("buffer_count", o.buffer_count, 1, 1 << 20));
    o.pin_optimizer = off.get_bool("pin_memory", false);
    for (const char* k : {"fast_init", "pipeline_read", "pipeline_write"}) off.get_bool(k, false);
    if (o.nvme()) {
      if (o.nvme_path.empty())
        fail(ZERO_ERR_CONFIG, "config key '" + off.qualified("device") + "' is \"nvme\" but '" +
                                  off.qualified("nvme_path") +
                                  "' is not set; give the directory (on a fast local disk) where each rank may write "
                                  "its optimizer state file");
      if (cfg.stage == 0)
        fail(ZERO_ERR_CONFIG, "config key '" + off.qualified("device") +
                                  "' is \"nvme\" at zero_optimization.stage 0; offloading the optimizer state needs "
                                  "ZeRO stage 1, 2 or 3 (as in DeepSpeed), where each rank keeps only its shard");
      if (o.buffer_count < 3)
        fail(ZERO_ERR_CONFIG, "config key '" + off.qualified("buffer_count") + "' is " +
                                  std::to_string(o.buffer_count) +
                                  "; NVMe offload streams the state through at least 3 chunks of host memory (one "
                                  "read ahead, one updated, one written behind)");
    }
  }
  o.chunk_elems = sub_group_size > 0 ? sub_group_size : OffloadConfig::kDefaultChunkElems;
}

void parse_aio(const Section& a, Config& cfg) {
  OffloadConfig& o = cfg.offload;
  o.aio_block_size = a.get_int("block_size", o.aio_block_size, 4096, int64_t{1} << 30);
  if (o.aio_block_size % 4096 != 0)
    fail(ZERO_ERR_CONFIG, "config key '" + a.qualified("block_size") + "' is " + std::to_string(o.aio_block_size) +
                              "; direct I/O needs a multiple of 4096 bytes");
  o.aio_queue_depth = static_cast<int>(a.get_int("queue_depth", o.aio_queue_depth, 1, 4096));
  a.get_int("intra_op_parallelism", 1, 1, 4096);
  for (const char* k : {"single_submit", "overlap_events"}) a.get_bool(k, false);
  if (a.get_bool("use_gds", false))
    a.unsupported("use_gds", "GPUDirect Storage needs the GPU engine; the CPU engine reads into host memory");
}

std::string lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

void parse_betas(const Section& p, OptimizerHyper& opt) {
  if (!p.has("betas")) return;
  const json& b = p.raw("betas");
  if (b.is_string() && b.get<std::string>() == "auto")
    fail(ZERO_ERR_CONFIG, "config key '" + p.qualified("betas") + "' is \"auto\"; " + kAutoAdvice);
  if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number())
    fail(ZERO_ERR_CONFIG, "config key '" + p.qualified("betas") + "' must be an array of two numbers, got " + b.dump());
  opt.beta1 = b[0].get<double>();
  opt.beta2 = b[1].get<double>();
  if (!(opt.beta1 >= 0 && opt.beta1 < 1 && opt.beta2 >= 0 && opt.beta2 < 1))
    fail(ZERO_ERR_CONFIG, "config key '" + p.qualified("betas") + "' is " + b.dump() + "; both must be in [0, 1)");
}

// DeepSpeed's optimizer types and parameter names, with the defaults of the optimizer DeepSpeed 0.19.8 builds for
// each (tests/deepspeed/fixtures.json, "optimizers"): FusedAdam for Adam/AdamW (weight_decay 0), torch.optim.AdamW
// with torch_adam (weight_decay 0.01), DeepSpeedCPULion (lr 1e-3, betas (0.9, 0.999)), torch's Adagrad and SGD.
void parse_optimizer(const Section& o, Config& cfg) {
  if (!o.has("type"))
    fail(ZERO_ERR_CONFIG,
         "config key 'optimizer.type' is missing; use one of \"Adam\", \"AdamW\", \"Adagrad\", \"Lion\", \"SGD\"");
  const std::string type = o.get_string("type", "");
  const std::string lower = lowercase(type);
  OptimizerHyper& opt = cfg.optimizer;
  const json empty = json::object();
  const Section p = o.has("params") ? o.child("params") : Section(empty, "optimizer.params", cfg);
  if (p.has("max_grad_norm"))
    fail(ZERO_ERR_CONFIG,
         "config key 'optimizer.params.max_grad_norm' is not an optimizer parameter (DeepSpeed refuses "
         "it too): use the top-level 'gradient_clipping'");
  if (lower == "adam" || lower == "adamw") {
    p.require_known({"lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode", "amsgrad", "torch_adam",
                     "fused", "set_grad_none"});
    opt.lr = p.get_number("lr", 1e-3, 0.0, 1e6);
    parse_betas(p, opt);
    opt.eps = p.get_number("eps", 1e-8, 0.0, 1.0);
    // DeepSpeed: type AdamW always decouples the weight decay; type Adam does too unless adam_w_mode is false.
    const bool decoupled = lower == "adamw" || p.get_bool("adam_w_mode", true);
    const bool torch_adam = p.get_bool("torch_adam", false);
    // FusedAdam's default weight decay is 0; with torch_adam DeepSpeed builds torch.optim.AdamW (0.01) when
    // decoupled and torch.optim.Adam (0) otherwise.
    opt.weight_decay = p.get_number("weight_decay", torch_adam && decoupled ? 0.01 : 0.0, 0.0, 1e6);
    opt.bias_correction = p.get_bool("bias_correction", true);
    if (p.get_bool("amsgrad", false)) p.unsupported("amsgrad", "AMSGrad is not implemented");
    p.get_bool("fused", true);
    p.no_effect("fused");
    p.get_bool("set_grad_none", true);
    p.no_effect("set_grad_none");
    opt.kind = decoupled ? OptimizerKind::kAdamW : OptimizerKind::kAdamL2;
  } else if (lower == "adagrad") {
    p.require_known({"lr", "eps", "weight_decay", "lr_decay", "initial_accumulator_value", "amsgrad"});
    opt.kind = OptimizerKind::kAdagrad;
    opt.lr = p.get_number("lr", 1e-2, 0.0, 1e6);
    opt.eps = p.get_number("eps", 1e-10, 0.0, 1.0);
    opt.weight_decay = p.get_number("weight_decay", 0.0, 0.0, 1e6);
    if (p.get_number("lr_decay", 0.0, 0.0, 1e6) != 0.0) p.unsupported("lr_decay", "use a scheduler instead");
    if (p.get_number("initial_accumulator_value", 0.0, 0.0, 1e30) != 0.0)
      p.unsupported("initial_accumulator_value", "the accumulator starts at 0");
    if (p.get_bool("amsgrad", false)) p.unsupported("amsgrad", "Adagrad has no AMSGrad variant");
  } else if (lower == "lion") {
    p.require_known({"lr", "betas", "weight_decay", "set_grad_none"});
    p.get_bool("set_grad_none", true);
    p.no_effect("set_grad_none");
    opt.kind = OptimizerKind::kLion;
    opt.lr = p.get_number("lr", 1e-3, 0.0, 1e6);
    opt.beta1 = 0.9;
    opt.beta2 = 0.999;
    parse_betas(p, opt);
    opt.weight_decay = p.get_number("weight_decay", 0.0, 0.0, 1e6);
  } else if (lower == "sgd") {
    p.require_known({"lr", "momentum", "dampening", "weight_decay", "nesterov"});
    opt.kind = OptimizerKind::kSgd;
    opt.lr = p.get_number("lr", 1e-3, 0.0, 1e6);  // torch.optim.SGD's default
    opt.momentum = p.get_number("momentum", 0.0, 0.0, 1.0);
    opt.dampening = p.get_number("dampening", 0.0, 0.0, 1.0);
    opt.weight_decay = p.get_number("weight_decay", 0.0, 0.0, 1e6);
    opt.nesterov = p.get_bool("nesterov", false);
    if (opt.nesterov && (opt.momentum == 0.0 || opt.dampening != 0.0))
      fail(ZERO_ERR_CONFIG, "config key 'optimizer.params.nesterov' needs momentum > 0 and dampening 0 (as in torch)");
  } else {
    // DeepSpeed's other optimizers, and torch.optim's (DeepSpeed builds torch.optim.<type> for a name it does not
    // know): valid there, not implemented here.
    const char* later[] = {"lamb",  "onebitadam", "zerooneadam", "onebitlamb", "muadam", "muadamw",
                           "musgd", "muon",       "adafactor",   "adadelta",   "adamax", "asgd",
                           "lbfgs", "nadam",      "radam",       "rmsprop",    "rprop",  "sparseadam"};
    for (const char* l : later)
      if (lower == l) o.unsupported("type", "optimizer \"" + type + "\" is not implemented");
    fail(ZERO_ERR_CONFIG, "config key 'optimizer.type' is \"" + type +
                              "\"; valid values: \"Adam\", \"AdamW\", \"Adagrad\", \"Lion\", \"SGD\"");
  }
}

DType parse_dtype_name(const Section& s, const std::string& key, DType fallback) {
  if (!s.has(key)) return fallback;
  const std::string v = lowercase(s.get_string(key, ""));
  if (v == "fp32" || v == "float32" || v == "float") return DType::kF32;
  if (v == "bf16" || v == "bfloat16") return DType::kBF16;
  if (v == "fp16" || v == "float16" || v == "half") return DType::kF16;
  fail(ZERO_ERR_CONFIG,
       "config key '" + s.qualified(key) + "' is \"" + v + "\"; valid values: \"fp32\", \"bf16\", \"fp16\"");
}

// fp16 / bf16 / amp blocks, communication_data_type and data_types.
void parse_precision(const Section& top, Config& cfg) {
  bool fp16 = false, bf16 = false, check_grad_overflow = true;
  if (top.has("fp16")) {
    Section s = top.child("fp16");
    fp16 = s.get_bool("enabled", false);
    LossScaleConfig& ls = cfg.loss_scale;
    ls.static_scale = s.get_number("loss_scale", 0.0, 0.0, 1e38);
    ls.initial_scale_power = static_cast<int>(s.get_int("initial_scale_power", 16, 0, 127));
    ls.window = s.get_int("loss_scale_window", 1000, 1, kMaxInt);
    ls.hysteresis = static_cast<int>(s.get_int("hysteresis", 2, 1, 1 << 30));
    ls.consecutive_hysteresis = s.get_bool("consecutive_hysteresis", false);
    ls.min_scale = s.get_number("min_loss_scale", 1.0, 1e-38, 1e38);
  }
  if (top.has("bf16")) {
    Section s = top.child("bf16");
    bf16 = s.get_bool("enabled", false);
    s.get_bool("immediate_grad_update", false);
    check_grad_overflow = s.get_bool("check_grad_overflow", true);
    cfg.stochastic_rounding = s.get_bool("stochastic_rounding", false);
    cfg.stochastic_rounding_seed = static_cast<uint32_t>(s.get_int("stochastic_rounding_seed", 0, 0, 0xffffffffll));
  }
  if (fp16 && bf16) fail(ZERO_ERR_CONFIG, "config enables both 'fp16' and 'bf16'; choose one");
  cfg.compute_dtype = bf16 ? DType::kBF16 : fp16 ? DType::kF16 : DType::kF32;
  // DeepSpeed ZeRO 1-2's skip rule: fp16 always checks (the loss scale needs it), bf16 as check_grad_overflow says,
  // fp32 when the norm is computed (zero_optimization.compute_grad_norm, read before this).
  if (fp16)
    cfg.skip_nonfinite_steps = true;
  else if (bf16)
    cfg.skip_nonfinite_steps = check_grad_overflow;
  if (cfg.stochastic_rounding && !bf16)
    fail(ZERO_ERR_CONFIG, "config key 'bf16.stochastic_rounding' needs 'bf16.enabled': true");
  cfg.comm_dtype = parse_dtype_name(top, "communication_data_type", cfg.compute_dtype);
  cfg.grad_accum_dtype = DType::kF32;
  if (top.has("data_types")) {
    Section d = top.child("data_types");
    cfg.grad_accum_dtype = parse_dtype_name(d, "grad_accum_dtype", DType::kF32);
  }
  // Reductions run in place in the gradient buffers, so the communication dtype may not be wider than them.
  if (dtype_size(cfg.comm_dtype) > dtype_size(cfg.grad_accum_dtype))
    top.unsupported("communication_data_type",
                    std::string("communicating in ") + dtype_name(cfg.comm_dtype) + " with " +
                        dtype_name(cfg.grad_accum_dtype) +
                        " gradient accumulation; accumulate in fp32 "
                        "(data_types.grad_accum_dtype) or communicate in the accumulation dtype");
}

void parse_scheduler(const Section& sch, Config& cfg) {
  if (!sch.has("type")) {  // DeepSpeed: a scheduler block without a type is no scheduler
    cfg.warnings.push_back(
        "config block 'scheduler' has no 'type': no learning-rate schedule is used (as in "
        "DeepSpeed), and its params have no effect");
    return;
  }
  const std::string type = sch.get_string("type", "");
  const json empty = json::object();
  const Section p = sch.has("params") ? sch.child("params") : Section(empty, "scheduler.params", cfg);
  SchedulerConfig& s = cfg.scheduler;
  auto warmup_type = [&]() {
    const std::string t = p.get_string("warmup_type", "log");
    if (t != "log" && t != "linear")
      fail(ZERO_ERR_CONFIG, "config key 'scheduler.params.warmup_type' is \"" + t + "\"; valid: \"log\", \"linear\"");
    return t == "log";
  };
  if (type == "WarmupLR" || type == "WarmupDecayLR") {
    if (type == "WarmupLR")
      p.require_known({"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"});
    else
      p.require_known({"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                       "last_batch_iteration"});
    s.kind = type == "WarmupLR" ? SchedulerConfig::Kind::kWarmupLR : SchedulerConfig::Kind::kWarmupDecayLR;
    s.warmup_min_lr = p.get_number("warmup_min_lr", 0.0, 0.0, 1e6);
    // Without warmup_max_lr, DeepSpeed's WarmupLR warms each group up to its own lr; WarmupDecayLR's default is
    // 0.001 (its signature's).
    s.warmup_max_lr_given = p.has("warmup_max_lr") || type == "WarmupDecayLR";
    s.warmup_max_lr = p.get_number("warmup_max_lr", 0.001, 0.0, 1e6);
    s.warmup_num_steps = p.get_int("warmup_num_steps", 1000, 1, kMaxInt);
    s.warmup_log = warmup_type();
    if (type == "WarmupDecayLR") {
      if (!p.has("total_num_steps"))
        fail(ZERO_ERR_CONFIG, "config key 'scheduler.params.total_num_steps' is required for WarmupDecayLR");
      s.total_num_steps = p.get_int("total_num_steps", 0, 1, kMaxInt);
    }
  } else if (type == "WarmupCosineLR") {
    p.require_known({"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type",
                     "last_batch_iteration"});
    s.kind = SchedulerConfig::Kind::kWarmupCosineLR;
    if (!p.has("total_num_steps"))
      fail(ZERO_ERR_CONFIG, "config key 'scheduler.params.total_num_steps' is required for WarmupCosineLR");
    s.total_num_steps = p.get_int("total_num_steps", 0, 1, kMaxInt);
    s.warmup_min_ratio = p.get_number("warmup_min_ratio", 0.0, 0.0, 1.0);
    s.warmup_num_steps = p.get_int("warmup_num_steps", 1000, 1, kMaxInt);
    s.cos_min_ratio = p.get_number("cos_min_ratio", 0.0001, 0.0, 1.0);
    s.warmup_log = warmup_type();
  } else if (type == "LRRangeTest" || type == "OneCycle") {
    sch.unsupported("type",
                    "scheduler \"" + type + "\" is not implemented; use WarmupLR, WarmupDecayLR or WarmupCosineLR");
  } else {
    fail(ZERO_ERR_CONFIG, "config key 'scheduler.type' is \"" + type +
                              "\"; valid values: \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\"");
  }
  if (s.kind != SchedulerConfig::Kind::kWarmupLR && s.total_num_steps < std::max<int64_t>(2, s.warmup_num_steps))
    cfg.warnings.push_back("scheduler.params.total_num_steps (" + std::to_string(s.total_num_steps) +
                           ") is less than warmup_num_steps (" +
                           std::to_string(std::max<int64_t>(2, s.warmup_num_steps)) +
                           "): the schedule ends at the end of its warmup (DeepSpeed accepts this too)");
  if (p.get_int("last_batch_iteration", -1, -1, kMaxInt) != -1)
    p.unsupported("last_batch_iteration", "resuming a schedule comes with checkpoints");
}

// a x b, or a config error naming what overflowed (the keys allow up to 2^53 each).
int64_t batch_product(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r) || r > kMaxInt)
    fail(ZERO_ERR_CONFIG, std::string("inconsistent batch sizes: ") + what + " (" + std::to_string(a) + " x " +
                              std::to_string(b) + ") is beyond 2^53");
  return r;
}

// train_batch_size = micro batch x accumulation steps x world size; any two determine the third.
void resolve_batch(const Section& top, Config& cfg, int world) {
  bool has_tbs = top.has("train_batch_size"), has_mb = top.has("train_micro_batch_size_per_gpu"),
       has_gas = top.has("gradient_accumulation_steps");
  int64_t tbs = top.get_int("train_batch_size", 0, 1, kMaxInt);
  int64_t mb = top.get_int("train_micro_batch_size_per_gpu", 0, 1, kMaxInt);
  int64_t gas = top.get_int("gradient_accumulation_steps", 1, 1, 1 << 20);
  const char* const kMbWorld = "train_micro_batch_size_per_gpu x world size";
  const char* const kGasWorld = "gradient_accumulation_steps x world size";
  if (has_tbs && has_mb && has_gas) {
    const int64_t mb_gas_world = batch_product(batch_product(mb, gas,
                                                             "train_micro_batch_size_per_gpu x "
                                                             "gradient_accumulation_steps"),
                                               world,
                                               "train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
                                               "world size");
    if (tbs != mb_gas_world) {
      std::ostringstream os;
      os << "inconsistent batch sizes: train_batch_size (" << tbs << ") must equal train_micro_batch_size_per_gpu ("
         << mb << ") x gradient_accumulation_steps (" << gas << ") x world size (" << world << ") = " << mb_gas_world;
      fail(ZERO_ERR_CONFIG, os.str());
    }
  } else if (has_tbs && has_mb) {
    const int64_t mb_world = batch_product(mb, world, kMbWorld);
    if (tbs % mb_world != 0)
      fail(ZERO_ERR_CONFIG, "inconsistent batch sizes: train_batch_size (" + std::to_string(tbs) +
                                ") is not divisible by train_micro_batch_size_per_gpu (" + std::to_string(mb) +
                                ") x world size (" + std::to_string(world) + ")");
    gas = tbs / mb_world;
    if (gas > (1 << 20))
      fail(ZERO_ERR_CONFIG, "train_batch_size / (train_micro_batch_size_per_gpu x world size) gives " +
                                std::to_string(gas) + " accumulation steps; at most 2^20 are allowed");
  } else if (has_tbs && has_gas) {
    const int64_t gas_world = batch_product(gas, world, kGasWorld);
    if (tbs % gas_world != 0)
      fail(ZERO_ERR_CONFIG, "inconsistent batch sizes: train_batch_size (" + std::to_string(tbs) +
                                ") is not divisible by gradient_accumulation_steps (" + std::to_string(gas) +
                                ") x world size (" + std::to_string(world) + ")");
    mb = tbs / gas_world;
  } else if (has_mb && has_gas) {
    tbs = batch_product(batch_product(mb, gas, "train_micro_batch_size_per_gpu x gradient_accumulation_steps"), world,
                        "train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size");
  } else if (has_tbs) {
    if (tbs % world != 0)
      fail(ZERO_ERR_CONFIG, "inconsistent batch sizes: train_batch_size (" + std::to_string(tbs) +
                                ") is not divisible by the world size (" + std::to_string(world) + ")");
    gas = 1;
    mb = tbs / world;
  } else if (has_mb) {
    gas = 1;
    tbs = batch_product(mb, world, kMbWorld);
  }
  cfg.train_batch_size = tbs;
  cfg.train_micro_batch_size_per_gpu = mb;
  cfg.gradient_accumulation_steps = gas;
}

}  // namespace

double timeout_from_environment(double fallback) {
  const char* env = std::getenv("ZERO_TIMEOUT_S");
  if (env == nullptr || env[0] == '\0') return fallback;
  char* end = nullptr;
  const double t = std::strtod(env, &end);
  if (end == env || *end != '\0' || !(t >= 1e-3 && t <= 1e9))
    fail(ZERO_ERR_CONFIG, std::string("the environment variable ZERO_TIMEOUT_S is '") + env +
                              "'; it must be a number of seconds in [0.001, 1e9]");
  return t;
}

Config parse_config(const std::string& json_text, int world_size) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& e) {
    fail(ZERO_ERR_CONFIG, std::string("the config is not valid JSON: ") + e.what());
  } catch (const json::out_of_range& e) {  // a number beyond double's range, such as 1e400
    fail(ZERO_ERR_CONFIG, std::string("the config has a number out of range: ") + e.what());
  } catch (const json::exception& e) {
    fail(ZERO_ERR_CONFIG, std::string("the config cannot be read: ") + e.what());
  }
  check_duplicate_keys(json_text);
  Config cfg;
  cfg.source_json = json_text;
  // Every key first (unknown ones all at once, then refused ones), so that a typo is never hidden behind a later
  // complaint about a missing block.
  check_config_keys(root, cfg.no_effect_keys, cfg.spelled_as);
  Section top(root, "", cfg);

  resolve_batch(top, cfg, world_size);
  cfg.gradient_clipping = top.get_number("gradient_clipping", 1.0, 0.0, 1e30);

  if (!top.has("optimizer"))
    fail(ZERO_ERR_CONFIG,
         "the config has no 'optimizer' block; libzero runs the optimizer itself, e.g. "
         "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}");
  parse_optimizer(top.child("optimizer"), cfg);
  if (top.has("zero_optimization")) parse_zero_optimization(top.child("zero_optimization"), cfg);
  parse_precision(top, cfg);
  if (top.has("scheduler")) parse_scheduler(top.child("scheduler"), cfg);
  if (top.has("aio")) parse_aio(top.child("aio"), cfg);
  top.get_int("steps_per_print", 10, 0, kMaxInt);

  if (top.has("libzero")) {
    const Section l = top.child("libzero");
    cfg.timeout_s = l.get_number("timeout_s", cfg.timeout_s, 1e-3, 1e9);
    cfg.optimizer_threads = static_cast<int>(l.get_int("optimizer_threads", 0, 0, 4096));
    cfg.require_deterministic = l.get_bool("deterministic", false);
    cfg.allow_any_order = l.has("deterministic") && !cfg.require_deterministic;
  }
  cfg.timeout_s = timeout_from_environment(cfg.timeout_s);
  return cfg;
}

}  // namespace zero
