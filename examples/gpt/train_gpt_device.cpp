// Trains the GPT on one GPU through libzero's public C API: a device engine (zero_engine_set_device "cuda") holds the
// params, gradients, master weights and optimizer state in the GPU's memory and steps them there, ordered on the
// model's own CUDA stream (zero_engine_set_stream); the model is device/: a kernel per layer, no atomics, cuBLASLt
// for the matmuls. --device cpu runs the same trainer and the same layer code on the CPU engine and the CPU, which
// is how the CPU machine checks it. Several processes (--world N --rank R --job NAME, each started by a launcher such
// as examples/gpt/launch_ranks.sh) join over shared memory and train data-parallel: with --comm nccl the data
// collectives go over NCCL (zero_comm_create_nccl) and control over shared memory; with --comm shm everything goes
// over shared memory, a device engine's collectives staged through pinned host memory.
//
//   train_gpt_device [--device cuda|cpu] [--stage 3] [--steps 200] [--compare-stages] [--digest] [--help]
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "data.hpp"
#include "device/host_backend.hpp"
#include "device/model_runner.hpp"
#include "engine_source.hpp"
#include "zero/zero.h"  // with ZERO_EXPERIMENTAL_API (engine_source.hpp): the device engine's calls

namespace {

#define ZCHECK(call)                                                                                                  \
  do {                                                                                                                \
    zero_status_t s_ = (call);                                                                                        \
    if (s_ != ZERO_OK)                                                                                                \
      throw std::runtime_error(std::string(#call) + " failed: " + zero_status_string(s_) + ": " + zero_last_error()); \
  } while (0)

constexpr int kNoDevice = 77;  // CTest's and gpu-check's "skipped"

struct Options {
  gpt::ModelConfig model;
  std::string device = "cuda";
  int steps = 200, micro_batch = 8, grad_accum = 1, stage = 3, print_every = 10, warmup = 30, compare_steps = 10;
  double lr = 2e-3, weight_decay = 0.1, clip = 1.0, beta2 = 0.95;
  bool checkpointing = false, bf16 = false, compare = false, digest = false;
  uint64_t seed = 1234;
  int world = 1, rank = 0;
  std::string job = "train-gpt-device", comm = "shm";
};

const char* kHelp = R"(train_gpt_device: the GPT example on one GPU, with libzero's device engine.

usage: train_gpt_device [options]

  --device cuda|cpu       cuda (default): the model's kernels and the engine on the current CUDA device; cpu: the
                          same layer code item by item on the CPU, with the CPU engine (no GPU needed)
  --layers L --channels C --heads H --seq-len T --untied-head
                          the model (default 4 layers, 192 channels, 6 heads, context 64, tied head)
  --steps S --micro-batch B --grad-accum G
                          optimizer steps (default 200), sequences per micro-step (8), micro-steps per step (1)
  --stage 0|1|2|3         ZeRO stage (default 3)
  --lr X --warmup N --clip X --weight-decay X --beta2 X
                          AdamW (2e-3 after 30 linear warmup steps; clipping 1, decay 0.1, beta2 0.95)
  --bf16                  bf16 params with fp32 master weights (the model computes in fp32)
  --activation-checkpointing
                          keep only each block's input; recompute the block's forward during backward
  --seed N                data and initialisation seed (default 1234)
  --print-every N         a progress line every N steps (default 10)
  --digest                FNV-1a over every param's bytes after training: equal digests are equal weights
  --compare-stages        train --compare-steps steps (default 10) at stages 0-3: memory and tokens/s per stage
  --world N --rank R --job NAME
                          one of N processes on this machine (rank R; NAME: the job's name, alike in every rank),
                          joined over shared memory; each trains on its own micro-batches
  --comm shm|nccl         with --world: every collective over shared memory (default; a device engine's staged
                          through pinned host memory), or data over NCCL and control over shared memory (several
                          processes on one GPU: give each its own NCCL_HOSTID)
Exit status 77: --device cuda where no CUDA device can be used.
)";

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value (see --help)");
      return argv[++i];
    };
    auto number = [&](auto convert) {
      const std::string value = next();
      try {
        size_t used = 0;
        const auto n = convert(value, &used);
        if (used == value.size()) return n;
      } catch (const std::logic_error&) {
      }
      throw std::invalid_argument(a + " " + value + ": not a number");
    };
    auto integer = [&] { return number([](const std::string& v, size_t* used) { return std::stoi(v, used); }); };
    auto real = [&] { return number([](const std::string& v, size_t* used) { return std::stod(v, used); }); };
    if (a == "--help" || a == "-h") {
      std::fputs(kHelp, stdout);
      std::exit(0);
    } else if (a == "--device") {
      o.device = next();
    } else if (a == "--layers") {
      o.model.layers = integer();
    } else if (a == "--channels") {
      o.model.channels = integer();
    } else if (a == "--heads") {
      o.model.heads = integer();
    } else if (a == "--seq-len") {
      o.model.seq_len = integer();
    } else if (a == "--untied-head") {
      o.model.tied_head = false;
    } else if (a == "--steps") {
      o.steps = integer();
    } else if (a == "--micro-batch") {
      o.micro_batch = integer();
    } else if (a == "--grad-accum") {
      o.grad_accum = integer();
    } else if (a == "--stage") {
      o.stage = integer();
    } else if (a == "--lr") {
      o.lr = real();
    } else if (a == "--warmup") {
      o.warmup = integer();
    } else if (a == "--clip") {
      o.clip = real();
    } else if (a == "--weight-decay") {
      o.weight_decay = real();
    } else if (a == "--beta2") {
      o.beta2 = real();
    } else if (a == "--bf16") {
      o.bf16 = true;
    } else if (a == "--activation-checkpointing") {
      o.checkpointing = true;
    } else if (a == "--seed") {
      o.seed = number([](const std::string& v, size_t* used) {
        if (v.empty() || v[0] == '-') throw std::invalid_argument(v);  // stoull would wrap it
        return std::stoull(v, used);
      });
    } else if (a == "--print-every") {
      o.print_every = integer();
    } else if (a == "--digest") {
      o.digest = true;
    } else if (a == "--compare-stages") {
      o.compare = true;
    } else if (a == "--compare-steps") {
      o.compare_steps = integer();
    } else if (a == "--world") {
      o.world = integer();
    } else if (a == "--rank") {
      o.rank = integer();
    } else if (a == "--job") {
      o.job = next();
    } else if (a == "--comm") {
      o.comm = next();
    } else {
      throw std::invalid_argument("unknown option " + a + " (see --help)");
    }
  }
  if (o.device != "cuda" && o.device != "cpu") throw std::invalid_argument("--device " + o.device + ": cuda or cpu");
  if (o.world < 1 || o.rank < 0 || o.rank >= o.world) throw std::invalid_argument("--rank must be in [0, --world)");
  if (o.comm != "shm" && o.comm != "nccl") throw std::invalid_argument("--comm " + o.comm + ": shm or nccl");
  if (o.comm == "nccl" && o.device != "cuda") throw std::invalid_argument("--comm nccl needs --device cuda");
  for (double x : {o.lr, o.clip, o.weight_decay, o.beta2})
    if (!std::isfinite(x) || x < 0) throw std::invalid_argument("--lr, --clip, --weight-decay, --beta2: finite, >= 0");
  // Sizes the layers index with int: rows (B x T), the widest activation (4C), the attention scores (B x H x T x T).
  const double rows = static_cast<double>(o.micro_batch) * o.model.seq_len;
  if (rows * 4 * o.model.channels > INT32_MAX || 4.0 * o.model.channels > INT32_MAX ||
      rows * o.model.heads * o.model.seq_len > INT32_MAX || rows * o.model.vocab > INT32_MAX)
    throw std::invalid_argument("the model or the micro-batch is too large for this example (int indices)");
  if (o.model.layers < 1 || o.model.heads < 1 || o.model.channels < 1 || o.model.seq_len < 1)
    throw std::invalid_argument("--layers, --heads, --channels and --seq-len must be positive");
  if (o.model.channels % o.model.heads != 0 || o.stage < 0 || o.stage > 3 || o.steps < 1 || o.micro_batch < 1 ||
      o.grad_accum < 1 || o.print_every < 1 || o.compare_steps < 1)
    throw std::invalid_argument("invalid options (channels must divide by heads, stage 0-3, counts positive)");
  return o;
}

