import java.util.Arrays;
import org.libzero.Comm;
import org.libzero.Config;
import org.libzero.Engine;
import org.libzero.Param;

/** The per-call cost of gather / gradReady / release from Java (bench/bindings/run.sh; overhead.c is the C one). */
public final class Overhead {
  public static void main(String[] args) {
    int params = 1000;
    int rounds = args.length > 0 ? Integer.parseInt(args[0]) : 200;
    Config config = Config.fromJson("{\"train_micro_batch_size_per_gpu\": 1, \"gradient_clipping\": 0,"
        + " \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1}}, \"zero_optimization\": {\"stage\": 1}}");
    try (Comm comm = Comm.single(); Engine engine = new Engine(config, comm)) {
      for (int p = 0; p < params; ++p) {
        engine.addParam(Param.of("p" + p, 1).unit(p));
      }
      engine.finalizeParams();
      double[] samples = new double[rounds];
      for (int r = 0; r < rounds; ++r) {
        long start = System.nanoTime();
        for (int p = 0; p < params; ++p) {
          engine.gather(p);
          engine.gradReady(p);
          engine.release(p);
        }
        samples[r] = (System.nanoTime() - start) / (3.0 * params);
        engine.backwardEnd();
        engine.step();
      }
      Arrays.sort(samples);
      System.out.printf("java %.1f ns/call (median of %d rounds of %d gather + grad_ready + release)%n",
          samples[rounds / 2], rounds, params);
    }
  }
}
