package org.libzero;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.libzero.internal.ZeroNative;
import org.libzero.internal.zero_comm_kind_stats_t;
import org.libzero.internal.zero_comm_stats_t;
import org.libzero.internal.zero_engine_info_t;
import org.libzero.internal.zero_memory_stats_t;
import org.libzero.internal.zero_param_desc_t;
import org.libzero.internal.zero_param_group_desc_t;
import org.libzero.internal.zero_param_info_t;
import org.libzero.internal.zero_step_info_t;

/**
 * A ZeRO training engine: it owns where every parameter, gradient and optimizer-state byte lives, the collectives
 * that move them, and the optimizer step; the program owns forward and backward.
 *
 * <pre>{@code
 * try (Comm comm = Comm.mpi(); Engine engine = new Engine(Config.fromPath(Path.of("ds_config.json")), comm)) {
 *   int w = engine.addParam(Param.of("w", 16, 8).unit(0).init(values));
 *   engine.finalizeParams();
 *   engine.gather(0);                 // forward: read engine.param(w)
 *   engine.grad(w).addAll(gradient);  // backward: add into the gradient buffer
 *   engine.gradReady(w);
 *   engine.release(0);
 *   engine.backwardEnd();
 *   StepInfo info = engine.step();
 * }
 * }</pre>
 *
 * <p>Calls on an engine, on its communicator and on every other engine of that communicator are serialized (they
 * hold the communicator's monitor: libzero initialises MPI with MPI_THREAD_SERIALIZED). Collective calls must come
 * in the same order on every rank, so drive all engines of one communicator from one thread. {@link #abort()} and
 * {@link #recentCollectives()} may be called from any thread at any time: abort makes a call blocked in a collective
 * return {@link ZeroException.Aborted}.
 */
public final class Engine implements AutoCloseable {
  private volatile long handle;
  private final Comm comm;
  /* The communicator's monitor: every call on the communicator and on each engine using it holds it, so that MPI
   * (initialised MPI_THREAD_SERIALIZED) is never entered by two threads at once. */
  final Object lock;
  private ParamInfo[] infoCache = new ParamInfo[0];
  private final int rank;
  private final List<Long> initBuffers = new ArrayList<>();
  private final List<String> names = new ArrayList<>();
  /* Java-side validity of views: bumped on every gather/release of a unit and on every end of a gradient. */
  private long[] unitEpoch = new long[0];
  private long[] gradEpoch = new long[0];
  private boolean[] gathered = new boolean[0];

  /** Creates an engine from a DeepSpeed config on {@code comm} (local). */
  public Engine(Config config, Comm comm) {
    if (config == null || comm == null) {
      throw new IllegalArgumentException("new Engine(config, comm): " + (config == null ? "config" : "comm")
          + " is null");
    }
    this.comm = comm;
    this.lock = comm;
    long[] out = new long[1];
    synchronized (lock) {
      ZeroNative.zero_engine_create(out, config.json(), comm.handle());
    }
    handle = out[0];
    abortHandle = handle;
    rank = info().rank();
  }

  /** Adds a param group; returns its id (1, 2, ... in call order). Before {@link #finalizeParams()}. Local. */
  public int addParamGroup(ParamGroup group) {
    if (group == null) {
      throw new IllegalArgumentException("addParamGroup(null)");
    }
    synchronized (lock) {
      zero_param_group_desc_t desc = new zero_param_group_desc_t();
      try {
        if (group.name != null) {
          desc.set_name(group.name);
        }
        if (!Double.isNaN(group.lr)) desc.setLr(group.lr);
        if (!Double.isNaN(group.weightDecay)) desc.setWeight_decay(group.weightDecay);
        if (!Double.isNaN(group.beta1)) desc.setBeta1(group.beta1);
        if (!Double.isNaN(group.beta2)) desc.setBeta2(group.beta2);
        if (!Double.isNaN(group.eps)) desc.setEps(group.eps);
        int[] out = new int[1];
        ZeroNative.zero_engine_add_param_group(out, handle(), desc);
        return out[0];
      } finally {
        desc.delete();
      }
    }
  }

