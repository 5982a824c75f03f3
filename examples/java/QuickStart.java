import java.util.Map;
import java.util.Random;
import org.libzero.Comm;
import org.libzero.Config;
import org.libzero.Engine;
import org.libzero.Param;
import org.libzero.StepInfo;

public class QuickStart {
  public static void main(String[] args) {
    Config config = Config.fromMap(Map.of("train_batch_size", 64, "zero_optimization", Map.of("stage", 2),
        "optimizer", Map.of("type", "AdamW", "params", Map.of("lr", 0.05))));
    try (Comm comm = Comm.mpi(); Engine engine = new Engine(config, comm)) {
      int w = engine.addParam(Param.of("w", 16));         // starts at zero
      engine.finalizeParams();                            // collective: every rank registered the same params
      Random rng = new Random(comm.rank());
      StepInfo info = null;
      for (int step = 0; step < 300; ++step) {
        engine.gather(0);
        float[] weights = engine.param(w).toArray(), grad = new float[16], x = new float[16];
        for (int sample = 0; sample < 32; ++sample) {     // this rank's batch
          float err = 0;
          for (int i = 0; i < 16; ++i) {
            x[i] = (float) rng.nextGaussian();
            err += x[i] * (weights[i] - target(i));
          }
          for (int i = 0; i < 16; ++i) grad[i] += 2 * err * x[i] / 32;
        }
        engine.grad(w).addAll(grad);                      // your backward adds the gradient here
        engine.gradReady(w);
        engine.release(0);
        engine.backwardEnd();
        info = engine.step();
      }
      engine.gather(0);
      float[] weights = engine.param(w).toArray();
      engine.release(0);
      double worst = 0;
      for (int i = 0; i < 16; ++i) worst = Math.max(worst, Math.abs(weights[i] - target(i)));
      System.out.println(String.format("rank %d/%d: step %d, max |w - w_true| = %.1e", comm.rank(), comm.size(),
          info.step(), worst));
    }
  }

  static float target(int i) {
    return -1 + 2 * i / 15f;
  }
}
