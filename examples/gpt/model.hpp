// A GPT-2-style decoder, forward and backward, written out layer by layer (in the manner of llm.c) and templated
// on the element type: float for training, double for the finite-difference gradient check. Matmuls go through
// CBLAS (OpenBLAS). The code knows nothing about libzero: it reads params and adds gradients through pointers that
// the trainer obtains from the engine (tests obtain them from plain arrays).
#pragma once

#include <cblas.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "structure.hpp"

namespace gpt {

// ---------------------------------------------------------------------------------------------------------------
// BLAS, for both element types. Row-major throughout.

inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, const float* a, int lda, const float* b,
                 int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}
inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, const double* a, int lda, const double* b,
                 int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc);
}

// ---------------------------------------------------------------------------------------------------------------
// Layers. N = B x T rows.

template <class T>
void encoder_forward(T* out, const int* tokens, const T* wte, const T* wpe, int B, int Tn, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t) {
      T* o = out + (static_cast<size_t>(b) * Tn + t) * C;
      const T* te = wte + static_cast<size_t>(tokens[b * Tn + t]) * C;
      const T* pe = wpe + static_cast<size_t>(t) * C;
      for (int i = 0; i < C; ++i) o[i] = te[i] + pe[i];
    }
}

template <class T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const int* tokens, int B, int Tn, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t) {
      const T* d = dout + (static_cast<size_t>(b) * Tn + t) * C;
      T* te = dwte + static_cast<size_t>(tokens[b * Tn + t]) * C;
      T* pe = dwpe + static_cast<size_t>(t) * C;
      for (int i = 0; i < C; ++i) te[i] += d[i], pe[i] += d[i];
    }
}

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* bias, int N, int C) {
  const T eps = T(1e-5);
  for (int n = 0; n < N; ++n) {
    const T* x = inp + static_cast<size_t>(n) * C;
    T m = 0;
    for (int i = 0; i < C; ++i) m += x[i];
    m /= C;
    T v = 0;
    for (int i = 0; i < C; ++i) v += (x[i] - m) * (x[i] - m);
    v /= C;
    const T s = T(1) / std::sqrt(v + eps);
    T* o = out + static_cast<size_t>(n) * C;
    for (int i = 0; i < C; ++i) o[i] = (x[i] - m) * s * w[i] + bias[i];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <class T>
void layernorm_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, const T* mean, const T* rstd,
                        int N, int C) {
  for (int n = 0; n < N; ++n) {
    const T* d = dout + static_cast<size_t>(n) * C;
    const T* x = inp + static_cast<size_t>(n) * C;
    T* di = dinp + static_cast<size_t>(n) * C;
    T dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int i = 0; i < C; ++i) {
      const T norm = (x[i] - mean[n]) * rstd[n];
      const T dnorm = w[i] * d[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int i = 0; i < C; ++i) {
      const T norm = (x[i] - mean[n]) * rstd[n];
      const T dnorm = w[i] * d[i];
      dbias[i] += d[i];
      dw[i] += norm * d[i];
      di[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[n];
    }
  }
}

// out[N, OC] = inp[N, C] . w[OC, C]^T + bias
template <class T>
void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int N, int C, int OC) {
  for (int n = 0; n < N; ++n) std::memcpy(out + static_cast<size_t>(n) * OC, bias, sizeof(T) * OC);
  gemm(CblasNoTrans, CblasTrans, N, OC, C, inp, C, w, C, T(1), out, OC);
}

// dinp += dout . w; dw += dout^T . inp; dbias += column sums of dout.
template <class T>
void matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int N, int C, int OC) {
  gemm(CblasNoTrans, CblasNoTrans, N, C, OC, dout, OC, w, C, T(1), dinp, C);
  gemm(CblasTrans, CblasNoTrans, OC, C, N, dout, OC, inp, C, T(1), dw, C);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) dbias[o] += dout[static_cast<size_t>(n) * OC + o];
}

