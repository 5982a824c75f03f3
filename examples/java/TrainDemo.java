import java.util.Locale;
import org.libzero.Comm;
import org.libzero.Config;
import org.libzero.Engine;
import org.libzero.Param;
import org.libzero.ParamGroup;
import org.libzero.StepInfo;
import org.libzero.View;

/**
 * examples/demo/train_demo.c in Java: the same two-layer softsign MLP, data, config and order of float operations,
 * so its final weights equal the C program's bit for bit (tests/bindings/three_languages.sh compares the checksums).
 *
 * <pre>
 *   mpirun -np 2 java -cp build/release/bindings/java/libzero.jar:build/release/bindings/java/example-classes \
 *       TrainDemo --stage 3 --steps 100
 * </pre>
 */
public final class TrainDemo {
  static final int INPUTS = 64;
  static final int BATCH = 32;

  /** xorshift64*, as in the C demo (Java's long arithmetic wraps the same way; >>> is C's unsigned shift). */
  static double uniform(long[] state) {
    long s = state[0];
    s ^= s >>> 12;
    s ^= s << 25;
    s ^= s >>> 27;
    state[0] = s;
    return (double) ((s * 2685821657736338717L) >>> 11) / 9007199254740992.0 * 2.0 - 1.0;
  }

  static float softsign(float a) {
    return a / (1.0f + Math.abs(a));
  }

  static float teacher(float[] x, int offset) {
    float y = 0.0f;
    for (int i = 0; i < INPUTS; ++i) {
      y += (float) ((i * 7) % 13 - 6) / 8.0f * x[offset + i];
    }
    return softsign(y) + 0.5f * x[offset] * x[offset + 1];
  }

