// Fused optimizer kernels over a contiguous run of one param group's elements, and the fused gradient-norm pass.
//
// One pass per step reads the gradient (in the accumulation dtype), averages and unscales it with one correctly
// rounded division (by world size x accumulation steps x loss scale: exact whenever the average is representable,
// so every rank count and accumulation count gives the same weights for the same averaged gradient), applies the
// clip with a separate multiply, updates the fp32 master and the optimizer state, and writes the compute-dtype copy
// of the param. Every element goes through the same float operations whatever its position (vector body or tail) and
// whichever SIMD path runs: there is no FMA anywhere, and sqrt and division are IEEE-exact, so the scalar, AVX2
// and AVX-512 paths produce bit-identical results.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "numeric/dtype.hpp"

namespace zero {

enum class OptimizerKind { kAdamW, kAdamL2, kAdagrad, kLion, kSgd };
constexpr int kNumOptimizerKinds = 5;

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
constexpr int kNumIsas = 3;
const char* isa_name(Isa isa);

// How the compute-dtype copy is written: not at all (fp32 params are the master), or rounded.
enum class CopyMode { kNone = 0, kBf16Rne = 1, kBf16Stochastic = 2, kFp16Rne = 3 };
constexpr int kNumCopyModes = 4;

// Per-step constants, computed once in double and rounded to float (kernels/optimizer.cpp), named as the
// update rules of each optimizer name them.
struct AdamScalars {
  float beta1, one_minus_beta1;  // m = beta1 m + (1 - beta1) g
  float beta2, one_minus_beta2;  // v = beta2 v + (1 - beta2) g^2
  float step_size;               // lr / (1 - beta1^t) (lr without bias correction)
  float inv_sqrt_bias2;          // 1 / sqrt(1 - beta2^t): denominator = sqrt(v) / sqrt(1 - beta2^t) + eps
  float eps;
  float l2;     // Adam: weight decay added to the gradient (g + l2 p); AdamW: 0
  float decay;  // AdamW: p = (1 - lr weight_decay) p before the update; Adam: 1
};
struct AdagradScalars {
  float lr, eps;
  float l2;  // weight decay added to the gradient
};
struct LionScalars {
  float beta1, one_minus_beta1;  // the update's interpolation: sign(beta1 m + (1 - beta1) g)
  float beta2, one_minus_beta2;  // the momentum's: m = beta2 m + (1 - beta2) g
  float lr;
  float decay;  // p = (1 - lr weight_decay) p before the update
};
struct SgdScalars {
  float momentum;
  float one_minus_dampening;  // buf = momentum buf + (1 - dampening) g
  float lr;
  float l2;  // weight decay added to the gradient
  bool nesterov;
  bool first_step;  // the momentum buffer starts as the gradient
};

struct StepScalars {
  float grad_divisor = 1.0f;  // world size x accumulation steps x loss scale: every gradient is divided by it first
  float grad_clip = 1.0f;     // then multiplied by the clip coefficient (1 when clipping does not engage)
  // The optimizer's own constants: the member of the optimizer the kernel runs.
  union {
    AdamScalars adam = {};
    AdagradScalars adagrad;
    LionScalars lion;
    SgdScalars sgd;
  };
  uint32_t seed = 0;  // stochastic rounding
};

struct KernelArgs {
  float* master = nullptr;     // fp32 master params (the params themselves when the copy mode is kNone)
  const void* grad = nullptr;  // gradients, in the grad dtype the kernel was chosen for
  size_t grad_elem_size = 4;   // bytes per gradient element (for splitting a run across threads)
  float* state0 = nullptr;     // Adam/Lion exp_avg, Adagrad sum, SGD momentum buffer
  float* state1 = nullptr;     // Adam exp_avg_sq
  void* copy = nullptr;        // compute-dtype params to write (2-byte elements), or null with kNone
  // Zero every gradient after reading it, in the same pass (the gradient buffer is then the caller's writable one):
  // the clearing costs no pass of its own over the gradients.
  bool clear_grad = false;
  // With block_sums, the pass also sums the squares of the gradients it reads, per block of kSumBlockElems elements
  // from the start of the run, into block_sums[b]: the same bits as sum_squares on that block, so a norm that no
  // decision needs before the update costs no pass of its own (the run must start on a block of the norm's run).
  double* block_sums = nullptr;
  size_t n = 0;
  uint64_t first_index = 0;  // global index of element 0 (stochastic rounding is keyed by it)
  StepScalars s;
};

using StepKernel = void (*)(const KernelArgs&);
using SumSquaresKernel = double (*)(const void* grad, size_t n);
// sum_squares over a run handed in consecutive pieces (a reduction's, as it is summed): the lanes, and the elements
// of a 16-element group not yet complete, carried between calls. squares_more over the pieces, then squares_end,
// give sum_squares' bits over the whole run; squares_end starts the carry afresh. One instruction set's kernels per
// carry (its lanes are that path's registers as stored).
struct SquaresCarry {
  alignas(64) unsigned char lanes[128];
  alignas(64) unsigned char pending[64];
  uint32_t pending_elems = 0;
  bool started = false;
};
using SquaresMoreKernel = void (*)(SquaresCarry& carry, const void* grad, size_t n);
using SquaresEndKernel = double (*)(SquaresCarry& carry);
// A reduction's pass straight from its sources: elements [0, count) of the sum in rank order of n sources (the
// communication dtype; a 16-bit sum rounded once to it, as the backends round it) written into the fp32 accumulator
// (into_zero: 0 + sum, else acc + sum: accumulate's bits), with non-temporal stores where `stream` (acc then aligned
// to 64 bytes; the stores fenced before it returns), and, with a carry (no element pending), each result's square
// into its lanes as squares_more over the results would add it. count: whole groups of kSquareLanes.
using ReduceIntoKernel = void (*)(float* acc, const void* const* sources, int n, size_t count, bool into_zero,
                                  bool stream, SquaresCarry* carry);

// Gradient conversions between fp32 and a 16-bit dtype, with core/numeric/convert.hpp's exact per-element results
// (round to nearest even, denormals kept, nans as there: quieted by narrowing and by fp16 widening), at memory speed.
// narrow: fp32 -> 16-bit, front to back, so dst may start at src or before it (in place). widen: 16-bit -> fp32,
// back to front, so dst may start at src or after it. accumulate: fp32 acc[i] += src[i] (into_zero: acc[i] = 0 +
// src[i]); acc and src must not overlap.
using ConvertKernel = void (*)(void* dst, const void* src, size_t n);

struct KernelTable {
  StepKernel step[kNumOptimizerKinds][3][kNumCopyModes];  // [optimizer][grad dtype][copy mode]
  SumSquaresKernel sum_squares[3];                        // [grad dtype]
  SquaresMoreKernel squares_more[3];                      // [grad dtype]
  SquaresEndKernel squares_end[3];                        // [grad dtype]
  ReduceIntoKernel reduce_into[3];                        // [communication dtype], into fp32
  ConvertKernel narrow[3];                                // [16-bit dtype: kBF16, kF16]; [kF32] unused
  ConvertKernel widen[3];                                 // [16-bit dtype]
  ConvertKernel accumulate[3];                            // [source dtype], into fp32
  ConvertKernel accumulate_into_zero[3];                  // [source dtype], into fp32
  // accumulate_into_zero with non-temporal stores (the same values): for a large accumulator read again only after
  // every other bucket, so that its lines are neither read for ownership nor kept in cache. Host paths only.
  ConvertKernel stream_into_zero[3];  // [source dtype], into fp32
};

// The best path this CPU supports, unless ZERO_SIMD=scalar|avx2|avx512 forces one (an unsupported forced path
// is an error, not a silent fallback).
Isa active_isa();
bool isa_supported(Isa isa);
const KernelTable& kernels(Isa isa);

const KernelTable& kernel_table_scalar();
const KernelTable& kernel_table_avx2();
const KernelTable& kernel_table_avx512();

// The run [begin, begin + n) of `args` (with block_sums, begin is a multiple of kSumBlockElems).
KernelArgs sub_run(const KernelArgs& args, size_t begin, size_t n);

// Runs `kernel` over [0, n) split into contiguous chunks across at most `max_threads` OpenMP threads (0: OpenMP's
// default) when n is large enough to pay for it; every element is computed identically whatever the split (with
// block_sums, threads take whole blocks, so the block sums do not depend on the split either).
void parallel_step(StepKernel kernel, const KernelArgs& args, int max_threads = 0);

// The sum of squares of a run, the same bits whatever the thread count: the run is cut into blocks of
// kSumBlockElems elements (the last one shorter), each summed by `kernel`, and the block sums are added in block
// order. `scratch` holds at least sum_squares_blocks(n) doubles (the caller allocates it once, not per step).
constexpr size_t kSumBlockElems = size_t{1} << 16;
inline size_t sum_squares_blocks(size_t n) { return (n + kSumBlockElems - 1) / kSumBlockElems; }
double parallel_sum_squares(SumSquaresKernel kernel, const void* grad, size_t elem_size, size_t n, int max_threads,
                            double* scratch);

// Whether parallel_step splits a run of n elements from global index `first_index` at a multiple of 2^32 (the
// stochastic-rounding keys) somewhere other than on a block of the norm: such a run cannot sum the norm's squares in
// the pass (block_sums). Boundaries are 2^32 apart, so the first one decides.
inline bool splits_inside_a_norm_block(uint64_t first_index, size_t n) {
  const uint64_t first_boundary = (uint64_t{1} << 32) - (first_index & 0xffffffffu);
  return first_boundary < n && first_boundary % kSumBlockElems != 0;
}

}  // namespace zero