// Causal multi-head attention. qkv[B, T, 3C] -> out[B, T, C]; att[B, H, T, T] keeps the softmax for backward.
template <class T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int H) {
  const int hs = C / H;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t)
      for (int h = 0; h < H; ++h) {
        const T* q = qkv + (static_cast<size_t>(b) * Tn + t) * 3 * C + h * hs;
        T* a = att + ((static_cast<size_t>(b) * H + h) * Tn + t) * Tn;
        T maxv = -1e30;
        for (int t2 = 0; t2 <= t; ++t2) {
          const T* k = qkv + (static_cast<size_t>(b) * Tn + t2) * 3 * C + C + h * hs;
          T dot = 0;
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          a[t2] = dot * scale;
          if (a[t2] > maxv) maxv = a[t2];
        }
        T sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) sum += (a[t2] = std::exp(a[t2] - maxv));
        for (int t2 = 0; t2 < Tn; ++t2) a[t2] = t2 <= t ? a[t2] / sum : T(0);
        T* o = out + (static_cast<size_t>(b) * Tn + t) * C + h * hs;
        for (int i = 0; i < hs; ++i) o[i] = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          const T* v = qkv + (static_cast<size_t>(b) * Tn + t2) * 3 * C + 2 * C + h * hs;
          for (int i = 0; i < hs; ++i) o[i] += a[t2] * v[i];
        }
      }
}

template <class T>
void attention_backward(T* dqkv, T* datt, const T* dout, const T* qkv, const T* att, int B, int Tn, int C, int H) {
  const int hs = C / H;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t)
      for (int h = 0; h < H; ++h) {
        const T* a = att + ((static_cast<size_t>(b) * H + h) * Tn + t) * Tn;
        T* da = datt + ((static_cast<size_t>(b) * H + h) * Tn + t) * Tn;
        const T* d = dout + (static_cast<size_t>(b) * Tn + t) * C + h * hs;
        for (int t2 = 0; t2 <= t; ++t2) {  // through the weighted sum of values
          const T* v = qkv + (static_cast<size_t>(b) * Tn + t2) * 3 * C + 2 * C + h * hs;
          T* dv = dqkv + (static_cast<size_t>(b) * Tn + t2) * 3 * C + 2 * C + h * hs;
          T s = 0;
          for (int i = 0; i < hs; ++i) s += v[i] * d[i], dv[i] += a[t2] * d[i];
          da[t2] = s;
        }
        T dot = 0;  // through the softmax
        for (int t2 = 0; t2 <= t; ++t2) dot += a[t2] * da[t2];
        const T* q = qkv + (static_cast<size_t>(b) * Tn + t) * 3 * C + h * hs;
        T* dq = dqkv + (static_cast<size_t>(b) * Tn + t) * 3 * C + h * hs;
        for (int t2 = 0; t2 <= t; ++t2) {  // through the scaled dot products
          const T dpre = a[t2] * (da[t2] - dot) * scale;
          const T* k = qkv + (static_cast<size_t>(b) * Tn + t2) * 3 * C + C + h * hs;
          T* dk = dqkv + (static_cast<size_t>(b) * Tn + t2) * 3 * C + C + h * hs;
          for (int i = 0; i < hs; ++i) dq[i] += dpre * k[i], dk[i] += dpre * q[i];
        }
      }
}

// GELU, tanh approximation (as GPT-2).
template <class T>
void gelu_forward(T* out, const T* inp, size_t n) {
  const T c = std::sqrt(T(2) / T(M_PI));
  for (size_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = T(0.5) * x * (T(1) + std::tanh(c * (x + T(0.044715) * x * x * x)));
  }
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
  const T c = std::sqrt(T(2) / T(M_PI));
  for (size_t i = 0; i < n; ++i) {
    const T x = inp[i], u = c * (x + T(0.044715) * x * x * x), th = std::tanh(u);
    const T sech2 = T(1) - th * th;
    const T grad = T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * c * (T(1) + T(3) * T(0.044715) * x * x);
    dinp[i] += grad * dout[i];
  }
}

