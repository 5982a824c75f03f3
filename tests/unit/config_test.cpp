#include <gtest/gtest.h>

#include <algorithm>

#include <string>

#include "config/config.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

const char* kOptimizer = R"("optimizer": {"type": "AdamW", "params": {"lr": 0.001}})";

std::string with_optimizer(const std::string& rest) {
  return "{" + std::string(kOptimizer) + (rest.empty() ? "" : ", " + rest) + "}";
}

// Parses and expects a failure; returns the message.
std::string parse_error(const std::string& json, zero_status_t want, int world = 1) {
  try {
    parse_config(json, world);
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), want) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error for " << json;
  return "";
}

TEST(Config, Defaults) {
  Config c = parse_config(with_optimizer(""), 4);
  EXPECT_EQ(c.stage, 0);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.param_persistence_threshold, 100000);
  EXPECT_EQ(c.gradient_clipping, 1.0);  // DeepSpeed's GRADIENT_CLIPPING_DEFAULT (tests/deepspeed/README.md)
  EXPECT_EQ(c.optimizer.kind, OptimizerKind::kAdamW);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.001);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.0);  // DeepSpeed builds FusedAdam, whose default is 0
  EXPECT_TRUE(c.no_effect_keys.empty());
}

TEST(Config, ZeroOptimizationBlock) {
  Config c = parse_config(with_optimizer(R"("zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8,
      "contiguous_gradients": false, "stage3_param_persistence_threshold": 1e4})"),
                          2);
  EXPECT_EQ(c.stage, 3);
  EXPECT_EQ(c.reduce_bucket_size, 500000000);
  EXPECT_FALSE(c.contiguous_gradients);
  EXPECT_EQ(c.param_persistence_threshold, 10000);
}

TEST(Config, UnknownKeysNameTheNearestValidKey) {
  std::string m = parse_error(with_optimizer(R"("zero_optimisation": {"stage": 1})"), ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("'zero_optimisation'"), std::string::npos) << m;
  EXPECT_NE(m.find("did you mean 'zero_optimization'"), std::string::npos) << m;
  m = parse_error(with_optimizer(R"("zero_optimization": {"stagee": 1})"), ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("'zero_optimization.stagee'"), std::string::npos) << m;
  EXPECT_NE(m.find("did you mean 'zero_optimization.stage'"), std::string::npos) << m;
  m = parse_error(R"({"optimizer": {"type": "AdamW", "params": {"learning_rate": 1}}})", ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("optimizer.params.learning_rate"), std::string::npos) << m;
}

