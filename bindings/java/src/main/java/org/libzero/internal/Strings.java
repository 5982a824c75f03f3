package org.libzero.internal;

import java.nio.charset.StandardCharsets;

/**
 * Strings to and from C as UTF-8 bytes (the SWIG string typemaps call these). JNI's own string functions use
 * "modified UTF-8", which writes characters outside the Basic Multilingual Plane as two 3-byte surrogates and NUL as
 * two bytes; libzero checks names and configs for real UTF-8 and would refuse them.
 */
public final class Strings {
  private Strings() {}

  /** The UTF-8 bytes of {@code s} (null stays null); a NUL inside would cut the C string short, so it is refused. */
  public static byte[] toC(String s) {
    if (s == null) {
      return null;
    }
    if (s.indexOf('\0') >= 0) {
      throw new IllegalArgumentException("a string passed to libzero contains a NUL character: "
          + s.replace("\0", "\\0"));
    }
    return s.getBytes(StandardCharsets.UTF_8);
  }

  /** A string from C's UTF-8 bytes (null stays null). */
  public static String fromC(byte[] bytes) {
    return bytes == null ? null : new String(bytes, StandardCharsets.UTF_8);
  }

  /** The first element of a one-element out-array filled by C, as a string. */
  public static String fromOut(byte[][] out) {
    return fromC(out[0]);
  }
}
