// AVX-512 path (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16; used only when CPUID
// reports F, BW, VL and DQ). Where AVX512_BF16 exists, bf16 copies use vcvtneps2bf16, which flushes denormal
// inputs to zero; those lanes (and NaNs) are redone with the integer rounding so the result is exactly
// float_to_bf16_rne, as on every other path. FMA is not used: results equal the scalar path bit for bit.
#include "kernels/no_fp_contraction.hpp"  // before anything else: no FMA contraction in this file

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu_loops.hpp"

namespace zero {
namespace {

template <bool kHardwareBf16>
struct Avx512V {
  static constexpr size_t W = 16;
  using F = __m512;
  struct D {
    __m512d lo, hi;
  };
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void stream(float* p, F v) { _mm512_stream_ps(p, v); }  // p aligned to the vector
  static void fence() { _mm_sfence(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  // m x sign(a) for m >= 0: +-m with a's sign where a is non-zero and not NaN, else +0 (as ScalarV::sign_times).
  static F sign_times(F a, F m) {
    __mmask16 nonzero = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_NEQ_OQ);
    __m512i signed_m =
        _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN)), _mm512_castps_si512(m));
    return _mm512_maskz_mov_ps(nonzero, _mm512_castsi512_ps(signed_m));
  }
  static F load_bf16(const uint16_t* p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  static F load_fp16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // Integer round-to-nearest-even of each lane to its high 16 bits; NaNs become quiet NaNs.
  static __m512i bf16_rne_bits(F v) {
    __m512i bits = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    rounded = _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x00400000));
    return _mm512_srli_epi32(rounded, 16);
  }
  static void store_bf16_rne(uint16_t* p, F v) {
    __m256i exact = _mm512_cvtepi32_epi16(bf16_rne_bits(v));
    if constexpr (kHardwareBf16) {
      __m256i hw = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
      __m512i abs = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff));
      __mmask16 special = _mm512_cmplt_epu32_mask(abs, _mm512_set1_epi32(0x00800000)) |
                          _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
      exact = _mm256_mask_blend_epi16(special, hw, exact);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), exact);
  }
  static __m512i mix32(__m512i x) {
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846ca68bu)));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    return x;
  }
  static void store_bf16_sr(uint16_t* p, F v, uint32_t seed, uint32_t index) {
    __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(index)),
                                   _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    __m512i random = _mm512_and_si512(mix32(_mm512_xor_si512(idx, _mm512_set1_epi32(static_cast<int>(seed)))),
                                      _mm512_set1_epi32(0xffff));
    __m512i bits = _mm512_castps_si512(v);
    __m512i abs = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
    __mmask16 finite = _mm512_cmplt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
    __m512i rounded = _mm512_mask_add_epi32(bits, finite, bits, random);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    rounded = _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x00400000));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
  }
  static void store_fp16_rne(uint16_t* p, F v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  static D dzero() { return D{_mm512_setzero_pd(), _mm512_setzero_pd()}; }
  // One vector is a whole 16-element block (`part` is always 0): elements 0-7 to lo, 8-15 to hi.
  static D accumulate_squares(D acc, F x, size_t /*part*/) {
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    return D{_mm512_add_pd(acc.lo, _mm512_mul_pd(lo, lo)), _mm512_add_pd(acc.hi, _mm512_mul_pd(hi, hi))};
  }
  static double dsum(const D& acc) {
    alignas(64) double lanes[8];
    _mm512_store_pd(lanes, _mm512_add_pd(acc.lo, acc.hi));
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  }
};

}  // namespace

const KernelTable& kernel_table_avx512_bf16() {
  static const KernelTable table = kernel_detail::make_table<Avx512V<true>>();
  return table;
}

const KernelTable& kernel_table_avx512_plain() {
  static const KernelTable table = kernel_detail::make_table<Avx512V<false>>();
  return table;
}

}  // namespace zero