  public static void main(String[] args) {
    int stage = 3;
    int steps = 300;
    int hidden = 512;
    for (int i = 0; i < args.length; ++i) {
      if (args[i].equals("--stage") && i + 1 < args.length) {
        stage = Integer.parseInt(args[++i]);
      } else if (args[i].equals("--steps") && i + 1 < args.length) {
        steps = Integer.parseInt(args[++i]);
      } else if (args[i].equals("--hidden") && i + 1 < args.length) {
        hidden = Integer.parseInt(args[++i]);
      } else {
        System.err.println("usage: TrainDemo [--stage 0-3] [--steps N] [--hidden H]");
        System.exit(2);
      }
    }
    String config = String.format(Locale.ROOT,
        "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": 1, \"gradient_clipping\": 1.0,"
            + " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.003, \"weight_decay\": 0.01}},"
            + " \"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 0}}",
        BATCH, stage);
    try (Comm comm = Comm.mpi(); Engine engine = new Engine(Config.fromJson(config), comm)) {
      int rank = comm.rank();
      int noDecay = engine.addParamGroup(ParamGroup.named("no_decay").weightDecay(0.0));
      float[] w1Init = new float[hidden * INPUTS];
      float[] w2Init = new float[hidden];
      long[] seed = {42};
      for (int i = 0; i < w1Init.length; ++i) {
        w1Init[i] = (float) (uniform(seed) / Math.sqrt((double) INPUTS));
      }
      for (int i = 0; i < hidden; ++i) {
        w2Init[i] = (float) (uniform(seed) / Math.sqrt((double) hidden));
      }
      int w1 = engine.addParam(Param.of("layer1.weight", hidden, INPUTS).unit(0).init(w1Init));
      int b1 = engine.addParam(Param.of("layer1.bias", hidden).unit(0).group(noDecay));
      int w2 = engine.addParam(Param.of("layer2.weight", 1, hidden).unit(1).init(w2Init));
      int b2 = engine.addParam(Param.of("layer2.bias", 1).unit(1).group(noDecay));
      engine.finalizeParams();

      float[] x = new float[BATCH * INPUTS];
      float[] h = new float[BATCH * hidden];
      float[] out = new float[BATCH];
      float[] target = new float[BATCH];
      long[] dataSeed = {1000 + rank};
      if (rank == 0) {
        System.out.printf("training a %d-parameter MLP at ZeRO stage %d on %d ranks (Java)%n",
            hidden * (INPUTS + 2) + 1, stage, comm.size());
      }
      long t0 = System.nanoTime();
      for (int step = 1; step <= steps; ++step) {
        for (int s = 0; s < BATCH; ++s) {
          for (int i = 0; i < INPUTS; ++i) {
            x[s * INPUTS + i] = (float) uniform(dataSeed);
          }
          target[s] = teacher(x, s * INPUTS);
        }
        engine.gather(0, 1);
        float[] mw1 = engine.param(w1).toArray();
        float[] mb1 = engine.param(b1).toArray();
        float[] mw2 = engine.param(w2).toArray();
        float mb2 = engine.param(b2).get(0);
        double loss = 0.0;
        for (int s = 0; s < BATCH; ++s) {
          float y = mb2;
          for (int j = 0; j < hidden; ++j) {
            float a = mb1[j];
            for (int i = 0; i < INPUTS; ++i) {
              a += mw1[j * INPUTS + i] * x[s * INPUTS + i];
            }
            h[s * hidden + j] = softsign(a);
            y += mw2[j] * h[s * hidden + j];
          }
          out[s] = y;
          loss += 0.5 * (out[s] - target[s]) * (out[s] - target[s]) / BATCH;
        }
        // Backward, layer 2 first, adding into the engine's buffers in the C demo's order.
        View gw2View = engine.grad(w2);
        View gb2View = engine.grad(b2);
        float[] gw2 = gw2View.toArray();
        float gb2 = gb2View.get(0);
        for (int s = 0; s < BATCH; ++s) {
          float dy = (out[s] - target[s]) / BATCH;
          gb2 += dy;
          for (int j = 0; j < hidden; ++j) {
            gw2[j] += dy * h[s * hidden + j];
          }
        }
        gw2View.floats().put(gw2);
        gb2View.set(0, gb2);
        engine.gradReady(w2);
        engine.gradReady(b2);
        View gw1View = engine.grad(w1);
        View gb1View = engine.grad(b1);
        float[] gw1 = gw1View.toArray();
        float[] gb1 = gb1View.toArray();
        for (int s = 0; s < BATCH; ++s) {
          float dy = (out[s] - target[s]) / BATCH;
          for (int j = 0; j < hidden; ++j) {
            float hj = h[s * hidden + j];
            float slope = 1.0f - Math.abs(hj);
            float dh = dy * mw2[j] * (slope * slope);
            gb1[j] += dh;
            for (int i = 0; i < INPUTS; ++i) {
              gw1[j * INPUTS + i] += dh * x[s * INPUTS + i];
            }
          }
        }
        gw1View.floats().put(gw1);
        gb1View.floats().put(gb1);
        engine.gradReady(w1);
        engine.gradReady(b1);
        engine.release(1, 0);
        engine.backwardEnd();
        StepInfo info = engine.step();
        if (rank == 0 && (step == 1 || step % 20 == 0 || step == steps)) {
          System.out.printf(Locale.ROOT, "step %4d  loss %.5f (rank 0)  grad_norm %.4f  %.2f ms/step%n", step, loss,
              info.gradNorm(), (System.nanoTime() - t0) / 1e6 / step);
        }
      }
      long checksum = checksum(engine, new int[] {w1, b1, w2, b2});
      if (rank == 0) {
        System.out.printf("final weights checksum %016x%n", checksum);
      }
    }
  }

  /** FNV-1a over every param's bytes in id order (little-endian fp32), as the C demo computes it. */
  static long checksum(Engine engine, int[] ids) {
    long hash = 0xcbf29ce484222325L;
    engine.gather(0, 1);
    for (int id : ids) {
      for (float v : engine.param(id).toArray()) {
        int bits = Float.floatToRawIntBits(v);
        for (int b = 0; b < 4; ++b) {
          hash ^= (bits >>> (8 * b)) & 0xff;
          hash *= 0x100000001b3L;
        }
      }
    }
    engine.release(1, 0);
    return hash;
  }
}
