package org.libzero;

/** Element types of params and gradients (zero_dtype_t). */
public enum DType {
  FP32(0, 4),
  BF16(1, 2),
  FP16(2, 2);

  private final int code;
  private final int bytes;

  DType(int code, int bytes) {
    this.code = code;
    this.bytes = bytes;
  }

  /** The zero_dtype_t value. */
  public int code() {
    return code;
  }

  /** Bytes per element. */
  public int bytes() {
    return bytes;
  }

  static DType of(int code) {
    for (DType d : values()) {
      if (d.code == code) {
        return d;
      }
    }
    throw new IllegalArgumentException("libzero dtype " + code + " is not a param or gradient dtype");
  }
}
