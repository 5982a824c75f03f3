package org.libzero;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import org.junit.Test;

/** One process (Comm.single()): the binding's contract, checked against arithmetic done here. */
public class EngineTest {
  static Config sgd(int stage) {
    return Config.fromMap(Map.of("train_micro_batch_size_per_gpu", 1, "gradient_clipping", 0.0,
        "optimizer", Map.of("type", "SGD", "params", Map.of("lr", 0.5)),
        "zero_optimization", Map.of("stage", stage, "stage3_param_persistence_threshold", 0)));
  }

  @Test
  public void sgdStepMatchesArithmetic() {
    for (int stage = 0; stage <= 3; ++stage) {
      try (Comm comm = Comm.single(); Engine engine = new Engine(sgd(stage), comm)) {
        // Odd sizes, units interleaved with registration order, a param that never gets a gradient.
        int a = engine.addParam(Param.of("a", 3, 5).unit(1).init(ramp(15, 1.0f)));
        int b = engine.addParam(Param.of("b", 7).unit(0).init(ramp(7, -2.0f)));
        int unused = engine.addParam(Param.of("unused", 2).unit(1).init(new float[] {4.0f, 8.0f}));
        engine.finalizeParams();
        assertEquals(stage, engine.info().stage());
        assertEquals(2, engine.info().numUnits());
        engine.gather(0, 1);
        engine.grad(a).addAll(ramp(15, 0.25f));
        engine.gradReady(a);
        View gb = engine.grad(b);
        for (int i = 0; i < 7; ++i) {
          gb.add(i, 1.0f);
        }
        engine.gradReady(b);
        engine.release(0, 1);
        engine.backwardEnd();
        StepInfo info = engine.step();
        assertEquals(1, info.step());
        assertFalse(info.skipped());
        engine.gather(0, 1);
        float[] expectA = new float[15];
        for (int i = 0; i < 15; ++i) {
          expectA[i] = (1.0f + i) - 0.5f * (0.25f + i); // exact in fp32
        }
        assertArrayEquals(expectA, engine.param(a).toArray(), 0.0f);
        float[] expectB = new float[7];
        for (int i = 0; i < 7; ++i) {
          expectB[i] = (-2.0f + i) - 0.5f;
        }
        assertArrayEquals(expectB, engine.param(b).toArray(), 0.0f);
        assertArrayEquals(new float[] {4.0f, 8.0f}, engine.param(unused).toArray(), 0.0f);
        engine.release(0, 1);
      }
    }
  }

  @Test
  public void viewsOfReleasedUnitsThrow() {
    try (Comm comm = Comm.single(); Engine engine = new Engine(sgd(3), comm)) {
      int p = engine.addParam(Param.of("p", 4).unit(0).init(ramp(4, 1.0f)));
      engine.finalizeParams();
      ZeroException.InvalidState notGathered = assertThrows(ZeroException.InvalidState.class, () -> engine.param(p));
      assertTrue(notGathered.getMessage(), notGathered.getMessage().contains("not gathered"));
      engine.gather(0);
      View view = engine.param(p);
      assertEquals(2.0f, view.get(1), 0.0f);
      View grad = engine.grad(p);
      grad.add(0, 1.0f);
      engine.gradReady(p);
      assertThrows(StaleViewException.class, () -> grad.add(0, 1.0f));
      engine.release(0);
      assertFalse(view.isValid());
      StaleViewException stale = assertThrows(StaleViewException.class, () -> view.get(0));
      assertTrue(stale.getMessage(), stale.getMessage().contains("released"));
      assertThrows(StaleViewException.class, view::floats);
      engine.gather(0);
      assertFalse("a view from an earlier gather stays invalid", view.isValid());
      assertEquals(2.0f, engine.param(p).get(1), 0.0f);
      engine.release(0);
    }
  }

