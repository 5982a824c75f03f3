// The optimizer kernels' CPU loops, written once over a SIMD abstraction V and instantiated per path by
// kernels_<isa>.cpp; the per-vector step they run is kernels/step_element.hpp's, which the GPU kernels share.
// V provides: W (lanes), F (float vector), load/store/set1/add/sub/mul/div/sqrt/sign_times, load_bf16/load_fp16,
// store_bf16_rne/store_bf16_sr/store_fp16_rne, and a double accumulator for the sum of squares.
//
// Tails are computed by the same vector code on a zero-padded copy of the last partial vector, so an element's
// result never depends on whether it sits in the body or the tail of a run.
#pragma once

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/kernels.hpp"
#include "kernels/step_element.hpp"

// The CPU loops' own pieces (host code only) must inline into the loops too.
#define ZERO_HOST_INLINE inline __attribute__((always_inline))

namespace zero {
namespace kernel_detail {

// Zeroes n gradients from element i, right after the loop read them (their lines are still in L1). The gradient
// stream is const in KernelArgs because the update only reads it; with clear_grad it is the caller's writable
// buffer.
template <DType G>
ZERO_HOST_INLINE void clear_grads(const void* grad, size_t i, size_t n) {
  std::memset(const_cast<char*>(static_cast<const char*>(grad)) + i * dtype_size(G), 0, n * dtype_size(G));
}

// Software prefetch: every stream is prefetched kPrefetchAhead elements ahead of the loop into L2 (prefetcht1),
// one prefetch per 64-byte line (per block of kBlock elements). Measured on the development machine with cold
// caches: in-place streams from memory run up to 15 % faster with it than with the hardware prefetchers alone;
// 512, 768, 1536 and 2048 elements ahead were no better than 1024, and prefetching into L2 rather than L1 let the
// kernels come closer to the fastest memory-only loop (bench/README.md). -DZERO_PREFETCH_AHEAD=N retunes the
// distance for another machine; 0 turns the software prefetch off.
#ifndef ZERO_PREFETCH_AHEAD
#define ZERO_PREFETCH_AHEAD 1024
#endif
constexpr size_t kPrefetchAhead = ZERO_PREFETCH_AHEAD;
constexpr int kPrefetchLocality = 2;  // __builtin_prefetch's locality: 2 = prefetcht1 on x86
constexpr size_t kBlock = 32;  // elements per prefetch block: two lines of a 4-byte stream, one of a 2-byte stream

template <size_t kElemBytes, int kWrite>
ZERO_HOST_INLINE void prefetch_block(const void* stream, size_t j) {
  const char* p = static_cast<const char*>(stream) + j * kElemBytes;
  for (size_t line = 0; line < kBlock * kElemBytes; line += 64) __builtin_prefetch(p + line, kWrite, kPrefetchLocality);
}

// Which streams a kernel touches is known at compile time.
template <OptimizerKind K, int kSgd>
constexpr bool kUsesState0 = K != OptimizerKind::kSgd || (kSgd & kSgdMomentum) != 0;
template <OptimizerKind K>
constexpr bool kUsesState1 = K == OptimizerKind::kAdamW || K == OptimizerKind::kAdamL2;

template <OptimizerKind K, DType G, CopyMode C, int kSgd>
ZERO_HOST_INLINE void prefetch_streams(const KernelArgs& a, size_t j) {
  prefetch_block<4, 1>(a.master, j);
  prefetch_block<dtype_size(G), 0>(a.grad, j);
  if constexpr (kUsesState0<K, kSgd>) prefetch_block<4, 1>(a.state0, j);
  if constexpr (kUsesState1<K>) prefetch_block<4, 1>(a.state1, j);
  if constexpr (C != CopyMode::kNone) prefetch_block<2, 1>(a.copy, j);
}

template <class V, OptimizerKind K, DType G, CopyMode C, int kSgd>
void step_run(const KernelArgs& args, typename V::D& sum, bool sum_squares) {
  constexpr size_t W = V::W;
  static_assert(kBlock % W == 0, "a prefetch block is whole vectors (the clearing after the blocks relies on it)");
  // Local copies: the stores through its float pointers cannot alias them (SIMD types may alias anything, so the
  // caller's accumulator could not stay in registers), so the compiler keeps the pointers, the broadcast constants
  // and the squares' lanes in registers instead of reloading them after every store.
  const KernelArgs local = args;
  RunVariant<C, kSgd> var;
  var.sum_squares = sum_squares;
  typename V::D acc = sum;
  const size_t body = local.n / W * W;
  const size_t blocks = local.n / kBlock * kBlock;
  size_t i = 0;
  for (; i < blocks; i += kBlock) {
    if constexpr (kPrefetchAhead > 0) prefetch_streams<K, G, C, kSgd>(local, i + kPrefetchAhead);
    if constexpr (W == 1) {
      // The portable path, one element per vector: a block unrolled whole is 32 copies of the step per compiled
      // loop and was most of the build's time; unrolled by 4 it runs from memory at the same quarter of its
      // roofline (bench/README.md, "Compiling the kernels").
#pragma GCC unroll 4
      for (size_t v = 0; v < kBlock; v += W) step_vector<V, K, G>(local, i + v, acc, square_part<V>(v), var);
    } else {
#pragma GCC unroll 32
      for (size_t v = 0; v < kBlock; v += W) step_vector<V, K, G>(local, i + v, acc, square_part<V>(v), var);
    }
    if (local.clear_grad) clear_grads<G>(local.grad, i, kBlock);
  }
  for (; i < body; i += W) step_vector<V, K, G>(local, i, acc, square_part<V>(i), var);
  if (local.clear_grad) clear_grads<G>(local.grad, blocks, body - blocks);
  const size_t tail = args.n - body;
  sum = acc;
  if (tail == 0) return;
  // The last partial vector, on zero-padded copies of every stream.
  alignas(64) float master[W] = {}, s0[W] = {}, s1[W] = {};
  // Of the gradient's own element type: a buffer of another type read through the kernel's loads would alias.
  alignas(64) std::conditional_t<G == DType::kF32, float, uint16_t> grad[W] = {};
  alignas(64) uint16_t copy[W] = {};
  const size_t gsize = dtype_size(G);
  KernelArgs t = args;
  t.master = master;
  std::memcpy(master, args.master + body, tail * sizeof(float));
  t.grad = grad;
  std::memcpy(grad, static_cast<const char*>(args.grad) + body * gsize, tail * gsize);
  if (args.state0) t.state0 = s0, std::memcpy(s0, args.state0 + body, tail * sizeof(float));
  if (args.state1) t.state1 = s1, std::memcpy(s1, args.state1 + body, tail * sizeof(float));
  if (args.copy) t.copy = copy;
  t.first_index = args.first_index + body;
  step_vector<V, K, G>(t, 0, acc, square_part<V>(body), var);  // zero padding adds squares of zero
  sum = acc;
  std::memcpy(args.master + body, master, tail * sizeof(float));
  if (args.state0) std::memcpy(args.state0 + body, s0, tail * sizeof(float));
  if (args.state1) std::memcpy(args.state1 + body, s1, tail * sizeof(float));
  if (args.copy) std::memcpy(static_cast<uint16_t*>(args.copy) + body, copy, tail * sizeof(uint16_t));
  if (args.clear_grad) clear_grads<G>(args.grad, body, tail);
}

// The pass over a run; with block_sums, block by block, each block's squares summed in its own 16 lanes.
template <class V, OptimizerKind K, DType G, CopyMode C, int kSgd>
void step_loop(const KernelArgs& args) {
  typename V::D acc = V::dzero();
  if (args.block_sums == nullptr) return step_run<V, K, G, C, kSgd>(args, acc, false);
  for (size_t b = 0, begin = 0; begin < args.n; ++b, begin += kSumBlockElems) {
    acc = V::dzero();
    step_run<V, K, G, C, kSgd>(sub_run(args, begin, std::min(kSumBlockElems, args.n - begin)), acc, true);
    args.block_sums[b] = V::dsum(acc);
  }
}

template <class V, OptimizerKind K, DType G, CopyMode C>
void step_kernel(const KernelArgs& args) {
  if constexpr (K != OptimizerKind::kSgd) {
    step_loop<V, K, G, C, 0>(args);
  } else {
    switch (sgd_variant(K, args)) {
      case 0:
        return step_loop<V, K, G, C, 0>(args);
      case kSgdMomentum:
        return step_loop<V, K, G, C, kSgdMomentum>(args);
      case kSgdMomentum | kSgdFirstStep:
        return step_loop<V, K, G, C, kSgdMomentum | kSgdFirstStep>(args);
      case kSgdMomentum | kSgdNesterov:
        return step_loop<V, K, G, C, kSgdMomentum | kSgdNesterov>(args);
      default:
        return step_loop<V, K, G, C, kSgdMomentum | kSgdFirstStep | kSgdNesterov>(args);
    }
  }
}

// One block of kSquareLanes elements at `i`, its vectors in order. The vector's place in the block is a constant in
// each call, so that a vector type whose lanes span several registers (AVX2's four) indexes them at compile time:
// with a loop counter the accumulator went through the stack on every add (3.6x slower than AVX-512's kernel).
template <class V, DType G, size_t... Part>
ZERO_HOST_INLINE typename V::D accumulate_block(typename V::D acc, const void* grad, size_t i,
                                                std::index_sequence<Part...>) {
  ((acc = V::accumulate_squares(acc, load_grad<V, G>(grad, i + Part * V::W), Part)), ...);
  return acc;
}

template <class V, DType G>
double sum_squares_kernel(const void* grad, size_t n) {
  constexpr size_t W = V::W;
  static_assert(kSquareLanes % W == 0, "a vector must divide the 16 lanes");
  using Parts = std::make_index_sequence<kSquareLanes / W>;
  typename V::D acc = V::dzero();
  const size_t body = n / kSquareLanes * kSquareLanes;
  for (size_t i = 0; i < body; i += kSquareLanes) acc = accumulate_block<V, G>(acc, grad, i, Parts{});
  if (body < n) {  // a zero-padded last block: squares of zero add nothing
    // Of the gradient's own element type, so that the loads below do not alias another type.
    using Elem = std::conditional_t<G == DType::kF32, float, uint16_t>;
    alignas(64) Elem tail[kSquareLanes] = {};
    std::memcpy(tail, static_cast<const char*>(grad) + body * dtype_size(G), (n - body) * dtype_size(G));
    acc = accumulate_block<V, G>(acc, tail, 0, Parts{});
  }
  return V::dsum(acc);
}

// sum_squares_kernel in pieces (SquaresCarry): the same 16-element groups from the run's start, the same zero-padded
// last group, the same lanes and the same final sum.
template <class V, DType G>
void squares_more_kernel(SquaresCarry& carry, const void* grad, size_t n) {
  using D = typename V::D;
  using Elem = std::conditional_t<G == DType::kF32, float, uint16_t>;
  using Parts = std::make_index_sequence<kSquareLanes / V::W>;
  static_assert(sizeof(D) <= sizeof(carry.lanes) && kSquareLanes * sizeof(Elem) <= sizeof(carry.pending), "carry");
  D acc = V::dzero();
  if (carry.started) std::memcpy(&acc, carry.lanes, sizeof acc);
  carry.started = true;
  const char* p = static_cast<const char*>(grad);
  if (carry.pending_elems != 0) {
    const size_t take = std::min<size_t>(kSquareLanes - carry.pending_elems, n);
    std::memcpy(carry.pending + carry.pending_elems * sizeof(Elem), p, take * sizeof(Elem));
    carry.pending_elems += static_cast<uint32_t>(take);
    p += take * sizeof(Elem), n -= take;
    if (carry.pending_elems == kSquareLanes) {
      alignas(64) Elem group[kSquareLanes];
      std::memcpy(group, carry.pending, sizeof group);
      acc = accumulate_block<V, G>(acc, group, 0, Parts{});
      carry.pending_elems = 0;
    }
  }
  const size_t body = n / kSquareLanes * kSquareLanes;
  for (size_t i = 0; i < body; i += kSquareLanes) acc = accumulate_block<V, G>(acc, p, i, Parts{});
  if (body < n) {
    std::memcpy(carry.pending, p + body * sizeof(Elem), (n - body) * sizeof(Elem));
    carry.pending_elems = static_cast<uint32_t>(n - body);
  }
  std::memcpy(carry.lanes, &acc, sizeof acc);
}

template <class V, DType G>
double squares_end_kernel(SquaresCarry& carry) {
  using D = typename V::D;
  using Elem = std::conditional_t<G == DType::kF32, float, uint16_t>;
  D acc = V::dzero();
  if (carry.started) std::memcpy(&acc, carry.lanes, sizeof acc);
  if (carry.pending_elems != 0) {  // a zero-padded last group: squares of zero add nothing
    alignas(64) Elem group[kSquareLanes] = {};
    std::memcpy(group, carry.pending, carry.pending_elems * sizeof(Elem));
    acc = accumulate_block<V, G>(acc, group, 0, std::make_index_sequence<kSquareLanes / V::W>{});
  }
  carry.pending_elems = 0;
  carry.started = false;
  return V::dsum(acc);
}

// The conversions (kernels.hpp): whole vectors, and the last partial vector by the same vector code on a
// zero-padded copy (as the step kernels do), so an element's result never depends on where it sits and these files
// call no scalar conversion (which, compiled here, would carry this file's instruction set).
template <class V, DType D>
ZERO_HOST_INLINE typename V::F load16(const uint16_t* p) {
  if constexpr (D == DType::kBF16) return V::load_bf16(p);
  return V::load_fp16(p);
}
template <class V, DType D>
ZERO_HOST_INLINE void store16(uint16_t* p, typename V::F x) {
  if constexpr (D == DType::kBF16)
    V::store_bf16_rne(p, x);
  else
    V::store_fp16_rne(p, x);
}
template <class V, DType D>
ZERO_HOST_INLINE typename V::F load_any(const void* p, size_t i) {
  if constexpr (D == DType::kF32) return V::load(static_cast<const float*>(p) + i);
  return load16<V, D>(static_cast<const uint16_t*>(p) + i);
}

template <class V, DType D>
void narrow_kernel(void* dst, const void* src, size_t n) {
  constexpr size_t W = V::W;
  uint16_t* d = static_cast<uint16_t*>(dst);
  const float* s = static_cast<const float*>(src);
  const size_t body = n / W * W;
  // Each vector is loaded whole before it is stored, and its 2-byte results end before the next vector's 4-byte
  // sources begin (when d <= s): in place is safe front to back.
  for (size_t i = 0; i < body; i += W) store16<V, D>(d + i, V::load(s + i));
  if (body == n) return;
  alignas(64) float in[W] = {};
  alignas(64) uint16_t out[W] = {};
  std::memcpy(in, s + body, (n - body) * sizeof(float));
  store16<V, D>(out, V::load(in));
  std::memcpy(d + body, out, (n - body) * sizeof(uint16_t));
}

template <class V, DType D>
void widen_kernel(void* dst, const void* src, size_t n) {
  constexpr size_t W = V::W;
  float* d = static_cast<float*>(dst);
  const uint16_t* s = static_cast<const uint16_t*>(src);
  const size_t body = n / W * W;
  // Back to front: the last partial vector first, then each vector, loaded whole before its 4-byte results
  // overwrite the 2-byte sources of elements already done (in place, d >= s).
  if (body < n) {
    alignas(64) uint16_t in[W] = {};
    alignas(64) float out[W] = {};
    std::memcpy(in, s + body, (n - body) * sizeof(uint16_t));
    V::store(out, load16<V, D>(in));
    std::memcpy(d + body, out, (n - body) * sizeof(float));
  }
  for (size_t i = body; i >= W;) {
    i -= W;
    V::store(d + i, load16<V, D>(s + i));
  }
}

template <class V, DType D, bool kIntoZero>
void accumulate_kernel(void* acc, const void* src, size_t n) {
  constexpr size_t W = V::W;
  float* a = static_cast<float*>(acc);
  const size_t body = n / W * W;
  for (size_t i = 0; i < body; i += W)
    V::store(a + i, V::add(kIntoZero ? V::set1(0.0f) : V::load(a + i), load_any<V, D>(src, i)));
  if (body == n) return;
  using Elem = std::conditional_t<D == DType::kF32, float, uint16_t>;
  alignas(64) float sum[W] = {};
  alignas(64) Elem in[W] = {};
  std::memcpy(sum, a + body, (n - body) * sizeof(float));
  std::memcpy(in, static_cast<const Elem*>(src) + body, (n - body) * sizeof(Elem));
  V::store(sum, V::add(kIntoZero ? V::set1(0.0f) : V::load(sum), load_any<V, D>(in, 0)));
  std::memcpy(a + body, sum, (n - body) * sizeof(float));
}

// Vector units with non-temporal stores have V::stream and V::fence (which orders them before a later
// release store); the others store as usual.
template <class V, class = void>
struct HasStream : std::false_type {};
template <class V>
struct HasStream<V, std::void_t<decltype(&V::fence)>> : std::true_type {};

template <class V, DType D>
void stream_into_zero_kernel(void* acc, const void* src, size_t n) {
  if constexpr (!HasStream<V>::value) {
    accumulate_kernel<V, D, true>(acc, src, n);
  } else {
    constexpr size_t W = V::W, kVectorBytes = W * sizeof(float);
    using Elem = std::conditional_t<D == DType::kF32, float, uint16_t>;
    float* a = static_cast<float*>(acc);
    const Elem* s = static_cast<const Elem*>(src);
    // Non-temporal stores want whole aligned vectors: the elements before the first such boundary, and those after
    // the last, are stored as usual (the same values).
    const uintptr_t misaligned = reinterpret_cast<uintptr_t>(a) % kVectorBytes;
    size_t head = misaligned == 0 ? 0 : (kVectorBytes - misaligned) / sizeof(float);
    if (misaligned % sizeof(float) != 0 || head > n) head = n;
    accumulate_kernel<V, D, true>(a, s, head);
    const size_t body = head + (n - head) / W * W;
    for (size_t i = head; i < body; i += W) V::stream(a + i, V::add(V::set1(0.0f), load_any<V, D>(s, i)));
    accumulate_kernel<V, D, true>(a + body, s + body, n - body);
    V::fence();
  }
}

// reduce_into (kernels.hpp): one vector of the sum in rank order — the first source as it is, each later one added
// (a 16-bit sum rounded once to its dtype, as the backends round it) — into the accumulator, as accumulate_kernel
// adds (the accumulator, or 0, plus the sum), and its square into the lanes as sum_squares_kernel adds it.
template <class V, DType C, bool kIntoZero, bool kStream, bool kSquares>
ZERO_HOST_INLINE typename V::D reduce_vector(typename V::D lanes, float* acc, const void* const* src, int n, size_t i,
                                             size_t part) {
  typename V::F x = load_any<V, C>(src[0], i);
  for (int r = 1; r < n; ++r) x = V::add(x, load_any<V, C>(src[r], i));
  if constexpr (C != DType::kF32) {
    alignas(64) uint16_t rounded[V::W];
    store16<V, C>(rounded, x);
    x = load16<V, C>(rounded);
  }
  const typename V::F v = V::add(kIntoZero ? V::set1(0.0f) : V::load(acc + i), x);
  if constexpr (kStream && HasStream<V>::value)
    V::stream(acc + i, v);
  else
    V::store(acc + i, v);
  if constexpr (kSquares) lanes = V::accumulate_squares(lanes, v, part);
  return lanes;
}

template <class V, DType C, bool kIntoZero, bool kStream, bool kSquares, size_t... Part>
ZERO_HOST_INLINE typename V::D reduce_group(typename V::D lanes, float* acc, const void* const* src, int n, size_t i,
                                            std::index_sequence<Part...>) {
  ((lanes = reduce_vector<V, C, kIntoZero, kStream, kSquares>(lanes, acc, src, n, i + Part * V::W, Part)), ...);
  return lanes;
}

template <class V, DType C, bool kIntoZero, bool kStream, bool kSquares>
void reduce_into_loop(float* acc, const void* const* src, int n, size_t count, SquaresCarry* carry) {
  using D = typename V::D;
  D lanes = V::dzero();
  if constexpr (kSquares) {
    static_assert(sizeof(D) <= sizeof(carry->lanes), "the carry holds the lanes");
    if (carry->started) std::memcpy(&lanes, carry->lanes, sizeof lanes);
  }
  for (size_t i = 0; i < count; i += kSquareLanes)
    lanes = reduce_group<V, C, kIntoZero, kStream, kSquares>(lanes, acc, src, n, i,
                                                             std::make_index_sequence<kSquareLanes / V::W>{});
  if constexpr (kSquares) {
    std::memcpy(carry->lanes, &lanes, sizeof lanes);
    carry->started = true;
  }
  if constexpr (kStream && HasStream<V>::value) V::fence();
}

template <class V, DType C>
void reduce_into_kernel(float* acc, const void* const* src, int n, size_t count, bool into_zero, bool stream,
                        SquaresCarry* carry) {
  const bool squares = carry != nullptr;
  if (into_zero && stream && squares) return reduce_into_loop<V, C, true, true, true>(acc, src, n, count, carry);
  if (into_zero && stream) return reduce_into_loop<V, C, true, true, false>(acc, src, n, count, carry);
  if (into_zero && squares) return reduce_into_loop<V, C, true, false, true>(acc, src, n, count, carry);
  if (into_zero) return reduce_into_loop<V, C, true, false, false>(acc, src, n, count, carry);
  if (squares) return reduce_into_loop<V, C, false, false, true>(acc, src, n, count, carry);
  return reduce_into_loop<V, C, false, false, false>(acc, src, n, count, carry);
}

template <class V, OptimizerKind K, DType G>
void fill_copy_modes(KernelTable& t) {
  t.step[static_cast<int>(K)][static_cast<int>(G)][0] = step_kernel<V, K, G, CopyMode::kNone>;
  t.step[static_cast<int>(K)][static_cast<int>(G)][1] = step_kernel<V, K, G, CopyMode::kBf16Rne>;
  t.step[static_cast<int>(K)][static_cast<int>(G)][2] = step_kernel<V, K, G, CopyMode::kBf16Stochastic>;
  t.step[static_cast<int>(K)][static_cast<int>(G)][3] = step_kernel<V, K, G, CopyMode::kFp16Rne>;
}

template <class V, OptimizerKind K>
void fill_grad_dtypes(KernelTable& t) {
  fill_copy_modes<V, K, DType::kF32>(t);
  fill_copy_modes<V, K, DType::kBF16>(t);
  fill_copy_modes<V, K, DType::kF16>(t);
}

template <class V>
KernelTable make_table() {
  KernelTable t{};
  fill_grad_dtypes<V, OptimizerKind::kAdamW>(t);
  fill_grad_dtypes<V, OptimizerKind::kAdamL2>(t);
  fill_grad_dtypes<V, OptimizerKind::kAdagrad>(t);
  fill_grad_dtypes<V, OptimizerKind::kLion>(t);
  fill_grad_dtypes<V, OptimizerKind::kSgd>(t);
  t.sum_squares[0] = sum_squares_kernel<V, DType::kF32>;
  t.sum_squares[1] = sum_squares_kernel<V, DType::kBF16>;
  t.sum_squares[2] = sum_squares_kernel<V, DType::kF16>;
  t.narrow[1] = narrow_kernel<V, DType::kBF16>;
  t.narrow[2] = narrow_kernel<V, DType::kF16>;
  t.widen[1] = widen_kernel<V, DType::kBF16>;
  t.widen[2] = widen_kernel<V, DType::kF16>;
  t.accumulate[0] = accumulate_kernel<V, DType::kF32, false>;
  t.accumulate[1] = accumulate_kernel<V, DType::kBF16, false>;
  t.accumulate[2] = accumulate_kernel<V, DType::kF16, false>;
  t.accumulate_into_zero[0] = accumulate_kernel<V, DType::kF32, true>;
  t.accumulate_into_zero[1] = accumulate_kernel<V, DType::kBF16, true>;
  t.accumulate_into_zero[2] = accumulate_kernel<V, DType::kF16, true>;
  t.squares_more[0] = squares_more_kernel<V, DType::kF32>;
  t.squares_more[1] = squares_more_kernel<V, DType::kBF16>;
  t.squares_more[2] = squares_more_kernel<V, DType::kF16>;
  t.squares_end[0] = squares_end_kernel<V, DType::kF32>;
  t.squares_end[1] = squares_end_kernel<V, DType::kBF16>;
  t.squares_end[2] = squares_end_kernel<V, DType::kF16>;
  t.reduce_into[0] = reduce_into_kernel<V, DType::kF32>;
  t.reduce_into[1] = reduce_into_kernel<V, DType::kBF16>;
  t.reduce_into[2] = reduce_into_kernel<V, DType::kF16>;
  t.stream_into_zero[0] = stream_into_zero_kernel<V, DType::kF32>;
  t.stream_into_zero[1] = stream_into_zero_kernel<V, DType::kBF16>;
  t.stream_into_zero[2] = stream_into_zero_kernel<V, DType::kF16>;
  return t;
}

}  // namespace kernel_detail
}  // namespace zero
