package org.libzero;

import java.nio.ByteBuffer;
import java.nio.FloatBuffer;
import java.nio.ShortBuffer;

/**
 * Engine memory seen from Java without a copy: a param's values ({@link Engine#param}, valid while its unit stays
 * gathered) or the buffer its gradient is added into ({@link Engine#grad}, valid until the gradient is declared
 * ready). Every accessor checks first, holding the communicator's lock, that the view is still valid, and throws
 * {@link StaleViewException} otherwise: a released stage-3 unit's pooled buffer is never read or written through a
 * view, and a {@link Engine#close()} on another thread cannot free the memory between the check and the access.
 *
 * <p>{@link #get}, {@link #set}, {@link #add}, {@link #addAll} and {@link #toArray} work in floats for every dtype:
 * bf16 and fp16 elements are widened exactly and written back rounded to nearest even, as a framework computing in
 * fp32 would store them. Param views are read-only (the optimizer changes weights); gradient views are written. The buffers that {@link #floats()} and {@link #shorts()} return are direct views of the
 * same memory without any check: use them only while the view is valid, from the thread that drives the engine
 * (the rule of zero_param_data in C).
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
    synchronized (engine.lock) {
      return engine.viewValid(gradient, param, unit, epoch);
    }
  }

  /** The element type: the param dtype for params, the gradient accumulation dtype for gradients. */
  public DType dtype() {
    return dtype;
  }

  /** The number of elements. */
  public int length() {
    return length;
  }

  /**
   * The fp32 elements as a direct FloatBuffer over engine memory (position 0, native order), read-only for a
   * param view. Unchecked later.
   */
  public FloatBuffer floats() {
    synchronized (engine.lock) {
      check();
      if (dtype != DType.FP32) {
        throw new IllegalStateException(what() + " holds " + dtype + " elements; use shorts() or toArray()");
      }
      FloatBuffer floats = bytes.duplicate().order(bytes.order()).asFloatBuffer();
      return gradient ? floats : floats.asReadOnlyBuffer();
    }
  }

  /** The bf16 / fp16 elements' bits as a direct ShortBuffer (read-only for a param view). Unchecked later. */
  public ShortBuffer shorts() {
    synchronized (engine.lock) {
      check();
      if (dtype == DType.FP32) {
        throw new IllegalStateException(what() + " holds FP32 elements; use floats()");
      }
      ShortBuffer shorts = bytes.duplicate().order(bytes.order()).asShortBuffer();
      return gradient ? shorts : shorts.asReadOnlyBuffer();
    }
  }

  /** Element {@code i} as a float. */
  public float get(int i) {
    synchronized (engine.lock) {
      check();
      index(i);
      return read(i);
    }
  }

  /** Sets element {@code i} of a gradient view (param views are read-only). Gradients accumulate: prefer {@link #add}. */
  public void set(int i, float value) {
    synchronized (engine.lock) {
      check();
      writable("set");
      index(i);
      write(i, value);
    }
  }

  /**
   * Adds {@code value} to element {@code i} of a gradient view: in fp32, then stored in the view's dtype. With a
   * 16-bit gradient accumulation dtype every call rounds (as {@code grad += g} does in bf16 in PyTorch): sum a
   * micro-step's contributions in a {@code float[]} and add them once with {@link #addAll}.
   */
  public void add(int i, float value) {
    synchronized (engine.lock) {
      check();
      writable("add");
      index(i);
      write(i, read(i) + value);
    }
  }

  /** Adds {@code values} element-wise to a gradient view ({@code values.length} must equal {@link #length()}). */
  public void addAll(float[] values) {
    synchronized (engine.lock) {
      check();
      writable("addAll");
      if (values == null || values.length != length) {
        throw new IllegalArgumentException(what() + " has " + length + " elements, not "
            + (values == null ? "null" : values.length));
      }
      for (int i = 0; i < length; ++i) {
        write(i, read(i) + values[i]);
      }
    }
  }

  /** Copies the elements, as floats, into a new array. */
  public float[] toArray() {
    synchronized (engine.lock) {
      check();
      float[] out = new float[length];
      if (dtype == DType.FP32) {
        bytes.duplicate().order(bytes.order()).asFloatBuffer().get(out);
      } else {
        for (int i = 0; i < length; ++i) {
          out[i] = read(i);
        }
      }
      return out;
    }
  }

  /* Param views are read-only: what a write to a gathered param would do depends on the stage and dtype (kept in
   * this rank's master weights only, or lost at the next gather or step), so the binding does not offer one. */
  private void writable(String op) {
    if (!gradient) {
      throw new UnsupportedOperationException(what() + " is read-only: " + op + " works on gradient views; the"
          + " optimizer (or loadCheckpoint) changes the weights");
    }
  }

  private float read(int i) {
    switch (dtype) {
      case FP32: return bytes.getFloat(4 * i);
      case BF16: return Float.intBitsToFloat((bytes.getShort(2 * i) & 0xffff) << 16);
      default: return Half.toFloat(bytes.getShort(2 * i));
    }
  }

  private void write(int i, float value) {
    switch (dtype) {
      case FP32: bytes.putFloat(4 * i, value); break;
      case BF16: bytes.putShort(2 * i, Half.toBf16(value)); break;
      default: bytes.putShort(2 * i, Half.toFp16(value));
    }
  }

  private void index(int i) {
    if (i < 0 || i >= length) {
      throw new IndexOutOfBoundsException("index " + i + " out of " + length + " elements of " + what());
    }
  }

  private void check() {
    if (!engine.viewValid(gradient, param, unit, epoch)) {
      String why = engine.isClosed() ? "the engine is closed"
          : gradient ? "its gradient was declared ready (or the micro-step ended)"
                     : "its unit " + unit + " was released (gather it again and ask for a new view)";
      throw new StaleViewException(what() + " is no longer valid: " + why);
    }
  }

  private String what() {
    return (gradient ? "the gradient view of param " : "the view of param ") + param + " ("
        + engine.paramName(param) + ")";
  }
}