// Every supported key with a value of the wrong type is an error naming that key.
TEST(Config, EveryKeyWithAWrongTypeIsNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("zero_optimization": {"stage": "2"})", "zero_optimization.stage"},
      {R"("zero_optimization": {"stage": 1.5})", "zero_optimization.stage"},
      {R"("zero_optimization": {"reduce_bucket_size": true})", "zero_optimization.reduce_bucket_size"},
      {R"("zero_optimization": {"allgather_bucket_size": "big"})", "zero_optimization.allgather_bucket_size"},
      {R"("zero_optimization": {"contiguous_gradients": 1})", "zero_optimization.contiguous_gradients"},
      {R"("zero_optimization": {"overlap_comm": "yes"})", "zero_optimization.overlap_comm"},
      {R"("zero_optimization": {"stage3_param_persistence_threshold": []})",
       "zero_optimization.stage3_param_persistence_threshold"},
      {R"("zero_optimization": {"stage3_prefetch_bucket_size": "x"})", "zero_optimization.stage3_prefetch_bucket_size"},
      {R"("zero_optimization": {"stage3_max_live_parameters": -1})", "zero_optimization.stage3_max_live_parameters"},
      {R"("zero_optimization": {"sub_group_size": 0.5})", "zero_optimization.sub_group_size"},
      {R"("zero_optimization": 3)", "zero_optimization"},
      {R"("gradient_accumulation_steps": "4")", "gradient_accumulation_steps"},
      {R"("gradient_accumulation_steps": 0)", "gradient_accumulation_steps"},
      {R"("train_batch_size": 2.5)", "train_batch_size"},
      {R"("train_micro_batch_size_per_gpu": null, "train_batch_size": {})", "train_batch_size"},
      {R"("gradient_clipping": "1.0")", "gradient_clipping"},
      {R"("gradient_clipping": -1)", "gradient_clipping"},
      {R"("steps_per_print": "10")", "steps_per_print"},
      {R"("fp16": {"enabled": "false"})", "fp16.enabled"},
      {R"("bf16": [])", "bf16"},
  };
  for (const auto& [rest, key] : cases) {
    std::string m = parse_error(with_optimizer(rest), ZERO_ERR_CONFIG, 2);
    EXPECT_NE(m.find(std::string("'") + key + "'"), std::string::npos) << rest << " -> " << m;
  }
  const std::pair<const char*, const char*> optimizer_cases[] = {
      {R"({"optimizer": {"type": 3}})", "optimizer.type"},
      {R"({"optimizer": {"type": "AdamW", "params": {"lr": "0.1"}}})", "optimizer.params.lr"},
      {R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})", "optimizer.params.betas"},
      {R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1.5]}}})", "optimizer.params.betas"},
      {R"({"optimizer": {"type": "AdamW", "params": {"eps": "tiny"}}})", "optimizer.params.eps"},
      {R"({"optimizer": {"type": "AdamW", "params": {"weight_decay": false}}})", "optimizer.params.weight_decay"},
      {R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": 0}}})", "optimizer.params.adam_w_mode"},
      {R"({"optimizer": {"type": "Adam", "params": {"bias_correction": "no"}}})", "optimizer.params.bias_correction"},
  };
  for (const auto& [json, key] : optimizer_cases) {
    std::string m = parse_error(json, ZERO_ERR_CONFIG);
    EXPECT_NE(m.find(std::string("'") + key + "'"), std::string::npos) << json << " -> " << m;
  }
}

TEST(Config, StageOutOfRange) {
  std::string m = parse_error(with_optimizer(R"("zero_optimization": {"stage": 4})"), ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("[0, 3]"), std::string::npos) << m;
}

TEST(Config, BatchSizesAnyTwoDetermineTheThird) {
  Config c = parse_config(with_optimizer(R"("train_batch_size": 32, "train_micro_batch_size_per_gpu": 4)"), 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  c = parse_config(with_optimizer(R"("train_batch_size": 32, "gradient_accumulation_steps": 2)"), 2);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  c = parse_config(with_optimizer(R"("train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5)"), 2);
  EXPECT_EQ(c.train_batch_size, 30);
  c = parse_config(with_optimizer(R"("train_batch_size": 16)"), 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  c = parse_config(
      with_optimizer(
          R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4)"),
      2);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
}

TEST(Config, InconsistentBatchSizesShowTheArithmetic) {
  std::string m = parse_error(
      with_optimizer(
          R"("train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2)"),
      ZERO_ERR_CONFIG, 2);
  EXPECT_NE(m.find("train_batch_size (32) must equal train_micro_batch_size_per_gpu (4) x "
                   "gradient_accumulation_steps (2) x world size (2) = 16"),
            std::string::npos)
      << m;
  m = parse_error(with_optimizer(R"("train_batch_size": 30, "train_micro_batch_size_per_gpu": 4)"), ZERO_ERR_CONFIG, 2);
  EXPECT_NE(m.find("not divisible"), std::string::npos) << m;
}

TEST(Config, KeysThatChangeResultsAreRefusedUntilSupported) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("scheduler": {"type": "OneCycle"})", "scheduler.type"},
      {R"("bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "bf16"}, "communication_data_type": "fp32")",
       "communication_data_type"},
      {R"("amp": {"enabled": true})", "amp"},
      {R"("prescale_gradients": true)", "prescale_gradients"},
      {R"("gradient_predivide_factor": 2.0)", "gradient_predivide_factor"},
      {R"("fp16": {"enabled": true, "fp16_master_weights_and_grads": true})", "fp16.fp16_master_weights_and_grads"},
  };
  for (const auto& [rest, key] : cases) {
    std::string m = parse_error(with_optimizer(rest), ZERO_ERR_UNSUPPORTED);
    EXPECT_NE(m.find(std::string("'") + key + "'"), std::string::npos) << rest << " -> " << m;
    EXPECT_NE(m.find("not supported"), std::string::npos) << m;
  }
  // The neutral values of the same keys are fine.
  parse_config(with_optimizer(R"("fp16": {"enabled": false}, "bf16": {"enabled": false},
      "zero_optimization": {"offload_optimizer": {"device": "none"}}, "communication_data_type": "fp32")"),
               1);
}

