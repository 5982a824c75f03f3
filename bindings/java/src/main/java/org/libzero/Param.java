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
    if (name == null) {
      throw new IllegalArgumentException("param name is null");
    }
    if (shape == null) {
      throw new IllegalArgumentException("param " + name + ": shape is null (no dimensions make a scalar)");
    }
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
    if (values == null) {
      throw new IllegalArgumentException("param " + name + ": initial values are null");
    }
    initFloats = values.clone();
    initBits = null;
    initDType = DType.FP32;
    return this;
  }

  /** 16-bit initial values given as their bits, in {@code dtype} (BF16 or FP16). */
  public Param initBits(short[] bits, DType dtype) {
    if (bits == null || dtype == null) {
      throw new IllegalArgumentException("param " + name + ": initBits needs the bits and their dtype");
    }
    if (dtype == DType.FP32) {
      throw new IllegalArgumentException("initBits takes BF16 or FP16 bits; use init(float[]) for FP32");
    }
    initBits = bits.clone();
    initFloats = null;
    initDType = dtype;
    return this;
  }

  /** The element count, or -1 when a dimension is not positive or the product overflows (libzero explains). */
  long numel() {
    long n = 1;
    for (long d : shape) {
      if (d <= 0 || n > Long.MAX_VALUE / d) {
        return -1;
      }
      n *= d;
    }
    return n;
  }

  /** Checks the initial values' count against the shape (on every rank, so that all fail together). */
  void checkInit() {
    if (initDType == null) {
      return;
    }
    long count = initFloats != null ? initFloats.length : initBits.length;
    long n = numel();
    if (n >= 0 && count != n) {
      throw new IllegalArgumentException("param " + this + " has " + n + " elements but " + count
          + " initial values");
    }
  }

  @Override
  public String toString() {
    return name + Arrays.toString(shape);
  }
}
