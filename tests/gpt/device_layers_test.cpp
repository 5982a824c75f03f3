// The device GPT's layers (examples/gpt/device/) against the CPU model (examples/gpt/model.hpp, itself checked
// against finite differences by unit.gpt.gradcheck): with the same matmuls (OpenBLAS) the device runner gives the
// CPU model's loss, logits and every gradient bit for bit, in float and double, tied and untied, with and without
// activation checkpointing, over two micro-steps that accumulate. Each launch's items run once in order and once in
// reverse: equal bits mean no item reads what another item of its launch writes (what a GPU would race on); a
// planted race shows that the comparison sees one.
// Also: the plain-loop matmul the trainer's CPU backend uses stays within a rounding bound of OpenBLAS's.
#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "device/host_backend.hpp"
#include "device/runner.hpp"
#include "model.hpp"

namespace {

template <class T>
class ArraySource : public gpt::ParamSource<T> {
 public:
  ArraySource(const gpt::ModelConfig& c, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal(0.0, 0.3);
    auto make = [&](const std::vector<std::vector<int>>& shapes) {
      std::vector<std::vector<T>> unit;
      for (const auto& s : shapes) {
        size_t n = 1;
        for (int d : s) n *= static_cast<size_t>(d);
        unit.emplace_back(n);
        for (auto& v : unit.back()) v = static_cast<T>(normal(rng));
      }
      return unit;
    };
    params_.push_back(make(gpt::embedding_shapes(c)));
    for (int l = 0; l < c.layers; ++l) params_.push_back(make(gpt::block_shapes(c)));
    grads_ = params_;
    for (auto& u : grads_)
      for (auto& t : u) std::fill(t.begin(), t.end(), T(0));
  }
  const std::vector<std::vector<std::vector<T>>>& grads() const { return grads_; }

  gpt::Embedding<const T*> gather_embedding() override { return gpt::embedding_view(pointers<const T*>(params_[0])); }
  void release_embedding() override {}
  gpt::Block<const T*> gather_block(int l) override { return block<const T*>(params_[static_cast<size_t>(l) + 1]); }
  void release_block(int) override {}
  gpt::Embedding<T*> embedding_grads() override { return gpt::embedding_view(pointers<T*>(grads_[0])); }
  gpt::Block<T*> block_grads(int l) override { return block<T*>(grads_[static_cast<size_t>(l) + 1]); }
  void block_grads_ready(int) override {}
  void final_norm_grads_ready() override {}
  void embedding_grads_ready() override {}