TEST(Config, MixedPrecision) {
  Config c = parse_config(with_optimizer(R"("bf16": {"enabled": true})"), 1);
  EXPECT_EQ(c.compute_dtype, DType::kBF16);
  EXPECT_EQ(c.comm_dtype, DType::kBF16);  // defaults to the compute dtype
  EXPECT_EQ(c.grad_accum_dtype, DType::kF32);
  c = parse_config(with_optimizer(R"("fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
      "loss_scale_window": 500, "hysteresis": 3, "consecutive_hysteresis": true, "min_loss_scale": 2},
      "communication_data_type": "fp32")"),
                   1);
  EXPECT_EQ(c.compute_dtype, DType::kF16);
  EXPECT_EQ(c.comm_dtype, DType::kF32);
  EXPECT_EQ(c.loss_scale.initial_scale_power, 12);
  EXPECT_EQ(c.loss_scale.window, 500);
  EXPECT_EQ(c.loss_scale.hysteresis, 3);
  EXPECT_TRUE(c.loss_scale.consecutive_hysteresis);
  EXPECT_EQ(c.loss_scale.min_scale, 2.0);
  c = parse_config(with_optimizer(R"("bf16": {"enabled": true, "stochastic_rounding": true,
      "stochastic_rounding_seed": 7}, "data_types": {"grad_accum_dtype": "bf16"})"),
                   1);
  EXPECT_EQ(c.grad_accum_dtype, DType::kBF16);
  EXPECT_TRUE(c.stochastic_rounding);
  EXPECT_EQ(c.stochastic_rounding_seed, 7u);
  std::string m =
      parse_error(with_optimizer(R"("bf16": {"enabled": true}, "fp16": {"enabled": true})"), ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("both"), std::string::npos) << m;
  m = parse_error(with_optimizer(R"("communication_data_type": "int8")"), ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("'communication_data_type'"), std::string::npos) << m;
  m = parse_error(with_optimizer(R"("bf16": {"stochastic_rounding": true})"), ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("bf16.enabled"), std::string::npos) << m;
}

TEST(Config, OptimizersAndSchedulersWithDeepSpeedNames) {
  Config c = parse_config(R"({"optimizer": {"type": "Adagrad", "params": {"lr": 0.1}}})", 1);
  EXPECT_EQ(c.optimizer.kind, OptimizerKind::kAdagrad);
  EXPECT_EQ(c.optimizer.eps, 1e-10);
  c = parse_config(R"({"optimizer": {"type": "Lion", "params": {"lr": 1e-4, "betas": [0.95, 0.98],
      "weight_decay": 0.1}}})",
                   1);
  EXPECT_EQ(c.optimizer.kind, OptimizerKind::kLion);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.98);
  c = parse_config(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true}}})", 1);
  EXPECT_EQ(c.optimizer.kind, OptimizerKind::kSgd);
  EXPECT_TRUE(c.optimizer.nesterov);
  c = parse_config(R"({"optimizer": {"type": "SGD", "params": {"momentum": 0.9}}})", 1);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);  // torch.optim.SGD's default, which DeepSpeed builds
  parse_error(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "nesterov": true}}})", ZERO_ERR_CONFIG);
  c = parse_config(with_optimizer(R"("scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100,
      "warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 10, "warmup_type": "linear"}})"),
                   1);
  EXPECT_EQ(c.scheduler.kind, SchedulerConfig::Kind::kWarmupDecayLR);
  EXPECT_FALSE(c.scheduler.warmup_log);
  c = parse_config(with_optimizer(R"("scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100,
      "warmup_num_steps": 10, "cos_min_ratio": 0.1, "warmup_min_ratio": 0.01}})"),
                   1);
  EXPECT_EQ(c.scheduler.kind, SchedulerConfig::Kind::kWarmupCosineLR);
  std::string m =
      parse_error(with_optimizer(R"("scheduler": {"type": "WarmupCosineLR", "params": {}})"), ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("total_num_steps"), std::string::npos) << m;
  m = parse_error(with_optimizer(R"("scheduler": {"type": "WarmupLR", "params": {"warmup_max": 1}})"), ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("did you mean 'scheduler.params.warmup_max_lr'"), std::string::npos) << m;
}

