// The GPT's layers as work items for a device: each struct is one kernel, and operator()(i) computes the i-th of its
// items, writing only that item's outputs, so any number of items may run at once, in any order, with no atomics:
// the same items give the same bits however they are scheduled. Sums over many rows (a bias's gradient, a norm's
// weight gradient, an embedding row's gradient) are one item per output element, adding its rows in row order.
//
// The arithmetic is model.hpp's, operation for operation, so that on the CPU (device/host_backend.hpp) these items
// give model.hpp's bits exactly (tests/gpt/device_layers_test.cpp); CUDA (device/cuda_backend.cu) runs them as
// kernels. The matmuls are the backends' own (cuBLASLt on the GPU).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define GPT_HD __host__ __device__
#else
#define GPT_HD
#endif

namespace gpt {
namespace device {

// The math functions by element type: CUDA's in device code, the C++ library's on the host.
#ifdef __CUDA_ARCH__
#define GPT_MATH(name)                 \
  template <class T>                   \
  __device__ inline T name##_of(T x) { \
    return ::name(x);                  \
  }
#else
#define GPT_MATH(name)      \
  template <class T>        \
  inline T name##_of(T x) { \
    return std::name(x);    \
  }
#endif
GPT_MATH(exp)
GPT_MATH(sqrt)
GPT_MATH(tanh)
GPT_MATH(log)
#undef GPT_MATH

// out[n, i] = wte[token[n], i] + wpe[n mod T, i]; item n * C + i.
template <class T>
struct EncoderForward {
  T* out;
  const int* tokens;
  const T *wte, *wpe;
  int seq_len, C;
  GPT_HD void operator()(size_t item) const {
    const size_t n = item / C, i = item % C;
    out[item] = wte[static_cast<size_t>(tokens[n]) * C + i] + wpe[(n % seq_len) * C + i];
  }
};

// dwte[v, i] += dout[n, i] over the positions n holding token v, in position order; item v * C + i. `first` and
// `positions` list each token's positions (ascending), built on the host from the tokens it already has:
// positions[first[v] .. first[v + 1]).
template <class T>
struct EncoderBackwardTokens {
  T* dwte;
  const T* dout;
  const int *first, *positions;
  int C;
  GPT_HD void operator()(size_t item) const {
    const size_t v = item / C, i = item % C;
    T acc = dwte[item];
    for (int p = first[v]; p < first[v + 1]; ++p) acc += dout[static_cast<size_t>(positions[p]) * C + i];
    dwte[item] = acc;
  }
};

// dwpe[t, i] += dout[b, t, i] over the sequences b in order; item t * C + i.
template <class T>
struct EncoderBackwardPositions {
  T* dwpe;
  const T* dout;
  int batch, seq_len, C;
  GPT_HD void operator()(size_t item) const {
    T acc = dwpe[item];
    for (int b = 0; b < batch; ++b) acc += dout[static_cast<size_t>(b) * seq_len * C + item];
    dwpe[item] = acc;
  }
};

// One row per item.
template <class T>
struct LayerNormForward {
  T *out, *mean, *rstd;
  const T *inp, *w, *bias;
  int C;
  GPT_HD void operator()(size_t n) const {
    const T eps = T(1e-5);
    const T* x = inp + n * C;
    T m = 0;
    for (int i = 0; i < C; ++i) m += x[i];
    m /= C;
    T v = 0;
    for (int i = 0; i < C; ++i) v += (x[i] - m) * (x[i] - m);
    v /= C;
    const T s = T(1) / sqrt_of(v + eps);
    T* o = out + n * C;
    for (int i = 0; i < C; ++i) o[i] = (x[i] - m) * s * w[i] + bias[i];
    mean[n] = m;
    rstd[n] = s;
  }
};

// dinp += the input's gradient; one row per item.
template <class T>
struct LayerNormBackwardInput {
  T* dinp;
  const T *dout, *inp, *w, *mean, *rstd;
  int C;
  GPT_HD void operator()(size_t n) const {
    const T* d = dout + n * C;
    const T* x = inp + n * C;
    T* di = dinp + n * C;
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
      di[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[n];
    }
  }
};

// dw[i] += norm[n, i] * dout[n, i] and dbias[i] += dout[n, i] over the rows in order; one column per item.
template <class T>
struct LayerNormBackwardParams {
  T *dw, *dbias;
  const T *dout, *inp, *mean, *rstd;
  int rows, C;
  GPT_HD void operator()(size_t i) const {
    T acc_w = dw[i], acc_b = dbias[i];
    for (int n = 0; n < rows; ++n) {
      const size_t at = static_cast<size_t>(n) * C + i;
      const T norm = (inp[at] - mean[n]) * rstd[n];
      acc_b += dout[at];
      acc_w += norm * dout[at];
    }
    dw[i] = acc_w;
    dbias[i] = acc_b;
  }
};