  @Test
  public void errorsCarryTheStatusAndMessage() {
    try (Comm comm = Comm.single()) {
      ZeroException.Config bad = assertThrows(ZeroException.Config.class,
          () -> new Engine(Config.fromJson("{\"zero_optimization\": {\"stage\": 2, \"no_such_key\": 1}}"), comm));
      assertEquals(3, bad.status());
      assertEquals("ZERO_ERR_CONFIG", bad.code());
      assertTrue(bad.getMessage(), bad.getMessage().contains("no_such_key"));
      assertThrows(ZeroException.Config.class, () -> new Engine(Config.fromJson("{not json"), comm));
      try (Engine engine = new Engine(sgd(1), comm)) {
        assertThrows(ZeroException.InvalidState.class, engine::step);
        assertThrows(ZeroException.InvalidArgument.class, () -> engine.addParam(Param.of("", 3)));
        assertThrows(ZeroException.InvalidArgument.class,
            () -> engine.addParam(Param.of("nine", 1, 1, 1, 1, 1, 1, 1, 1, 1)));
        engine.addParam(Param.of("x", 2));
        assertThrows(ZeroException.InvalidArgument.class, () -> engine.addParam(Param.of("x", 2)));
        assertThrows(IllegalArgumentException.class, () -> engine.addParam(Param.of("y", 3).init(new float[2])));
      }
    }
    String report = sgd(3).check(4);
    assertTrue(report, report.contains("zero stage             3"));
  }

  @Test
  public void closedObjectsRefuseCalls() {
    Comm comm = Comm.single();
    Engine engine = new Engine(sgd(2), comm);
    comm.close(); // the engine keeps the communicator alive
    engine.addParam(Param.of("p", 3));
    engine.finalizeParams();
    engine.close();
    engine.close();
    assertTrue(engine.isClosed());
    assertThrows(IllegalStateException.class, () -> engine.gather(0));
    assertThrows(IllegalStateException.class, comm::shutdown);
    assertEquals(0, comm.rank()); // fixed at creation: readable any time
  }

  @Test
  public void abortMakesEveryLaterCallFail() {
    try (Comm comm = Comm.single(); Engine engine = new Engine(sgd(3), comm)) {
      engine.addParam(Param.of("p", 3));
      engine.finalizeParams();
      engine.abort();
      assertThrows(ZeroException.Aborted.class, () -> engine.gather(0));
    }
  }

  @Test
  public void checkpointRoundTrip() throws Exception {
    Path dir = Files.createTempDirectory("libzero-java-ckpt");
    float[] trained;
    try (Comm comm = Comm.single(); Engine engine = new Engine(sgd(3), comm)) {
      int p = engine.addParam(Param.of("p", 5).init(ramp(5, 1.0f)));
      engine.finalizeParams();
      engine.gather(0);
      engine.grad(p).addAll(ramp(5, 1.0f));
      engine.release(0);
      engine.backwardEnd();
      engine.step();
      engine.saveCheckpoint(dir, "global_step1");
      engine.gather(0);
      trained = engine.param(p).toArray();
      engine.release(0);
    }
    try (Comm comm = Comm.single(); Engine engine = new Engine(sgd(1), comm)) {
      int p = engine.addParam(Param.of("p", 5));
      engine.finalizeParams();
      engine.loadCheckpoint(dir, null);
      engine.gather(0);
      assertArrayEquals(trained, engine.param(p).toArray(), 0.0f);
      engine.release(0);
      assertThrows(ZeroException.class, () -> engine.loadCheckpoint(dir, "no_such_tag"));
    }
  }

  @Test
  public void configFromMapIsJson() {
    Config c = Config.fromMap(Map.of("a", List.of(1, 2.5, "x\"y"), "b", true));
    assertTrue(c.json(), c.json().contains("[1, 2.5, \"x\\\"y\"]"));
    assertThrows(IllegalArgumentException.class, () -> Config.fromMap(Map.of("nan", Double.NaN)));
  }