TEST(Config, TuningKnobsAreAcceptedAndReported) {
  Config c = parse_config(with_optimizer(R"("zero_optimization": {"stage": 3, "overlap_comm": true,
      "stage3_prefetch_bucket_size": 5e7, "stage3_max_live_parameters": 1e9, "sub_group_size": 1e9},
      "steps_per_print": 100, "wall_clock_breakdown": false)"),
                          1);
  std::vector<std::string> want = {"steps_per_print", "wall_clock_breakdown"};
  for (const auto& k : want)
    EXPECT_NE(std::find(c.no_effect_keys.begin(), c.no_effect_keys.end(), k), c.no_effect_keys.end()) << k;
  // overlap_comm and the stage-3 fetch keys are honoured: not among them.
  EXPECT_TRUE(c.overlap_comm);
  for (const char* k : {"zero_optimization.overlap_comm", "zero_optimization.stage3_prefetch_bucket_size",
                        "zero_optimization.stage3_max_live_parameters"})
    EXPECT_EQ(std::find(c.no_effect_keys.begin(), c.no_effect_keys.end(), k), c.no_effect_keys.end()) << k;
  EXPECT_EQ(c.prefetch_bucket_size, 50000000);
  EXPECT_EQ(c.max_live_parameters, 1000000000);
  EXPECT_EQ(c.max_reuse_distance, 1000000000);  // absent: DeepSpeed's default, since overlap_comm is on
}

TEST(Config, FetchAheadDefaultsFollowOverlapComm) {
  Config off = parse_config(with_optimizer(R"("zero_optimization": {"stage": 3})"), 1);
  EXPECT_EQ(off.prefetch_bucket_size, 0);
  EXPECT_EQ(off.max_reuse_distance, 0);
  EXPECT_EQ(off.max_live_parameters, 1000000000);
  Config on = parse_config(with_optimizer(R"("zero_optimization": {"stage": 3, "overlap_comm": true,
      "stage3_max_reuse_distance": 0, "max_live_parameters": 123})"),
                           1);
  EXPECT_EQ(on.prefetch_bucket_size, 50000000);
  EXPECT_EQ(on.max_reuse_distance, 0);
  EXPECT_EQ(on.max_live_parameters, 123);
  Config given = parse_config(with_optimizer(R"("zero_optimization": {"stage": 3, "prefetch_bucket_size": 7})"), 1);
  EXPECT_EQ(given.prefetch_bucket_size, 7);
  EXPECT_EQ(given.max_reuse_distance, 0);
}

// DeepSpeed ZeRO 1-2's rule for skipping a step with a non-finite gradient norm: fp16 always; bf16 as
// check_grad_overflow says (default true); fp32 as compute_grad_norm says (default true), which needs clipping off.
TEST(Config, NonFiniteStepsAreSkippedAsDeepSpeedSkipsThem) {
  EXPECT_TRUE(parse_config(with_optimizer(""), 1).skip_nonfinite_steps);
  EXPECT_TRUE(parse_config(with_optimizer(R"("bf16": {"enabled": true})"), 1).skip_nonfinite_steps);
  EXPECT_FALSE(parse_config(with_optimizer(R"("bf16": {"enabled": true, "check_grad_overflow": false})"), 1)
                   .skip_nonfinite_steps);
  const std::string no_norm = R"("gradient_clipping": 0, "zero_optimization": {"compute_grad_norm": false})";
  EXPECT_FALSE(parse_config(with_optimizer(no_norm), 1).skip_nonfinite_steps);
  // bf16 follows check_grad_overflow alone; fp16 always checks (its loss scale needs it).
  EXPECT_TRUE(parse_config(with_optimizer(no_norm + R"(, "bf16": {"enabled": true})"), 1).skip_nonfinite_steps);
  EXPECT_TRUE(parse_config(with_optimizer(no_norm + R"(, "fp16": {"enabled": true})"), 1).skip_nonfinite_steps);
  // Clipping needs the norm (libzero's default gradient_clipping is 1.0, as DeepSpeed's).
  const std::string e =
      parse_error(with_optimizer(R"("zero_optimization": {"compute_grad_norm": false})"), ZERO_ERR_CONFIG);
  EXPECT_NE(e.find("compute_grad_norm = false needs gradient_clipping = 0"), std::string::npos) << e;
  EXPECT_NE(parse_error(with_optimizer(R"("zero_optimization": {"compute_grad_norm": 0})"), ZERO_ERR_CONFIG)
                .find("compute_grad_norm"),
            std::string::npos);
}

