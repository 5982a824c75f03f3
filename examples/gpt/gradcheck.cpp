// The GPT example's backward against central finite differences, in double precision, for every kind of tensor
// (embeddings, final norm, the head tied or untied, and each of a block's twelve), plus: activation checkpointing gives
// exactly the same gradients. Exits non-zero on failure (registered in CTest).
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "model.hpp"

namespace {

// Params and grads in plain arrays, laid out tensor after tensor per unit.
class ArraySource : public gpt::ParamSource<double> {
 public:
  explicit ArraySource(const gpt::ModelConfig& c) : c_(c) {
    std::mt19937_64 rng(5);
    std::normal_distribution<double> normal(0.0, 0.3);
    auto make = [&](const std::vector<std::vector<int>>& shapes) {
      std::vector<std::vector<double>> unit;
      for (const auto& s : shapes) {
        size_t n = 1;
        for (int d : s) n *= static_cast<size_t>(d);
        unit.emplace_back(n);
        for (auto& v : unit.back()) v = normal(rng);
      }
      return unit;
    };
    params_.push_back(make(gpt::embedding_shapes(c)));
    for (int l = 0; l < c.layers; ++l) params_.push_back(make(gpt::block_shapes(c)));
    grads_ = params_;
    zero_grads();
  }
  void zero_grads() {
    for (auto& u : grads_)
      for (auto& t : u) std::fill(t.begin(), t.end(), 0.0);
  }
  std::vector<std::vector<std::vector<double>>>& params() { return params_; }
  std::vector<std::vector<std::vector<double>>>& grads() { return grads_; }

  gpt::Embedding<const double*> gather_embedding() override {
    return gpt::embedding_view(pointers<const double*>(params_[0]));
  }
  void release_embedding() override {}
  gpt::Block<const double*> gather_block(int l) override {
    auto& u = params_[static_cast<size_t>(l) + 1];
    return {u[0].data(), u[1].data(), u[2].data(), u[3].data(), u[4].data(),  u[5].data(),
            u[6].data(), u[7].data(), u[8].data(), u[9].data(), u[10].data(), u[11].data()};
  }
  void release_block(int) override {}
  gpt::Embedding<double*> embedding_grads() override { return gpt::embedding_view(pointers<double*>(grads_[0])); }
  gpt::Block<double*> block_grads(int l) override {
    auto& u = grads_[static_cast<size_t>(l) + 1];
    return {u[0].data(), u[1].data(), u[2].data(), u[3].data(), u[4].data(),  u[5].data(),
            u[6].data(), u[7].data(), u[8].data(), u[9].data(), u[10].data(), u[11].data()};
  }
  void block_grads_ready(int) override {}
  void final_norm_grads_ready() override {}
  void embedding_grads_ready() override {}

 private:
  template <class P>
  static std::vector<P> pointers(std::vector<std::vector<double>>& unit) {
    std::vector<P> out;
    for (auto& tensor : unit) out.push_back(tensor.data());
    return out;
  }
  gpt::ModelConfig c_;
  std::vector<std::vector<std::vector<double>>> params_, grads_;
};

// Checks one model variant; returns the failures and adds to `checked` and `worst`.
int check(bool tied_head, int& checked, double& worst) {
  gpt::ModelConfig c;
  c.tied_head = tied_head;
  c.vocab = 32;
  c.seq_len = 8;
  c.layers = 2;
  c.heads = 2;
  c.channels = 16;
  const int B = 2;
  std::mt19937 rng(11);
  std::vector<int> tokens(static_cast<size_t>(B) * c.seq_len), targets(tokens.size());
  for (auto& t : tokens) t = static_cast<int>(rng() % c.vocab);
  for (auto& t : targets) t = static_cast<int>(rng() % c.vocab);

  ArraySource src(c);
  gpt::Runner<double> runner(c, B, false);
  runner.step(src, tokens.data(), targets.data(), true);
  const auto analytic = src.grads();

  // Activation checkpointing recomputes each block's forward: the gradients must not change at all.
  src.zero_grads();
  gpt::Runner<double> checkpointed(c, B, true);
  checkpointed.step(src, tokens.data(), targets.data(), true);
  int failures = 0;
  if (src.grads() != analytic) {
    std::printf("FAIL: activation checkpointing changed the gradients\n");
    ++failures;
  }

  const double h = 1e-5;
  for (size_t u = 0; u < src.params().size(); ++u) {
    for (size_t t = 0; t < src.params()[u].size(); ++t) {
      auto& values = src.params()[u][t];
      for (int k = 0; k < 4; ++k) {
        const size_t i = (rng() % values.size());
        const double saved = values[i];
        values[i] = saved + h;
        const double up = runner.step(src, tokens.data(), targets.data(), false);
        values[i] = saved - h;
        const double down = runner.step(src, tokens.data(), targets.data(), false);
        values[i] = saved;
        const double numeric = (up - down) / (2 * h), a = analytic[u][t][i];
        const double error = std::fabs(a - numeric) / std::max(std::fabs(a) + std::fabs(numeric), 1e-6);
        worst = std::max(worst, error);
        ++checked;
        if (error > 1e-5) {
          std::printf(
              "FAIL: unit %zu tensor %zu (%s) element %zu: analytic %.10g, finite difference %.10g\n", u, t,
              u == 0 ? gpt::embedding_tensor_name(static_cast<int>(t)) : gpt::block_tensor_name(static_cast<int>(t)), i,
              a, numeric);
          ++failures;
        }
      }
    }
  }
  return failures;
}

}  // namespace

int main() {
  int checked = 0;
  double worst = 0;
  const int failures = check(true, checked, worst) + check(false, checked, worst);
  std::printf(
      "gradient check (tied and untied head): %d elements over %zu tensor kinds, worst relative error %.2e; "
      "activation checkpointing gives identical gradients: %s\n",
      checked, static_cast<size_t>(gpt::kEmbeddingTensors + gpt::kBlockTensors), worst, failures == 0 ? "yes" : "NO");
  std::printf("%d passed, %d failed\n", checked + 2 - failures, failures);
  return failures == 0 ? 0 : 1;
}