std::string engine_config(const Options& o, int stage) {
  char buffer[1024];
  std::snprintf(buffer, sizeof buffer,
                "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": %d,"
                " \"gradient_clipping\": %.17g, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": %.17g,"
                " \"betas\": [0.9, %.17g], \"weight_decay\": %.17g}}, \"zero_optimization\": {\"stage\": %d,"
                " \"stage3_param_persistence_threshold\": 0, \"reduce_bucket_size\": 500000},"
                " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0, \"warmup_max_lr\": %.17g,"
                " \"warmup_num_steps\": %d, \"warmup_type\": \"linear\"}}%s}",
                o.micro_batch, o.grad_accum, o.clip, o.lr, o.beta2, o.weight_decay, stage, o.lr, o.warmup,
                o.bf16 ? ", \"bf16\": {\"enabled\": true}" : "");
  return buffer;
}

std::unique_ptr<gpt::device::ModelRunner> make_runner(const Options& o) {
  return o.device == "cuda" ? gpt::device::make_cuda_runner(o.model, o.micro_batch, o.checkpointing)
                            : gpt::device::make_cpu_runner(o.model, o.micro_batch, o.checkpointing);
}

struct RunResult {
  zero_memory_stats_t mem = ZERO_MEMORY_STATS_INIT;
  size_t activation_bytes = 0, scratch_bytes = 0;  // the model's: kept for backward, and everything else it holds
  double tokens_per_s = 0, ms_per_step = 0, final_loss = 0, heldout_loss = 0, answers_right = 0;
  uint64_t digest = 0;
};

