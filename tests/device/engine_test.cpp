// The device engine at one rank against the CPU engine, bit for bit: the same params, gradients and config trained
// on both — every stage, fp32 and bf16 (fp32 master, bf16 communication: the narrowing in place on the device, and
// stochastic rounding keyed by the global index), AdamW with clipping engaged and SGD with Nesterov momentum, two
// micro-steps per step, a frozen param, a unit larger than a block of the norm — then the params read back and the
// checkpoints' files compared byte for byte. On each runtime (the emulator everywhere; CUDA where a GPU is): on the
// emulator, the engine's device memory faults if the host touches it and its checker fails the test on an access no
// event orders.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/single_communicator.hpp"
#include "engine/engine.hpp"
#include "numeric/dtype.hpp"
#include "runtimes.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

namespace fs = std::filesystem;

struct Param {
  ParamShape shape;
  std::vector<float> init;
};

std::vector<Param> model() {
  std::vector<Param> params = {{{"a", {7}, 0, 0}, {}},       {{"b", {3, 5}, 0, 1}, {}},    {{"w", {64, 33}, 1, 0}, {}},
                               {{"frozen", {10}, 1, 0}, {}}, {{"big", {70000}, 2, 0}, {}}, {{"one", {1}, 3, 1}, {}}};
  params[3].shape.frozen = true;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> k(-64, 64);
  for (Param& p : params) {
    p.init.resize(p.shape.numel());
    for (float& v : p.init) v = static_cast<float>(k(rng)) / 64.0f;
  }
  return params;
}

// Dyadic gradients (multiples of 2^-8), the same for every engine: sums over micro-steps are exact.
std::vector<float> gradient(int step, int micro, int param, size_t n) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * step + 10 * micro + param));
  std::uniform_int_distribution<int> k(-512, 512);
  std::vector<float> g(n);
  for (float& v : g) v = static_cast<float>(k(rng)) / 256.0f;
  return g;
}

struct Trained {
  std::vector<std::vector<char>> params;                         // each param's bytes as zero_param_data shows them
  std::vector<std::pair<std::string, std::vector<char>>> files;  // the checkpoint's files, by relative path
};

std::vector<char> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Host <-> engine memory: memcpy for the CPU engine, the runtime's copies on the engine's stream for a device engine.
void to_engine(Engine& e, void* dst, const void* src, size_t bytes) {
  if (!e.device()) return void(std::memcpy(dst, src, bytes));
  e.device()->runtime().copy(dst, src, bytes, e.device()->stream());
}
void from_engine(Engine& e, void* dst, const void* src, size_t bytes) {
  if (!e.device()) return void(std::memcpy(dst, src, bytes));
  e.device()->runtime().copy(dst, src, bytes, e.device()->stream());
}

// What a training run does besides its steps.
struct Schedule {
  int first_step = 1, last_step = 3;
  const fs::path* load = nullptr;  // a checkpoint (tag "t") loaded after finalize
  int overflow_step = 0;           // this step's first gradient holds an inf: every engine skips the step
  bool modify = false;             // then zero_release_modified of unit 0 with new values of param "a"
  bool backward_order = false;     // gradients from the last param to the first, as a backward pass gives them
};

