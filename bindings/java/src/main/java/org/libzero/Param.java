package org.libzero;

import java.util.Arrays;

/**
 * A parameter to register: {@code Param.of("layer1.weight", 512, 64).unit(0).group(noDecay).init(values)}. Its
 * initial values are copied when {@link Engine#addParam} is called (only rank 0's are used: finalize broadcasts
 * them), so the array may be reused at once.
 */
public final class Param {
  final String name;
  final long[] shape;
  int unit;
  int group;
  float[] initFloats;
  short[] initBits;
  DType initDType;

  private Param(String name, long[] shape) {
    this.name = name;
    this.shape = shape.clone();
  }

  /** A param called {@code name} (unique, non-empty) with this shape (no dimensions: a scalar). */
  public static Param of(String name, long... shape) {
    return new Param(name, shape);
  }

  /** Its gather unit (default 0): units are numbered 0..U-1 in forward order. */
  public Param unit(int value) {
    unit = value;
    return this;
  }

  /** Its group: 0 (the default) or an id from {@link Engine#addParamGroup}. */
  public Param group(int value) {
    group = value;
    return this;
  }

  /** fp32 initial values (row-major, one per element); without it the param starts at zero. */
  public Param init(float[] values) {
    initFloats = values.clone();
    initBits = null;
    initDType = DType.FP32;
    return this;
  }

  /** 16-bit initial values given as their bits, in {@code dtype} (BF16 or FP16). */
  public Param initBits(short[] bits, DType dtype) {
    if (dtype == DType.FP32) {
      throw new IllegalArgumentException("initBits takes BF16 or FP16 bits; use init(float[]) for FP32");
    }
    initBits = bits.clone();
    initFloats = null;
    initDType = dtype;
    return this;
  }

  long numel() {
    long n = 1;
    for (long d : shape) {
      n *= d;
    }
    return n;
  }

  @Override
  public String toString() {
    return name + Arrays.toString(shape);
  }
}