// out[n, o] = bias[o]: the rows a matmul then adds into (model.hpp's matmul_forward); item n * OC + o.
template <class T>
struct BiasRows {
  T* out;
  const T* bias;
  int OC;
  GPT_HD void operator()(size_t item) const { out[item] = bias[item % OC]; }
};

// dbias[o] += dout[n, o] over the rows in order; one column per item.
template <class T>
struct BiasBackward {
  T* dbias;
  const T* dout;
  int rows, OC;
  GPT_HD void operator()(size_t o) const {
    T acc = dbias[o];
    for (int n = 0; n < rows; ++n) acc += dout[static_cast<size_t>(n) * OC + o];
    dbias[o] = acc;
  }
};

// Causal attention, one (sequence, position, head) per item: item (b * T + t) * H + h.
template <class T>
struct AttentionForward {
  T *out, *att;
  const T* qkv;
  int seq_len, C, H;
  GPT_HD void operator()(size_t item) const {
    const int h = static_cast<int>(item % H), t = static_cast<int>(item / H % seq_len);
    const size_t b = item / H / seq_len;
    const int hs = C / H;
    const T scale = T(1) / sqrt_of(static_cast<T>(hs));
    const T* q = qkv + (b * seq_len + t) * 3 * C + h * hs;
    T* a = att + ((b * H + h) * seq_len + t) * seq_len;
    T maxv = -1e30;
    for (int t2 = 0; t2 <= t; ++t2) {
      const T* k = qkv + (b * seq_len + t2) * 3 * C + C + h * hs;
      T dot = 0;
      for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
      a[t2] = dot * scale;
      if (a[t2] > maxv) maxv = a[t2];
    }
    T sum = 0;
    for (int t2 = 0; t2 <= t; ++t2) sum += (a[t2] = exp_of(a[t2] - maxv));
    for (int t2 = 0; t2 < seq_len; ++t2) a[t2] = t2 <= t ? a[t2] / sum : T(0);
    T* o = out + (b * seq_len + t) * C + h * hs;
    for (int i = 0; i < hs; ++i) o[i] = 0;
    for (int t2 = 0; t2 <= t; ++t2) {
      const T* v = qkv + (b * seq_len + t2) * 3 * C + 2 * C + h * hs;
      for (int i = 0; i < hs; ++i) o[i] += a[t2] * v[i];
    }
  }
};

// Attention's backward in three launches, each writing only its own items (model.hpp's loop scatters into the keys
// and values of earlier positions). First the scores' gradients: dscore[t, t2] (the softmax's input gradient, with
// the scale) into `dscore`, laid out as att; one (sequence, position, head) per item.
template <class T>
struct AttentionBackwardScores {
  T* dscore;
  const T *dout, *qkv, *att;
  int seq_len, C, H;
  GPT_HD void operator()(size_t item) const {
    const int h = static_cast<int>(item % H), t = static_cast<int>(item / H % seq_len);
    const size_t b = item / H / seq_len;
    const int hs = C / H;
    const T scale = T(1) / sqrt_of(static_cast<T>(hs));
    const T* a = att + ((b * H + h) * seq_len + t) * seq_len;
    T* ds = dscore + ((b * H + h) * seq_len + t) * seq_len;
    const T* d = dout + (b * seq_len + t) * C + h * hs;
    for (int t2 = 0; t2 <= t; ++t2) {  // through the weighted sum of values
      const T* v = qkv + (b * seq_len + t2) * 3 * C + 2 * C + h * hs;
      T s = 0;
      for (int i = 0; i < hs; ++i) s += v[i] * d[i];
      ds[t2] = s;
    }
    T dot = 0;  // through the softmax
    for (int t2 = 0; t2 <= t; ++t2) dot += a[t2] * ds[t2];
    for (int t2 = 0; t2 <= t; ++t2) ds[t2] = a[t2] * (ds[t2] - dot) * scale;
    for (int t2 = t + 1; t2 < seq_len; ++t2) ds[t2] = T(0);
  }
};

