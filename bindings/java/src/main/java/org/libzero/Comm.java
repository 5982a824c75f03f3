package org.libzero;

import org.libzero.internal.ZeroNative;

/**
 * A communicator: the ranks that train together. {@link #mpi()} for MPI (libzero initialises MPI itself, with
 * MPI_THREAD_SERIALIZED, when the program has not), {@link #single()} for one process. Engines keep their
 * communicator alive, so closing it before them is safe.
 */
public final class Comm implements AutoCloseable {
  private long handle;
  private final int rank;
  private final int size;

  private Comm(long handle) {
    this.handle = handle;
    int[] out = new int[1];
    try {
      ZeroNative.zero_comm_rank(out, handle);
      rank = out[0];
      ZeroNative.zero_comm_size(out, handle);
      size = out[0];
    } catch (RuntimeException e) {
      ZeroNative.zero_comm_destroy(handle);
      throw e;
    }
  }

  /** The whole MPI job (MPI_COMM_WORLD). Collective. */
  public static Comm mpi() {
    return mpi(-1L);
  }

  /**
   * An MPI communicator given by its Fortran handle (MPI_Comm_c2f: what Java MPI bindings expose), or -1 for
   * MPI_COMM_WORLD. libzero duplicates it. Collective.
   */
  public static Comm mpi(long fortranHandle) {
    long[] out = new long[1];
    ZeroNative.zero_comm_create_mpi(out, fortranHandle);
    return new Comm(out[0]);
  }

  /** One process, no MPI. */
  public static Comm single() {
    long[] out = new long[1];
    ZeroNative.zero_comm_create_single(out);
    return new Comm(out[0]);
  }

  /** This process's rank (fixed: any thread, any time, also while a collective is in progress). */
  public int rank() {
    return rank;
  }

  /** The number of ranks. */
  public int size() {
    return size;
  }

  /**
   * Collective teardown (zero_comm_finalize): agrees with every rank that the communicator is done, frees its
   * collective resources and finalises MPI if libzero initialised it. Afterwards only {@link #close()} is valid.
   */
  public synchronized void shutdown() {
    ZeroNative.zero_comm_finalize(handle());
  }

  /**
   * Releases this reference (local; engines on the communicator keep it alive). Idempotent. An MPI communicator
   * closed without {@link #shutdown()} keeps its duplicated MPI communicator (tens of KB) until MPI is finalised.
   */
  @Override
  public synchronized void close() {
    if (handle != 0) {
      ZeroNative.zero_comm_destroy(handle);
      handle = 0;
    }
  }

  synchronized long handle() {
    if (handle == 0) {
      throw new IllegalStateException("this Comm is closed");
    }
    return handle;
  }
}