// Held-out loss, and on the generated additions the share of whole answers right (argmax at every answer digit).
void evaluate(gpt::device::ModelRunner& runner, gpt::EngineSource& src, const gpt::Corpus& corpus, const Options& o,
              RunResult& r) {
  constexpr int kBatches = 8;
  std::vector<int> tokens, targets;
  std::vector<float> logits;
  const int T = o.model.seq_len, V = o.model.vocab;
  int answers = 0, exact = 0;
  for (int batch = 0; batch < kBatches; ++batch) {
    corpus.heldout_batch(o.micro_batch, T, tokens, targets, batch);
    r.heldout_loss += runner.step(src, tokens.data(), targets.data(), false) / kBatches;
    if (!corpus.arithmetic) continue;
    runner.logits(logits);
    for (int b = 0; b < o.micro_batch; ++b) {
      int line_chars = 0;
      bool line_right = true;
      for (int t = 0; t < T; ++t) {
        const size_t row = static_cast<size_t>(b) * T + t;
        if (targets[row] < 0) continue;
        const float* l = logits.data() + row * V;
        int best = 0;
        for (int v = 1; v < V; ++v) best = l[v] > l[best] ? v : best;
        ++line_chars;
        line_right = line_right && best == targets[row];
        if (targets[row] == '\n') {
          if (line_chars == gpt::kAdditionLine - gpt::kAnswerAt) ++answers, exact += line_right;
          line_chars = 0, line_right = true;
        }
      }
    }
  }
  r.answers_right = answers ? 100.0 * exact / answers : 0;
}

// One process: the single-process communicator. Several: shared memory (a segment per run, named after the job and
// the stage), and with --comm nccl NCCL for the data on top of it.
zero_comm_t* make_comm(const Options& o, int stage) {
  zero_comm_t* comm = nullptr;
  if (o.world == 1) {
    ZCHECK(zero_comm_create_single(&comm));
    return comm;
  }
  const std::string name = o.job + "-stage" + std::to_string(stage);
  ZCHECK(zero_comm_create_shm(&comm, name.c_str(), o.rank, o.world, 120.0));
  if (o.comm == "shm") return comm;
  zero_comm_t* split = nullptr;
  const zero_status_t s = zero_comm_create_nccl(&split, comm, 0, 120.0);
  const std::string why = s == ZERO_OK ? "" : zero_last_error();
  zero_comm_destroy(comm);  // the split keeps it
  if (s != ZERO_OK)
    throw std::runtime_error(std::string("zero_comm_create_nccl: ") + zero_status_string(s) + ": " + why);
  return split;
}

