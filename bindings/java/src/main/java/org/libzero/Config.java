package org.libzero;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Collection;
import java.util.Map;

/**
 * A DeepSpeed JSON config (ds_config.json), from text, a file or a {@code Map} of maps, lists, strings, numbers,
 * booleans and nulls. libzero checks it when the engine is created: unknown keys and wrong types are
 * {@link ZeroException.Config} errors naming the key.
 */
public final class Config {
  private final String json;

  private Config(String json) {
    this.json = json;
  }

  /** The config as JSON text. */
  public static Config fromJson(String json) {
    if (json == null) {
      throw new IllegalArgumentException("config text is null");
    }
    return new Config(json);
  }

  /** The config in a JSON file. */
  public static Config fromPath(Path path) {
    if (path == null) {
      throw new IllegalArgumentException("config path is null");
    }
    try {
      return new Config(Files.readString(path, StandardCharsets.UTF_8));
    } catch (IOException e) {
      throw new UncheckedIOException("cannot read the config " + path, e);
    }
  }

  /**
   * The config as nested maps, e.g. {@code Map.of("zero_optimization", Map.of("stage", 3), ...)}: maps with String
   * keys, lists and arrays, strings, numbers, booleans and null.
   */
  public static Config fromMap(Map<String, ?> config) {
    if (config == null) {
      throw new IllegalArgumentException("config map is null");
    }
    StringBuilder out = new StringBuilder();
    write(out, config, "", 0);
    return new Config(out.toString());
  }

  /** What libzero will do with this config for {@code worldSize} ranks (the text {@code zero-config check} prints). */
  public String check(int worldSize) {
    byte[][] report = new byte[1][];
    org.libzero.internal.ZeroNative.zero_config_check(report, json, worldSize);
    return org.libzero.internal.Strings.fromOut(report);
  }

  /** The JSON text. */
  public String json() {
    return json;
  }

  @Override
  public String toString() {
    return json;
  }

  private static void write(StringBuilder out, Object value, String path, int depth) {
    if (depth > 64) {
      throw new IllegalArgumentException("config value at " + path + " nests more than 64 levels (a map that"
          + " contains itself?)");
    }
    if (value != null && value.getClass().isArray()) {
      int n = java.lang.reflect.Array.getLength(value);
      java.util.List<Object> items = new java.util.ArrayList<>(n);
      for (int i = 0; i < n; ++i) {
        items.add(java.lang.reflect.Array.get(value, i));
      }
      value = items;
    }
    if (value == null) {
      out.append("null");
    } else if (value instanceof String) {
      quote(out, (String) value);
    } else if (value instanceof Boolean) {
      out.append(value);
    } else if (value instanceof Double || value instanceof Float) {
      double d = ((Number) value).doubleValue();
      if (Double.isNaN(d) || Double.isInfinite(d)) {
        throw new IllegalArgumentException("config value at " + path + " is " + d + ", which JSON cannot hold");
      }
      // A float's shortest decimal (0.1f is 0.1, not 0.10000000149011612).
      out.append(value instanceof Float ? Float.toString((Float) value) : Double.toString(d));
    } else if (value instanceof Number) {
      out.append(value);
    } else if (value instanceof Map) {
      out.append('{');
      boolean first = true;
      for (Map.Entry<?, ?> e : ((Map<?, ?>) value).entrySet()) {
        if (!(e.getKey() instanceof String)) {
          throw new IllegalArgumentException("config key at " + path + " is not a String: " + e.getKey());
        }
        if (!first) {
          out.append(", ");
        }
        first = false;
        quote(out, (String) e.getKey());
        out.append(": ");
        write(out, e.getValue(), path + "/" + e.getKey(), depth + 1);
      }
      out.append('}');
    } else if (value instanceof Collection) {
      out.append('[');
      int i = 0;
      for (Object item : (Collection<?>) value) {
        if (i > 0) {
          out.append(", ");
        }
        write(out, item, path + "/" + i++, depth + 1);
      }
      out.append(']');
    } else {
      throw new IllegalArgumentException(
          "config value at " + path + " has type " + value.getClass().getName() + ", which JSON cannot hold");
    }
  }

  private static void quote(StringBuilder out, String s) {
    out.append('"');
    for (int i = 0; i < s.length(); ++i) {
      char c = s.charAt(i);
      switch (c) {
        case '"': out.append("\\\""); break;
        case '\\': out.append("\\\\"); break;
        case '\n': out.append("\\n"); break;
        case '\r': out.append("\\r"); break;
        case '\t': out.append("\\t"); break;
        default:
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
      }
    }
    out.append('"');
  }
}