// dq[t, i] += dscore[t, t2] * k[t2, i] over t2 <= t in order; item ((b * T + t) * H + h) * hs + i.
template <class T>
struct AttentionBackwardQuery {
  T* dqkv;
  const T *dscore, *qkv;
  int seq_len, C, H;
  GPT_HD void operator()(size_t item) const {
    const int hs = C / H;
    const int i = static_cast<int>(item % hs), h = static_cast<int>(item / hs % H);
    const int t = static_cast<int>(item / hs / H % seq_len);
    const size_t b = item / hs / H / seq_len;
    const T* ds = dscore + ((b * H + h) * seq_len + t) * seq_len;
    T* dq = dqkv + (b * seq_len + t) * 3 * C + h * hs + i;
    T acc = *dq;
    for (int t2 = 0; t2 <= t; ++t2) acc += ds[t2] * qkv[(b * seq_len + t2) * 3 * C + C + h * hs + i];
    *dq = acc;
  }
};

// dk[t2, i] += dscore[t, t2] * q[t, i] and dv[t2, i] += att[t, t2] * dout[t, i] over t >= t2 in order; item
// ((b * T + t2) * H + h) * hs + i.
template <class T>
struct AttentionBackwardKeyValue {
  T* dqkv;
  const T *dscore, *att, *dout, *qkv;
  int seq_len, C, H;
  GPT_HD void operator()(size_t item) const {
    const int hs = C / H;
    const int i = static_cast<int>(item % hs), h = static_cast<int>(item / hs % H);
    const int t2 = static_cast<int>(item / hs / H % seq_len);
    const size_t b = item / hs / H / seq_len;
    T* dk = dqkv + (b * seq_len + t2) * 3 * C + C + h * hs + i;
    T* dv = dk + C;
    T acc_k = *dk, acc_v = *dv;
    for (int t = t2; t < seq_len; ++t) {
      const size_t row = ((b * H + h) * seq_len + t) * seq_len + t2;
      acc_v += att[row] * dout[(b * seq_len + t) * C + h * hs + i];
      acc_k += dscore[row] * qkv[(b * seq_len + t) * 3 * C + h * hs + i];
    }
    *dk = acc_k;
    *dv = acc_v;
  }
};

// GELU, tanh approximation (as GPT-2); per element.
template <class T>
struct GeluForward {
  T* out;
  const T* inp;
  GPT_HD void operator()(size_t i) const {
    const T c = sqrt_of(T(2) / T(M_PI));
    const T x = inp[i];
    out[i] = T(0.5) * x * (T(1) + tanh_of(c * (x + T(0.044715) * x * x * x)));
  }
};

template <class T>
struct GeluBackward {
  T* dinp;
  const T *inp, *dout;
  GPT_HD void operator()(size_t i) const {
    const T c = sqrt_of(T(2) / T(M_PI));
    const T x = inp[i], u = c * (x + T(0.044715) * x * x * x), th = tanh_of(u);
    const T sech2 = T(1) - th * th;
    const T grad = T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * c * (T(1) + T(3) * T(0.044715) * x * x);
    dinp[i] += grad * dout[i];
  }
};

// out[i] += in[i].
template <class T>
struct AddInto {
  T* out;
  const T* in;
  GPT_HD void operator()(size_t i) const { out[i] += in[i]; }
};

// Softmax cross-entropy, one row per item: loss[n] = -log p[target] (0 where the target is -1, not counted) and
// dlogits = (p - onehot) / counted. The host sums the rows' losses in row order (model.hpp's order).
template <class T>
struct CrossEntropy {
  T *dlogits, *loss;
  const T* logits;
  const int* targets;
  int V, counted;
  GPT_HD void operator()(size_t n) const {
    const T* l = logits + n * V;
    T* d = dlogits + n * V;
    if (targets[n] < 0) {
      for (int v = 0; v < V; ++v) d[v] = T(0);
      loss[n] = T(0);
      return;
    }
    T maxv = l[0];
    for (int v = 1; v < V; ++v) maxv = l[v] > maxv ? l[v] : maxv;
    T sum = 0;
    for (int v = 0; v < V; ++v) sum += (d[v] = exp_of(l[v] - maxv));
    for (int v = 0; v < V; ++v) d[v] /= sum;
    loss[n] = -log_of(d[targets[n]]);
    d[targets[n]] -= T(1);
    for (int v = 0; v < V; ++v) d[v] /= counted;
  }
};

// bf16 params widened into the fp32 copy the model reads.
struct WidenBf16 {
  float* out;
  const uint16_t* in;
  GPT_HD void operator()(size_t i) const {
    const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
    float value;
    memcpy_bits(&value, &bits);
    out[i] = value;
  }
  GPT_HD static void memcpy_bits(float* dst, const uint32_t* src) {
    const unsigned char* s = reinterpret_cast<const unsigned char*>(src);
    unsigned char* d = reinterpret_cast<unsigned char*>(dst);
    for (int k = 0; k < 4; ++k) d[k] = s[k];
  }
};

}  // namespace device
}  // namespace gpt
