// ZeRO beside Megatron-style tensor parallelism, over the C API: a GPT whose attention heads and MLP are split across
// the tensor-parallel ranks of a replica (column-parallel qkv and MLP-up linears, row-parallel output projections, a
// vocab-parallel embedding and head with a vocab-parallel cross-entropy, LayerNorms and position embeddings whole on
// every rank), trained by libzero on the data-parallel dimension. It learns to copy a sequence of random tokens
// shifted by one.
//
//   mpirun -np 4 train_tensor_parallel --tp 2 [--stage 0..3] [--steps 150]
//
// World rank r is tensor-parallel rank r % tp and data-parallel rank r / tp (Megatron-LM's order). Each rank's engine
// runs over its data-parallel group and is given its tensor-parallel group as the model-parallel group
// (zero_engine_set_model_parallel), so the gradient norm and its clip span the whole model; the whole params are
// registered as ZERO_PARAM_MODEL_PARALLEL_DUPLICATE on tensor-parallel ranks other than 0. The forward's and
// backward's tensor-parallel sums are MPI_Allreduce calls of the example's own. The layers are
// examples/gpt/model.hpp's.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "data.hpp"
#include "model.hpp"
#include "zero/zero.h"

namespace {

constexpr int kVocab = 32, kSeq = 16, kChannels = 32, kHeads = 4, kLayers = 2, kBatch = 8;

void check(zero_status_t status, const char* what) {
  if (status == ZERO_OK) return;
  std::fprintf(stderr, "%s: %s: %s\n", what, zero_status_string(status), zero_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

enum class Split { kWhole, kRows, kCols };  // how the whole param is cut across tensor-parallel ranks

struct Param {
  std::string name;
  std::vector<int64_t> whole;  // the whole param's shape
  Split split;
  int unit;
  // kRows of a param that stacks `stride` blocks of rows (qkv: q, k and v): each block is split, so that a rank holds
  // the q, k and v rows of its own heads (Megatron's partition_stride), and the whole model computes what its parts do.
  int stride = 1;
  int id = -1;
};

// The tensor-parallel group, its size and this rank's place in it.
struct TensorParallel {
  MPI_Comm comm;
  int size, rank;
  void sum(float* x, size_t n) const {
    if (size > 1) MPI_Allreduce(MPI_IN_PLACE, x, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm);
  }
  void max(float* x, size_t n) const {
    if (size > 1) MPI_Allreduce(MPI_IN_PLACE, x, static_cast<int>(n), MPI_FLOAT, MPI_MAX, comm);
  }
};

class Model {
 public:
  Model(zero_engine_t* engine, const TensorParallel& tp) : engine_(engine), tp_(tp) {
    add("wte", {kVocab, kChannels}, Split::kRows, 0);
    add("wpe", {kSeq, kChannels}, Split::kWhole, 0);
    for (int l = 0; l < kLayers; ++l) {
      const std::string p = "h" + std::to_string(l) + ".";
      const int u = 1 + l;
      add(p + "ln1.w", {kChannels}, Split::kWhole, u), add(p + "ln1.b", {kChannels}, Split::kWhole, u);
      add(p + "qkv.w", {3 * kChannels, kChannels}, Split::kRows, u, 3);  // q, k, v of this rank's heads
      add(p + "qkv.b", {3 * kChannels}, Split::kRows, u, 3);
      add(p + "proj.w", {kChannels, kChannels}, Split::kCols, u), add(p + "proj.b", {kChannels}, Split::kWhole, u);
      add(p + "ln2.w", {kChannels}, Split::kWhole, u), add(p + "ln2.b", {kChannels}, Split::kWhole, u);
      add(p + "fc.w", {4 * kChannels, kChannels}, Split::kRows, u), add(p + "fc.b", {4 * kChannels}, Split::kRows, u);
      add(p + "fcproj.w", {kChannels, 4 * kChannels}, Split::kCols, u);
      add(p + "fcproj.b", {kChannels}, Split::kWhole, u);
    }
    add("lnf.w", {kChannels}, Split::kWhole, kLayers + 1), add("lnf.b", {kChannels}, Split::kWhole, kLayers + 1);
    add("head.w", {kVocab, kChannels}, Split::kRows, kLayers + 1);
  }

  // Registers this rank's parts; rank 0 of each data-parallel group gives the initial values (the whole model's,
  // the same everywhere, cut to this rank's part). The values stay alive until finalize.
  void register_params(bool give_values) {
    for (Param& p : params_) {
      std::vector<int64_t> shape = p.whole;
      if (p.split == Split::kRows) shape[0] /= tp_.size;
      if (p.split == Split::kCols) shape[1] /= tp_.size;
      const size_t n = numel(shape);
      init_.emplace_back(give_values ? n : 0);
      for (size_t i = 0; give_values && i < n; ++i) init_.back()[i] = initial_value(p, whole_index(p, shape, i));
      zero_param_desc_t d;
      check(zero_param_desc_init(&d, sizeof d), "zero_param_desc_init");
      d.name = p.name.c_str();
      d.ndim = static_cast<int32_t>(shape.size());
      d.shape = shape.data();
      d.unit = p.unit;
      d.init_data = give_values ? init_.back().data() : nullptr;
      d.flags = p.split == Split::kWhole && tp_.rank > 0 ? ZERO_PARAM_MODEL_PARALLEL_DUPLICATE : 0;
      check(zero_engine_add_param(&p.id, engine_, &d), "zero_engine_add_param");
    }
  }
  void forget_values() { init_.clear(); }

  // One micro-step: forward and backward on `tokens` (kBatch x kSeq); returns the mean loss over the copied
  // positions.
  float micro_step(const std::vector<int>& tokens) {
    const int N = kBatch * kSeq, C = kChannels, Cl = C / tp_.size, Hl = kHeads / tp_.size, Vl = kVocab / tp_.size;
    std::vector<int> targets(N);
    for (int b = 0; b < kBatch; ++b)
      for (int t = 0; t < kSeq; ++t) targets[b * kSeq + t] = t == 0 ? -1 : tokens[b * kSeq + t - 1];
    acts_.assign(kLayers, {});
    std::vector<float> x(static_cast<size_t>(N) * C, 0.0f), zeros(4 * C, 0.0f);
    // Forward. The embedding: rows outside this rank's vocabulary slice look up zeros; the slices are summed.
    gather(0);
    const float *wte = w("wte"), *wpe = w("wpe");
    for (int n = 0; n < N; ++n) {
      const int local = tokens[n] - tp_.rank * Vl;
      if (local >= 0 && local < Vl) std::memcpy(&x[n * C], wte + local * C, sizeof(float) * C);
    }
    tp_.sum(x.data(), x.size());
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) x[n * C + c] += wpe[(n % kSeq) * C + c];
    release(0);
    for (int l = 0; l < kLayers; ++l) {
      const std::string p = "h" + std::to_string(l) + ".";
      Acts& a = acts_[l];
      gather(1 + l);
      a.in = x;
      a.ln1.resize(x.size()), a.mean1.resize(N), a.rstd1.resize(N);
      gpt::layernorm_forward(a.ln1.data(), a.mean1.data(), a.rstd1.data(), x.data(), w(p + "ln1.w"), w(p + "ln1.b"), N,
                             C);
      a.qkv.resize(static_cast<size_t>(N) * 3 * Cl), a.atty.resize(static_cast<size_t>(N) * Cl);
      a.att.resize(static_cast<size_t>(kBatch) * Hl * kSeq * kSeq);
      gpt::matmul_forward(a.qkv.data(), a.ln1.data(), w(p + "qkv.w"), w(p + "qkv.b"), N, C, 3 * Cl);
      gpt::attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), kBatch, kSeq, Cl, Hl);
      std::vector<float> y(x.size());
      gpt::matmul_forward(y.data(), a.atty.data(), w(p + "proj.w"), zeros.data(), N, Cl, C);  // a partial product
      tp_.sum(y.data(), y.size());
      const float* proj_b = w(p + "proj.b");
      a.res.resize(x.size());
      for (size_t i = 0; i < x.size(); ++i) a.res[i] = x[i] + y[i] + proj_b[i % C];
      a.ln2.resize(x.size()), a.mean2.resize(N), a.rstd2.resize(N);
      gpt::layernorm_forward(a.ln2.data(), a.mean2.data(), a.rstd2.data(), a.res.data(), w(p + "ln2.w"), w(p + "ln2.b"),
                             N, C);
      a.fc.resize(static_cast<size_t>(N) * 4 * Cl), a.gelu.resize(a.fc.size());
      gpt::matmul_forward(a.fc.data(), a.ln2.data(), w(p + "fc.w"), w(p + "fc.b"), N, C, 4 * Cl);
      gpt::gelu_forward(a.gelu.data(), a.fc.data(), a.fc.size());
      gpt::matmul_forward(y.data(), a.gelu.data(), w(p + "fcproj.w"), zeros.data(), N, 4 * Cl, C);
      tp_.sum(y.data(), y.size());
      const float* fcproj_b = w(p + "fcproj.b");
      for (size_t i = 0; i < x.size(); ++i) x[i] = a.res[i] + y[i] + fcproj_b[i % C];
      release(1 + l);
    }
    // The head's logits are split by vocabulary: the softmax's maximum and sum, and the target's logit, are summed
    // (or maximised) across the tensor-parallel ranks.
    const int last = kLayers + 1;
    gather(last);
    std::vector<float> lnf(x.size()), meanf(N), rstdf(N), logits(static_cast<size_t>(N) * Vl);
    gpt::layernorm_forward(lnf.data(), meanf.data(), rstdf.data(), x.data(), w("lnf.w"), w("lnf.b"), N, C);
    gpt::matmul_forward(logits.data(), lnf.data(), w("head.w"), zeros.data(), N, C, Vl);
    std::vector<float> maxv(N, -1e30f), sum(N, 0.0f), target(N, 0.0f);
    for (int n = 0; n < N; ++n)
      for (int v = 0; v < Vl; ++v) maxv[n] = std::max(maxv[n], logits[n * Vl + v]);
    tp_.max(maxv.data(), N);
    for (int n = 0; n < N; ++n) {
      for (int v = 0; v < Vl; ++v) sum[n] += std::exp(logits[n * Vl + v] - maxv[n]);
      const int local = targets[n] - tp_.rank * Vl;
      if (targets[n] >= 0 && local >= 0 && local < Vl) target[n] = logits[n * Vl + local];
    }
    tp_.sum(sum.data(), N);
    tp_.sum(target.data(), N);
    int counted = 0;
    float loss = 0.0f;
    for (int n = 0; n < N; ++n) counted += targets[n] >= 0;
    std::vector<float> dlogits(logits.size(), 0.0f);
    for (int n = 0; n < N; ++n) {
      if (targets[n] < 0) continue;
      loss += std::log(sum[n]) + maxv[n] - target[n];
      for (int v = 0; v < Vl; ++v) {
        const float p = std::exp(logits[n * Vl + v] - maxv[n]) / sum[n];
        dlogits[n * Vl + v] = (p - (v == targets[n] - tp_.rank * Vl ? 1.0f : 0.0f)) / counted;
      }
    }
    // Backward. The head and the column-parallel linears take their input's gradient as a partial sum.
    std::vector<float> dlnf(x.size(), 0.0f), dx(x.size(), 0.0f), scratch(4 * C, 0.0f);
    gpt::matmul_backward(dlnf.data(), g("head.w"), scratch.data(), dlogits.data(), lnf.data(), w("head.w"), N, C, Vl);
    tp_.sum(dlnf.data(), dlnf.size());
    gpt::layernorm_backward(dx.data(), g("lnf.w"), g("lnf.b"), dlnf.data(), x.data(), w("lnf.w"), meanf.data(),
                            rstdf.data(), N, C);
    ready(last);
    release(last);
    for (int l = kLayers - 1; l >= 0; --l) {
      const std::string p = "h" + std::to_string(l) + ".";
      Acts& a = acts_[l];
      gather(1 + l);
      // out = res + fcproj(gelu(fc(ln2(res)))): dres = dx + the MLP path's.
      std::vector<float> dres = dx, dgelu(a.fc.size(), 0.0f), dfc(a.fc.size(), 0.0f), dln2(x.size(), 0.0f);
      float* dfcproj_b = g(p + "fcproj.b");
      for (size_t i = 0; i < dx.size(); ++i) dfcproj_b[i % C] += dx[i];
      gpt::matmul_backward(dgelu.data(), g(p + "fcproj.w"), scratch.data(), dx.data(), a.gelu.data(), w(p + "fcproj.w"),
                           N, 4 * Cl, C);
      gpt::gelu_backward(dfc.data(), a.fc.data(), dgelu.data(), dfc.size());
      gpt::matmul_backward(dln2.data(), g(p + "fc.w"), g(p + "fc.b"), dfc.data(), a.ln2.data(), w(p + "fc.w"), N, C,
                           4 * Cl);
      tp_.sum(dln2.data(), dln2.size());
      gpt::layernorm_backward(dres.data(), g(p + "ln2.w"), g(p + "ln2.b"), dln2.data(), a.res.data(), w(p + "ln2.w"),
                              a.mean2.data(), a.rstd2.data(), N, C);
      // res = in + proj(attention(qkv(ln1(in)))): din = dres + the attention path's.
      std::vector<float> datty(a.atty.size(), 0.0f), dqkv(a.qkv.size(), 0.0f), datt(a.att.size(), 0.0f),
          dln1(x.size(), 0.0f);
      float* dproj_b = g(p + "proj.b");
      for (size_t i = 0; i < dres.size(); ++i) dproj_b[i % C] += dres[i];
      gpt::matmul_backward(datty.data(), g(p + "proj.w"), scratch.data(), dres.data(), a.atty.data(), w(p + "proj.w"),
                           N, Cl, C);
      gpt::attention_backward(dqkv.data(), datt.data(), datty.data(), a.qkv.data(), a.att.data(), kBatch, kSeq, Cl, Hl);
      gpt::matmul_backward(dln1.data(), g(p + "qkv.w"), g(p + "qkv.b"), dqkv.data(), a.ln1.data(), w(p + "qkv.w"), N, C,
                           3 * Cl);
      tp_.sum(dln1.data(), dln1.size());
      dx = dres;
      gpt::layernorm_backward(dx.data(), g(p + "ln1.w"), g(p + "ln1.b"), dln1.data(), a.in.data(), w(p + "ln1.w"),
                              a.mean1.data(), a.rstd1.data(), N, C);
      ready(1 + l);
      release(1 + l);
    }
    gather(0);
    float *dwte = g("wte"), *dwpe = g("wpe");
    for (int n = 0; n < N; ++n) {
      const int local = tokens[n] - tp_.rank * Vl;
      for (int c = 0; c < C; ++c) {
        if (local >= 0 && local < Vl) dwte[local * C + c] += dx[n * C + c];
        dwpe[(n % kSeq) * C + c] += dx[n * C + c];
      }
    }
    ready(0);
    release(0);
    check(zero_backward_end(engine_), "zero_backward_end");
    return loss / counted;
  }

