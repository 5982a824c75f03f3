// Two views of a parsed config: the settings ranks must agree on (compared at finalize, reported by key), and the
// human summary of `zero-config check` / zero_config_check().
#include <cstdio>
#include <sstream>

#include "config/config.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

std::string number(double v) { return exact_decimal(v); }

// The optimizer with the kind of weight decay it applies (Adam's two modes differ only there).
std::string optimizer_kind_name(OptimizerKind k) {
  const std::string name = optimizer_name(k);
  if (k == OptimizerKind::kAdamW) return name + " (decoupled weight decay)";
  if (k == OptimizerKind::kAdamL2) return name + " (L2 weight decay)";
  return name;
}

const char* scheduler_name(SchedulerConfig::Kind k) {
  switch (k) {
    case SchedulerConfig::Kind::kNone:
      return "none";
    case SchedulerConfig::Kind::kWarmupLR:
      return "WarmupLR";
    case SchedulerConfig::Kind::kWarmupDecayLR:
      return "WarmupDecayLR";
    case SchedulerConfig::Kind::kWarmupCosineLR:
      return "WarmupCosineLR";
  }
  return "?";
}

}  // namespace

std::vector<std::string> result_settings(const Config& c) {
  std::vector<std::string> out;
  auto add = [&](const char* key, const std::string& value) { out.push_back(std::string("'") + key + "' = " + value); };
  auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  add("zero_optimization.stage", std::to_string(c.stage));
  add("zero_optimization.reduce_bucket_size", std::to_string(c.reduce_bucket_size));
  add("zero_optimization.allgather_bucket_size", std::to_string(c.allgather_bucket_size));
  add("zero_optimization.stage3_param_persistence_threshold", std::to_string(c.param_persistence_threshold));
  add("zero_optimization.overlap_comm", flag(c.overlap_comm));
  // A backend's reduce-scatter algorithm follows it (the NCCL module's exchange or NCCL's own): every rank alike.
  add("libzero.deterministic = false (sums in any order)", flag(c.allow_any_order));
  add("zero_optimization.stage3_prefetch_bucket_size", std::to_string(c.prefetch_bucket_size));
  add("zero_optimization.stage3_max_live_parameters", std::to_string(c.max_live_parameters));
  add("zero_optimization.stage3_max_reuse_distance", std::to_string(c.max_reuse_distance));
  add("zero_optimization.stage3_gather_16bit_weights_on_model_save", flag(c.gather_16bit_weights_on_save));
  add("gradient_accumulation_steps", std::to_string(c.gradient_accumulation_steps));
  add("train_micro_batch_size_per_gpu", std::to_string(c.train_micro_batch_size_per_gpu));
  add("train_batch_size", std::to_string(c.train_batch_size));
  add("gradient_clipping", number(c.gradient_clipping));
  add("bf16.check_grad_overflow / zero_optimization.compute_grad_norm (non-finite steps skipped)",
      flag(c.skip_nonfinite_steps));
  const OptimizerHyper& o = c.optimizer;
  add("optimizer.type", optimizer_kind_name(o.kind));
  add("optimizer.params.lr", number(o.lr));
  add("optimizer.params.betas", "[" + number(o.beta1) + ", " + number(o.beta2) + "]");
  add("optimizer.params.eps", number(o.eps));
  add("optimizer.params.weight_decay", number(o.weight_decay));
  add("optimizer.params.bias_correction", flag(o.bias_correction));
  add("optimizer.params.momentum", number(o.momentum));
  add("optimizer.params.dampening", number(o.dampening));
  add("optimizer.params.nesterov", flag(o.nesterov));
  add("bf16.enabled / fp16.enabled (the compute dtype)", dtype_name(c.compute_dtype));
  add("communication_data_type", dtype_name(c.comm_dtype));
  add("data_types.grad_accum_dtype", dtype_name(c.grad_accum_dtype));
  add("bf16.stochastic_rounding", flag(c.stochastic_rounding));
  add("bf16.stochastic_rounding_seed", std::to_string(c.stochastic_rounding_seed));
  const LossScaleConfig& l = c.loss_scale;
  add("fp16.loss_scale", number(l.static_scale));
  add("fp16.initial_scale_power", std::to_string(l.initial_scale_power));
  add("fp16.loss_scale_window", std::to_string(l.window));
  add("fp16.hysteresis", std::to_string(l.hysteresis));
  add("fp16.consecutive_hysteresis", flag(l.consecutive_hysteresis));
  add("fp16.min_loss_scale", number(l.min_scale));
  const SchedulerConfig& s = c.scheduler;
  add("scheduler.type", scheduler_name(s.kind));
  add("scheduler.params.warmup_min_lr", number(s.warmup_min_lr));
  add("scheduler.params.warmup_max_lr", s.warmup_max_lr_given ? number(s.warmup_max_lr) : "each group's lr");
  add("scheduler.params.warmup_num_steps", std::to_string(s.warmup_num_steps));
  add("scheduler.params.warmup_type", s.warmup_log ? "log" : "linear");
  add("scheduler.params.total_num_steps", std::to_string(s.total_num_steps));
  add("scheduler.params.warmup_min_ratio", number(s.warmup_min_ratio));
  add("scheduler.params.cos_min_ratio", number(s.cos_min_ratio));
  return out;
}