// Trains, reads every param back and saves a checkpoint in `dir` (kept: a later run may load it).
Trained train(const std::string& config, std::shared_ptr<device::Runtime> runtime, const fs::path& dir,
              const Schedule& run = {}) {
  Engine e(parse_config(config, 1), make_single_communicator());
  if (runtime) e.set_device(std::move(runtime));
  e.add_param_group("second", 0.5e-2, 0.0, 0.8, 0.9, 1e-6);
  const std::vector<Param> params = model();
  for (const Param& p : params) e.add_param(p.shape, ParamInit{p.init.data(), DType::kF32});
  e.finalize();
  if (e.device() && e.plan().space != MemorySpace::kDevice)
    fail(ZERO_ERR_INTERNAL, "the device engine plans host memory");
  const bool offloaded = e.config().offload.optimizer == OffloadConfig::Device::kCpu;
  if (e.device() && offloaded && host_addressable(e.plan().units[0].master.space) != true)
    fail(ZERO_ERR_INTERNAL, "ZeRO-Offload keeps the master in device memory");
  if (run.load) e.load_checkpoint(run.load->string(), "t");
  const size_t grad_size = dtype_size(e.config().grad_accum_dtype);
  const size_t compute_size = dtype_size(e.config().compute_dtype);
  for (int step = run.first_step; step <= run.last_step; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      for (size_t k = 0; k < params.size(); ++k) {
        const size_t p = run.backward_order ? params.size() - 1 - k : k;
        if (params[p].shape.frozen) continue;
        const int param = static_cast<int>(p);
        const size_t n = params[p].init.size();
        std::vector<float> g = gradient(step, micro, param, n);
        if (step == run.overflow_step && micro == 0 && p == 0) g[0] = std::numeric_limits<float>::infinity();
        // The framework adds into the gradient buffer (fp32 accumulation in these configs).
        if (grad_size != 4) fail(ZERO_ERR_INTERNAL, "the test adds fp32 gradients");
        std::vector<float> sum(n);
        void* dst = e.grad_data(param);
        from_engine(e, sum.data(), dst, n * 4);
        for (size_t i = 0; i < n; ++i) sum[i] += g[i];
        to_engine(e, dst, sum.data(), n * 4);
        e.grad_ready(param);
      }
      e.backward_end();
    }
    const StepResult result = e.step();
    if ((step == run.overflow_step) != result.skipped) fail(ZERO_ERR_INTERNAL, "the overflow did not skip the step");
  }
  if (run.modify) {  // the modifier rank's new values of "a", in the compute dtype
    e.gather(0);
    std::vector<char> values(params[0].init.size() * compute_size);
    for (size_t i = 0; i < params[0].init.size(); ++i) {
      const float v = 0.125f * static_cast<float>(i) - 0.5f;
      if (compute_size == 4) std::memcpy(&values[i * 4], &v, 4);
      const uint16_t h = e.config().compute_dtype == DType::kBF16 ? float_to_bf16_rne(v) : float_to_fp16_rne(v);
      if (compute_size == 2) std::memcpy(&values[i * 2], &h, 2);
    }
    to_engine(e, e.param_data(0), values.data(), values.size());
    e.release_modified(0, 0);
  }
  Trained out;
  for (int u = 0; u < e.num_units(); ++u) e.gather(u);
  for (size_t p = 0; p < params.size(); ++p) {
    const size_t bytes = params[p].init.size() * (params[p].shape.frozen ? 4 : compute_size);
    out.params.emplace_back(bytes);
    from_engine(e, out.params.back().data(), e.param_data(static_cast<int>(p)), bytes);
  }
  for (int u = 0; u < e.num_units(); ++u) e.release(u);
  fs::remove_all(dir);
  e.save_checkpoint(dir.string(), "t");
  for (const auto& entry : fs::recursive_directory_iterator(dir / "t"))
    if (entry.is_regular_file())
      out.files.emplace_back(fs::relative(entry.path(), dir).string(), read_file(entry.path()));
  std::sort(out.files.begin(), out.files.end());
  return out;
}

void expect_same(const Trained& cpu, const Trained& dev) {
  ASSERT_EQ(cpu.params.size(), dev.params.size());
  for (size_t p = 0; p < cpu.params.size(); ++p) EXPECT_TRUE(cpu.params[p] == dev.params[p]) << "param " << p;
  ASSERT_EQ(cpu.files.size(), dev.files.size());
  for (size_t f = 0; f < cpu.files.size(); ++f) {
    EXPECT_EQ(cpu.files[f].first, dev.files[f].first);
    EXPECT_TRUE(cpu.files[f].second == dev.files[f].second) << cpu.files[f].first << " differs";
  }
}