RunResult train(const Options& o, int stage, int steps, bool verbose, const gpt::Corpus& corpus) {
  // The runner (and its stream) outlives the engine, whose frees are ordered on that stream.
  std::unique_ptr<gpt::device::ModelRunner> runner = make_runner(o);
  zero_comm_t* comm = make_comm(o, stage);
  zero_engine_t* e = nullptr;
  const zero_status_t created = zero_engine_create(&e, engine_config(o, stage).c_str(), comm);
  if (created != ZERO_OK) {
    const std::string why = zero_last_error();
    zero_comm_destroy(comm);
    throw std::runtime_error(std::string("zero_engine_create: ") + zero_status_string(created) + ": " + why);
  }
  RunResult result;
  try {
    if (o.device == "cuda") {
      ZCHECK(zero_engine_set_device(e, "cuda"));
      ZCHECK(zero_engine_set_stream(e, runner->stream()));
    }
    gpt::device::ModelRunner& model = *runner;
    gpt::EngineSource src(e, o.model, o.bf16,
                          {[&model](int unit, size_t n) { return model.scratch(unit, n); },
                           [&model](float* dst, const void* bf16, size_t n) { model.widen_bf16(dst, bf16, n); }},
                          [](const std::string& message) { throw std::runtime_error(message); });
    std::vector<std::vector<float>> init_values;
    src.register_model(o.seed, init_values);
    ZCHECK(zero_engine_finalize(e));
    init_values.clear();
    if (verbose)  // rank 0's; the others' stdout is closed (main)
      std::printf("model on: %s | engine on: %s\n", runner->describe().c_str(),
                  o.device == "cuda" ? "the GPU (device engine)" : "the CPU (CPU engine)");
    const double tokens_per_step = static_cast<double>(o.micro_batch) * o.model.seq_len * o.grad_accum * o.world;
    std::vector<int> tokens, targets;
    double total_ms = 0;  // steps 2 on: the first also plans the matmuls and allocates
    for (int step = 1; step <= steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      double loss = 0;
      for (int m = 0; m < o.grad_accum; ++m) {
        corpus.batch(o.seed, step, m, o.rank, o.micro_batch, o.model.seq_len, tokens, targets);
        loss += runner->step(src, tokens.data(), targets.data(), true);
        ZCHECK(zero_backward_end(e));
      }
      zero_step_info_t si = ZERO_STEP_INFO_INIT;
      ZCHECK(zero_step(&si, e));
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (step > 1 || steps == 1) total_ms += ms;
      result.final_loss = loss / o.grad_accum;
      if (verbose && (step == 1 || step % o.print_every == 0 || step == steps)) {
        std::printf("step %5d/%d | loss %.4f | %9.0f tok/s | %7.2f ms/step | grad norm %.4f\n", step, steps,
                    result.final_loss, tokens_per_step / (ms / 1e3), ms, si.grad_norm);
        std::fflush(stdout);
      }
    }
    result.ms_per_step = total_ms / (steps > 1 ? steps - 1 : 1);
    result.tokens_per_s = tokens_per_step / (result.ms_per_step / 1e3);
    if (verbose) evaluate(*runner, src, corpus, o, result);
    if (o.digest) result.digest = src.digest();
    ZCHECK(zero_memory_stats(&result.mem, e));
    result.activation_bytes = runner->activation_bytes();
    result.scratch_bytes = runner->model_bytes() - result.activation_bytes;
  } catch (...) {
    zero_engine_destroy(e);
    zero_comm_destroy(comm);
    throw;
  }
  zero_engine_destroy(e);
  zero_comm_destroy(comm);
  return result;
}

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// The engine's (zero_memory_stats) and the model's: activations kept for backward, and its scratch (backward's
// buffers, the logits' gradient, bf16's widened copies, cuBLASLt's workspace).
void print_memory(const RunResult& r) {
  std::printf("\nmemory (MiB)\n%9s %9s %9s %9s %9s %11s %9s %9s\n", "params", "grads", "master", "optim", "buffers",
              "activations", "scratch", "total");
  std::printf("%9.2f %9.2f %9.2f %9.2f %9.2f %11.2f %9.2f %9.2f\n", mib(r.mem.param_bytes), mib(r.mem.grad_bytes),
              mib(r.mem.master_param_bytes), mib(r.mem.optimizer_state_bytes),
              mib(r.mem.bucket_bytes + r.mem.gathered_bytes), mib(r.activation_bytes), mib(r.scratch_bytes),
              mib(r.mem.total_bytes + r.activation_bytes + r.scratch_bytes));
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  std::string why;
  if (o.device == "cuda" && !gpt::device::cuda_available(&why)) {
    std::printf("train_gpt_device: no CUDA device (%s): skipped; --device cpu runs the same code on the CPU\n",
                why.c_str());
    return kNoDevice;
  }
  // Rank 0 speaks for the job (every rank computes the same weights, digests and held-out losses).
  if (o.rank != 0 && std::freopen("/dev/null", "w", stdout) == nullptr) return 1;
  const gpt::Corpus corpus = gpt::Corpus::generated(o.seed);
  const gpt::ModelConfig& c = o.model;
  const double params = static_cast<double>(c.vocab * (c.tied_head ? 1 : 2) + c.seq_len + 2) * c.channels +
                        static_cast<double>(c.layers) * (12.0 * c.channels * c.channels + 13.0 * c.channels);
  std::printf("GPT: %d layers, %d channels, %d heads, context %d, %.2f M params | %d process(es)%s on %s, %s%s\n",
              c.layers, c.channels, c.heads, c.seq_len, params / 1e6, o.world,
              o.world == 1       ? ""
              : o.comm == "nccl" ? " (data over NCCL)"
                                 : " (over shared memory)",
              o.device == "cuda" ? "a GPU" : "the CPU", o.bf16 ? "bf16" : "fp32",
              o.checkpointing ? ", activation checkpointing" : "");
  if (!o.compare) {
    std::printf("stage %d, %d x %d tokens per micro-step, %d micro-step(s) per step\n", o.stage, o.micro_batch,
                c.seq_len, o.grad_accum);
    const RunResult r = train(o, o.stage, o.steps, true, corpus);
    std::printf("held-out loss %.4f", r.heldout_loss);
    if (corpus.arithmetic) std::printf(" | whole answers right %.1f %%", r.answers_right);
    std::printf("\ntokens/s %.0f (%.2f ms per step, the mean over steps %d-%d)\n", r.tokens_per_s, r.ms_per_step,
                o.steps > 1 ? 2 : 1, o.steps);
    if (o.digest) std::printf("weights digest %016llx\n", static_cast<unsigned long long>(r.digest));
    print_memory(r);
    return 0;
  }
  std::printf("\n%-6s %8s %8s %8s %8s %9s %12s %10s %10s %s\n", "stage", "params", "grads", "master", "optim",
              "buffers", "activations", "ms/step", "tokens/s", o.digest ? "weights digest" : "");
  for (int stage = 0; stage <= 3; ++stage) {
    const RunResult r = train(o, stage, o.compare_steps, false, corpus);
    std::printf("%-6d %8.2f %8.2f %8.2f %8.2f %9.2f %12.2f %10.2f %10.0f %s\n", stage, mib(r.mem.param_bytes),
                mib(r.mem.grad_bytes), mib(r.mem.master_param_bytes), mib(r.mem.optimizer_state_bytes),
                mib(r.mem.bucket_bytes + r.mem.gathered_bytes), mib(r.activation_bytes), r.ms_per_step, r.tokens_per_s,
                o.digest ? [&] {
                  static char hex[17];
                  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(r.digest));
                  return hex;
                }()
                         : "");
  }
  if (o.world == 1)
    std::printf("(MiB; one process, so every stage keeps whole model states: ZeRO divides them among ranks)\n");
  else
    std::printf("(MiB, rank 0's)\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_gpt_device: %s\n", e.what());
  return 1;
}

namespace gpt {
namespace device {

std::unique_ptr<ModelRunner> make_cpu_runner(const ModelConfig& c, int batch, bool checkpointing) {
  return std::make_unique<RunnerOn<HostBackend<float>>>(c, batch, checkpointing);
}

#ifndef GPT_WITH_CUDA
bool cuda_available(std::string* why) {
  if (why) *why = "this build has no CUDA (configure with -DZERO_CUDA=ON)";
  return false;
}
std::unique_ptr<ModelRunner> make_cuda_runner(const ModelConfig&, int, bool) {
  throw std::runtime_error("this build has no CUDA (configure with -DZERO_CUDA=ON)");
}
#endif

}  // namespace device
}  // namespace gpt