TEST(Config, OptimizerTypes) {
  Config c = parse_config(R"({"optimizer": {"type": "Adam"}})", 1);
  EXPECT_EQ(c.optimizer.kind, OptimizerKind::kAdamW);  // DeepSpeed's adam_w_mode defaults to true
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);
  c = parse_config(R"({"optimizer": {"type": "adam", "params": {"adam_w_mode": false, "weight_decay": 0.1,
      "betas": [0.8, 0.9], "eps": 1e-6}}})",
                   1);
  EXPECT_EQ(c.optimizer.kind, OptimizerKind::kAdamL2);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.9);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-6);
  parse_error(R"({"optimizer": {"type": "Lamb"}})", ZERO_ERR_UNSUPPORTED);
  std::string m = parse_error(R"({"optimizer": {"type": "Adamm"}})", ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("\"Adam\""), std::string::npos) << m;
  m = parse_error(R"({"zero_optimization": {"stage": 1}})", ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("'optimizer'"), std::string::npos) << m;
  parse_error(R"({"optimizer": {"type": "AdamW", "params": {"amsgrad": true}}})", ZERO_ERR_UNSUPPORTED);
}

TEST(Config, MalformedInput) {
  std::string m = parse_error("{\"optimizer\": ", ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("not valid JSON"), std::string::npos) << m;
  m = parse_error("[1, 2]", ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("JSON object"), std::string::npos) << m;
  m = parse_error(with_optimizer(R"("train_micro_batch_size_per_gpu": "auto")"), ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("\"auto\""), std::string::npos) << m;
}

TEST(Config, EditDistance) {
  EXPECT_EQ(edit_distance("stage", "stage"), 0u);
  EXPECT_EQ(edit_distance("stagee", "stage"), 1u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

}  // namespace
}  // namespace zero

namespace zero {
namespace {

// A number beyond double's range is a config error, not an internal one.
TEST(Config, NumbersOutOfRangeAreConfigErrors) {
  for (const char* json : {R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e309}}})",
                           R"({"optimizer": {"type": "AdamW"}, "libzero": {"timeout_s": 1e400}})"}) {
    try {
      parse_config(json, 1);
      ADD_FAILURE() << "accepted " << json;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), ZERO_ERR_CONFIG) << e.what();
      EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
    }
  }
}

// Batch products beyond 2^53 are errors, not wrapped-around numbers.
TEST(Config, BatchSizeProductsDoNotOverflow) {
  std::string m = parse_error(
      with_optimizer(R"("train_micro_batch_size_per_gpu": 4503599627370496, "gradient_accumulation_steps": 1048576)"),
      ZERO_ERR_CONFIG, 4);
  EXPECT_NE(m.find("beyond 2^53"), std::string::npos) << m;
  m = parse_error(with_optimizer(R"("train_micro_batch_size_per_gpu": 4503599627370496)"), ZERO_ERR_CONFIG, 3);
  EXPECT_NE(m.find("beyond 2^53"), std::string::npos) << m;
  m = parse_error(with_optimizer(R"("train_batch_size": 4503599627370496, "train_micro_batch_size_per_gpu": 1)"),
                  ZERO_ERR_CONFIG, 1);
  EXPECT_NE(m.find("at most 2^20"), std::string::npos) << m;
}