class DeviceEngine : public testing_device::OnEachRuntime {};
INSTANTIATE_TEST_SUITE_P(Runtimes, DeviceEngine, testing_device::kEachRuntime, testing_device::runtime_name);

TEST_P(DeviceEngine, TrainsAsTheCpuEngineBitForBit) {
  const std::string adamw =
      R"("optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}, "gradient_clipping": 0.5)";
  const std::string sgd = R"("optimizer": {"type": "SGD", "params": {"lr": 0.01, "momentum": 0.9, "nesterov": true}})";
  const std::vector<std::pair<std::string, std::string>> configs = {
      {"fp32 AdamW", adamw},
      {"bf16 AdamW", adamw + R"(, "bf16": {"enabled": true, "stochastic_rounding": true, "stochastic_rounding_seed": 7},
                            "data_types": {"grad_accum_dtype": "fp32"})"},
      {"fp32 SGD", sgd}};
  const fs::path root = fs::temp_directory_path() / ("libzero-device-engine-" + std::to_string(::getpid()));
  for (const auto& [name, body] : configs) {
    for (int stage = 0; stage <= 3; ++stage) {
      SCOPED_TRACE(name + ", stage " + std::to_string(stage));
      const std::string config = "{" + body + R"(, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": )" +
                                 std::to_string(stage) +
                                 R"(, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 5000}})";
      expect_same(train(config, nullptr, root / "cpu"), train(config, rt_, root / "device"));
    }
  }
  fs::remove_all(root);
}

// ZeRO-Offload (offload_optimizer "cpu") on the device engine: the fp32 master and the optimizer state in host
// memory stepped by the CPU's kernels, the gradient shards accumulated there from the device's reductions (stages
// 2-3) or copied from the device in the step (stage 1), the new params copied back — the CPU engine's bits and
// checkpoint files, pinned or pageable.
TEST_P(DeviceEngine, OffloadsTheOptimizerToTheCpuAsTheCpuEngine) {
  const fs::path root = fs::temp_directory_path() / ("libzero-device-offload-" + std::to_string(::getpid()));
  const std::vector<std::pair<std::string, std::string>> dtypes = {
      {"fp32", ""},
      {"bf16",
       R"(, "bf16": {"enabled": true, "stochastic_rounding": true}, "data_types": {"grad_accum_dtype": "fp32"})"}};
  for (const auto& [dtype, extra] : dtypes) {
    for (int stage : {1, 2, 3}) {
      for (const char* pin : {"true", "false"}) {
        SCOPED_TRACE(dtype + ", stage " + std::to_string(stage) + ", pin_memory " + pin);
        const std::string config =
            R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}, "gradient_clipping": 0.5,
                "gradient_accumulation_steps": 2)" +
            extra + R"(, "zero_optimization": {"stage": )" + std::to_string(stage) +
            R"(, "reduce_bucket_size": 5000, "stage3_param_persistence_threshold": 0,
                "offload_optimizer": {"device": "cpu", "pin_memory": )" +
            pin + "}}}";
        expect_same(train(config, nullptr, root / "cpu"), train(config, rt_, root / "device"));
        if (stage == 1) continue;
        // In backward order a bucket's buffer is taken again in the same micro-step, while its gradients may still
        // be on their way to the host; with overlap_comm, reductions complete later, out of order.
        Schedule backward;
        backward.backward_order = true;
        for (const char* overlap : {"false", "true"}) {
          SCOPED_TRACE(std::string("backward order, overlap_comm ") + overlap);
          std::string c = config;
          c.replace(c.find("\"reduce_bucket_size\""), 0, std::string("\"overlap_comm\": ") + overlap + ", ");
          expect_same(train(c, nullptr, root / "cpu", backward), train(c, rt_, root / "device", backward));
        }
      }
    }
  }
  // offload_param too (stage 3, 16-bit params): the shards of non-resident units in host memory, updated there by
  // the CPU's kernel and copied into the device's gathered buffer at each gather; the resident units' new params go
  // back to the device.
  for (const char* persistence : {"0", "100"}) {
    SCOPED_TRACE(std::string("offload_param, persistence threshold ") + persistence);
    const std::string config =
        R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}, "gradient_clipping": 0.5,
            "gradient_accumulation_steps": 2, "bf16": {"enabled": true, "stochastic_rounding": true},
            "data_types": {"grad_accum_dtype": "fp32"},
            "zero_optimization": {"stage": 3, "reduce_bucket_size": 5000, "stage3_param_persistence_threshold": )" +
        std::string(persistence) +
        R"(, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                                  "offload_param": {"device": "cpu", "pin_memory": true}}})";
    expect_same(train(config, nullptr, root / "cpu"), train(config, rt_, root / "device"));
  }
  fs::remove_all(root);
}