std::string config_report(const Config& c, int world) {
  std::ostringstream os;
  char line[512];
  auto put = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof line, fmt, args...);
    os << line;
  };
  put("accepted by libzero for world size %d\n", world);
  put("  zero stage             %d\n", c.stage);
  put("  gradient accumulation  %lld micro-steps per step\n", static_cast<long long>(c.gradient_accumulation_steps));
  if (c.train_batch_size > 0 && c.train_micro_batch_size_per_gpu > 0)
    put("  batch                  train_batch_size %lld = micro %lld x accumulation %lld x world %d\n",
        static_cast<long long>(c.train_batch_size), static_cast<long long>(c.train_micro_batch_size_per_gpu),
        static_cast<long long>(c.gradient_accumulation_steps), world);
  const OptimizerHyper& o = c.optimizer;
  switch (o.kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdamL2:
      put("  optimizer              %s lr %g betas (%g, %g) eps %g weight_decay %g%s\n",
          optimizer_kind_name(o.kind).c_str(), o.lr, o.beta1, o.beta2, o.eps, o.weight_decay,
          o.bias_correction ? "" : " (no bias correction)");
      break;
    case OptimizerKind::kAdagrad:
      put("  optimizer              Adagrad lr %g eps %g weight_decay %g\n", o.lr, o.eps, o.weight_decay);
      break;
    case OptimizerKind::kLion:
      put("  optimizer              Lion lr %g betas (%g, %g) weight_decay %g\n", o.lr, o.beta1, o.beta2,
          o.weight_decay);
      break;
    case OptimizerKind::kSgd:
      put("  optimizer              SGD lr %g momentum %g dampening %g weight_decay %g%s\n", o.lr, o.momentum,
          o.dampening, o.weight_decay, o.nesterov ? " nesterov" : "");
      break;
  }
  const SchedulerConfig& s = c.scheduler;
  switch (s.kind) {
    case SchedulerConfig::Kind::kNone:
      os << "  lr schedule            none (constant; zero_set_lr may change it)\n";
      break;
    case SchedulerConfig::Kind::kWarmupLR:
      if (s.warmup_max_lr_given)
        put("  lr schedule            WarmupLR %g -> %g over %lld steps (%s)\n", s.warmup_min_lr, s.warmup_max_lr,
            static_cast<long long>(s.warmup_num_steps), s.warmup_log ? "log" : "linear");
      else
        put("  lr schedule            WarmupLR %g -> each group's lr over %lld steps (%s)\n", s.warmup_min_lr,
            static_cast<long long>(s.warmup_num_steps), s.warmup_log ? "log" : "linear");
      break;
    case SchedulerConfig::Kind::kWarmupDecayLR:
      put("  lr schedule            WarmupDecayLR %g -> %g over %lld steps (%s), to 0 at step %lld\n", s.warmup_min_lr,
          s.warmup_max_lr, static_cast<long long>(s.warmup_num_steps), s.warmup_log ? "log" : "linear",
          static_cast<long long>(s.total_num_steps));
      break;
    case SchedulerConfig::Kind::kWarmupCosineLR:
      put("  lr schedule            WarmupCosineLR ratio %g -> 1 over %lld steps (%s), cosine to %g at step %lld\n",
          s.warmup_min_ratio, static_cast<long long>(s.warmup_num_steps), s.warmup_log ? "log" : "linear",
          s.cos_min_ratio, static_cast<long long>(s.total_num_steps));
      break;
  }
  put("  dtypes                 params %s, gradients %s, communication %s, master and state fp32%s\n",
      dtype_name(c.compute_dtype), dtype_name(c.grad_accum_dtype), dtype_name(c.comm_dtype),
      c.stochastic_rounding ? " (stochastic rounding)" : "");
  if (c.compute_dtype == DType::kF16) {
    if (c.loss_scale.static_scale > 0)
      put("  loss scale             static %g\n", c.loss_scale.static_scale);
    else
      put("  loss scale             dynamic from 2^%d, window %lld, hysteresis %d, min %g\n",
          c.loss_scale.initial_scale_power, static_cast<long long>(c.loss_scale.window), c.loss_scale.hysteresis,
          c.loss_scale.min_scale);
  }
  if (c.gradient_clipping > 0)
    put("  gradient clipping      global norm %g\n", c.gradient_clipping);
  else
    os << "  gradient clipping      off\n";
  if (c.skip_nonfinite_steps)
    os << "  non-finite gradients   the step is skipped\n";
  else
    os << "  non-finite gradients   the step is applied (the overflow check is off)"
       << (c.gradient_clipping > 0 ? "\n"
           : c.stage > 0           ? "; the optimizer pass sums the norm\n"
                                   : "; at one rank the optimizer pass sums the norm\n");
  if (c.stage >= 2) put("  reduce bucket          %lld elements\n", static_cast<long long>(c.reduce_bucket_size));
  if (c.stage >= 1)
    os << "  overlap_comm           "
       << (c.overlap_comm ? (c.stage >= 2 ? "on (up to two buckets reduced while backward goes on; new params "
                                            "all-gathered in the background after the step)\n"
                                          : "on (new params all-gathered in the background after the step)\n")
                          : "off\n");
  if (c.stage == 3) {
    if (c.prefetch_bucket_size > 0)
      put("  prefetch               up to %lld elements ahead of zero_gather (stage3_prefetch_bucket_size)\n",
          static_cast<long long>(c.prefetch_bucket_size));
    else
      os << "  prefetch               off (stage3_prefetch_bucket_size 0)\n";
    if (c.max_reuse_distance > 0)
      put("  reuse                  released units kept gathered when needed again within %lld elements "
          "(stage3_max_reuse_distance)\n",
          static_cast<long long>(c.max_reuse_distance));
    if (c.prefetch_bucket_size > 0 || c.max_reuse_distance > 0)
      put("  live params            at most %lld elements gathered ahead or kept (stage3_max_live_parameters)\n",
          static_cast<long long>(c.max_live_parameters));
  }
  if (c.stage == 3)
    put("  persistence threshold  %lld elements (smaller units stay resident)\n",
        static_cast<long long>(c.param_persistence_threshold));
  if (c.offload.nvme())
    put("  offload                %s to NVMe: a file per rank under '%s', streamed "
        "through %d chunks of %lld elements (aio: %lld-byte requests, %d in flight)\n",
        c.compute_dtype == DType::kF32 ? "optimizer state (fp32 params are their own master)"
                                       : "fp32 master and optimizer state",
        c.offload.nvme_path.c_str(), c.offload.buffer_count, static_cast<long long>(c.offload.chunk_elems),
        static_cast<long long>(c.offload.aio_block_size), c.offload.aio_queue_depth);
  else
    os << "  offload                optimizer state in host memory\n";
  if (c.offload.params_nvme())
    put("  offload params         stage 3's param shards%s to NVMe: a file per rank under '%s', read through a "
        "buffer of up to %lld elements (at most one shard)\n",
        c.compute_dtype == DType::kF32 ? " (fp32: the optimizer's master too)" : "", c.offload.param_nvme_path.c_str(),
        static_cast<long long>(c.offload.param_buffer_size));
  put("  collective timeout     %g s\n", c.timeout_s);
  if (c.require_deterministic) os << "  deterministic sums     required (libzero.deterministic)\n";
  if (c.allow_any_order) os << "  deterministic sums     given up: sums in any order allowed (libzero.deterministic)\n";
  if (c.optimizer_threads > 0)
    put("  optimizer threads      %d\n", c.optimizer_threads);
  else
    os << "  optimizer threads      automatic (OMP_NUM_THREADS, else cores / ranks on the node)\n";
  if (!c.no_effect_keys.empty()) {
    os << "  no effect              ";
    for (size_t i = 0; i < c.no_effect_keys.size(); ++i) os << (i ? ", " : "") << c.no_effect_keys[i];
    os << "\n";
  }
  return os.str();
}

}  // namespace zero
