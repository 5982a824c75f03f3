// One micro-batch of the GPT on a device: model.hpp's Runner, step for step, with every activation in the backend's
// memory and every layer a launch of a work-item kernel (device/layers.hpp) or a backend matmul. The backend is
// CUDA (device/cuda_backend.cu: kernels and cuBLASLt on one stream) or the CPU (device/host_backend.hpp). Params
// and gradients come from a ParamSource as pointers into the backend's memory (the engine's, for a device engine).
//
// A Backend provides: each(n, item) runs item(i) for i in [0, n) in any order; gemm (row-major, alpha 1, model.hpp's
// arguments); matmul_bias (out = inp . w^T + bias); alloc<T>(n) (zeroed, freed with the backend); zero, copy (within
// its memory), upload (from the host; the host buffer may change once it returns), download (to the host; complete
// on return).
#pragma once

#include <cstddef>
#include <vector>

#include "../structure.hpp"
#include "layers.hpp"

namespace gpt {
namespace device {

template <class Backend, class T>
class DeviceRunner {
 public:
  DeviceRunner(Backend& backend, const ModelConfig& c, int batch, bool checkpointing)
      : be_(backend), c_(c), B_(batch), N_(batch * c.seq_len), checkpointing_(checkpointing) {
    const size_t N = static_cast<size_t>(N_), C = c.channels, att = static_cast<size_t>(batch) * c.heads * c.seq_len;
    for (int l = 0; l <= c.layers; ++l) residual_.push_back(kept(N * C));
    acts_.resize(checkpointing ? 1 : static_cast<size_t>(c.layers));
    for (Acts& a : acts_) {
      a.ln1 = kept(N * C), a.ln1_mean = kept(N), a.ln1_rstd = kept(N), a.qkv = kept(N * 3 * C);
      a.att = kept(att * c.seq_len), a.atty = kept(N * C), a.res2 = kept(N * C), a.ln2 = kept(N * C);
      a.ln2_mean = kept(N), a.ln2_rstd = kept(N), a.fc = kept(N * 4 * C), a.gelu = kept(N * 4 * C);
    }
    lnf_ = kept(N * C), lnf_mean_ = kept(N), lnf_rstd_ = kept(N), logits_ = kept(N * c.vocab);
    dres2_ = scratch<T>(N * C), dwide_ = scratch<T>(N * 4 * C), dfc_ = scratch<T>(N * 4 * C);
    dnarrow_ = scratch<T>(N * C), dqkv_ = scratch<T>(N * 3 * C), dscore_ = scratch<T>(att * c.seq_len);
    dlogits_ = scratch<T>(N * c.vocab), dx_ = scratch<T>(N * C), dlnf_ = scratch<T>(N * C);
    recompute_out_ = scratch<T>(N * C), losses_ = scratch<T>(N);
    tokens_ = scratch<int>(N), targets_ = scratch<int>(N), first_ = scratch<int>(static_cast<size_t>(c.vocab) + 1);
    positions_ = scratch<int>(N);
    host_losses_.resize(N);
  }
  DeviceRunner(const DeviceRunner&) = delete;
  DeviceRunner& operator=(const DeviceRunner&) = delete;

  // Bytes of activations kept across the forward pass (model.hpp's count).
  size_t activation_bytes() const { return activation_bytes_; }