// A checkpoint saved by one engine and loaded by the other, then trained on: the same as the CPU engine throughout
// (loading writes device memory through the copies, saving reads it through the bounce buffer).
TEST_P(DeviceEngine, CheckpointsMoveBetweenTheCpuAndTheDeviceEngine) {
  const fs::path root = fs::temp_directory_path() / ("libzero-device-ckpt-" + std::to_string(::getpid()));
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::string config =
        R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "gradient_clipping": 0.5,
            "bf16": {"enabled": true, "stochastic_rounding": true}, "data_types": {"grad_accum_dtype": "fp32"},
            "gradient_accumulation_steps": 2, "zero_optimization": {"stage": )" +
        std::to_string(stage) + R"(, "stage3_param_persistence_threshold": 0}})";
    Schedule first, second;
    first.last_step = 2;
    second.first_step = 3, second.last_step = 4;
    const fs::path from_cpu = root / "first-cpu", from_device = root / "first-device";
    train(config, nullptr, from_cpu, first);
    train(config, rt_, from_device, first);
    second.load = &from_cpu;
    const Trained reference = train(config, nullptr, root / "cpu", second);
    expect_same(reference, train(config, rt_, root / "device-from-cpu", second));
    second.load = &from_device;
    expect_same(reference, train(config, nullptr, root / "cpu-from-device", second));
  }
  fs::remove_all(root);
}

// fp16 with a dynamic loss scale: a step whose gradients overflow is skipped by both engines, with the same scale
// after it; then zero_release_modified writes new values of a param into its master and shards on both.
TEST_P(DeviceEngine, SkipsAnOverflowAndTakesModifiedParamsAsTheCpuEngine) {
  const fs::path root = fs::temp_directory_path() / ("libzero-device-fp16-" + std::to_string(::getpid()));
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::string config =
        R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "gradient_clipping": 1.0,
            "fp16": {"enabled": true, "initial_scale_power": 4}, "data_types": {"grad_accum_dtype": "fp32"},
            "gradient_accumulation_steps": 2, "zero_optimization": {"stage": )" +
        std::to_string(stage) + R"(, "stage3_param_persistence_threshold": 0}})";
    Schedule run;
    run.overflow_step = 2;
    run.modify = true;
    expect_same(train(config, nullptr, root / "cpu", run), train(config, rt_, root / "device", run));
  }
  fs::remove_all(root);
}

// An engine of `config` on `rt` with the test model's params, finalized.
std::unique_ptr<Engine> finalized_on(const std::string& config, std::shared_ptr<device::Runtime> rt,
                                     const std::vector<Param>& params) {
  auto e = std::make_unique<Engine>(parse_config(config, 1), make_single_communicator());
  e->set_device(std::move(rt));
  e->add_param_group("second", 0.5e-2, 0.0, 0.8, 0.9, 1e-6);
  for (const Param& p : params) e->add_param(p.shape, ParamInit{p.init.data(), DType::kF32});
  e->finalize();
  return e;
}