  /** Registers a param; returns its id (0, 1, ... in call order). Before {@link #finalizeParams()}. Local. */
  public int addParam(Param param) {
    if (param == null) {
      throw new IllegalArgumentException("addParam(null)");
    }
    param.checkInit(); // on every rank: only rank 0's values are copied, but all ranks fail together
    synchronized (lock) {
      long engine = handle();
      zero_param_desc_t desc = new zero_param_desc_t();
      long init = 0;
      try {
        desc.set_name(param.name);
        desc.set_shape(param.shape);
        desc.setUnit(param.unit);
        desc.setGroup(param.group);
        // Only rank 0's values are read (finalize broadcasts them).
        if (rank == 0 && param.initDType != null && param.numel() >= 0) {
          long count = param.initFloats != null ? param.initFloats.length : param.initBits.length;
          long bytes = count * param.initDType.bytes();
          init = ZeroNative.zero_swig_alloc(bytes);
          if (init == 0) {
            throw new OutOfMemoryError("no memory for the " + bytes + " bytes of " + param + "'s initial values");
          }
          ByteBuffer target = direct(init, bytes);
          if (param.initFloats != null) {
            target.asFloatBuffer().put(param.initFloats);
          } else {
            target.asShortBuffer().put(param.initBits);
          }
          desc.set_init_address(init);
          desc.setInit_dtype(param.initDType.code());
        }
        int[] out = new int[1];
        ZeroNative.zero_engine_add_param(out, engine, desc);
        if (init != 0) {
          initBuffers.add(init); // read during finalize
          init = 0;
        }
        names.add(param.name);
        return out[0];
      } finally {
        if (init != 0) {
          ZeroNative.zero_swig_free(init);
        }
        desc.delete();
      }
    }
  }

  /**
   * Collective: checks that every rank registered the same params and config, lays out and allocates the stage's
   * buffers and broadcasts rank 0's initial values.
   */
  public void finalizeParams() {
    synchronized (lock) {
      ZeroNative.zero_engine_finalize(handle());
      freeInitBuffers();
      int units = info().numUnits();
      unitEpoch = new long[units];
      gathered = new boolean[units];
      gradEpoch = new long[names.size()];
    }
  }

  /** Makes units' full parameters available (stage 3: all-gathers them; collective there). */
  public void gather(int... units) {
    synchronized (lock) {
      long engine = handle();
      for (int unit : units) {
        ZeroNative.zero_gather(engine, unit);
        unitEpoch[unit]++;
        gathered[unit] = true;
      }
    }
  }

  /** Gives gathered units back; views of them become invalid. Local. */
  public void release(int... units) {
    synchronized (lock) {
      long engine = handle();
      for (int unit : units) {
        ZeroNative.zero_release(engine, unit);
        unitEpoch[unit]++;
        gathered[unit] = false;
      }
    }
  }

  /** Stage 3: starts the all-gather of {@code unit} ahead of its {@link #gather} (experimental API; collective). */
  public void prefetch(int unit) {
    synchronized (lock) {
      ZeroNative.zero_prefetch(handle(), unit);
    }
  }

  /** The param's values, valid while its unit stays gathered. */
  public View param(int param) {
    synchronized (lock) {
      long engine = handle();
      long[] address = new long[1];
      ZeroNative.zero_param_data(address, engine, param);
      ParamInfo info = paramInfo(param);
      int unit = info.unit();
      return new View(this, false, param, unit, unitEpoch[unit], direct(address[0], bytes(info, info.paramDType())),
          info.paramDType(), (int) info.numel());
    }
  }

  /** The buffer the param's gradient is added into, valid until {@link #gradReady} for it. */
  public View grad(int param) {
    synchronized (lock) {
      long engine = handle();
      long[] address = new long[1];
      ZeroNative.zero_grad_data(address, engine, param);
      ParamInfo info = paramInfo(param);
      return new View(this, true, param, info.unit(), gradEpoch[param], direct(address[0], bytes(info, info.gradDType())),
          info.gradDType(), (int) info.numel());
    }
  }

  /** Declares the param's gradient for this micro-step complete (stages 2-3: may start a reduction; collective). */
  public void gradReady(int param) {
    synchronized (lock) {
      ZeroNative.zero_grad_ready(handle(), param);
      gradEpoch[param]++;
    }
  }

  /** Ends the micro-step: reduces every bucket still pending. Collective. */
  public void backwardEnd() {
    synchronized (lock) {
      try {
        ZeroNative.zero_backward_end(handle());
      } finally {
        bumpAllGradients();
      }
    }
  }