  // Mean cross-entropy of the micro-batch; with `backward`, its gradients are added through `src`. `tokens` and
  // `targets` are host arrays of batch x seq_len.
  T step(ParamSource<T>& src, const int* tokens, const int* targets, bool backward) {
    const int N = N_, C = c_.channels, V = c_.vocab, L = c_.layers;
    const size_t NC = static_cast<size_t>(N) * C;
    upload_batch(tokens, targets);
    Embedding<const T*> e = src.gather_embedding();
    be_.each(NC, EncoderForward<T>{residual_[0], tokens_, e.wte, e.wpe, c_.seq_len, C});
    src.release_embedding();
    for (int l = 0; l < L; ++l) {
      Block<const T*> p = src.gather_block(l);
      block_forward(p, acts(l), residual_[l], residual_[l + 1]);
      src.release_block(l);
    }
    e = src.gather_embedding();
    be_.each(N, LayerNormForward<T>{lnf_, lnf_mean_, lnf_rstd_, residual_[L], e.lnf_w, e.lnf_b, C});
    be_.gemm(false, true, N, V, C, lnf_, C, e.head, C, T(0), logits_, V);
    be_.each(N, CrossEntropy<T>{dlogits_, losses_, logits_, targets_, V, counted_});
    if (backward) {
      Embedding<T*> eg = src.embedding_grads();
      // The head: dlnf = dlogits . head, dhead += dlogits^T . lnf (tied, into wte's gradient, which the encoder
      // adds to below).
      be_.gemm(false, false, N, C, V, dlogits_, V, e.head, C, T(0), dlnf_, C);
      be_.gemm(true, false, V, C, N, dlogits_, V, lnf_, C, T(1), eg.head, C);
      be_.zero(dx_, NC * sizeof(T));
      layernorm_backward(dx_, eg.lnf_w, eg.lnf_b, dlnf_, residual_[L], e.lnf_w, lnf_mean_, lnf_rstd_);
      src.final_norm_grads_ready();
    }
    src.release_embedding();
    if (backward) {
      for (int l = L - 1; l >= 0; --l) {
        Block<const T*> p = src.gather_block(l);
        if (checkpointing_) block_forward(p, acts(l), residual_[l], recompute_out_);
        block_backward(p, src.block_grads(l), acts(l), residual_[l], dx_);
        src.block_grads_ready(l);
        src.release_block(l);
      }
      src.gather_embedding();
      Embedding<T*> eg = src.embedding_grads();
      be_.each(static_cast<size_t>(V) * C, EncoderBackwardTokens<T>{eg.wte, dx_, first_, positions_, C});
      be_.each(static_cast<size_t>(c_.seq_len) * C, EncoderBackwardPositions<T>{eg.wpe, dx_, B_, c_.seq_len, C});
      src.embedding_grads_ready();
      src.release_embedding();
    }
    // The rows' losses in row order, as model.hpp sums them.
    be_.download(host_losses_.data(), losses_, sizeof(T) * host_losses_.size());
    T loss = 0;
    for (T row : host_losses_) loss += row;
    return loss / counted_;
  }

  // The last step's logits [batch x seq_len, vocab], on the host.
  void logits(std::vector<T>& out) {
    out.resize(static_cast<size_t>(N_) * c_.vocab);
    be_.download(out.data(), logits_, sizeof(T) * out.size());
  }

 private:
  struct Acts {
    T *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd, *fc, *gelu;
  };

  T* kept(size_t n) {
    activation_bytes_ += n * sizeof(T);
    return be_.template alloc<T>(n);
  }
  template <class U>
  U* scratch(size_t n) {
    return be_.template alloc<U>(n);
  }
  Acts& acts(int layer) { return acts_[checkpointing_ ? 0 : static_cast<size_t>(layer)]; }

  // Tokens, targets, the count of positions the loss counts, and each token's positions for the encoder's backward.
  void upload_batch(const int* tokens, const int* targets) {
    const int V = c_.vocab;
    counted_ = 0;
    for (int n = 0; n < N_; ++n) counted_ += targets[n] >= 0;
    if (counted_ == 0) counted_ = 1;
    host_first_.assign(static_cast<size_t>(V) + 1, 0);
    for (int n = 0; n < N_; ++n) ++host_first_[static_cast<size_t>(tokens[n]) + 1];
    for (int v = 0; v < V; ++v) host_first_[static_cast<size_t>(v) + 1] += host_first_[static_cast<size_t>(v)];
    host_positions_.resize(static_cast<size_t>(N_));
    std::vector<int> next(host_first_.begin(), host_first_.end() - 1);
    for (int n = 0; n < N_; ++n) host_positions_[static_cast<size_t>(next[static_cast<size_t>(tokens[n])]++)] = n;
    be_.upload(tokens_, tokens, sizeof(int) * static_cast<size_t>(N_));
    be_.upload(targets_, targets, sizeof(int) * static_cast<size_t>(N_));
    be_.upload(first_, host_first_.data(), sizeof(int) * host_first_.size());
    be_.upload(positions_, host_positions_.data(), sizeof(int) * host_positions_.size());
  }

  void matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int C, int OC) {
    be_.gemm(false, false, N_, C, OC, dout, OC, w, C, T(1), dinp, C);
    be_.gemm(true, false, OC, C, N_, dout, OC, inp, C, T(1), dw, C);
    be_.each(static_cast<size_t>(OC), BiasBackward<T>{dbias, dout, N_, OC});
  }

  void layernorm_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, const T* mean,
                          const T* rstd) {
    const int C = c_.channels;
    be_.each(static_cast<size_t>(N_), LayerNormBackwardInput<T>{dinp, dout, inp, w, mean, rstd, C});
    be_.each(static_cast<size_t>(C), LayerNormBackwardParams<T>{dw, dbias, dout, inp, mean, rstd, N_, C});
  }

