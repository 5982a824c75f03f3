// zero-config: checks a DeepSpeed config the way libzero will read it, before a job starts, and estimates the
// per-rank memory of the model states for each ZeRO stage from the engine's own placement plan (core/plan/plan.hpp):
// the bytes zero_memory_stats reports after finalize, for the same layout.
//
//   zero-config check CONFIG.json [--world-size N]
//   zero-config estimate --params P [--frozen-params F [--frozen-dtype T]] [--world-size N] [--units U]
//                        [--config CONFIG.json] [--device cpu|cuda]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "plan/layout.hpp"
#include "plan/plan.hpp"
#include "plan/plan_spec.hpp"
#include "util/error.hpp"

namespace {

int usage(FILE* out) {
  std::fprintf(out,
               "usage:\n"
               "  zero-config check CONFIG.json [--world-size N]\n"
               "      Validates a DeepSpeed config as libzero reads it and prints the resolved settings.\n"
               "      Exit status 0 if libzero accepts it, 1 otherwise (the message names the key).\n"
               "  zero-config estimate --params P [--frozen-params F [--frozen-dtype T]] [--world-size N]\n"
               "                      [--units U] [--config CONFIG.json] [--device cpu|cuda]\n"
               "      Per-rank bytes of the model states at ZeRO stages 0-3, as libzero's placement plan\n"
               "      allocates them (what zero_memory_stats reports after finalize): params, gradients, fp32\n"
               "      master, optimizer state, one gradient bucket and one gathered unit, for P params in U\n"
               "      equal units (default 1), with the config's dtypes, optimizer, reduce_bucket_size and\n"
               "      stage3_param_persistence_threshold (fp32 AdamW and DeepSpeed's defaults without one).\n"
               "      --device cuda plans a GPU engine: the model states in device memory, and with the config's\n"
               "      offload_optimizer / offload_param \"cpu\" (ZeRO-Offload) the offloaded ones in host memory\n"
               "      (page-locked with pin_memory); two more columns split the total by where it lives.\n"
               "      --frozen-params F adds F frozen params (a fine-tuned model's base, in T: the compute dtype by\n"
               "      default, or fp32, bf16, fp16, fp64, int64, uint8, int8, bytes), spread over the same units:\n"
               "      whole on every rank at stages 0-2, sharded at stage 3.\n");
  return out == stdout ? 0 : 2;
}

// The file's text, or false (with a message) when it cannot be read.
bool read_text(const std::string& path, std::string& text) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "zero-config: cannot read %s\n", path.c_str());
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  text = ss.str();
  return true;
}

