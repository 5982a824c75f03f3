package org.libzero.internal;

import org.libzero.ZeroException;

/** Turns the status code of a C call into an exception (the SWIG status typemap calls this after every call). */
public final class Status {
  private Status() {}

  /**
   * Throws the {@link ZeroException} of {@code status} with libzero's message, or returns for ZERO_OK. The message is
   * zero_last_error(), which is per OS thread: a JNI call runs on the calling Java thread, so it is read on the thread
   * that failed, right after the failure.
   */
  public static void check(int status) {
    if (status != 0) {
      throw ZeroException.of(status, ZeroNative.zero_last_error());
    }
  }
}