  /** The optimizer step, after gradient_accumulation_steps micro-steps. Collective. */
  public StepInfo step() {
    synchronized (lock) {
      zero_step_info_t out = new zero_step_info_t();
      try {
        ZeroNative.zero_step(out, handle());
        return new StepInfo(out.getStep(), out.getLoss_scale(), out.getGrad_norm(), out.getSkipped() != 0,
            out.getLr());
      } finally {
        bumpAllGradients();
        out.delete();
      }
    }
  }

  /** The factor to multiply the loss by before backward (fp16's loss scale; 1 otherwise). */
  public double lossScale() {
    synchronized (lock) {
      double[] out = new double[1];
      ZeroNative.zero_loss_scale(out, handle());
      return out[0];
    }
  }

  /** Sets a group's learning rate ({@code group} -1: every group); every rank must set the same value. */
  public void setLr(int group, double lr) {
    synchronized (lock) {
      ZeroNative.zero_set_lr(handle(), group, lr);
    }
  }

  /** Optimizer threads of this rank (0: automatic). Results do not depend on it. */
  public void setNumThreads(int threads) {
    synchronized (lock) {
      ZeroNative.zero_engine_set_num_threads(handle(), threads);
    }
  }

  /**
   * Collective: saves a sharded checkpoint as {@code dir/tag} and points {@code dir/latest} at it. The tag is
   * required (DeepSpeed's default is {@code "global_step" + step}); an existing tag is never overwritten.
   */
  public void saveCheckpoint(Path dir, String tag) {
    if (dir == null || tag == null) {
      throw new IllegalArgumentException("saveCheckpoint needs a directory and a tag (e.g. \"global_step\" + step)");
    }
    synchronized (lock) {
      ZeroNative.zero_save_checkpoint(handle(), dir.toString(), tag);
    }
  }

  /** Collective: loads {@code dir/tag} (or the latest when {@code tag} is null), whatever rank count saved it. */
  public void loadCheckpoint(Path dir, String tag) {
    if (dir == null) {
      throw new IllegalArgumentException("loadCheckpoint needs a directory");
    }
    synchronized (lock) {
      ZeroNative.zero_load_checkpoint(handle(), dir.toString(), tag);
    }
  }

  /** The engine's rank, world size, stage, dtypes and counts. */
  public EngineInfo info() {
    synchronized (lock) {
      zero_engine_info_t out = new zero_engine_info_t();
      try {
        ZeroNative.zero_engine_info(out, handle());
        return new EngineInfo(out.getRank(), out.getWorld_size(), out.getStage(), out.getGradient_accumulation_steps(),
            DType.of(out.getParam_dtype()), DType.of(out.getGrad_dtype()), DType.of(out.getComm_dtype()),
            out.getNum_params(), out.getNum_units(), out.getOptimizer_threads(), out.getDeterministic() != 0,
            out.getTimeout_s());
      } finally {
        out.delete();
      }
    }
  }

  /** A registered param's name, shape, unit, group and dtypes. */
  public ParamInfo paramInfo(int param) {
    synchronized (lock) {
      if (param >= 0 && param < infoCache.length && infoCache[param] != null) {
        return infoCache[param]; // fixed once registered
      }
      zero_param_info_t out = new zero_param_info_t();
      try {
        ZeroNative.zero_param_info(out, handle(), param);
        Long[] shape = new Long[out.getNdim()];
        for (int i = 0; i < shape.length; ++i) {
          shape[i] = out.dim(i);
        }
        ParamInfo info = new ParamInfo(out.param_name(), List.of(shape), out.getUnit(), out.getGroup(),
            out.getNumel(), DType.of(out.getParam_dtype()), DType.of(out.getGrad_dtype()));
        if (param >= infoCache.length) {
          infoCache = Arrays.copyOf(infoCache, Math.max(param + 1, 2 * infoCache.length));
        }
        infoCache[param] = info;
        return info;
      } finally {
        out.delete();
      }
    }
  }

  /** Bytes this rank allocated per category (after finalize). */
  public MemoryStats memoryStats() {
    synchronized (lock) {
      zero_memory_stats_t out = new zero_memory_stats_t();
      try {
        ZeroNative.zero_memory_stats(out, handle());
        return new MemoryStats(out.getParam_bytes(), out.getGrad_bytes(), out.getMaster_param_bytes(),
            out.getOptimizer_state_bytes(), out.getBucket_bytes(), out.getGathered_bytes(), out.getTotal_bytes());
      } finally {
        out.delete();
      }
    }
  }

