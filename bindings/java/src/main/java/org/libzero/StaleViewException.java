package org.libzero;

/**
 * A {@link View} used after the memory it shows stopped being the caller's: its unit was released (the buffer of a
 * stage-3 unit goes back to the engine's pool) or its gradient was declared ready. Thrown in Java before any byte
 * is touched.
 */
public final class StaleViewException extends IllegalStateException {
  private static final long serialVersionUID = 1L;

  StaleViewException(String message) {
    super(message);
  }
}