  @Test
  public void bf16ParamsReadAsFloats() {
    Config c = Config.fromMap(Map.of("train_micro_batch_size_per_gpu", 1, "bf16", Map.of("enabled", true),
        "optimizer", Map.of("type", "SGD", "params", Map.of("lr", 1.0)), "zero_optimization", Map.of("stage", 1)));
    try (Comm comm = Comm.single(); Engine engine = new Engine(c, comm)) {
      int p = engine.addParam(Param.of("p", 2).init(new float[] {1.5f, -3.0f}));
      engine.finalizeParams();
      assertEquals(DType.BF16, engine.info().paramDType());
      engine.gather(0);
      View v = engine.param(p);
      assertEquals(-3.0f, v.get(1), 0.0f);
      assertEquals((short) 0x3fc0, v.shorts().get(0));
      assertThrows(IllegalStateException.class, v::floats);
      engine.release(0);
    }
  }

  @Test
  public void sixteenBitViewsWorkInFloats() {
    for (String dtype : List.of("bf16", "fp16")) {
      Config c = Config.fromMap(Map.of("train_micro_batch_size_per_gpu", 1, dtype, Map.of("enabled", true),
          "gradient_clipping", 0.0, "data_types", Map.of("grad_accum_dtype", dtype),
          "optimizer", Map.of("type", "SGD", "params", Map.of("lr", 1.0)), "zero_optimization", Map.of("stage", 2)));
      try (Comm comm = Comm.single(); Engine engine = new Engine(c, comm)) {
        int p = engine.addParam(Param.of("p", 3).init(new float[] {1.5f, -3.0f, 0.1f}));
        engine.finalizeParams();
        engine.gather(0);
        float[] values = engine.param(p).toArray();
        assertEquals(1.5f, values[0], 0.0f);
        assertEquals(-3.0f, values[1], 0.0f);
        float rounded = dtype.equals("bf16") ? 0.10009765625f : 0.0999755859375f; // 0.1 to nearest even
        assertEquals(dtype, rounded, values[2], 0.0f);
        View g = engine.grad(p);
        assertEquals(DType.valueOf(dtype.toUpperCase()), g.dtype());
        g.addAll(new float[] {0.5f, 0.25f, 0.0f});
        g.add(0, 0.5f);
        assertArrayEquals(new float[] {1.0f, 0.25f, 0.0f}, g.toArray(), 0.0f);
        engine.release(0);
      }
    }
    // Conversions at the edges: subnormals, the largest finite values, infinity and NaN.
    assertEquals((short) 0x0001, Half.toFp16(0x1p-24f));
    assertEquals(0x1p-24f, Half.toFloat((short) 0x0001), 0.0f);
    assertEquals((short) 0x0000, Half.toFp16(0x1p-26f));
    assertEquals((short) 0x7bff, Half.toFp16(65504.0f));
    assertEquals((short) 0x7c00, Half.toFp16(65520.0f));
    assertEquals((short) 0x3c00, Half.toFp16(1.0f + 0x1p-11f)); // a tie: to even
    assertEquals((short) 0x3c02, Half.toFp16(1.0f + 3 * 0x1p-11f));
    assertTrue(Float.isNaN(Half.toFloat(Half.toFp16(Float.NaN))));
    assertTrue(Float.isNaN(Float.intBitsToFloat(Half.toBf16(Float.NaN) << 16)));
    assertEquals((short) 0x3f80, Half.toBf16(1.0f + 0x1p-8f)); // a tie: to even
    for (int bits = 0; bits < 0x10000; ++bits) { // every finite fp16 value survives the round trip
      if ((bits & 0x7c00) != 0x7c00) {
        assertEquals(Integer.toHexString(bits), (short) bits, Half.toFp16(Half.toFloat((short) bits)));
      }
    }
  }

