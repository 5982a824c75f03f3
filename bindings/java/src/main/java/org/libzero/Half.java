package org.libzero;

/** bf16 and fp16 bits to and from float, rounding to nearest even (Java 17 has neither conversion built in). */
final class Half {
  private Half() {}

  static short toBf16(float value) {
    int bits = Float.floatToRawIntBits(value);
    if ((bits & 0x7fffffff) > 0x7f800000) {
      return (short) ((bits >>> 16) | 0x0040); // NaN stays a (quiet) NaN
    }
    int rounding = 0x7fff + ((bits >>> 16) & 1);
    return (short) ((bits + rounding) >>> 16);
  }

  static float toFloat(short half) {
    int h = half & 0xffff;
    int sign = (h & 0x8000) << 16;
    int exponent = (h >>> 10) & 0x1f;
    int mantissa = h & 0x3ff;
    if (exponent == 0x1f) {
      return Float.intBitsToFloat(sign | 0x7f800000 | (mantissa << 13)); // inf, NaN
    }
    if (exponent == 0) { // zero or subnormal: mantissa x 2^-24, exact in float
      float magnitude = mantissa * 0x1p-24f;
      return sign != 0 ? -magnitude : magnitude;
    }
    return Float.intBitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }

  static short toFp16(float value) {
    int bits = Float.floatToRawIntBits(value);
    int sign = (bits >>> 16) & 0x8000;
    int abs = bits & 0x7fffffff;
    if (abs > 0x7f800000) {
      return (short) (sign | 0x7e00); // NaN
    }
    if (abs >= 0x477ff000) { // rounds to 65520 or more: infinity
      return (short) (sign | 0x7c00);
    }
    if (abs < 0x38800000) { // below fp16's smallest normal: a subnormal (or zero), rounded to nearest even
      float magnitude = Float.intBitsToFloat(abs);
      int m = (int) Math.rint(magnitude * 0x1p24f); // exact scaling; rint rounds half to even
      return (short) (sign | m);
    }
    int exponent = (abs >>> 23) - 112;
    int mantissa = abs & 0x7fffff;
    int half = (exponent << 10) | (mantissa >>> 13);
    int rest = mantissa & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1) != 0)) {
      half++; // may carry into the exponent, which is right
    }
    return (short) (sign | half);
  }
}