// A device that fails or stops: the call that meets it returns an error that says so, never a hang. A kernel that
// faults is reported by the next call that waits for the device (sticky, as CUDA's); a device that stops makes the
// host's wait end at libzero.timeout_s with ZERO_ERR_TIMEOUT naming the call.
TEST(DeviceEngineFaults, AFailedOrStoppedDeviceIsAnErrorOfTheCall) {
  const std::string config = R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "gradient_clipping": 1.0,
      "zero_optimization": {"stage": 2}, "libzero": {"timeout_s": 1}})";
  for (const bool stall : {false, true}) {
    SCOPED_TRACE(stall ? "stalled" : "failed");
    std::shared_ptr<device::Emulator> rt = testing_device::emulator(5);
    {
      const std::vector<Param> params = model();
      const std::unique_ptr<Engine> engine = finalized_on(config, rt, params);
      Engine& e = *engine;
      for (size_t p = 0; p < params.size(); ++p)
        if (!params[p].shape.frozen) e.grad_ready(static_cast<int>(p));
      e.backward_end();
      if (stall) {
        rt->stall_here(e.device()->stream());
      } else {
        rt->fail_here(e.device()->stream(), "an illegal memory access (planted)");
      }
      try {
        e.step();
        ADD_FAILURE() << "the step returned";
      } catch (const Error& error) {
        const std::string what = error.what();
        EXPECT_EQ(stall ? ZERO_ERR_TIMEOUT : ZERO_ERR_INTERNAL, error.status()) << what;
        EXPECT_NE(std::string::npos,
                  what.find(stall ? "did not complete within 1 s" : "illegal memory access (planted)"))
            << what;
      }
      rt->resume();
    }
  }
}

// ZeRO-Offload's copies to the host stop in the middle of a backward: the call that waits for one — the host for a
// slot, or the engine's stream for a bucket taken again — fails with ZERO_ERR_TIMEOUT (never a hang), and the engine
// is destroyed after the device resumes with no access out of order.
TEST(DeviceEngineFaults, AStoppedOffloadCopyIsATimeout) {
  const std::string config = R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "gradient_clipping": 1.0,
      "zero_optimization": {"stage": 2, "reduce_bucket_size": 5000, "offload_optimizer": {"device": "cpu"}},
      "libzero": {"timeout_s": 1}})";
  std::shared_ptr<device::Emulator> rt = testing_device::emulator(9);
  {
    const std::vector<Param> params = model();
    const std::unique_ptr<Engine> engine = finalized_on(config, rt, params);
    Engine& e = *engine;
    ASSERT_NE(nullptr, e.offload_transfers());
    rt->stall_here(e.offload_transfers()->to_host_stream());
    std::string what;
    try {
      for (size_t k = params.size(); k-- > 0;)
        if (!params[k].shape.frozen) e.grad_ready(static_cast<int>(k));
      e.backward_end();
    } catch (const Error& error) {
      what = error.what();
      EXPECT_EQ(ZERO_ERR_TIMEOUT, error.status()) << what;
    }
    EXPECT_NE(std::string::npos, what.find("did not complete within 1 s")) << what;
    rt->resume();
  }
  EXPECT_TRUE(rt->races().empty()) << rt->races().front();
}

// The framework's own stream (zero_engine_set_stream): its backward adds each micro-step's gradients into the
// engine's buffers with a kernel on its stream, from device buffers it uploaded from pinned memory — no host wait
// anywhere —, its forward reads the params on it, and it reads the trained params back on it. The engine orders each
// call's work after the framework's and the framework's after it with events: the same bits as the CPU engine, and no
// race. The same program without zero_engine_set_stream is a race the emulator's checker names.
struct FrameworkRun {
  std::vector<std::vector<char>> params;
  std::string error;
};