// Softmax cross-entropy over logits[N, V]: returns the mean loss over the counted positions (a target of -1 is not
// counted: its dlogits are 0); writes dlogits = (p - onehot) / counted.
template <class T>
T crossentropy_forward_backward(T* dlogits, const T* logits, const int* targets, int N, int V) {
  int counted = 0;
  for (int n = 0; n < N; ++n) counted += targets[n] >= 0;
  if (counted == 0) counted = 1;
  T loss = 0;
  for (int n = 0; n < N; ++n) {
    const T* l = logits + static_cast<size_t>(n) * V;
    T* d = dlogits + static_cast<size_t>(n) * V;
    if (targets[n] < 0) {
      for (int v = 0; v < V; ++v) d[v] = T(0);
      continue;
    }
    T maxv = l[0];
    for (int v = 1; v < V; ++v) maxv = l[v] > maxv ? l[v] : maxv;
    T sum = 0;
    for (int v = 0; v < V; ++v) sum += (d[v] = std::exp(l[v] - maxv));
    for (int v = 0; v < V; ++v) d[v] /= sum;
    loss -= std::log(d[targets[n]]);
    d[targets[n]] -= T(1);
    for (int v = 0; v < V; ++v) d[v] /= counted;
  }
  return loss / counted;
}

// ---------------------------------------------------------------------------------------------------------------
// Blocks and the model.

// Activations of one block for one micro-batch.
template <class T>
struct BlockActs {
  std::vector<T> ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean, ln2_rstd, fc, gelu;
  void resize(const ModelConfig& c, int B) {
    const size_t N = static_cast<size_t>(B) * c.seq_len, C = c.channels;
    ln1.resize(N * C), ln1_mean.resize(N), ln1_rstd.resize(N), qkv.resize(N * 3 * C);
    att.resize(static_cast<size_t>(B) * c.heads * c.seq_len * c.seq_len), atty.resize(N * C), res2.resize(N * C);
    ln2.resize(N * C), ln2_mean.resize(N), ln2_rstd.resize(N), fc.resize(N * 4 * C), gelu.resize(N * 4 * C);
  }
  size_t bytes() const {
    return sizeof(T) * (ln1.size() + ln1_mean.size() + ln1_rstd.size() + qkv.size() + att.size() + atty.size() +
                        res2.size() + ln2.size() + ln2_mean.size() + ln2_rstd.size() + fc.size() + gelu.size());
  }
};

template <class T>
void block_forward(const ModelConfig& c, int B, const Block<const T*>& p, BlockActs<T>& a, const T* x, T* out) {
  const int N = B * c.seq_len, C = c.channels;
  layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, p.ln1_w, p.ln1_b, N, C);
  matmul_forward(a.qkv.data(), a.ln1.data(), p.qkv_w, p.qkv_b, N, C, 3 * C);
  attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), B, c.seq_len, C, c.heads);
  matmul_forward(a.res2.data(), a.atty.data(), p.proj_w, p.proj_b, N, C, C);
  for (size_t i = 0; i < static_cast<size_t>(N) * C; ++i) a.res2[i] += x[i];
  layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), p.ln2_w, p.ln2_b, N, C);
  matmul_forward(a.fc.data(), a.ln2.data(), p.fc_w, p.fc_b, N, C, 4 * C);
  gelu_forward(a.gelu.data(), a.fc.data(), static_cast<size_t>(N) * 4 * C);
  matmul_forward(out, a.gelu.data(), p.fcproj_w, p.fcproj_b, N, 4 * C, C);
  for (size_t i = 0; i < static_cast<size_t>(N) * C; ++i) out[i] += a.res2[i];
}