  void block_forward(const Block<const T*>& p, Acts& a, const T* x, T* out) {
    const int N = N_, C = c_.channels, H = c_.heads;
    const size_t NC = static_cast<size_t>(N) * C;
    be_.each(N, LayerNormForward<T>{a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1_w, p.ln1_b, C});
    be_.matmul_bias(a.qkv, a.ln1, p.qkv_w, p.qkv_b, N, C, 3 * C);
    be_.each(static_cast<size_t>(N) * H, AttentionForward<T>{a.atty, a.att, a.qkv, c_.seq_len, C, H});
    be_.matmul_bias(a.res2, a.atty, p.proj_w, p.proj_b, N, C, C);
    be_.each(NC, AddInto<T>{a.res2, x});
    be_.each(N, LayerNormForward<T>{a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2_w, p.ln2_b, C});
    be_.matmul_bias(a.fc, a.ln2, p.fc_w, p.fc_b, N, C, 4 * C);
    be_.each(NC * 4, GeluForward<T>{a.gelu, a.fc});
    be_.matmul_bias(out, a.gelu, p.fcproj_w, p.fcproj_b, N, 4 * C, C);
    be_.each(NC, AddInto<T>{out, a.res2});
  }

  // dx holds d(loss)/d(block output) on entry and d(loss)/d(block input) on exit; gradients are added into g.
  void block_backward(const Block<const T*>& p, const Block<T*>& g, const Acts& a, const T* x, T* dx) {
    const int N = N_, C = c_.channels, H = c_.heads;
    const size_t NC = static_cast<size_t>(N) * C;
    be_.copy(dres2_, dx, NC * sizeof(T));  // the residual path
    be_.zero(dwide_, NC * 4 * sizeof(T));
    matmul_backward(dwide_, g.fcproj_w, g.fcproj_b, dx, a.gelu, p.fcproj_w, 4 * C, C);
    be_.zero(dfc_, NC * 4 * sizeof(T));
    be_.each(NC * 4, GeluBackward<T>{dfc_, a.fc, dwide_});
    be_.zero(dnarrow_, NC * sizeof(T));
    matmul_backward(dnarrow_, g.fc_w, g.fc_b, dfc_, a.ln2, p.fc_w, C, 4 * C);
    layernorm_backward(dres2_, g.ln2_w, g.ln2_b, dnarrow_, a.res2, p.ln2_w, a.ln2_mean, a.ln2_rstd);
    be_.copy(dx, dres2_, NC * sizeof(T));  // the residual into the block input
    be_.zero(dnarrow_, NC * sizeof(T));
    matmul_backward(dnarrow_, g.proj_w, g.proj_b, dres2_, a.atty, p.proj_w, C, C);
    be_.zero(dqkv_, NC * 3 * sizeof(T));
    const size_t rows = static_cast<size_t>(N) * H, elements = NC;
    be_.each(rows, AttentionBackwardScores<T>{dscore_, dnarrow_, a.qkv, a.att, c_.seq_len, C, H});
    be_.each(elements, AttentionBackwardQuery<T>{dqkv_, dscore_, a.qkv, c_.seq_len, C, H});
    be_.each(elements, AttentionBackwardKeyValue<T>{dqkv_, dscore_, a.att, dnarrow_, a.qkv, c_.seq_len, C, H});
    be_.zero(dnarrow_, NC * sizeof(T));
    matmul_backward(dnarrow_, g.qkv_w, g.qkv_b, dqkv_, a.ln1, p.qkv_w, C, 3 * C);
    layernorm_backward(dx, g.ln1_w, g.ln1_b, dnarrow_, x, p.ln1_w, a.ln1_mean, a.ln1_rstd);
  }

  Backend& be_;
  ModelConfig c_;
  int B_, N_;
  bool checkpointing_;
  int counted_ = 1;
  size_t activation_bytes_ = 0;
  std::vector<T*> residual_;  // block inputs (and the final output)
  std::vector<Acts> acts_;
  T *lnf_, *lnf_mean_, *lnf_rstd_, *logits_;
  T *dres2_, *dwide_, *dfc_, *dnarrow_, *dqkv_, *dscore_, *dlogits_, *dx_, *dlnf_, *recompute_out_, *losses_;
  int *tokens_, *targets_, *first_, *positions_;
  std::vector<int> host_first_, host_positions_;
  std::vector<T> host_losses_;
};

}  // namespace device
}  // namespace gpt