// What DeepSpeed users' configs hold (review of DeepSpeed-Chat, Hugging Face and Megatron-DeepSpeed configs).
TEST(Config, DisabledBlocksAndOldStyleSectionsAreAccepted) {
  // Blocks switched off (or at DeepSpeed's default) ask for nothing.
  parse_config(with_optimizer(R"("hybrid_engine": {"enabled": false, "max_out_tokens": 512, "inference_tp_size": 1},
      "torch_autocast": {"enabled": false}, "compile": {}, "data_efficiency": {"enabled": false},
      "tensor_parallel": {"autotp_size": 1}, "expert_parallel": {"enabled": false},
      "weight_quantization": {"enabled": false}, "gradient_allreduce_op": "MEAN")"),
               2);
  std::string m = parse_error(with_optimizer(R"("hybrid_engine": {"enabled": true})"), ZERO_ERR_UNSUPPORTED);
  EXPECT_NE(m.find("'hybrid_engine'"), std::string::npos) << m;
  parse_error(with_optimizer(R"("compile": {"deepcompile": true})"), ZERO_ERR_UNSUPPORTED);
  parse_error(with_optimizer(R"("tensor_parallel": {"autotp_size": 2})"), ZERO_ERR_UNSUPPORTED);
  parse_error(with_optimizer(R"("weight_quantization": {"num_bits": 8})"), ZERO_ERR_UNSUPPORTED);  // enabled: true
  // DeepSpeed's aio block ignores keys it does not know (the old thread_count): libzero reports them as having
  // no effect, and honours the block's own.
  Config c = parse_config(
      with_optimizer(R"("aio": {"block_size": 65536, "queue_depth": 4, "thread_count": 1, "single_submit": false})"),
      1);
  EXPECT_NE(std::find(c.no_effect_keys.begin(), c.no_effect_keys.end(), "aio.thread_count"), c.no_effect_keys.end());
  EXPECT_EQ(c.offload.aio_block_size, 65536);
  EXPECT_EQ(c.offload.aio_queue_depth, 4);
}