// Scratch for a block's backward, reused across blocks.
template <class T>
struct BlockScratch {
  std::vector<T> dres2, dwide, dfc, dnarrow, dqkv, datt;
  void resize(const ModelConfig& c, int B) {
    const size_t N = static_cast<size_t>(B) * c.seq_len, C = c.channels;
    dres2.resize(N * C), dwide.resize(N * 4 * C), dfc.resize(N * 4 * C), dnarrow.resize(N * C), dqkv.resize(N * 3 * C);
    datt.resize(static_cast<size_t>(B) * c.heads * c.seq_len * c.seq_len);
  }
};

// dx holds d(loss)/d(block output) on entry and d(loss)/d(block input) on exit; gradients are added into g.
template <class T>
void block_backward(const ModelConfig& c, int B, const Block<const T*>& p, const Block<T*>& g, const BlockActs<T>& a,
                    const T* x, T* dx, BlockScratch<T>& s) {
  const int N = B * c.seq_len, C = c.channels;
  const size_t NC = static_cast<size_t>(N) * C;
  std::copy(dx, dx + NC, s.dres2.begin());  // the residual path
  std::fill(s.dwide.begin(), s.dwide.end(), T(0));
  matmul_backward(s.dwide.data(), g.fcproj_w, g.fcproj_b, dx, a.gelu.data(), p.fcproj_w, N, 4 * C, C);
  std::fill(s.dfc.begin(), s.dfc.end(), T(0));
  gelu_backward(s.dfc.data(), a.fc.data(), s.dwide.data(), s.dfc.size());
  std::fill(s.dnarrow.begin(), s.dnarrow.end(), T(0));
  matmul_backward(s.dnarrow.data(), g.fc_w, g.fc_b, s.dfc.data(), a.ln2.data(), p.fc_w, N, C, 4 * C);
  layernorm_backward(s.dres2.data(), g.ln2_w, g.ln2_b, s.dnarrow.data(), a.res2.data(), p.ln2_w, a.ln2_mean.data(),
                     a.ln2_rstd.data(), N, C);
  std::copy(s.dres2.begin(), s.dres2.end(), dx);  // the residual into the block input
  std::fill(s.dnarrow.begin(), s.dnarrow.end(), T(0));
  matmul_backward(s.dnarrow.data(), g.proj_w, g.proj_b, s.dres2.data(), a.atty.data(), p.proj_w, N, C, C);
  std::fill(s.dqkv.begin(), s.dqkv.end(), T(0));
  attention_backward(s.dqkv.data(), s.datt.data(), s.dnarrow.data(), a.qkv.data(), a.att.data(), B, c.seq_len, C,
                     c.heads);
  std::fill(s.dnarrow.begin(), s.dnarrow.end(), T(0));
  matmul_backward(s.dnarrow.data(), g.qkv_w, g.qkv_b, s.dqkv.data(), a.ln1.data(), p.qkv_w, N, C, 3 * C);
  layernorm_backward(dx, g.ln1_w, g.ln1_b, s.dnarrow.data(), x, p.ln1_w, a.ln1_mean.data(), a.ln1_rstd.data(), N, C);
}

// One micro-batch: forward, loss, backward. With activation checkpointing only each block's input is kept and the
// block's forward is recomputed during backward (bit-identical: same inputs, same operations).
template <class T>
class Runner {
 public:
  Runner(const ModelConfig& c, int batch, bool checkpointing) : c_(c), B_(batch), checkpointing_(checkpointing) {
    const size_t N = static_cast<size_t>(batch) * c.seq_len;
    residual_.assign(static_cast<size_t>(c.layers) + 1, std::vector<T>(N * c.channels));
    acts_.resize(checkpointing ? 1 : static_cast<size_t>(c.layers));
    for (auto& a : acts_) a.resize(c, batch);
    scratch_.resize(c, batch);
    lnf_.resize(N * c.channels), lnf_mean_.resize(N), lnf_rstd_.resize(N);
    logits_.resize(N * c.vocab), dlogits_.resize(N * c.vocab), dx_.resize(N * c.channels), dlnf_.resize(N * c.channels);
    recompute_out_.resize(N * c.channels);
  }