 private:
  struct Acts {
    std::vector<float> in, ln1, mean1, rstd1, qkv, att, atty, res, ln2, mean2, rstd2, fc, gelu;
  };

  void add(const std::string& name, std::vector<int64_t> whole, Split split, int unit, int stride = 1) {
    params_.push_back({name, std::move(whole), split, unit, stride});
  }
  static size_t numel(const std::vector<int64_t>& shape) {
    size_t n = 1;
    for (int64_t e : shape) n *= static_cast<size_t>(e);
    return n;
  }
  // The whole param's element that element i of this rank's part (of shape `part`) is.
  size_t whole_index(const Param& p, const std::vector<int64_t>& part, size_t i) const {
    if (p.split == Split::kWhole) return i;
    const size_t cols = p.whole.size() == 2 ? static_cast<size_t>(part[1]) : 1, row = i / cols, col = i % cols;
    if (p.split == Split::kRows) {
      // Block `row / block` of the stride's blocks, this rank's slice of it.
      const size_t block = static_cast<size_t>(part[0] / p.stride), whole_block = block * tp_.size;
      const size_t whole_row = row / block * whole_block + static_cast<size_t>(tp_.rank) * block + row % block;
      return whole_row * cols + col;
    }
    return row * static_cast<size_t>(p.whole[1]) + static_cast<size_t>(tp_.rank) * cols + col;
  }
  // The whole model's initial values, a function of the name and the element (the same on every rank): matrices
  // uniform with standard deviation 0.02, LayerNorm weights 1, biases 0.
  static float initial_value(const Param& p, size_t i) {
    if (p.whole.size() == 1)
      return p.name.find(".ln") != std::string::npos || p.name.rfind("lnf", 0) == 0
                 ? (p.name.back() == 'w' ? 1.0f : 0.0f)
                 : 0.0f;
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : p.name) h = (h ^ c) * 1099511628211ull;
    const double u = static_cast<double>(gpt::splitmix(h ^ i) >> 11) / 9007199254740992.0;
    return static_cast<float>((2.0 * u - 1.0) * 0.02 * std::sqrt(3.0));
  }
  const Param& param(const std::string& name) const {
    for (const Param& p : params_)
      if (p.name == name) return p;
    std::fprintf(stderr, "no param %s\n", name.c_str());
    std::abort();
  }
  const float* w(const std::string& name) {
    void* data = nullptr;
    check(zero_param_data(&data, engine_, param(name).id), "zero_param_data");
    return static_cast<const float*>(data);
  }
  float* g(const std::string& name) {
    void* data = nullptr;
    check(zero_grad_data(&data, engine_, param(name).id), "zero_grad_data");
    return static_cast<float*>(data);
  }
  void gather(int unit) { check(zero_gather(engine_, unit), "zero_gather"); }
  void release(int unit) { check(zero_release(engine_, unit), "zero_release"); }
  void ready(int unit) {
    for (const Param& p : params_)
      if (p.unit == unit) check(zero_grad_ready(engine_, p.id), "zero_grad_ready");
  }

  zero_engine_t* engine_;
  TensorParallel tp_;
  std::vector<Param> params_;
  std::vector<std::vector<float>> init_;
  std::vector<Acts> acts_;
};

}  // namespace

