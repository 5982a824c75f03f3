// AVX2 + FMA + F16C path (compiled with -mavx2 -mfma -mf16c; used only when CPUID reports them). FMA is not
// used: results must equal the scalar path bit for bit.
#include "kernels/no_fp_contraction.hpp"  // before anything else: no FMA contraction in this file

#include <immintrin.h>

#include "kernels/cpu_loops.hpp"

namespace zero {
namespace {

struct Avx2V {
  static constexpr size_t W = 8;
  using F = __m256;
  struct D {
    __m256d lanes[4];  // the 16 fp64 lanes of kernel_body.hpp's sum of squares, 4 per register
  };
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void stream(float* p, F v) { _mm256_stream_ps(p, v); }  // p aligned to the vector
  static void fence() { _mm_sfence(); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  // m x sign(a) for m >= 0: +-m with a's sign where a is non-zero and not NaN, else +0 (as ScalarV::sign_times).
  static F sign_times(F a, F m) {
    F nonzero = _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_NEQ_OQ);
    return _mm256_and_ps(nonzero, _mm256_or_ps(_mm256_and_ps(a, _mm256_set1_ps(-0.0f)), m));
  }
  static F load_bf16(const uint16_t* p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static F load_fp16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // Packs the high halves of eight 32-bit lanes into eight 16-bit values, in order.
  static void store_high16(uint16_t* p, __m256i v) {
    __m256i shifted = _mm256_srli_epi32(v, 16);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(shifted), _mm256_extracti128_si256(shifted, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  static __m256i quiet_nan_fixup(F v, __m256i rounded) {
    // NaN lanes: the truncated bits with the quiet bit set, as float_to_bf16_rne does.
    __m256i bits = _mm256_castps_si256(v);
    __m256 is_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    __m256i nan = _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000));
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(nan), is_nan));
  }
  static void store_bf16_rne(uint16_t* p, F v) {
    __m256i bits = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    store_high16(p, quiet_nan_fixup(v, rounded));
  }
  static __m256i mix32(__m256i x) {
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bu)));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    return x;
  }
  static void store_bf16_sr(uint16_t* p, F v, uint32_t seed, uint32_t index) {
    __m256i idx =
        _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(index)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i random = _mm256_and_si256(mix32(_mm256_xor_si256(idx, _mm256_set1_epi32(static_cast<int>(seed)))),
                                      _mm256_set1_epi32(0xffff));
    __m256i bits = _mm256_castps_si256(v);
    // Infinities keep their bits; finite values get the random addend.
    __m256i abs = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
    __m256i is_inf = _mm256_cmpeq_epi32(abs, _mm256_set1_epi32(0x7f800000));
    random = _mm256_andnot_si256(is_inf, random);
    store_high16(p, quiet_nan_fixup(v, _mm256_add_epi32(bits, random)));
  }
  static void store_fp16_rne(uint16_t* p, F v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  static D dzero() { return D{{_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()}}; }
  // Vector `part` (0 or 1) of a 16-element block: its elements go to lanes 8 x part .. 8 x part + 7.
  // Inlined into each call with a constant `part` (cpu_loops.hpp), so that the lanes stay in registers.
  __attribute__((always_inline)) static D accumulate_squares(D acc, F x, size_t part) {
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    acc.lanes[2 * part] = _mm256_add_pd(acc.lanes[2 * part], _mm256_mul_pd(lo, lo));
    acc.lanes[2 * part + 1] = _mm256_add_pd(acc.lanes[2 * part + 1], _mm256_mul_pd(hi, hi));
    return acc;
  }
  static double dsum(const D& acc) {
    alignas(32) double t[8];
    _mm256_store_pd(t, _mm256_add_pd(acc.lanes[0], acc.lanes[2]));
    _mm256_store_pd(t + 4, _mm256_add_pd(acc.lanes[1], acc.lanes[3]));
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
  }
};

}  // namespace

const KernelTable& kernel_table_avx2() {
  static const KernelTable table = kernel_detail::make_table<Avx2V>();
  return table;
}

}  // namespace zero
