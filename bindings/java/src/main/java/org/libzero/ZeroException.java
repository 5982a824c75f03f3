package org.libzero;

/**
 * A failed libzero call. Each status code of the C API has its own subclass (nested here, so that {@code catch
 * (ZeroException.Timeout e)} reads as what it catches); the message is libzero's, which says what went wrong and
 * how to fix it.
 */
public class ZeroException extends RuntimeException {
  private static final long serialVersionUID = 1L;
  private static final String[] CODES = {"ZERO_OK", "ZERO_ERR_INVALID_ARGUMENT", "ZERO_ERR_INVALID_STATE",
      "ZERO_ERR_CONFIG", "ZERO_ERR_UNSUPPORTED", "ZERO_ERR_MISMATCH", "ZERO_ERR_COMM", "ZERO_ERR_OUT_OF_MEMORY",
      "ZERO_ERR_INTERNAL", "ZERO_ERR_CHECKPOINT_CORRUPT", "ZERO_ERR_IO", "ZERO_ERR_REMOTE", "ZERO_ERR_TIMEOUT",
      "ZERO_ERR_ABORTED"};

  private final int status;

  protected ZeroException(int status, String message) {
    super(codeName(status) + ": " + message);
    this.status = status;
  }

  /** The C status code (zero_status_t). */
  public int status() {
    return status;
  }

  /** The status code's name, e.g. "ZERO_ERR_CONFIG". */
  public String code() {
    return codeName(status);
  }

  private static String codeName(int status) {
    return status >= 0 && status < CODES.length ? CODES[status] : "ZERO_ERR_" + status;
  }

  /** The exception for {@code status} (not ZERO_OK) with libzero's {@code message}. */
  public static ZeroException of(int status, String message) {
    switch (status) {
      case 1: return new InvalidArgument(message);
      case 2: return new InvalidState(message);
      case 3: return new Config(message);
      case 4: return new Unsupported(message);
      case 5: return new Mismatch(message);
      case 6: return new Comm(message);
      case 7: return new OutOfMemory(message);
      case 8: return new Internal(message);
      case 9: return new CheckpointCorrupt(message);
      case 10: return new Io(message);
      case 11: return new Remote(message);
      case 12: return new Timeout(message);
      case 13: return new Aborted(message);
      default: return new ZeroException(status, message); // a code newer than this binding
    }
  }

  /** A NULL pointer, an unknown id, a size that does not fit. */
  public static final class InvalidArgument extends ZeroException {
    private static final long serialVersionUID = 1L;
    InvalidArgument(String m) { super(1, m); }
  }

  /** A call in the wrong order (e.g. step() before finalizeParams()). */
  public static final class InvalidState extends ZeroException {
    private static final long serialVersionUID = 1L;
    InvalidState(String m) { super(2, m); }
  }

  /** The config is malformed, has an unknown key or a value of the wrong type. */
  public static final class Config extends ZeroException {
    private static final long serialVersionUID = 1L;
    Config(String m) { super(3, m); }
  }

  /** A valid request this version does not support. */
  public static final class Unsupported extends ZeroException {
    private static final long serialVersionUID = 1L;
    Unsupported(String m) { super(4, m); }
  }

  /** Ranks disagree: registration, config, or which collective they call. */
  public static final class Mismatch extends ZeroException {
    private static final long serialVersionUID = 1L;
    Mismatch(String m) { super(5, m); }
  }

  /** The communication backend failed. */
  public static final class Comm extends ZeroException {
    private static final long serialVersionUID = 1L;
    Comm(String m) { super(6, m); }
  }

  /** libzero could not allocate what the configured stage needs. */
  public static final class OutOfMemory extends ZeroException {
    private static final long serialVersionUID = 1L;
    OutOfMemory(String m) { super(7, m); }
  }

  /** A bug in libzero: please report it with the message. */
  public static final class Internal extends ZeroException {
    private static final long serialVersionUID = 1L;
    Internal(String m) { super(8, m); }
  }

  /** A checkpoint file is missing, truncated or fails its checksum. */
  public static final class CheckpointCorrupt extends ZeroException {
    private static final long serialVersionUID = 1L;
    CheckpointCorrupt(String m) { super(9, m); }
  }

  /** The file system refused (no space, permissions, ...). */
  public static final class Io extends ZeroException {
    private static final long serialVersionUID = 1L;
    Io(String m) { super(10, m); }
  }

  /** Another rank failed; the message names the rank and its error. */
  public static final class Remote extends ZeroException {
    private static final long serialVersionUID = 1L;
    Remote(String m) { super(11, m); }
  }

  /** A collective did not complete within the timeout; the message says who is missing. */
  public static final class Timeout extends ZeroException {
    private static final long serialVersionUID = 1L;
    Timeout(String m) { super(12, m); }
  }

  /** {@link Engine#abort()} was called on this engine, or another on its communicator. */
  public static final class Aborted extends ZeroException {
    private static final long serialVersionUID = 1L;
    Aborted(String m) { super(13, m); }
  }
}
