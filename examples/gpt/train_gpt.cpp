// Trains a small GPT across MPI ranks through libzero's public C API only (zero/zero.h): one unit per transformer
// block plus one for the embeddings, the final norm and an untied head, so stage 3 gathers and releases block by
// block.
//
//   mpirun -np 4 train_gpt [--stage 3] [--steps 300] [--compare-stages] [--help]
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data.hpp"
#include "engine_source.hpp"
#include "model.hpp"
#include "zero/zero.h"

namespace {

#define ZCHECK(call)                                                                                            \
  do {                                                                                                          \
    zero_status_t s_ = (call);                                                                                  \
    if (s_ != ZERO_OK) {                                                                                        \
      std::fprintf(stderr, "train_gpt: %s failed: %s: %s\n", #call, zero_status_string(s_), zero_last_error()); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                             \
    }                                                                                                           \
  } while (0)

struct Options {
  gpt::ModelConfig model;
  int steps = 200, micro_batch = 8, grad_accum = 1, stage = 3, print_every = 10, eval_every = 0;
  int compare_steps = 10, warmup = 30;
  bool redraw = false;
  double lr = 2e-3, weight_decay = 0.1, clip = 1.0, beta2 = 0.95;
  bool checkpointing = false, bf16 = false, compare = false, digest = false;
  std::string schedule = "constant";  // after the warmup: constant, linear or cosine to 0 at the last step
  uint64_t seed = 1234;
  std::string config_file, data_file, csv_file;
};

const char* kHelp = R"(train_gpt: a GPT-2-style decoder trained across MPI ranks with libzero.

usage: mpirun -np N train_gpt [options]

model
  --layers L              transformer blocks (default 4)
  --channels C            width (default 192); --heads H attention heads (default 6)
  --seq-len T             context length in bytes (default 64)
  --untied-head           the output head is a tensor of its own (default: tied to the token embedding)
training
  --steps S               optimizer steps (default 200)
  --micro-batch B         sequences per rank per micro-step (default 8)
  --grad-accum G          micro-steps per step (default 1)
  --stage 0|1|2|3         ZeRO stage (default 3)
  --lr X                  AdamW peak learning rate (default 2e-3), --beta2 X (default 0.95), --weight-decay X
                          (default 0.1), --clip X (default 1), --warmup N linear warmup steps (default 30,
                          DeepSpeed's WarmupLR)
  --schedule S            after the warmup: constant (default; DeepSpeed's WarmupLR), linear (WarmupDecayLR) or
                          cosine (WarmupCosineLR) to 0 at the last step; --decay is --schedule linear
  --bf16                  bf16 params with fp32 master weights (default fp32)
  --activation-checkpointing
                          keep only each block's input; recompute the block's forward during backward
  --config FILE           a DeepSpeed ds_config.json instead of the flags above for the engine (stage, optimizer,
                          batch sizes, bf16, scheduler, ...); its "activation_checkpointing" block turns
                          checkpointing on
  --seed N                data and initialisation seed (default 1234)
data
  --data FILE             train on any text file (the last tenth is held out); default: generated two-digit
                          additions ("37+48=580"), whose held-out answers the trainer scores
output
  --progress redraw|lines redraw one progress line in place (a terminal) or print lines (default: lines; under
                          mpirun a rank cannot tell whether mpirun writes to a terminal, scripts/demo.sh can)
  --print-every N         with --progress lines, a line every N steps (default 10)
  --eval-every N          held-out evaluation every N steps (default: at the end)
  --csv FILE              step, loss, tokens/s, ms/step, lr, grad norm per step (rank 0)
  --digest                a digest of the trained weights (FNV-1a over every param's bytes, in registration
                          order): equal digests are equal weights, bit for bit
  --compare-stages        train --compare-steps steps (default 10) at stages 0-3 and print per-rank memory next
                          to the ZeRO formula, and tokens/s per stage
)";

Options parse(int argc, char** argv, int rank) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        if (rank == 0) std::fprintf(stderr, "train_gpt: %s needs a value (see --help)\n", a.c_str());
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      if (rank == 0) std::fputs(kHelp, stdout);
      MPI_Finalize();
      std::exit(0);
    } else if (a == "--layers")
      o.model.layers = std::stoi(next());
    else if (a == "--channels")
      o.model.channels = std::stoi(next());
    else if (a == "--heads")
      o.model.heads = std::stoi(next());
    else if (a == "--seq-len")
      o.model.seq_len = std::stoi(next());
    else if (a == "--steps")
      o.steps = std::stoi(next());
    else if (a == "--micro-batch")
      o.micro_batch = std::stoi(next());
    else if (a == "--grad-accum")
      o.grad_accum = std::stoi(next());
    else if (a == "--stage")
      o.stage = std::stoi(next());
    else if (a == "--lr")
      o.lr = std::stod(next());
    else if (a == "--beta2")
      o.beta2 = std::stod(next());
    else if (a == "--weight-decay")
      o.weight_decay = std::stod(next());
    else if (a == "--clip")
      o.clip = std::stod(next());
    else if (a == "--bf16")
      o.bf16 = true;
    else if (a == "--activation-checkpointing")
      o.checkpointing = true;
    else if (a == "--config")
      o.config_file = next();
    else if (a == "--seed")
      o.seed = std::stoull(next());
    else if (a == "--data")
      o.data_file = next();
    else if (a == "--print-every")
      o.print_every = std::stoi(next());
    else if (a == "--warmup")
      o.warmup = std::stoi(next());
    else if (a == "--untied-head")
      o.model.tied_head = false;
    else if (a == "--decay")
      o.schedule = "linear";
    else if (a == "--schedule")
      o.schedule = next();
    else if (a == "--progress")
      o.redraw = next() == "redraw";
    else if (a == "--eval-every")
      o.eval_every = std::stoi(next());
    else if (a == "--csv")
      o.csv_file = next();
    else if (a == "--compare-stages")
      o.compare = true;
    else if (a == "--digest")
      o.digest = true;
    else if (a == "--compare-steps")
      o.compare_steps = std::stoi(next());
    else {
      if (rank == 0) std::fprintf(stderr, "train_gpt: unknown option %s (see --help)\n", a.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (o.model.channels % o.model.heads != 0 || o.stage < 0 || o.stage > 3 || o.steps < 1 || o.micro_batch < 1) {
    if (rank == 0) std::fprintf(stderr, "train_gpt: invalid options (channels must divide by heads, stage 0-3)\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (o.schedule != "constant" && o.schedule != "linear" && o.schedule != "cosine") {
    if (rank == 0)
      std::fprintf(stderr, "train_gpt: --schedule %s: use constant, linear or cosine\n", o.schedule.c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return o;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The DeepSpeed config: from --config, or built from the flags. Also reads activation_checkpointing.
std::string engine_config(Options& o, int stage) try {
  if (!o.config_file.empty()) {
    std::string text = read_file(o.config_file);
    auto j = nlohmann::json::parse(text);
    if (j.contains("activation_checkpointing")) {
      // Every block is checkpointed; DeepSpeed's number_checkpoints (checkpoints kept during forward) may be any
      // value >= the number of layers, which means the same thing.
      const auto& ac = j["activation_checkpointing"];
      if (ac.contains("number_checkpoints") && !ac["number_checkpoints"].is_null() &&
          ac["number_checkpoints"].get<int>() < o.model.layers)
        throw std::runtime_error(
            "activation_checkpointing.number_checkpoints below the layer count is not supported "
            "by this example: it checkpoints every block");
      o.checkpointing = true;
    }
    if (j.contains("bf16") && j["bf16"].value("enabled", false)) o.bf16 = true;
    if (j.contains("gradient_accumulation_steps")) o.grad_accum = j["gradient_accumulation_steps"].get<int>();
    if (j.contains("train_micro_batch_size_per_gpu")) o.micro_batch = j["train_micro_batch_size_per_gpu"].get<int>();
    if (j.contains("zero_optimization") && j["zero_optimization"].contains("stage") && !o.compare)
      o.stage = j["zero_optimization"]["stage"].get<int>();
    else
      j["zero_optimization"]["stage"] = stage;
    return j.dump();
  }
  // DeepSpeed's schedulers: WarmupLR and WarmupDecayLR take learning rates, WarmupCosineLR ratios of the peak.
  const std::string warmup = "\"warmup_num_steps\": " + std::to_string(o.warmup) + ", \"warmup_type\": \"linear\"";
  const std::string total = ", \"total_num_steps\": " + std::to_string(o.steps);
  char peak[32];
  std::snprintf(peak, sizeof peak, "%g", o.lr);
  const std::string rates = "\"warmup_min_lr\": 0, \"warmup_max_lr\": " + std::string(peak) + ", ";
  std::string scheduler;
  if (o.schedule == "constant")
    scheduler = "{\"type\": \"WarmupLR\", \"params\": {" + rates + warmup + "}}";
  else if (o.schedule == "linear")
    scheduler = "{\"type\": \"WarmupDecayLR\", \"params\": {" + rates + warmup + total + "}}";
  else
    scheduler = "{\"type\": \"WarmupCosineLR\", \"params\": {\"cos_min_ratio\": 0, " + warmup + total + "}}";
  char buffer[1024];
  std::snprintf(buffer, sizeof buffer,
                "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": %d,"
                " \"gradient_clipping\": %g, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": %g,"
                " \"betas\": [0.9, %.17g], \"weight_decay\": %g}}, \"zero_optimization\": {\"stage\": %d,"
                " \"stage3_param_persistence_threshold\": 0, \"reduce_bucket_size\": 500000},"
                " \"scheduler\": %s%s}",
                o.micro_batch, o.grad_accum, o.clip, o.lr, o.beta2, o.weight_decay, stage, scheduler.c_str(),
                o.bf16 ? ", \"bf16\": {\"enabled\": true}" : "");
  return buffer;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_gpt: --config %s: %s\n", o.config_file.c_str(), e.what());
  MPI_Abort(MPI_COMM_WORLD, 2);
  return "";
}

// libzero as the model's parameter source. Units: 0 = embeddings, final norm (and an untied head), 1 + l = block l.
struct Eval {
  double loss = 0, char_accuracy = 0, exact = 0;
  int answers = 0;
  std::vector<std::string> samples;  // arithmetic: a few held-out problems as the model answers them
};

// Held-out loss; on the generated corpus also the answers: the share of answer characters predicted right (argmax)
// and of answers right in full, over kEvalBatches batches of held-out problems. An answer whose every character is
// right with the true previous ones fed in is also what the model writes greedily on its own (the first wrong
// character would be the same either way), so "whole answers" is the greedy accuracy. Samples are written by the
// model digit by digit from the '=' on.
constexpr int kEvalBatches = 8;

Eval evaluate(gpt::Runner<float>& runner, gpt::EngineSource& src, const gpt::Corpus& corpus, const Options& o) {
  std::vector<int> tokens, targets;
  Eval ev;
  int chars = 0, right = 0, answers = 0, exact = 0;
  const int batches = corpus.arithmetic ? kEvalBatches : 1;
  const int T = o.model.seq_len;
  for (int batch = 0; batch < batches; ++batch) {
    corpus.heldout_batch(o.micro_batch, T, tokens, targets, batch);
    ev.loss += runner.step(src, tokens.data(), targets.data(), false) / batches;
    if (!corpus.arithmetic) continue;
    const auto& logits = runner.logits();
    for (int b = 0; b < o.micro_batch; ++b) {
      // Each line's answer is scored where its four targets (three digits and the newline) are in the window.
      int line_chars = 0;
      bool line_right = true;
      for (int t = 0; t < T; ++t) {
        const size_t row = static_cast<size_t>(b) * T + t;
        if (targets[row] < 0) continue;
        const float* l = logits.data() + row * o.model.vocab;
        int best = 0;
        for (int v = 1; v < o.model.vocab; ++v) best = l[v] > l[best] ? v : best;
        ++chars, ++line_chars;
        right += best == targets[row];
        line_right = line_right && best == targets[row];
        if (targets[row] == '\n') {
          if (line_chars == gpt::kAdditionLine - gpt::kAnswerAt) ++answers, exact += line_right;
          line_chars = 0, line_right = true;
        }
      }
    }
  }
  ev.char_accuracy = chars ? 100.0 * right / chars : 0;
  ev.exact = answers ? 100.0 * exact / answers : 0;
  ev.answers = answers;
  if (!corpus.arithmetic) return ev;
  // Samples: the last whole line of each window of the first held-out batch, its answer written by the model.
  corpus.heldout_batch(o.micro_batch, T, tokens, targets, 0);
  if (T < gpt::kAdditionLine) return ev;
  const int line = (T / gpt::kAdditionLine - 1) * gpt::kAdditionLine;
  std::vector<int> written = tokens;
  for (int d = 0; d < 3; ++d) {
    runner.step(src, written.data(), targets.data(), false);
    const auto& logits = runner.logits();
    for (int b = 0; b < o.micro_batch; ++b) {
      const size_t row = static_cast<size_t>(b) * T + line + gpt::kAnswerAt - 1 + d;
      const float* l = logits.data() + row * o.model.vocab;
      int best = 0;
      for (int v = 1; v < o.model.vocab; ++v) best = l[v] > l[best] ? v : best;
      written[row + 1] = best;
    }
  }
  for (int b = 0; b < std::min(o.micro_batch, 6); ++b) {
    std::string problem, answer, truth;
    for (int t = 0; t < gpt::kAdditionLine - 1; ++t) {
      const size_t row = static_cast<size_t>(b) * T + line + t;
      problem += static_cast<char>(tokens[row]);
      if (t >= gpt::kAnswerAt) answer += static_cast<char>(written[row]), truth += static_cast<char>(tokens[row]);
    }
    bool digits = true;
    for (char c : answer) digits = digits && c >= '0' && c <= '9';
    const std::string said = digits ? gpt::readable_addition(problem, answer) : "(not digits)";
    const std::string right_text = gpt::readable_addition(problem, truth);
    ev.samples.push_back(problem.substr(0, gpt::kAnswerAt) + answer + "   " + said +
                         (answer == truth ? "   right" : "   wrong: " + right_text));
  }
  return ev;
}

struct RunResult {
  zero_memory_stats_t mem = ZERO_MEMORY_STATS_INIT;
  size_t activation_bytes = 0;
  double tokens_per_s = 0, ms_per_step = 0, final_loss = 0;
  uint64_t padded_params = 0;
};

RunResult train(Options& o, int stage, int steps, bool verbose, const gpt::Corpus& corpus, int rank, int world) {
  zero_comm_t* comm = nullptr;
  ZCHECK(zero_comm_create_mpi(&comm, static_cast<int64_t>(MPI_Comm_c2f(MPI_COMM_WORLD))));
  const std::string config = engine_config(o, stage);
  zero_engine_t* e = nullptr;
  ZCHECK(zero_engine_create(&e, config.c_str(), comm));
  zero_engine_info_t info = ZERO_ENGINE_INFO_INIT;
  ZCHECK(zero_engine_info(&info, e));
  if (info.grad_dtype != ZERO_DTYPE_FP32) {
    if (rank == 0) std::fprintf(stderr, "train_gpt: this example accumulates gradients in fp32 only\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const bool bf16 = info.param_dtype == ZERO_DTYPE_BF16;
  if (info.param_dtype == ZERO_DTYPE_FP16) {
    if (rank == 0) std::fprintf(stderr, "train_gpt: use fp32 or bf16 (fp16 needs loss scaling in the model code)\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  o.grad_accum = info.gradient_accumulation_steps;
  // bf16: each unit's fp32 copy for the float math, widened on the host.
  std::vector<std::vector<float>> widened(static_cast<size_t>(o.model.layers) + 1);
  gpt::EngineSource::Widening widening{[&widened](int unit, size_t n) {
                                         auto& copy = widened[static_cast<size_t>(unit)];
                                         copy.resize(n);
                                         return copy.data();
                                       },
                                       [](float* dst, const void* src, size_t n) {
                                         const uint16_t* bf16 = static_cast<const uint16_t*>(src);
                                         for (size_t i = 0; i < n; ++i) {
                                           const uint32_t bits = static_cast<uint32_t>(bf16[i]) << 16;
                                           std::memcpy(&dst[i], &bits, 4);
                                         }
                                       }};
  gpt::EngineSource src(e, o.model, bf16, widening, [](const std::string& message) {
    std::fprintf(stderr, "train_gpt: %s\n", message.c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  });
  std::vector<std::vector<float>> init_values;
  src.register_model(o.seed, init_values);
  ZCHECK(zero_engine_finalize(e));
  init_values.clear();
  gpt::Runner<float> runner(o.model, o.micro_batch, o.checkpointing);

  FILE* csv = nullptr;
  if (verbose && rank == 0 && !o.csv_file.empty()) {
    csv = std::fopen(o.csv_file.c_str(), "w");
    if (csv) std::fprintf(csv, "step,loss,loss_hex,tokens_per_s,ms_per_step,lr,grad_norm\n");
  }
  const bool tty = o.redraw;
  const double tokens_per_step = static_cast<double>(o.micro_batch) * o.model.seq_len * o.grad_accum * world;
  std::vector<int> tokens, targets;
  RunResult result;
  auto t_start = std::chrono::steady_clock::now();
  double total_ms = 0;
  for (int step = 1; step <= steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    double loss = 0;
    for (int m = 0; m < o.grad_accum; ++m) {
      corpus.batch(o.seed, step, m, rank, o.micro_batch, o.model.seq_len, tokens, targets);
      loss += runner.step(src, tokens.data(), targets.data(), true);
      ZCHECK(zero_backward_end(e));
    }
    zero_step_info_t si = ZERO_STEP_INFO_INIT;
    ZCHECK(zero_step(&si, e));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    total_ms += ms;
    double mean_loss = 0;
    loss /= o.grad_accum;
    MPI_Allreduce(&loss, &mean_loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    mean_loss /= world;
    result.final_loss = mean_loss;
    const double tok_s = tokens_per_step / (ms / 1e3);
    if (csv)
      std::fprintf(csv, "%d,%.6f,%a,%.0f,%.2f,%g,%.6f\n", step, mean_loss, mean_loss, tok_s, ms, si.lr, si.grad_norm);
    if (verbose && rank == 0) {
      if (tty)
        std::printf("\rstep %5d/%d | loss %.4f | %8.0f tok/s | %7.1f ms/step", step, steps, mean_loss, tok_s, ms);
      else if (step == 1 || step % o.print_every == 0 || step == steps)
        std::printf("step %5d/%d | loss %.4f | %8.0f tok/s | %7.1f ms/step\n", step, steps, mean_loss, tok_s, ms);
      std::fflush(stdout);
    }
    if (verbose && o.eval_every > 0 && step % o.eval_every == 0 && step != steps) {
      const Eval ev = evaluate(runner, src, corpus, o);
      if (rank == 0)
        std::printf("%seval at step %d: held-out loss %.4f%s\n", tty ? "\n" : "", step, ev.loss,
                    corpus.arithmetic ? (", answer characters " + std::to_string(ev.char_accuracy).substr(0, 5) +
                                         " % right, whole answers " + std::to_string(ev.exact).substr(0, 5) + " %")
                                            .c_str()
                                      : "");
    }
  }
  if (verbose && rank == 0 && tty) std::printf("\n");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  result.tokens_per_s = tokens_per_step * steps / seconds;
  result.ms_per_step = total_ms / steps;
  if (verbose) {
    const Eval ev = evaluate(runner, src, corpus, o);
    if (rank == 0) {
      std::printf("held-out loss %.4f", ev.loss);
      if (corpus.arithmetic)
        std::printf(" | answer characters right %.1f %% | whole answers right %.1f %% (of %d held-out problems)",
                    ev.char_accuracy, ev.exact, ev.answers);
      std::printf("\n");
      if (!ev.samples.empty()) {
        std::printf("held-out problems, answered by the model (answers are written ones digit first):\n");
        for (const auto& line : ev.samples) std::printf("  %s\n", line.c_str());
      }
    }
  }
  if (verbose && o.digest) {
    const uint64_t d = src.digest();
    if (rank == 0) std::printf("weights digest %016llx\n", static_cast<unsigned long long>(d));
  }
  ZCHECK(zero_memory_stats(&result.mem, e));
  result.activation_bytes = runner.activation_bytes();
  result.padded_params = result.mem.param_bytes / (bf16 ? 2 : 4) * (stage == 3 ? world : 1);
  if (csv) std::fclose(csv);
  zero_engine_destroy(e);
  zero_comm_destroy(comm);
  return result;
}

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

void print_memory_table(const RunResult& r, int rank, int world) {
  double mine[7] = {mib(r.mem.param_bytes),
                    mib(r.mem.grad_bytes),
                    mib(r.mem.master_param_bytes),
                    mib(r.mem.optimizer_state_bytes),
                    mib(r.mem.bucket_bytes + r.mem.gathered_bytes),
                    mib(r.activation_bytes),
                    mib(r.mem.total_bytes + r.activation_bytes)};
  std::vector<double> all(7 * static_cast<size_t>(world));
  MPI_Gather(mine, 7, MPI_DOUBLE, all.data(), 7, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank != 0) return;
  std::printf("\nper-rank memory (MiB)\n%-5s %9s %9s %9s %9s %9s %11s %9s\n", "rank", "params", "grads", "master",
              "optim", "buffers", "activations", "total");
  for (int q = 0; q < world; ++q) {
    const double* v = all.data() + 7 * q;
    std::printf("%-5d %9.2f %9.2f %9.2f %9.2f %9.2f %11.2f %9.2f\n", q, v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
  }
}

// The ZeRO paper's model-state bytes per rank for this run's dtypes (Adam: 8 bytes of state per param).
double formula_bytes(int stage, double psi, int world, bool bf16) {
  const double p = bf16 ? 2 : 4, g = 4, m = bf16 ? 4 : 0, k = 8, n = world;
  switch (stage) {
    case 0:
      return (p + g + m + k) * psi;
    case 1:
      return (p + g) * psi + (m + k) * psi / n;
    case 2:
      return p * psi + (g + m + k) * psi / n;
    default:
      return (p + g + m + k) * psi / n;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int mpi_provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &mpi_provided);
  openblas_set_num_threads(1);  // one BLAS thread per rank: ranks share the cores, and results stay deterministic
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  Options o = parse(argc, argv, rank);
  gpt::Corpus corpus;
  try {
    corpus = o.data_file.empty() ? gpt::Corpus::generated(o.seed) : gpt::Corpus::from_file(o.data_file);
  } catch (const std::exception& ex) {
    if (rank == 0) std::fprintf(stderr, "train_gpt: %s\n", ex.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const gpt::ModelConfig& c = o.model;
  const double params = static_cast<double>(c.vocab * (c.tied_head ? 1 : 2) + c.seq_len + 2) * c.channels +
                        static_cast<double>(c.layers) * (12.0 * c.channels * c.channels + 13.0 * c.channels);
  if (!o.compare) {
    engine_config(o, o.stage);  // resolves --config into the options before printing them
    if (rank == 0)
      std::printf(
          "GPT: %d layers, %d channels, %d heads, context %d, %.2f M params | %d ranks, ZeRO stage %d, %s%s\n"
          "data: %s | %d x %d tokens per rank per micro-step, %d micro-step(s) per step | OpenBLAS kernels: %s\n",
          c.layers, c.channels, c.heads, c.seq_len, params / 1e6, world, o.stage, o.bf16 ? "bf16" : "fp32",
          o.checkpointing ? ", activation checkpointing" : "",
          o.data_file.empty() ? "generated two-digit additions" : o.data_file.c_str(), o.micro_batch, c.seq_len,
          o.grad_accum, openblas_get_corename());
    RunResult r = train(o, o.stage, o.steps, true, corpus, rank, world);
    print_memory_table(r, rank, world);
    // What the other choice would keep, measured by building it.
    const gpt::Runner<float> other(o.model, o.micro_batch, !o.checkpointing);
    if (rank == 0)
      std::printf("activations per rank: %.2f MiB with activation checkpointing, %.2f MiB without\n",
                  mib(o.checkpointing ? r.activation_bytes : other.activation_bytes()),
                  mib(o.checkpointing ? other.activation_bytes() : r.activation_bytes));
  } else {
    if (rank == 0)
      std::printf("comparing ZeRO stages on %d ranks: %.2f M params, %d steps each, %s\n", world, params / 1e6,
                  o.compare_steps, o.bf16 ? "bf16" : "fp32");
    std::vector<RunResult> results;
    for (int stage = 0; stage <= 3; ++stage)
      results.push_back(train(o, stage, o.compare_steps, false, corpus, rank, world));
    if (rank == 0) {
      std::printf("\nper-rank memory of rank 0 (MiB); model states = params + grads + master + optimizer state\n");
      std::printf("%-6s %8s %8s %8s %8s %9s %12s %13s %13s %10s %10s\n", "stage", "params", "grads", "master", "optim",
                  "buffers", "activations", "model states", "ZeRO formula", "vs stage 0", "tokens/s");
      const double stage0 =
          static_cast<double>(results[0].mem.param_bytes + results[0].mem.grad_bytes +
                              results[0].mem.master_param_bytes + results[0].mem.optimizer_state_bytes);
      for (int s = 0; s < 4; ++s) {
        const RunResult& r = results[static_cast<size_t>(s)];
        const double states = static_cast<double>(r.mem.param_bytes + r.mem.grad_bytes + r.mem.master_param_bytes +
                                                  r.mem.optimizer_state_bytes);
        std::printf("%-6d %8.2f %8.2f %8.2f %8.2f %9.2f %12.2f %13.2f %13.2f %9.2fx %10.0f\n", s,
                    mib(r.mem.param_bytes), mib(r.mem.grad_bytes), mib(r.mem.master_param_bytes),
                    mib(r.mem.optimizer_state_bytes), mib(r.mem.bucket_bytes + r.mem.gathered_bytes),
                    mib(r.activation_bytes), states / (1 << 20),
                    formula_bytes(s, static_cast<double>(results[0].padded_params), world, o.bf16) / (1 << 20),
                    stage0 / states, r.tokens_per_s);
      }
      std::printf("stage-3 / stage-0 step time: %.2f (%.1f ms against %.1f ms per step)\n",
                  results[3].ms_per_step / results[0].ms_per_step, results[3].ms_per_step, results[0].ms_per_step);
    }
  }
  MPI_Finalize();
  return 0;
}