  // Bytes of activations kept across the forward pass (block inputs, per-block activations, head).
  size_t activation_bytes() const {
    size_t bytes = 0;
    for (const auto& r : residual_) bytes += r.size() * sizeof(T);
    for (const auto& a : acts_) bytes += a.bytes();
    return bytes + sizeof(T) * (lnf_.size() + lnf_mean_.size() + lnf_rstd_.size() + logits_.size());
  }

  // Mean cross-entropy of the micro-batch; with `backward`, its gradients are added through `src`.
  T step(ParamSource<T>& src, const int* tokens, const int* targets, bool backward) {
    const int N = B_ * c_.seq_len, C = c_.channels, V = c_.vocab;
    Embedding<const T*> e = src.gather_embedding();
    encoder_forward(residual_[0].data(), tokens, e.wte, e.wpe, B_, c_.seq_len, C);
    src.release_embedding();
    for (int l = 0; l < c_.layers; ++l) {
      Block<const T*> p = src.gather_block(l);
      block_forward(c_, B_, p, acts(l), residual_[l].data(), residual_[l + 1].data());
      src.release_block(l);
    }
    e = src.gather_embedding();
    layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), residual_[c_.layers].data(), e.lnf_w, e.lnf_b, N,
                      C);
    gemm(CblasNoTrans, CblasTrans, N, V, C, lnf_.data(), C, e.head, C, T(0), logits_.data(), V);
    const T loss = crossentropy_forward_backward(dlogits_.data(), logits_.data(), targets, N, V);
    if (!backward) {
      src.release_embedding();
      return loss;
    }
    Embedding<T*> eg = src.embedding_grads();
    // The head: dlnf = dlogits . head, dhead += dlogits^T . lnf (tied, into wte's gradient, which the encoder
    // adds to below).
    gemm(CblasNoTrans, CblasNoTrans, N, C, V, dlogits_.data(), V, e.head, C, T(0), dlnf_.data(), C);
    gemm(CblasTrans, CblasNoTrans, V, C, N, dlogits_.data(), V, lnf_.data(), C, T(1), eg.head, C);
    std::fill(dx_.begin(), dx_.end(), T(0));
    layernorm_backward(dx_.data(), eg.lnf_w, eg.lnf_b, dlnf_.data(), residual_[c_.layers].data(), e.lnf_w,
                       lnf_mean_.data(), lnf_rstd_.data(), N, C);
    src.final_norm_grads_ready();
    src.release_embedding();
    for (int l = c_.layers - 1; l >= 0; --l) {
      Block<const T*> p = src.gather_block(l);
      if (checkpointing_) block_forward(c_, B_, p, acts(l), residual_[l].data(), recompute_out_.data());
      Block<T*> g = src.block_grads(l);
      block_backward(c_, B_, p, g, acts(l), residual_[l].data(), dx_.data(), scratch_);
      src.block_grads_ready(l);
      src.release_block(l);
    }
    src.gather_embedding();
    eg = src.embedding_grads();
    encoder_backward(eg.wte, eg.wpe, dx_.data(), tokens, B_, c_.seq_len, C);
    src.embedding_grads_ready();
    src.release_embedding();
    return loss;
  }

  const std::vector<T>& logits() const { return logits_; }

 private:
  BlockActs<T>& acts(int layer) { return acts_[checkpointing_ ? 0 : static_cast<size_t>(layer)]; }

  ModelConfig c_;
  int B_;
  bool checkpointing_;
  std::vector<std::vector<T>> residual_;  // block inputs (and the final output)
  std::vector<BlockActs<T>> acts_;
  BlockScratch<T> scratch_;
  std::vector<T> lnf_, lnf_mean_, lnf_rstd_, logits_, dlogits_, dx_, dlnf_, recompute_out_;
};

}  // namespace gpt
