package org.libzero.internal;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.Comparator;
import java.util.stream.Stream;

/**
 * Loads libzero and the JNI glue the jar carries, without LD_LIBRARY_PATH. The jar holds libzero.so.1, its MPI
 * module libzero-mpi.so.1 and libzero_jni.so under org/libzero/native/linux-x86_64/. They are copied into one
 * private temporary directory (removed at exit): libzero.so.1 is loaded first, so that the glue's dependency on it
 * resolves to the loaded copy by its SONAME, and zero_comm_create_mpi finds the MPI module next to it.
 *
 * <p>Setting the system property {@code org.libzero.library.dir} to a directory that holds these three files (an
 * installation, or a build tree) loads them from there instead.
 */
public final class NativeLoader {
  private static final String RESOURCE_DIR = "/org/libzero/native/linux-x86_64/";
  private static final String[] LIBRARIES = {"libzero.so.1", "libzero-mpi.so.1", "libzero_jni.so"};
  private static boolean loaded;

  private NativeLoader() {}

  /** Loads the native libraries once per class loader; later calls return at once. */
  public static synchronized void load() {
    if (loaded) {
      return;
    }
    String arch = System.getProperty("os.arch");
    if (!System.getProperty("os.name", "").startsWith("Linux") || !("amd64".equals(arch) || "x86_64".equals(arch))) {
      throw new UnsatisfiedLinkError("libzero's jar carries Linux x86-64 libraries; this JVM runs on "
          + System.getProperty("os.name") + " " + arch);
    }
    Path dir;
    String given = System.getProperty("org.libzero.library.dir");
    if (given != null) {
      dir = Path.of(given);
    } else {
      dir = extract();
    }
    System.load(dir.resolve("libzero.so.1").toAbsolutePath().toString());
    System.load(dir.resolve("libzero_jni.so").toAbsolutePath().toString());
    loaded = true;
  }

  private static Path extract() {
    try {
      Path dir = Files.createTempDirectory("libzero-jni-");
      Runtime.getRuntime().addShutdownHook(new Thread(() -> removeTree(dir)));
      for (String name : LIBRARIES) {
        try (InputStream in = NativeLoader.class.getResourceAsStream(RESOURCE_DIR + name)) {
          if (in == null) {
            if (name.startsWith("libzero-mpi")) {
              continue; // built without MPI: Comm.mpi() then says how to get the module
            }
            throw new UnsatisfiedLinkError("libzero's jar lacks " + RESOURCE_DIR + name
                + " (a jar built without its native libraries?); set -Dorg.libzero.library.dir=DIR to load them"
                + " from DIR");
          }
          Files.copy(in, dir.resolve(name), StandardCopyOption.REPLACE_EXISTING);
        }
      }
      return dir;
    } catch (IOException e) {
      throw new UncheckedIOException("cannot unpack libzero's native libraries into a temporary directory", e);
    }
  }

  private static void removeTree(Path dir) {
    try (Stream<Path> paths = Files.walk(dir)) {
      paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    } catch (IOException ignored) {
      // best effort at exit
    }
  }
}