TEST(Config, OffloadBlocks) {
  // offload_optimizer to cpu is where the CPU engine keeps the state: accepted, reported as having no effect.
  Config c = parse_config(with_optimizer(R"("zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "cpu", "pin_memory": true}, "offload_param": {"device": "cpu"}})"),
                          2);
  EXPECT_FALSE(c.offload.nvme());
  EXPECT_NE(std::find(c.no_effect_keys.begin(), c.no_effect_keys.end(), "zero_optimization.offload_optimizer.device"),
            c.no_effect_keys.end());
  // nvme: DeepSpeed's keys and defaults; sub_group_size sets the chunk.
  c = parse_config(with_optimizer(R"("zero_optimization": {"stage": 3, "sub_group_size": 4096,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "fast_init": true}})"),
                   2);
  EXPECT_TRUE(c.offload.nvme());
  EXPECT_EQ(c.offload.nvme_path, "/local_nvme");
  EXPECT_EQ(c.offload.buffer_count, 4);
  EXPECT_EQ(c.offload.chunk_elems, 4096);
  EXPECT_EQ(c.offload.aio_block_size, 1 << 20);
  EXPECT_EQ(c.offload.aio_queue_depth, 8);
  c = parse_config(with_optimizer(R"("zero_optimization": {"stage": 1,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}})"),
                   1);
  EXPECT_EQ(c.offload.chunk_elems, OffloadConfig::kDefaultChunkElems);
  // Invalid combinations say why.
  const std::pair<const char*, const char*> bad[] = {
      {R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}})", "nvme_path' is not set"},
      {R"("zero_optimization": {"stage": 0, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}})",
       "needs ZeRO stage 1, 2 or 3"},
      {R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/x",
          "buffer_count": 2}})",
       "at least 3 chunks"},
      {R"("zero_optimization": {"offload_optimizer": {"device": "disk"}})", "valid values"},
      {R"("aio": {"block_size": 5000})", "multiple of 4096"},
      {R"("aio": {"queue_depth": 0})", "queue_depth"},
  };
  for (const auto& [rest, fragment] : bad) {
    const std::string m = parse_error(with_optimizer(rest), ZERO_ERR_CONFIG);
    EXPECT_NE(m.find(fragment), std::string::npos) << rest << " -> " << m;
  }
  EXPECT_NE(parse_error(with_optimizer(R"("aio": {"use_gds": true})"), ZERO_ERR_UNSUPPORTED).find("use_gds"),
            std::string::npos);
  // offload_param to NVMe: stage 3, a path; 16-bit params, or fp32 ones (their own master, in the params file).
  c = parse_config(with_optimizer(R"("bf16": {"enabled": true}, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme", "nvme_path": "/p", "buffer_size": 1e6, "buffer_count": 4}})"),
                   2);
  EXPECT_TRUE(c.offload.params_nvme());
  EXPECT_EQ(c.offload.param_nvme_path, "/p");
  EXPECT_EQ(c.offload.param_buffer_size, 1000000);
  c = parse_config(with_optimizer(R"("zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme", "nvme_path": "/p"}})"),
                   2);
  EXPECT_TRUE(c.offload.params_nvme());
  EXPECT_EQ(c.compute_dtype, DType::kF32);
  EXPECT_NE(parse_error(with_optimizer(R"("bf16": {"enabled": true}, "zero_optimization": {"stage": 2,
      "offload_param": {"device": "nvme", "nvme_path": "/p"}})"),
                        ZERO_ERR_CONFIG)
                .find("needs ZeRO stage 3"),
            std::string::npos);
  EXPECT_NE(parse_error(with_optimizer(R"("bf16": {"enabled": true}, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme"}})"),
                        ZERO_ERR_CONFIG)
                .find("nvme_path' is not set"),
            std::string::npos);
  EXPECT_NE(parse_error(with_optimizer(R"("zero_optimization": {"offload_optimizer": {"device": "nvme",
      "nvme_path": "/x", "ratio": 0.5}})"),
                        ZERO_ERR_UNSUPPORTED)
                .find("ratio"),
            std::string::npos);
}

TEST(Config, MessagesNameWhatTheUserWrote) {
  // The suggestion uses the alias the config used.
  std::string m =
      parse_error(with_optimizer(R"("bfloat16": {"enabled": true, "immediate_grad_updat": true})"), ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("'bfloat16.immediate_grad_updat' (did you mean 'bfloat16.immediate_grad_update'?)"),
            std::string::npos)
      << m;
  m = parse_error(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "max_grad_norm": 1.0}}})", ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("gradient_clipping"), std::string::npos) << m;
  m = parse_error(R"({"optimizer": {"type": "AdamW", "params": {"betas": "auto"}}})", ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("\"auto\""), std::string::npos) << m;
  // Every unknown optimizer param at once; FusedAdam's own set_grad_none is valid.
  m = parse_error(R"({"optimizer": {"type": "AdamW", "params": {"learning_rate": 1, "beta": [0.9, 0.9]}}})",
                  ZERO_ERR_CONFIG);
  EXPECT_NE(m.find("'optimizer.params.learning_rate'"), std::string::npos) << m;
  EXPECT_NE(m.find("'optimizer.params.beta' (did you mean 'optimizer.params.betas'?)"), std::string::npos) << m;
  parse_config(R"({"optimizer": {"type": "AdamW", "params": {"set_grad_none": true}}})", 1);
  // DeepSpeed's and torch's other optimizers are valid there, not implemented here.
  for (const char* type : {"Muon", "MuAdamW", "RMSprop", "NAdam"})
    parse_error(std::string(R"({"optimizer": {"type": ")") + type + R"("}})", ZERO_ERR_UNSUPPORTED);
  // A scheduler block without a type is no scheduler, with a warning.
  Config c = parse_config(with_optimizer(R"("scheduler": {"params": {"warmup_num_steps": 10}})"), 1);
  EXPECT_EQ(c.scheduler.kind, SchedulerConfig::Kind::kNone);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("no 'type'"), std::string::npos) << c.warnings[0];
}

}  // namespace
}  // namespace zero