  @Test
  public void paramViewsAreReadOnly() {
    try (Comm comm = Comm.single(); Engine engine = new Engine(sgd(0), comm)) {
      int p = engine.addParam(Param.of("p", 2));
      engine.finalizeParams();
      engine.gather(0);
      View v = engine.param(p);
      assertThrows(UnsupportedOperationException.class, () -> v.set(0, 1.0f));
      assertThrows(UnsupportedOperationException.class, () -> v.addAll(new float[2]));
      assertThrows(java.nio.ReadOnlyBufferException.class, () -> v.floats().put(0, 1.0f));
      engine.grad(p).floats().put(0, 1.0f); // gradient views are written
      engine.release(0);
    }
  }

  @Test
  public void stringsAreUtf8AndNulIsRefused() {
    try (Comm comm = Comm.single(); Engine engine = new Engine(sgd(1), comm)) {
      int p = engine.addParam(Param.of("w\uD83D\uDE00", 3)); // outside the BMP
      assertEquals("w\uD83D\uDE00", engine.paramInfo(p).name());
      assertThrows(IllegalArgumentException.class, () -> engine.addParam(Param.of("a\0b", 3)));
      assertThrows(IllegalArgumentException.class, () -> engine.addParam(Param.of("lone\uD83D", 3)));
      ZeroException e = assertThrows(ZeroException.class, () -> engine.addParam(Param.of("w\uD83D\uDE00", 3)));
      assertTrue(e.getMessage(), e.getMessage().contains("w\uD83D\uDE00"));
    }
  }

  @Test
  public void badArgumentsAreClearErrors() {
    assertThrows(IllegalArgumentException.class, () -> ParamGroup.named("g").lr(-1.0));
    assertThrows(IllegalArgumentException.class, () -> Param.of("x", (long[]) null));
    assertThrows(IllegalArgumentException.class, () -> Config.fromMap(null));
    assertEquals("{\"lr\": 0.1}", Config.fromMap(Map.of("lr", 0.1f)).json());
    assertEquals("{\"a\": [1, 2]}", Config.fromMap(Map.of("a", new int[] {1, 2})).json());
    java.util.Map<String, Object> loop = new java.util.HashMap<>();
    loop.put("self", loop);
    assertThrows(IllegalArgumentException.class, () -> Config.fromMap(loop));
    try (Comm comm = Comm.single(); Engine engine = new Engine(sgd(1), comm)) {
      assertThrows(IllegalArgumentException.class, () -> engine.addParam(Param.of("y", 3).init(new float[2])));
      assertThrows(IllegalArgumentException.class, () -> engine.addParam(null));
      assertThrows(IllegalArgumentException.class, () -> engine.saveCheckpoint(Path.of("/tmp"), null));
    }
    assertThrows(IllegalArgumentException.class, () -> new Engine(null, null));
  }

  /** A view read on one thread while another closes the engine: StaleViewException, never a crash. */
  @Test
  public void closingWhileAnotherThreadReadsAViewIsSafe() throws Exception {
    for (int round = 0; round < 20; ++round) {
      Comm comm = Comm.single();
      Engine engine = new Engine(sgd(3), comm);
      int p = engine.addParam(Param.of("p", 1 << 16));
      engine.finalizeParams();
      engine.gather(0);
      View view = engine.param(p);
      java.util.concurrent.atomic.AtomicReference<Throwable> failure = new java.util.concurrent.atomic.AtomicReference<>();
      Thread reader = new Thread(() -> {
        try {
          for (int i = 0;; i = (i + 4099) % (1 << 16)) {
            view.get(i);
          }
        } catch (StaleViewException expected) {
          // the engine was closed
        } catch (Throwable t) {
          failure.set(t);
        }
      });
      reader.start();
      Thread.sleep(2);
      engine.close();
      comm.close();
      reader.join();
      if (failure.get() != null) {
        throw new AssertionError(failure.get());
      }
    }
  }

  static float[] ramp(int n, float start) {
    float[] v = new float[n];
    for (int i = 0; i < n; ++i) {
      v[i] = start + i;
    }
    return v;
  }
}