// Where the trained params are read: on the framework's stream, or on another one (a DLPack consumer's) after
// Engine::order_stream, or on another one without it.
enum class ReadOn { kFramework, kConsumerOrdered, kConsumerUnordered };

FrameworkRun train_on_framework_stream(const std::string& config, device::Runtime& rt, bool set_stream,
                                       ReadOn read_on = ReadOn::kFramework) {
  FrameworkRun out;
  std::unique_ptr<device::Stream> framework = rt.create_stream("framework");
  std::unique_ptr<device::Stream> consumer = rt.create_stream("consumer");
  std::unique_ptr<device::Event> done = rt.create_event();
  std::vector<void*> device_buffers;
  try {
    auto shared = std::shared_ptr<device::Runtime>(&rt, [](device::Runtime*) {});
    Engine e(parse_config(config, 1), make_single_communicator());
    e.set_device(shared);
    if (set_stream) e.set_stream(rt.native(*framework));
    e.add_param_group("second", 0.5e-2, 0.0, 0.8, 0.9, 1e-6);
    const std::vector<Param> params = model();
    for (const Param& p : params) e.add_param(p.shape, ParamInit{p.init.data(), DType::kF32});
    e.finalize();
    size_t most = 0;
    for (const Param& p : params) most = std::max(most, p.init.size());
    auto* staging = static_cast<float*>(rt.allocate_pinned(most * 4));
    auto* grads = static_cast<float*>(rt.allocate(most * 4, *framework));
    device_buffers.push_back(grads);
    auto* activations = static_cast<char*>(rt.allocate(most * 4, *framework));
    device_buffers.push_back(activations);
    for (int step = 1; step <= 3; ++step) {
      for (int micro = 0; micro < 2; ++micro) {
        // The forward reads every param on the framework's stream.
        for (int u = 0; u < e.num_units(); ++u) {
          e.gather(u);
          for (size_t p = 0; p < params.size(); ++p) {
            if (e.param_shape(static_cast<int>(p)).unit != u) continue;
            const size_t bytes =
                params[p].init.size() * (params[p].shape.frozen ? 4 : dtype_size(e.config().compute_dtype));
            rt.copy(activations, e.param_data(static_cast<int>(p)), bytes, *framework);
          }
          e.release(u);
        }
        for (size_t p = 0; p < params.size(); ++p) {
          if (params[p].shape.frozen) continue;
          const int param = static_cast<int>(p);
          const std::vector<float> g = gradient(step, micro, param, params[p].init.size());
          rt.synchronize(*done, 60.0, "the previous upload");  // the staging is free again
          rt.host_access(staging, g.size() * 4, true);
          std::memcpy(staging, g.data(), g.size() * 4);
          rt.copy(grads, staging, g.size() * 4, *framework);
          rt.record(*done, *framework);
          rt.accumulate(DType::kF32, static_cast<float*>(e.grad_data(param)), grads, g.size(), false, *framework);
          e.grad_ready(param);
        }
        e.backward_end();
      }
      e.step();
    }
    for (int u = 0; u < e.num_units(); ++u) e.gather(u);
    device::Stream& reader = read_on == ReadOn::kFramework ? *framework : *consumer;
    if (read_on == ReadOn::kConsumerOrdered) e.order_stream(rt.native(*consumer));
    for (size_t p = 0; p < params.size(); ++p) {
      const size_t bytes = params[p].init.size() * (params[p].shape.frozen ? 4 : dtype_size(e.config().compute_dtype));
      rt.synchronize(*done, 60.0, "the previous read");
      rt.copy(staging, e.param_data(static_cast<int>(p)), bytes, reader);
      rt.record(*done, reader);
      rt.synchronize(*done, 60.0, "the read");
      rt.host_access(staging, bytes, false);
      out.params.emplace_back(reinterpret_cast<char*>(staging), reinterpret_cast<char*>(staging) + bytes);
    }
    // The consumer's reads come before the units go back to the pool.
    if (read_on != ReadOn::kFramework) {
      rt.record(*done, *consumer);
      rt.wait(*framework, *done);
    }
    for (int u = 0; u < e.num_units(); ++u) e.release(u);
    rt.record(*done, *framework);
    rt.synchronize(*done, 60.0, "the framework's last work");
    rt.release_pinned(staging);
  } catch (const Error& e) {
    out.error = e.what();
  }
  for (void* p : device_buffers) rt.release(p, *framework);
  rt.record(*done, *framework);
  rt.synchronize(*done, 60.0, "the framework's releases");
  return out;
}

