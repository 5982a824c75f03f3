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
 * <p>Calls are made by one thread at a time (they are synchronized on the engine); {@link #abort()} may be called
 * from any thread, and makes a call blocked in a collective return {@link ZeroException.Aborted}. Methods
 * documented as collective must be called by every rank in the same order.
 */
public final class Engine implements AutoCloseable {
  private volatile long handle;
  private final Comm comm;
  private final int rank;
  private final List<Long> initBuffers = new ArrayList<>();
  private final List<String> names = new ArrayList<>();
  private final List<Integer> paramUnits = new ArrayList<>();
  /* Java-side validity of views: bumped on every gather/release of a unit and on every end of a gradient. */
  private long[] unitEpoch = new long[0];
  private long[] gradEpoch = new long[0];
  private boolean[] gathered = new boolean[0];

  /** Creates an engine from a DeepSpeed config on {@code comm} (local). */
  public Engine(Config config, Comm comm) {
    this.comm = comm;
    long[] out = new long[1];
    ZeroNative.zero_engine_create(out, config.json(), comm.handle());
    handle = out[0];
    abortHandle = handle;
    rank = info().rank();
  }

  /** Adds a param group; returns its id (1, 2, ... in call order). Before {@link #finalizeParams()}. Local. */
  public synchronized int addParamGroup(ParamGroup group) {
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

  /** Registers a param; returns its id (0, 1, ... in call order). Before {@link #finalizeParams()}. Local. */
  public synchronized int addParam(Param param) {
    long engine = handle();
    zero_param_desc_t desc = new zero_param_desc_t();
    long init = 0;
    try {
      desc.set_name(param.name);
      desc.set_shape(param.shape);
      desc.setUnit(param.unit);
      desc.setGroup(param.group);
      if (rank == 0 && param.initDType != null) { // only rank 0's values are read (finalize broadcasts them)
        long count = param.initFloats != null ? param.initFloats.length : param.initBits.length;
        if (count != param.numel()) {
          throw new IllegalArgumentException("param " + param + " has " + param.numel() + " elements but "
              + count + " initial values");
        }
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
      paramUnits.add(param.unit);
      return out[0];
    } finally {
      if (init != 0) {
        ZeroNative.zero_swig_free(init);
      }
      desc.delete();
    }
  }

  /**
   * Collective: checks that every rank registered the same params and config, lays out and allocates the stage's
   * buffers and broadcasts rank 0's initial values.
   */
  public synchronized void finalizeParams() {
    ZeroNative.zero_engine_finalize(handle());
    freeInitBuffers();
    int units = info().numUnits();
    unitEpoch = new long[units];
    gathered = new boolean[units];
    gradEpoch = new long[names.size()];
  }

  /** Makes units' full parameters available (stage 3: all-gathers them; collective there). */
  public synchronized void gather(int... units) {
    long engine = handle();
    for (int unit : units) {
      ZeroNative.zero_gather(engine, unit);
      unitEpoch[unit]++;
      gathered[unit] = true;
    }
  }

  /** Gives gathered units back; views of them become invalid. Local. */
  public synchronized void release(int... units) {
    long engine = handle();
    for (int unit : units) {
      ZeroNative.zero_release(engine, unit);
      unitEpoch[unit]++;
      gathered[unit] = false;
    }
  }

  /** Stage 3: starts the all-gather of {@code unit} ahead of its {@link #gather} (experimental API; collective). */
  public synchronized void prefetch(int unit) {
    ZeroNative.zero_prefetch(handle(), unit);
  }

  /** The param's values, valid while its unit stays gathered. */
  public synchronized View param(int param) {
    long engine = handle();
    long[] address = new long[1];
    ZeroNative.zero_param_data(address, engine, param);
    ParamInfo info = paramInfo(param);
    int unit = info.unit();
    return new View(this, false, param, unit, unitEpoch[unit], direct(address[0], bytes(info, info.paramDType())),
        info.paramDType(), (int) info.numel());
  }

  /** The buffer the param's gradient is added into, valid until {@link #gradReady} for it. */
  public synchronized View grad(int param) {
    long engine = handle();
    long[] address = new long[1];
    ZeroNative.zero_grad_data(address, engine, param);
    ParamInfo info = paramInfo(param);
    return new View(this, true, param, info.unit(), gradEpoch[param], direct(address[0], bytes(info, info.gradDType())),
        info.gradDType(), (int) info.numel());
  }

  /** Declares the param's gradient for this micro-step complete (stages 2-3: may start a reduction; collective). */
  public synchronized void gradReady(int param) {
    ZeroNative.zero_grad_ready(handle(), param);
    gradEpoch[param]++;
  }

  /** Ends the micro-step: reduces every bucket still pending. Collective. */
  public synchronized void backwardEnd() {
    try {
      ZeroNative.zero_backward_end(handle());
    } finally {
      bumpAllGradients();
    }
  }

  /** The optimizer step, after gradient_accumulation_steps micro-steps. Collective. */
  public synchronized StepInfo step() {
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

  /** The factor to multiply the loss by before backward (fp16's loss scale; 1 otherwise). */
  public synchronized double lossScale() {
    double[] out = new double[1];
    ZeroNative.zero_loss_scale(out, handle());
    return out[0];
  }

  /** Sets a group's learning rate ({@code group} -1: every group); every rank must set the same value. */
  public synchronized void setLr(int group, double lr) {
    ZeroNative.zero_set_lr(handle(), group, lr);
  }

  /** Optimizer threads of this rank (0: automatic). Results do not depend on it. */
  public synchronized void setNumThreads(int threads) {
    ZeroNative.zero_engine_set_num_threads(handle(), threads);
  }

  /** Collective: saves a sharded checkpoint as {@code dir/tag} and points {@code dir/latest} at it. */
  public synchronized void saveCheckpoint(Path dir, String tag) {
    ZeroNative.zero_save_checkpoint(handle(), dir.toString(), tag);
  }

  /** Collective: loads {@code dir/tag} (or the latest when {@code tag} is null), whatever rank count saved it. */
  public synchronized void loadCheckpoint(Path dir, String tag) {
    ZeroNative.zero_load_checkpoint(handle(), dir.toString(), tag);
  }

  /** The engine's rank, world size, stage, dtypes and counts. */
  public synchronized EngineInfo info() {
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

  /** A registered param's name, shape, unit, group and dtypes. */
  public synchronized ParamInfo paramInfo(int param) {
    zero_param_info_t out = new zero_param_info_t();
    try {
      ZeroNative.zero_param_info(out, handle(), param);
      long[] shape = new long[out.getNdim()];
      for (int i = 0; i < shape.length; ++i) {
        shape[i] = out.dim(i);
      }
      return new ParamInfo(out.param_name(), shape, out.getUnit(), out.getGroup(), out.getNumel(),
          DType.of(out.getParam_dtype()), DType.of(out.getGrad_dtype()));
    } finally {
      out.delete();
    }
  }

  /** Bytes this rank allocated per category (after finalize). */
  public synchronized MemoryStats memoryStats() {
    zero_memory_stats_t out = new zero_memory_stats_t();
    try {
      ZeroNative.zero_memory_stats(out, handle());
      return new MemoryStats(out.getParam_bytes(), out.getGrad_bytes(), out.getMaster_param_bytes(),
          out.getOptimizer_state_bytes(), out.getBucket_bytes(), out.getGathered_bytes(), out.getTotal_bytes());
    } finally {
      out.delete();
    }
  }

  /** Collective traffic since finalize. */
  public synchronized CommStats commStats() {
    zero_comm_stats_t out = new zero_comm_stats_t();
    try {
      ZeroNative.zero_comm_stats(out, handle());
      return new CommStats(out.getSequence(), kind(out.getAll_gather()), kind(out.getReduce_scatter()),
          kind(out.getAll_reduce()), kind(out.getBroadcast()), kind(out.getControl()));
    } finally {
      out.delete();
    }
  }

  /** The engine's last collectives as JSON (experimental API): for a framework's own hang reports. Any thread. */
  public String recentCollectives() {
    long engine;
    synchronized (this) {
      engine = handle();
    }
    String[] out = new String[1];
    ZeroNative.zero_engine_recent_collectives(out, engine);
    return out[0];
  }

  /**
   * Makes the engine unusable now: a call blocked in a collective on another thread returns {@link
   * ZeroException.Aborted}, and the other ranks' collectives fail naming this rank. Any thread; never blocks.
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
  public synchronized void close() {
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

  /* Unsynchronized: views are used by the thread that drives the engine, which is the only one that changes these. */
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
