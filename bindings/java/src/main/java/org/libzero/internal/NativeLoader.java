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
 * Loads libzero and the JNI glue, without LD_LIBRARY_PATH, from the first of:
 *
 * <ol>
 *   <li>the directory named by the system property {@code org.libzero.library.dir}, which holds libzero.so.1,
 *       libzero_jni.so and (for MPI) libzero-mpi.so.1;
 *   <li>the jar itself, when it was built to carry them (the default build): they sit under
 *       org/libzero/native/linux-x86_64/ and are copied into one private temporary directory, removed at exit;
 *   <li>the system: the glue where the build installs it (a jar built without its libraries names that directory:
 *       /usr/lib/&lt;triplet&gt;/jni for the Debian package), else {@code System.loadLibrary("zero_jni")} through
 *       java.library.path; the dynamic linker finds libzero.so.1 where libzero1 installed it.
 * </ol>
 *
 * <p>In the first two, libzero.so.1 is loaded first, so that the glue's dependency on it resolves to the loaded
 * copy by its SONAME, and the MPI module (when its MPI library is present) before it, so that zero_comm_create_mpi
 * finds it loaded by its SONAME. The unpacked copies are deleted as soon as they are loaded (the loaded mappings
 * stay), so nothing is left behind however the JVM ends.
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
    } else if (NativeLoader.class.getResource(RESOURCE_DIR + "libzero_jni.so") != null) {
      dir = extract();
    } else {
      loadInstalled();
      loaded = true;
      return;
    }
    Path mpi = dir.resolve("libzero-mpi.so.1");
    if (Files.exists(mpi)) {
      try {
        System.load(mpi.toAbsolutePath().toString());
      } catch (UnsatisfiedLinkError e) {
        // no MPI library on this machine: Comm.single() still works, Comm.mpi() says what is missing
      }
    }
    System.load(dir.resolve("libzero.so.1").toAbsolutePath().toString());
    System.load(dir.resolve("libzero_jni.so").toAbsolutePath().toString());
    if (given == null) {
      removeTree(dir);
    }
    loaded = true;
  }

  /* A jar without libraries: the glue where the build installs it (named in the jar), else java.library.path. */
  private static void loadInstalled() {
    try (InputStream in = NativeLoader.class.getResourceAsStream(RESOURCE_DIR + "jni-dir")) {
      if (in != null) {
        Path glue = Path.of(new String(in.readAllBytes(), java.nio.charset.StandardCharsets.UTF_8).trim())
            .resolve("libzero_jni.so");
        if (Files.exists(glue)) {
          System.load(glue.toString());
          return;
        }
      }
    } catch (IOException e) {
      throw new UncheckedIOException("cannot read libzero's jar", e);
    }
    System.loadLibrary("zero_jni");
  }

  private static Path extract() {
    try {
      Path dir = Files.createTempDirectory("libzero-jni-");
      for (String name : LIBRARIES) {
        try (InputStream in = NativeLoader.class.getResourceAsStream(RESOURCE_DIR + name)) {
          if (in == null) {
            if (name.startsWith("libzero-mpi")) {
              continue; // built without MPI: Comm.mpi() then says how to get the module
            }
            throw new UnsatisfiedLinkError("libzero's jar carries libzero_jni.so but not " + name
                + " under " + RESOURCE_DIR + "; set -Dorg.libzero.library.dir=DIR to load the libraries from DIR");
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
      // best effort: a temporary directory
    }
  }
}