  /** Collective traffic since finalize. */
  public CommStats commStats() {
    synchronized (lock) {
      zero_comm_stats_t out = new zero_comm_stats_t();
      try {
        ZeroNative.zero_comm_stats(out, handle());
        return new CommStats(out.getSequence(), kind(out.getAll_gather()), kind(out.getReduce_scatter()),
            kind(out.getAll_reduce()), kind(out.getBroadcast()), kind(out.getControl()));
      } finally {
        out.delete();
      }
    }
  }

  /**
   * The engine's last collectives as JSON (experimental API): for a framework's own hang reports. Any thread, and it
   * does not wait for a call in progress on another thread (that is the call it reports).
   */
  public String recentCollectives() {
    synchronized (abortLock) { // not the engine's lock: a call blocked in a collective holds that one
      if (abortHandle == 0) {
        throw new IllegalStateException("this Engine is closed");
      }
      byte[][] out = new byte[1][];
      ZeroNative.zero_engine_recent_collectives(out, abortHandle);
      return org.libzero.internal.Strings.fromOut(out);
    }
  }

  /**
   * Makes the engine unusable now: a call blocked in a collective on another thread returns {@link
   * ZeroException.Aborted}, and the other ranks' collectives fail naming this rank. Any thread; waits for no
   * other rank.
   */
  public void abort() {
    synchronized (abortLock) {
      if (abortHandle != 0) {
        ZeroNative.zero_engine_abort(abortHandle);
      }
    }
  }

  /**
   * Destroys the engine and every buffer it owns; views become invalid. Waits for a call in progress on another
   * thread (call {@link #abort()} first to cut a collective short). Idempotent.
   */
  @Override
  public void close() {
    synchronized (lock) {
      if (handle != 0) {
        long engine = handle;
        handle = 0;
        synchronized (abortLock) { // zero_engine_abort must never run concurrently with zero_engine_destroy
          abortHandle = 0;
          ZeroNative.zero_engine_destroy(engine);
        }
        freeInitBuffers();
      }
    }
  }

  /** True after {@link #close()}. */
  public boolean isClosed() {
    return handle == 0;
  }

  /** The communicator the engine runs on. */
  public Comm comm() {
    return comm;
  }

  // ---- internals ---------------------------------------------------------------------------------------------

  /* abort() takes only this lock, never the engine's (a call blocked in a collective holds that one); close() takes
   * it around zero_engine_destroy, which must never run concurrently with zero_engine_abort. */
  private final Object abortLock = new Object();
  private long abortHandle;

  /* Called with the lock held (View's accessors take it around the check and the access, so close() on another
   * thread cannot free the memory between the two). */
  boolean viewValid(boolean gradient, int param, int unit, long epoch) {
    if (handle == 0) {
      return false;
    }
    if (gradient) {
      return param < gradEpoch.length && gradEpoch[param] == epoch;
    }
    return unit < unitEpoch.length && gathered[unit] && unitEpoch[unit] == epoch;
  }

  String paramName(int param) {
    return param >= 0 && param < names.size() ? names.get(param) : "?";
  }

  private long handle() {
    if (handle == 0) {
      throw new IllegalStateException("this Engine is closed");
    }
    return handle;
  }

  private void bumpAllGradients() {
    for (int i = 0; i < gradEpoch.length; ++i) {
      gradEpoch[i]++;
    }
  }

  private void freeInitBuffers() {
    for (long address : initBuffers) {
      ZeroNative.zero_swig_free(address);
    }
    initBuffers.clear();
  }

  private static long bytes(ParamInfo info, DType dtype) {
    return info.numel() * dtype.bytes();
  }

  private static ByteBuffer direct(long address, long bytes) {
    if (bytes > Integer.MAX_VALUE) {
      throw new UnsupportedOperationException("a Java buffer holds at most 2 GiB; this param has " + bytes
          + " bytes (register it as several params)");
    }
    ByteBuffer buffer = (ByteBuffer) ZeroNative.directBuffer(address, bytes);
    return buffer.order(ByteOrder.nativeOrder());
  }

  private static CommStats.Kind kind(zero_comm_kind_stats_t k) {
    return new CommStats.Kind(k.getCalls(), k.getBytes(), k.getWire_bytes());
  }

  @Override
  public String toString() {
    return "Engine" + (isClosed() ? "(closed)" : Arrays.toString(new int[] {rank}));
  }
}
