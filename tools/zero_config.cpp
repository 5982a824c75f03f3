// zero-config: checks a DeepSpeed config the way libzero will read it, before a job starts, and estimates the
// per-rank memory of the model states for each ZeRO stage.
//
//   zero-config check CONFIG.json [--world-size N]
//   zero-config estimate --params P [--world-size N]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "config.hpp"
#include "error.hpp"

namespace {

int usage(FILE* out) {
  std::fprintf(out,
               "usage:\n"
               "  zero-config check CONFIG.json [--world-size N]\n"
               "      Validates a DeepSpeed config as libzero reads it and prints the resolved settings.\n"
               "      Exit status 0 if libzero accepts it, 1 otherwise (the message names the key).\n"
               "  zero-config estimate --params P [--world-size N]\n"
               "      Per-rank bytes of params, gradients and Adam state for ZeRO stages 0-3 (fp32; the\n"
               "      ZeRO paper's formula with K = 8, before padding to 16 x N elements per unit).\n");
  return out == stdout ? 0 : 2;
}

int check(const std::string& path, int world) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "zero-config: cannot read %s\n", path.c_str());
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  // The same code as zero_config_check(), linked statically so the tool needs no libzero.so at run time.
  try {
    const zero::Config c = zero::parse_config(text.str(), world);
    std::printf("%s: %s", path.c_str(), zero::config_report(c, world).c_str());
  } catch (const zero::Error& e) {
    std::fprintf(stderr, "zero-config: %s: %s\n", zero::status_name(e.status()), e.what());
    return 1;
  }
  return 0;
}

void print_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  std::printf(" %10.2f %-3s", b, units[u]);
}

int estimate(double params, int world) {
  const double n = world;
  const double params_b[4] = {4 * params, 4 * params, 4 * params, 4 * params / n};
  const double grads_b[4] = {4 * params, 4 * params, 4 * params / n, 4 * params / n};
  const double optim_b[4] = {8 * params, 8 * params / n, 8 * params / n, 8 * params / n};
  std::printf("per-rank model states for %.0f params on %d ranks (fp32, Adam)\n", params, world);
  std::printf("stage       params          grads      optimizer          total\n");
  for (int s = 0; s < 4; ++s) {
    std::printf("%-5d", s);
    print_bytes(params_b[s]);
    print_bytes(grads_b[s]);
    print_bytes(optim_b[s]);
    print_bytes(params_b[s] + grads_b[s] + optim_b[s]);
    std::printf("\n");
  }
  std::printf("plus, at stages 2-3, one gradient bucket and, at stage 3, one buffer per gathered unit\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage(stderr);
  std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") return usage(stdout);
  int world = 1;
  double params = -1;
  std::string file;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--world-size" && i + 1 < argc) {
      world = std::atoi(argv[++i]);
    } else if (a == "--params" && i + 1 < argc) {
      params = std::strtod(argv[++i], nullptr);
    } else if (file.empty() && a[0] != '-') {
      file = a;
    } else {
      return usage(stderr);
    }
  }
  if (world < 1) {
    std::fprintf(stderr, "zero-config: --world-size must be at least 1\n");
    return 2;
  }
  if (command == "check" && !file.empty()) return check(file, world);
  if (command == "estimate" && params > 0) return estimate(params, world);
  return usage(stderr);
}