 private:
  template <class P>
  static gpt::Block<P> block(std::vector<std::vector<T>>& u) {
    return {u[0].data(), u[1].data(), u[2].data(), u[3].data(), u[4].data(),  u[5].data(),
            u[6].data(), u[7].data(), u[8].data(), u[9].data(), u[10].data(), u[11].data()};
  }
  template <class P>
  static std::vector<P> pointers(std::vector<std::vector<T>>& unit) {
    std::vector<P> out;
    for (auto& tensor : unit) out.push_back(tensor.data());
    return out;
  }
  std::vector<std::vector<std::vector<T>>> params_, grads_;
};

template <class T>
void blas_gemm(bool ta, bool tb, int m, int n, int k, const T* a, int lda, const T* b, int ldb, T beta, T* c, int ldc) {
  gpt::gemm(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

// Two micro-batches of random tokens; the targets of every third position are -1 (not counted).
void batches(const gpt::ModelConfig& c, int B, int micro, std::vector<int>& tokens, std::vector<int>& targets) {
  std::mt19937 rng(static_cast<unsigned>(100 + micro));
  tokens.resize(static_cast<size_t>(B) * c.seq_len), targets.resize(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int>(rng() % static_cast<unsigned>(c.vocab));
    targets[i] = i % 3 == 2 ? -1 : static_cast<int>(rng() % static_cast<unsigned>(c.vocab));
  }
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(T) * a.size()) == 0;
}

struct Outcome {
  std::vector<double> losses;
  std::vector<std::vector<unsigned char>> bytes;  // logits, then every gradient tensor
};

template <class T>
void record(Outcome& out, T loss, const std::vector<T>& logits, const ArraySource<T>& src) {
  out.losses.push_back(static_cast<double>(loss));
  auto add = [&](const std::vector<T>& v) {
    const auto* p = reinterpret_cast<const unsigned char*>(v.data());
    out.bytes.emplace_back(p, p + sizeof(T) * v.size());
  };
  add(logits);
  for (const auto& unit : src.grads())
    for (const auto& tensor : unit) add(tensor);
}

template <class T>
Outcome run_cpu_model(const gpt::ModelConfig& c, int B, bool checkpointing) {
  ArraySource<T> src(c, 7);
  gpt::Runner<T> runner(c, B, checkpointing);
  Outcome out;
  std::vector<int> tokens, targets;
  for (int micro = 0; micro < 2; ++micro) {
    batches(c, B, micro, tokens, targets);
    const T loss = runner.step(src, tokens.data(), targets.data(), true);
    record(out, loss, runner.logits(), src);
  }
  return out;
}

template <class T>
Outcome run_device_model(const gpt::ModelConfig& c, int B, bool checkpointing, gpt::device::GemmFunction<T> gemm,
                         bool reverse, size_t* activation_bytes = nullptr) {
  ArraySource<T> src(c, 7);
  gpt::device::HostBackend<T> backend(gemm, reverse);
  gpt::device::DeviceRunner<gpt::device::HostBackend<T>, T> runner(backend, c, B, checkpointing);
  if (activation_bytes) *activation_bytes = runner.activation_bytes();
  Outcome out;
  std::vector<int> tokens, targets;
  std::vector<T> logits;
  for (int micro = 0; micro < 2; ++micro) {
    batches(c, B, micro, tokens, targets);
    const T loss = runner.step(src, tokens.data(), targets.data(), true);
    runner.logits(logits);
    record(out, loss, logits, src);
  }
  return out;
}

bool equal(const Outcome& a, const Outcome& b) {
  if (a.losses != b.losses || a.bytes.size() != b.bytes.size()) return false;
  for (size_t i = 0; i < a.bytes.size(); ++i)
    if (a.bytes[i] != b.bytes[i]) return false;
  return true;
}

template <class T>
int check_variant(const char* type, const gpt::ModelConfig& c, int B, bool checkpointing) {
  int failures = 0;
  size_t device_bytes = 0;
  const Outcome cpu = run_cpu_model<T>(c, B, checkpointing);
  const Outcome forward = run_device_model<T>(c, B, checkpointing, &blas_gemm<T>, false, &device_bytes);
  const Outcome reverse = run_device_model<T>(c, B, checkpointing, &blas_gemm<T>, true);
  const gpt::Runner<T> cpu_runner(c, B, checkpointing);
  char what[160];
  std::snprintf(what, sizeof what, "%s, %d layers x %d channels, %d heads, T %d, B %d, %s head%s", type, c.layers,
                c.channels, c.heads, c.seq_len, B, c.tied_head ? "tied" : "untied",
                checkpointing ? ", checkpointing" : "");
  if (!equal(cpu, forward)) std::printf("FAIL %s: device layers differ from model.hpp\n", what), ++failures;
  if (!equal(forward, reverse)) std::printf("FAIL %s: items in reverse order change bits\n", what), ++failures;
  if (device_bytes != cpu_runner.activation_bytes())
    std::printf("FAIL %s: %zu activation bytes, model.hpp keeps %zu\n", what, device_bytes,
                cpu_runner.activation_bytes()),
        ++failures;
  if (!failures) std::printf("ok   %s: loss %.9g, %zu tensors the same bits\n", what, cpu.losses[1], cpu.bytes.size());
  return failures;
}

// The plain loop against OpenBLAS: each dot product of k terms in fp32 is within k * eps * sum |terms| of the
// exact one, for either order, so twice that bounds their difference (terms here are |x y| <= 1 products).
int check_loop_gemm() {
  const int m = 37, n = 29, k = 53;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  int failures = 0;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      std::vector<float> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n), c0(static_cast<size_t>(m) * n),
          c1;
      for (auto& v : a) v = u(rng);
      for (auto& v : b) v = u(rng);
      for (auto& v : c0) v = u(rng);
      c1 = c0;
      const int lda = ta ? m : k, ldb = tb ? k : n;
      blas_gemm<float>(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, 1.0f, c0.data(), n);
      gpt::device::loop_gemm<float>(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, 1.0f, c1.data(), n);
      const double bound = 2.0 * (k + 1) * std::ldexp(1.0, -24) * (k + 1);
      double worst = 0;
      for (size_t i = 0; i < c0.size(); ++i) worst = std::max(worst, std::fabs(double(c0[i]) - double(c1[i])));
      if (worst > bound)
        std::printf("FAIL loop gemm ta %d tb %d: differs by %g > %g\n", ta, tb, worst, bound), ++failures;
    }
  if (!failures) std::printf("ok   the plain-loop matmul within its rounding bound of OpenBLAS's\n");
  return failures;
}

// The order check itself: a planted race (each item reads what its neighbour writes, as a GPU's threads would race
// on) gives other bits in reverse order, so the check above would name it.
struct PlantedRace {
  float* out;
  const float* in;
  void operator()(size_t i) const { out[i] = in[i] + (i > 0 ? 0.5f * out[i - 1] : 0.0f); }
};

int check_planted_race() {
  std::vector<float> in(64), forward(64, 0.0f), reverse(64, 0.0f);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 7) - 3.0f;
  gpt::device::HostBackend<float>(&blas_gemm<float>, false).each(in.size(), PlantedRace{forward.data(), in.data()});
  gpt::device::HostBackend<float>(&blas_gemm<float>, true).each(in.size(), PlantedRace{reverse.data(), in.data()});
  if (same_bits(forward, reverse)) {
    std::printf("FAIL a planted race gives the same bits in both orders: the order check would miss it\n");
    return 1;
  }
  std::printf("ok   a planted race changes the bits in reverse order (what the check looks for)\n");
  return 0;
}

}  // namespace

int main() {
  int failures = 0;
  gpt::ModelConfig odd;  // odd sizes: 3 heads of 12, context 7, a batch of 3
  odd.vocab = 41, odd.seq_len = 7, odd.layers = 2, odd.heads = 3, odd.channels = 36;
  gpt::ModelConfig small;
  small.vocab = 256, small.seq_len = 10, small.layers = 2, small.heads = 4, small.channels = 64;
  for (bool tied : {true, false})
    for (bool checkpointing : {false, true}) {
      odd.tied_head = small.tied_head = tied;
      failures += check_variant<double>("double", odd, 3, checkpointing);
      failures += check_variant<float>("float", odd, 3, checkpointing);
      failures += check_variant<float>("float", small, 4, checkpointing);
    }
  failures += check_loop_gemm();
  failures += check_planted_race();
  std::printf("%s\n", failures ? "FAILED" : "all passed");
  return failures ? 1 : 0;
}
