package org.libzero;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.util.Map;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/**
 * Run by every rank under mpirun (tests/bindings: N = 2 and 3). Every rank runs the same tests in the same order:
 * each test is collective.
 */
public class MpiTest {
  static Comm comm;
  static int rank;
  static int world;

  @BeforeClass
  public static void open() {
    comm = Comm.mpi();
    rank = comm.rank();
    world = comm.size();
  }

  @AfterClass
  public static void close() {
    comm.close();
  }

  static Config config(int stage, int accumulation) {
    return Config.fromMap(Map.of("train_micro_batch_size_per_gpu", 1, "gradient_accumulation_steps", accumulation,
        "gradient_clipping", 0.0, "optimizer", Map.of("type", "SGD", "params", Map.of("lr", 0.25)),
        "zero_optimization", Map.of("stage", stage, "stage3_param_persistence_threshold", 0,
            "reduce_bucket_size", 8)));
  }

  /**
   * Stages 0-3, accumulation 1 and 2: every rank adds gradients that are small integers, so every sum is exact and
   * the averaged update is computed here exactly; the weights must equal it bit for bit.
   */
  @Test
  public void everyStageGivesTheExactUpdate() {
    int[] sizes = {7, 1, 13, 4}; // odd sizes; units interleave registration order
    int[] units = {1, 0, 1, 2};
    for (int stage = 0; stage <= 3; ++stage) {
      for (int accumulation = 1; accumulation <= 2; ++accumulation) {
        try (Engine engine = new Engine(config(stage, accumulation), comm)) {
          int[] ids = new int[sizes.length];
          for (int p = 0; p < sizes.length; ++p) {
            ids[p] = engine.addParam(Param.of("p" + p, sizes[p]).unit(units[p]).init(EngineTest.ramp(sizes[p], p)));
          }
          engine.finalizeParams();
          for (int micro = 0; micro < accumulation; ++micro) {
            engine.gather(0, 1, 2);
            for (int p = sizes.length - 1; p >= 0; --p) {
              if (p == 1 && rank == 0) {
                continue; // unused on rank 0: the reduction still counts rank 1's gradient
              }
              View g = engine.grad(ids[p]);
              for (int i = 0; i < sizes[p]; ++i) {
                g.add(i, grad(rank, micro, p, i));
              }
              engine.gradReady(ids[p]);
            }
            engine.release(2, 1, 0);
            engine.backwardEnd();
          }
          engine.step();
          engine.gather(0, 1, 2);
          for (int p = 0; p < sizes.length; ++p) {
            float[] expect = new float[sizes[p]];
            for (int i = 0; i < sizes[p]; ++i) {
              float sum = 0.0f;
              for (int r = 0; r < world; ++r) {
                for (int m = 0; m < accumulation; ++m) {
                  sum += (p == 1 && r == 0) ? 0.0f : grad(r, m, p, i);
                }
              }
              // mean over ranks x micro-steps (world x accumulation is 2, 3, 4 or 6: the division is the engine's,
              // correctly rounded, and so is this one)
              float mean = sum / (world * accumulation);
              expect[i] = (p + i) - 0.25f * mean;
            }
            assertArrayEquals("stage " + stage + " accumulation " + accumulation + " param " + p, expect,
                engine.param(ids[p]).toArray(), 0.0f);
          }
          engine.release(0, 1, 2);
        }
      }
    }
  }

  static float grad(int rank, int micro, int param, int index) {
    return (float) ((rank + 1) * (index + 1) + micro - param);
  }

  /** A rank that fails inside a collective makes it fail on every rank, naming the rank. */
  @Test
  public void oneRankFailingReachesEveryRank() {
    try (Engine engine = new Engine(config(3, 1), comm)) {
      engine.addParam(Param.of("p", 5).unit(0));
      engine.addParam(Param.of("q", 3).unit(1));
      engine.finalizeParams();
      engine.gather(0);
      int bad = world - 1;
      ZeroException e;
      if (rank == bad) {
        e = assertThrows(ZeroException.class, () -> engine.gather(7)); // no unit 7
        assertTrue(e.getMessage(), e instanceof ZeroException.InvalidArgument);
      } else {
        e = assertThrows(ZeroException.class, () -> engine.gather(1));
        assertTrue(e.getMessage(), e instanceof ZeroException.Remote);
        assertTrue(e.getMessage(), e.getMessage().contains("rank " + bad));
      }
    }
  }

  /** A hang report asked for while this rank is blocked in a collective comes back at once. */
  @Test
  public void recentCollectivesAnswersWhileACallIsBlocked() throws Exception {
    try (Engine engine = new Engine(config(3, 1), comm)) {
      engine.addParam(Param.of("p", 5));
      engine.finalizeParams();
      if (rank != 0) {
        Thread.sleep(2000);
        engine.gather(0);
        engine.release(0);
        return;
      }
      String[] report = new String[1];
      long[] took = new long[1];
      Thread reporter = new Thread(() -> {
        try {
          Thread.sleep(300);
        } catch (InterruptedException e) {
          return;
        }
        long start = System.nanoTime();
        report[0] = engine.recentCollectives();
        took[0] = System.nanoTime() - start;
      });
      reporter.start();
      engine.gather(0);
      reporter.join();
      engine.release(0);
      assertTrue("took " + took[0] + " ns", took[0] < 1_000_000_000L);
      assertTrue(report[0], report[0].contains("waiting"));
    }
  }

  /** Initial values of the wrong length fail on every rank, not only on rank 0 (whose values are used). */
  @Test
  public void initLengthIsCheckedOnEveryRank() {
    try (Engine engine = new Engine(config(2, 1), comm)) {
      assertThrows(IllegalArgumentException.class, () -> engine.addParam(Param.of("w", 4).init(new float[3])));
    }
  }

  /** Ranks that register different params are told so at finalize, on every rank. */
  @Test
  public void registrationMismatchIsAnErrorEverywhere() {
    try (Engine engine = new Engine(config(2, 1), comm)) {
      engine.addParam(Param.of("w", rank == 0 ? 4 : 5));
      ZeroException.Mismatch e = assertThrows(ZeroException.Mismatch.class, engine::finalizeParams);
      assertTrue(e.getMessage(), e.getMessage().contains("w"));
    }
  }
}