TEST_P(DeviceEngine, OrdersItsWorkWithTheFrameworksStream) {
  const std::string config =
      R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "gradient_clipping": 0.5,
          "bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"}, "gradient_accumulation_steps": 2,
          "zero_optimization": {"stage": 2, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 5000}})";
  const fs::path root = fs::temp_directory_path() / ("libzero-device-stream-" + std::to_string(::getpid()));
  // And ZeRO-Offload's copies beside the engine's stream: new params must not overwrite what the framework's queued
  // work still reads, nor a bucket be rewritten before its gradients have left for the host.
  const std::string offload = R"(, "offload_optimizer": {"device": "cpu"}}})";
  const std::string offload_params =
      R"(, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu", "pin_memory": true}}})";
  for (const std::string stage : {"2", "3", "1 offloaded", "2 offloaded", "3 offloaded", "3 params offloaded"}) {
    SCOPED_TRACE("stage " + stage);
    std::string c = config;
    c.replace(c.find("\"stage\": 2"), 10, "\"stage\": " + stage.substr(0, 1));
    if (stage.size() > 1)
      c.replace(c.rfind("}}"), 2, stage.find("params") != std::string::npos ? offload_params : offload);
    const Trained cpu = train(c, nullptr, root);
    const FrameworkRun dev = train_on_framework_stream(c, *rt_, true);
    ASSERT_EQ("", dev.error);
    ASSERT_EQ(cpu.params.size(), dev.params.size());
    for (size_t p = 0; p < cpu.params.size(); ++p) EXPECT_TRUE(cpu.params[p] == dev.params[p]) << "param " << p;
  }
  // A DLPack consumer on a stream of its own reads the params after Engine::order_stream: the same bits, no race.
  for (const char* stage : {"2", "3"}) {
    std::string c = config;
    c.replace(c.find("\"stage\": 2"), 10, std::string("\"stage\": ") + stage);
    const FrameworkRun ordered = train_on_framework_stream(c, *rt_, true, ReadOn::kConsumerOrdered);
    ASSERT_EQ("", ordered.error);
    const Trained cpu = train(c, nullptr, root);
    for (size_t p = 0; p < cpu.params.size(); ++p) EXPECT_TRUE(cpu.params[p] == ordered.params[p]) << "param " << p;
  }
  if (rt_->emulated()) {  // without order_stream, the consumer's reads race with the step's writes
    std::unique_ptr<device::Emulator> unchecked = testing_device::emulator(3);
    const FrameworkRun racy = train_on_framework_stream(config, *unchecked, true, ReadOn::kConsumerUnordered);
    EXPECT_NE(std::string::npos, racy.error.find("a race")) << racy.error;
    EXPECT_NE(std::string::npos, racy.error.find("stream 'consumer'")) << racy.error;
  }
  if (rt_->emulated()) {  // the negative: the same without the stream handed to the engine
    std::unique_ptr<device::Emulator> unchecked = testing_device::emulator(3);
    const FrameworkRun racy = train_on_framework_stream(config, *unchecked, false);
    EXPECT_NE(std::string::npos, racy.error.find("a race")) << racy.error;
    EXPECT_NE(std::string::npos, racy.error.find("stream 'framework'")) << racy.error;
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace zero
