/* fp16 for the tests, from the IEEE definition rather than bit tricks (and without _Float16, which clang 14 lacks
 * on x86): a half is decoded exactly with ldexp, and a float rounds to the nearest half by exact distance in
 * double, ties to the even one, |x| >= 65520 to infinity. Independent of the engine's conversions
 * (core/numeric/dtype.hpp). */
#ifndef ZERO_TESTS_MPI_FP16_REFERENCE_H_
#define ZERO_TESTS_MPI_FP16_REFERENCE_H_

#include <math.h>
#include <stdint.h>

static inline double fp16_reference_decode(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double v;
  if (exponent == 0x1f)
    v = mantissa ? NAN : INFINITY;
  else if (exponent == 0)
    v = ldexp((double)mantissa, -24);
  else
    v = ldexp((double)(mantissa | 0x400), exponent - 25);
  return sign ? -v : v;
}

static inline float fp16_reference_to_float(uint16_t h) { return (float)fp16_reference_decode(h); }

static inline uint16_t fp16_reference_from_float(float f) {
  if (isnan(f)) return 0x7e00;
  const uint16_t sign = signbit(f) ? 0x8000 : 0;
  const double x = fabs((double)f);
  if (x >= 65520.0) return sign | 0x7c00;
  /* The largest finite half not above x, by binary search over the ordered positive halves 0 .. 0x7bff. */
  uint16_t lo = 0, hi = 0x7bff;
  while (lo < hi) {
    const uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
    if (fp16_reference_decode(mid) <= x)
      lo = mid;
    else
      hi = (uint16_t)(mid - 1);
  }
  if (fp16_reference_decode(lo) == x || lo == 0x7bff) return sign | lo; /* exact, or between 65504 and 65520 */
  const double below = x - fp16_reference_decode(lo), above = fp16_reference_decode((uint16_t)(lo + 1)) - x;
  const uint16_t nearest = below < above ? lo : above < below ? (uint16_t)(lo + 1) : (lo & 1) ? (uint16_t)(lo + 1) : lo;
  return sign | nearest;
}

#endif /* ZERO_TESTS_MPI_FP16_REFERENCE_H_ */
