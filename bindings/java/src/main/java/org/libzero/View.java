package org.libzero;

import java.nio.ByteBuffer;
import java.nio.FloatBuffer;
import java.nio.ShortBuffer;

/**
 * Engine memory seen from Java without a copy: a param's values ({@link Engine#param}, valid while its unit stays
 * gathered) or the buffer its gradient is added into ({@link Engine#grad}, valid until the gradient is declared
 * ready). Every accessor checks first that the view is still valid and throws {@link StaleViewException}
 * otherwise, so a released stage-3 unit's pooled buffer is never read or written through a view. The buffers that
 * {@link #floats()} and {@link #shorts()} return are direct views of the same memory: they cannot check, so use
 * them only while the view is valid (the same rule as zero_param_data in C).
 */
public final class View {
  private final Engine engine;
  private final boolean gradient;
  private final int param;
  private final int unit;
  private final long epoch;
  private final ByteBuffer bytes;
  private final DType dtype;
  private final int length;

  View(Engine engine, boolean gradient, int param, int unit, long epoch, ByteBuffer bytes, DType dtype, int length) {
    this.engine = engine;
    this.gradient = gradient;
    this.param = param;
    this.unit = unit;
    this.epoch = epoch;
    this.bytes = bytes;
    this.dtype = dtype;
    this.length = length;
  }

  /** True while the memory is still this view's to use. */
  public boolean isValid() {
    return engine.viewValid(gradient, param, unit, epoch);
  }

  /** The element type: the param dtype for params, the gradient accumulation dtype for gradients. */
  public DType dtype() {
    return dtype;
  }

  /** The number of elements. */
  public int length() {
    return length;
  }

  /** The fp32 elements as a direct FloatBuffer over engine memory (position 0, native order). */
  public FloatBuffer floats() {
    check();
    if (dtype != DType.FP32) {
      throw new IllegalStateException(what() + " holds " + dtype + " elements; use shorts()");
    }
    return bytes.duplicate().order(bytes.order()).asFloatBuffer();
  }

  /** The bf16 / fp16 elements' bits as a direct ShortBuffer over engine memory. */
  public ShortBuffer shorts() {
    check();
    if (dtype == DType.FP32) {
      throw new IllegalStateException(what() + " holds FP32 elements; use floats()");
    }
    return bytes.duplicate().order(bytes.order()).asShortBuffer();
  }

  /** Element {@code i} as a float (FP32 and BF16 views). */
  public float get(int i) {
    check();
    index(i);
    switch (dtype) {
      case FP32: return bytes.getFloat(4 * i);
      case BF16: return Float.intBitsToFloat((bytes.getShort(2 * i) & 0xffff) << 16);
      default: throw new IllegalStateException(what() + " holds FP16 elements; read them with shorts()");
    }
  }

  /** Sets element {@code i} (FP32 views). For a gradient, prefer {@link #add}: the buffer accumulates. */
  public void set(int i, float value) {
    check();
    index(i);
    requireFp32("set");
    bytes.putFloat(4 * i, value);
  }

  /** Adds {@code value} to element {@code i} (FP32 views): how a gradient is accumulated. */
  public void add(int i, float value) {
    check();
    index(i);
    requireFp32("add");
    bytes.putFloat(4 * i, bytes.getFloat(4 * i) + value);
  }

  /** Adds {@code values} element-wise (FP32 views; {@code values.length} must equal {@link #length()}). */
  public void addAll(float[] values) {
    check();
    requireFp32("addAll");
    if (values.length != length) {
      throw new IllegalArgumentException(what() + " has " + length + " elements, not " + values.length);
    }
    for (int i = 0; i < length; ++i) {
      bytes.putFloat(4 * i, bytes.getFloat(4 * i) + values[i]);
    }
  }

  /** Copies the fp32 elements into a new array. */
  public float[] toArray() {
    float[] out = new float[length];
    floats().get(out);
    return out;
  }

  private void requireFp32(String op) {
    if (dtype != DType.FP32) {
      throw new IllegalStateException(what() + " holds " + dtype + " elements; " + op + " works on FP32 views");
    }
  }

  private void index(int i) {
    if (i < 0 || i >= length) {
      throw new IndexOutOfBoundsException("index " + i + " out of " + length + " elements of " + what());
    }
  }

  private void check() {
    if (!isValid()) {
      throw new StaleViewException(what() + " is no longer valid: "
          + (gradient ? "its gradient was declared ready (or the micro-step ended)"
                      : "its unit " + unit + " was released (gather it again and ask for a new view)")
          + (engine.isClosed() ? " — the engine is closed" : ""));
    }
  }

  private String what() {
    return (gradient ? "the gradient view of param " : "the view of param ") + param + " ("
        + engine.paramName(param) + ")";
  }
}
