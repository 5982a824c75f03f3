package org.libzero.internal;

import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
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
    try { // getBytes would turn a lone surrogate into '?' silently
      ByteBuffer bytes = StandardCharsets.UTF_8.newEncoder().onMalformedInput(CodingErrorAction.REPORT)
          .onUnmappableCharacter(CodingErrorAction.REPORT).encode(CharBuffer.wrap(s));
      byte[] out = new byte[bytes.remaining()];
      bytes.get(out);
      return out;
    } catch (CharacterCodingException e) {
      throw new IllegalArgumentException("a string passed to libzero is not valid Unicode (a lone surrogate?): "
          + s, e);
    }
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