int check(const std::string& path, int world) {
  std::string text;
  if (!read_text(path, text)) return 1;
  // The same code as zero_config_check(), linked statically so the tool needs no libzero.so at run time.
  try {
    const zero::Config c = zero::parse_config(text, world);
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

int estimate(double params, double frozen, const std::string& frozen_dtype, int world, int64_t units,
             const std::string& config_path, bool cuda) {
  zero::Config config;
  if (!config_path.empty()) {
    std::string text;
    if (!read_text(config_path, text)) return 1;
    try {
      config = zero::parse_config(text, world);
    } catch (const zero::Error& e) {
      std::fprintf(stderr, "zero-config: %s: %s\n", zero::status_name(e.status()), e.what());
      return 1;
    }
  }
  const uint64_t total = static_cast<uint64_t>(params);
  if (params < 1 || params > 1e16 || units < 1 || static_cast<uint64_t>(units) > total || units > 1000000) {
    std::fprintf(stderr, "zero-config: --params must be in [1, 1e16] and --units in [1, min(params, 1e6)]\n");
    return 2;
  }
  zero::StoredType frozen_type = static_cast<zero::StoredType>(config.compute_dtype);
  if (!frozen_dtype.empty() && !zero::stored_from_name(frozen_dtype, &frozen_type)) {
    std::fprintf(stderr, "zero-config: --frozen-dtype must be fp32, bf16, fp16, fp64, int64, uint8, int8 or bytes\n");
    return 2;
  }
  const uint64_t frozen_total = static_cast<uint64_t>(frozen);
  if (frozen < 0 || frozen > 1e16) {
    std::fprintf(stderr, "zero-config: --frozen-params must be in [0, 1e16]\n");
    return 2;
  }
  // U units of equal size (the first ones one element larger when P does not divide), one param each, and as
  // many frozen params of F / U elements beside them.
  std::vector<zero::ParamShape> shapes;
  for (int64_t u = 0; u < units; ++u) {
    zero::ParamShape trained;
    trained.name = "unit" + std::to_string(u);
    trained.dims = {static_cast<int64_t>(total / units + (static_cast<uint64_t>(u) < total % units ? 1 : 0))};
    trained.unit = static_cast<int>(u);
    shapes.push_back(trained);
    const uint64_t f = frozen_total / units + (static_cast<uint64_t>(u) < frozen_total % units ? 1 : 0);
    if (f == 0) continue;
    zero::ParamShape base = trained;
    base.name += ".frozen";
    base.dims = {static_cast<int64_t>(f)};
    base.frozen = true;
    base.stored = frozen_type;
    shapes.push_back(base);
  }
  zero::Layout layout;
  try {
    layout = zero::build_layout(shapes, world);
  } catch (const zero::Error& e) {
    std::fprintf(stderr, "zero-config: %s\n", e.what());
    return 1;
  }
  const zero::OffloadConfig& o = config.offload;
  std::printf("per-rank model states of %.0f params in %lld unit(s) on %d ranks%s: %s params, %s gradients, %s\n",
              params, static_cast<long long>(units), world, cuda ? " (GPU engine)" : "",
              zero::dtype_name(config.compute_dtype), zero::dtype_name(config.grad_accum_dtype),
              zero::optimizer_name(config.optimizer.kind));
  if (frozen_total > 0)
    std::printf("and %.0f frozen params in %s (no gradient, master or optimizer state)\n", frozen,
                zero::stored_name(frozen_type));
  // Offload to NVMe (stages 1-3 for the optimizer, 3 for the params) puts some kinds in a file; on a GPU engine,
  // offload to "cpu" puts them in host memory. The extra columns split the total by where it lives.
  const bool nvme = o.nvme() || o.params_nvme();
  std::printf("stage       params%s          grads    fp32 master      optimizer  bucket+gather          total%s%s%s\n",
              frozen_total > 0 ? "         frozen" : "", cuda ? "  device memory" : "",
              cuda || nvme ? "    host memory" : "", nvme ? "      NVMe file" : "");
  for (int stage = 0; stage < 4; ++stage) {
    const zero::PlanSpec spec =
        zero::plan_spec_for(config, stage, world, 0, cuda ? zero::MemorySpace::kDevice : zero::MemorySpace::kHost);
    std::printf("%-1d%-4s", stage, !config_path.empty() && stage == config.stage ? " *" : "");
    zero::MemoryStats m;
    try {
      m = zero::make_plan(spec, layout).bytes();
    } catch (const zero::Error& e) {  // a combination the plan refuses at this stage (a GPU engine's NVMe offload)
      std::printf(" not planned: %s\n", e.what());
      continue;
    }
    print_bytes(static_cast<double>(m.param_bytes));
    if (frozen_total > 0) print_bytes(static_cast<double>(m.frozen_param_bytes));
    print_bytes(static_cast<double>(m.grad_bytes));
    print_bytes(static_cast<double>(m.master_param_bytes));
    print_bytes(static_cast<double>(m.optimizer_state_bytes));
    print_bytes(static_cast<double>(m.bucket_bytes + m.gathered_bytes));
    print_bytes(static_cast<double>(m.total()));
    const bool to_nvme = (o.nvme() && stage > 0) || (o.params_nvme() && stage == 3);
    if (cuda) {
      print_bytes(static_cast<double>(m.device_bytes));
      print_bytes(static_cast<double>(m.host_bytes));
    } else if (nvme && to_nvme) {
      print_bytes(static_cast<double>(m.host_bytes));
    }
    if (nvme && to_nvme) print_bytes(static_cast<double>(m.nvme_bytes));
    if (nvme && !to_nvme && !cuda) std::printf("   (no offload at stage %d)", stage);
    if (cuda && m.pinned_bytes > 0)
      std::printf("   (%.2f GiB pinned)", static_cast<double>(m.pinned_bytes) / (1 << 30));
    std::printf("\n");
  }
  if (cuda && (o.optimizer == zero::OffloadConfig::Device::kCpu || o.params == zero::OffloadConfig::Device::kCpu))
    std::printf(
        "offload to \"cpu\" (ZeRO-Offload): the fp32 master and optimizer state (stages 1-3) and the gradient shards "
        "(2-3)%s are in host memory; host memory includes two transfer slots each way (one unit's shard each)\n",
        o.params == zero::OffloadConfig::Device::kCpu ? ", and at stage 3 the param shards," : "");
  if (o.params_nvme())
    std::printf(
        "offload_param to NVMe (stage 3): the param shards of units above the persistence threshold are in "
        "the file, read through a buffer of up to %lld elements (at most one shard)\n",
        static_cast<long long>(o.param_buffer_size));
  if (o.nvme())
    std::printf(
        "offload_optimizer to NVMe: host memory includes the window the state streams through (at most %d chunks "
        "of %lld elements per array); the file pads each unit to 4 KiB\n",
        o.buffer_count, static_cast<long long>(o.chunk_elems));
  std::printf(
      "rank 0's bytes%s; units padded to 16 x N elements; a stage-3 unit below the persistence\n"
      "threshold stays whole; gathering several units at once adds one buffer each\n",
      config_path.empty() ? "" : " (* the config's stage)");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage(stderr);
  std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") return usage(stdout);
  int world = 1;
  double params = -1, frozen = 0;
  int64_t units = 1;
  std::string file, config_path, device = "cpu", frozen_dtype;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--world-size" && i + 1 < argc) {
      world = std::atoi(argv[++i]);
    } else if (a == "--params" && i + 1 < argc) {
      params = std::strtod(argv[++i], nullptr);
    } else if (a == "--frozen-params" && i + 1 < argc) {
      frozen = std::strtod(argv[++i], nullptr);
    } else if (a == "--frozen-dtype" && i + 1 < argc) {
      frozen_dtype = argv[++i];
    } else if (a == "--units" && i + 1 < argc) {
      units = std::strtoll(argv[++i], nullptr, 10);
    } else if (a == "--config" && i + 1 < argc) {
      config_path = argv[++i];
    } else if (a == "--device" && i + 1 < argc) {
      device = argv[++i];
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
  if (device != "cpu" && device != "cuda") {
    std::fprintf(stderr, "zero-config: --device is \"cpu\" or \"cuda\", not \"%s\"\n", device.c_str());
    return 2;
  }
  if (command == "estimate" && params > 0)
    return estimate(params, frozen, frozen_dtype, world, units, config_path, device == "cuda");
  return usage(stderr);
}