int main(int argc, char** argv) {
  int tp_size = 2, stage = 1, steps = 150;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--tp") == 0) tp_size = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--stage") == 0) stage = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (tp_size < 1 || world % tp_size != 0 || kHeads % tp_size != 0 || kVocab % tp_size != 0) {
    if (rank == 0) std::fprintf(stderr, "--tp must divide the rank count, the 4 heads and the 32 tokens\n");
    MPI_Finalize();
    return 2;
  }
  const int tp_rank = rank % tp_size, dp_rank = rank / tp_size, dp_size = world / tp_size;
  MPI_Comm tp_mpi, dp_mpi;
  MPI_Comm_split(MPI_COMM_WORLD, dp_rank, tp_rank, &tp_mpi);
  MPI_Comm_split(MPI_COMM_WORLD, tp_rank, dp_rank, &dp_mpi);
  zero_comm_t *dp_comm = nullptr, *tp_comm = nullptr;
  check(zero_comm_create_mpi(&dp_comm, MPI_Comm_c2f(dp_mpi)), "zero_comm_create_mpi");
  check(zero_comm_create_mpi(&tp_comm, MPI_Comm_c2f(tp_mpi)), "zero_comm_create_mpi");
  char config[512];
  std::snprintf(
      config, sizeof config,
      "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": 1, \"gradient_clipping\": 1.0,"
      " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.003, \"weight_decay\": 0.01}},"
      " \"zero_optimization\": {\"stage\": %d}}",
      kBatch, stage);
  zero_engine_t* engine = nullptr;
  check(zero_engine_create(&engine, config, dp_comm), "zero_engine_create");
  check(zero_engine_set_model_parallel(engine, tp_comm), "zero_engine_set_model_parallel");
  Model model(engine, TensorParallel{tp_mpi, tp_size, tp_rank});
  model.register_params(dp_rank == 0);
  check(zero_engine_finalize(engine), "zero_engine_finalize");
  model.forget_values();

  // Every tensor-parallel rank of a replica sees the same batch; the replicas see different ones.
  float first = 0.0f, last = 0.0f;
  for (int step = 0; step < steps; ++step) {
    std::vector<int> tokens(kBatch * kSeq);
    for (size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<int>(gpt::splitmix((static_cast<uint64_t>(step) * 1000 + dp_rank) * 4096 + i) % kVocab);
    const float loss = model.micro_step(tokens);
    zero_step_info_t info;
    check(zero_step_info_init(&info, sizeof info), "zero_step_info_init");
    check(zero_step(&info, engine), "zero_step");
    if (step == 0) first = loss;
    last = loss;
  }
  if (rank == 0)
    std::printf(
        "tensor-parallel GPT over the C API: %d tensor-parallel x %d data-parallel ranks, ZeRO stage %d: loss %.3f -> "
        "%.3f in %d steps (uniform guess: %.3f)\n",
        tp_size, dp_size, stage, first, last, steps, std::log(static_cast<float>(kVocab)));
  zero_engine_destroy(engine);
  check(zero_comm_finalize(dp_comm), "zero_comm_finalize");
  check(zero_comm_finalize(tp_comm), "zero_comm_finalize");
  zero_comm_destroy(dp_comm);
  zero_comm_destroy(tp_comm);
  MPI_Comm_free(&tp_mpi);
  MPI_Comm_free(&dp_mpi);
  MPI_Finalize();
  return 0;
}
