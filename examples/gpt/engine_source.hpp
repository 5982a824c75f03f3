// The GPT's params and gradients from a libzero engine, through the public C API only (zero/zero.h): the model's
// ParamSource for both trainers (train_gpt.cpp across MPI ranks, train_gpt_device.cpp on a GPU), and the GPT-2
// initialisation they register. One unit per transformer block plus one for the embeddings, the final norm and an
// untied head, so stage 3 gathers and releases block by block. Pointers point into the engine's memory, the GPU's
// for a device engine; in bf16 a gathered unit is widened into an fp32 copy the trainer provides.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "structure.hpp"
#ifndef ZERO_EXPERIMENTAL_API
#define ZERO_EXPERIMENTAL_API  // zero_engine_copy, which reads a device engine's params as well
#endif
#include "zero/zero.h"

namespace gpt {

class EngineSource : public ParamSource<float> {
 public:
  // A failed call, with its message: the trainer's handler aborts the job or throws (it must not return).
  using Fail = std::function<void(const std::string& message)>;
  // bf16: `scratch(unit, n)` is room for n floats in the model's memory (kept by the trainer), `widen(dst, src, n)`
  // fills n of them from the engine's bf16 params.
  struct Widening {
    std::function<float*(int unit, size_t n)> scratch;
    std::function<void(float* dst, const void* src, size_t n)> widen;
  };

  EngineSource(zero_engine_t* e, const ModelConfig& c, bool bf16, Widening widening, Fail fail)
      : e_(e),
        c_(c),
        bf16_(bf16),
        widening_(std::move(widening)),
        fail_(std::move(fail)),
        ids_(static_cast<size_t>(c.layers) + 1) {}

  // A call's status: a failure goes to the handler.
  void check(zero_status_t s, const char* call) const {
    if (s != ZERO_OK) fail_(std::string(call) + " failed: " + zero_status_string(s) + ": " + zero_last_error());
  }

  Embedding<const float*> gather_embedding() override { return embedding_view(gather(0)); }
  void release_embedding() override { check(zero_release(e_, 0), "zero_release"); }
  Block<const float*> gather_block(int l) override {
    auto p = gather(l + 1);
    return {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11]};
  }
  void release_block(int l) override { check(zero_release(e_, l + 1), "zero_release"); }
  // Asked for after the head and again for the encoder: the pointers stay valid until their gradients are ready, and
  // asking the engine again for lnf's (already declared ready) would rightly be refused.
  Embedding<float*> embedding_grads() override {
    if (embedding_grads_.empty()) embedding_grads_ = grads(0);
    return embedding_view(embedding_grads_);
  }
  Block<float*> block_grads(int l) override {
    auto g = grads(l + 1);
    return {g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11]};
  }
  void block_grads_ready(int l) override {
    for (int32_t id : ids_[static_cast<size_t>(l) + 1]) check(zero_grad_ready(e_, id), "zero_grad_ready");
  }
  void final_norm_grads_ready() override {  // lnf's two, and an untied head
    for (size_t i = 2; i < ids_[0].size(); ++i) check(zero_grad_ready(e_, ids_[0][i]), "zero_grad_ready");
  }
  void embedding_grads_ready() override {
    check(zero_grad_ready(e_, ids_[0][0]), "zero_grad_ready");
    check(zero_grad_ready(e_, ids_[0][1]), "zero_grad_ready");
    embedding_grads_.clear();
  }

  // GPT-2's initialisation on rank 0 (libzero broadcasts it): N(0, 0.02), residual projections scaled by
  // 1/sqrt(2 L), biases 0, norms 1; no weight decay on biases and norms. The values must stay alive until
  // zero_engine_finalize: `init_values` holds them.
  void register_model(uint64_t seed, std::vector<std::vector<float>>& init_values) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    zero_param_group_desc_t no_decay = ZERO_PARAM_GROUP_DESC_INIT;
    no_decay.name = "no_decay";
    no_decay.weight_decay = 0.0;
    int32_t group = 0;
    check(zero_engine_add_param_group(&group, e_, &no_decay), "zero_engine_add_param_group");
    auto add = [&](int unit, const std::string& name, const std::vector<int>& shape, int kind) {
      std::vector<int64_t> dims(shape.begin(), shape.end());
      size_t n = 1;
      for (int d : shape) n *= static_cast<size_t>(d);
      init_values.emplace_back(n);
      std::vector<float>& init = init_values.back();
      const float scale = kind == 2 ? 1.0f / std::sqrt(2.0f * static_cast<float>(c_.layers)) : 1.0f;
      for (auto& v : init) v = kind == 0 ? 0.0f : kind == 3 ? 1.0f : normal(rng) * scale;
      zero_param_desc_t d = ZERO_PARAM_DESC_INIT;
      d.name = name.c_str();
      d.ndim = static_cast<int32_t>(dims.size());
      d.shape = dims.data();
      d.dtype = bf16_ ? ZERO_DTYPE_BF16 : ZERO_DTYPE_FP32;
      d.unit = unit;
      d.group = kind == 1 || kind == 2 ? 0 : group;
      d.init_data = init.data();
      d.init_dtype = ZERO_DTYPE_FP32;
      int32_t id = 0;
      check(zero_engine_add_param(&id, e_, &d), "zero_engine_add_param");
      ids_[static_cast<size_t>(unit)].push_back(id);
    };
    const auto es = embedding_shapes(c_);
    add(0, "wte", es[0], 1);
    add(0, "wpe", es[1], 1);
    add(0, "lnf.weight", es[2], 3);
    add(0, "lnf.bias", es[3], 0);
    if (!c_.tied_head) add(0, "head.weight", es[4], 1);
    const auto bs = block_shapes(c_);
    const int kinds[kBlockTensors] = {3, 0, 1, 0, 2, 0, 3, 0, 1, 0, 2, 0};
    for (int l = 0; l < c_.layers; ++l)
      for (int i = 0; i < kBlockTensors; ++i)
        add(l + 1, "h." + std::to_string(l) + "." + block_tensor_name(i), bs[static_cast<size_t>(i)], kinds[i]);
  }

  // FNV-1a over the bytes of every param, unit by unit in registration order (read with zero_engine_copy, which
  // reads device memory too): equal digests are equal weights.
  uint64_t digest() {
    uint64_t h = 1469598103934665603ull;
    std::vector<unsigned char> bytes;
    for (size_t unit = 0; unit < ids_.size(); ++unit) {
      check(zero_gather(e_, static_cast<int32_t>(unit)), "zero_gather");
      for (size_t i = 0; i < ids_[unit].size(); ++i) {
        void* data = nullptr;
        check(zero_param_data(&data, e_, ids_[unit][i]), "zero_param_data");
        bytes.resize(numel(static_cast<int>(unit), i) * (bf16_ ? 2 : 4));
        check(zero_engine_copy(e_, bytes.data(), data, bytes.size()), "zero_engine_copy");
        for (unsigned char b : bytes) h = (h ^ b) * 1099511628211ull;
      }
      check(zero_release(e_, static_cast<int32_t>(unit)), "zero_release");
    }
    return h;
  }

 private:
  size_t numel(int unit, size_t index) const {
    const auto shapes = unit == 0 ? embedding_shapes(c_) : block_shapes(c_);
    size_t n = 1;
    for (int d : shapes[index]) n *= static_cast<size_t>(d);
    return n;
  }

  std::vector<const float*> gather(int unit) {
    check(zero_gather(e_, unit), "zero_gather");
    const auto& ids = ids_[static_cast<size_t>(unit)];
    std::vector<void*> data(ids.size());
    // In bf16 each tensor's slice of the widened copy starts 256 bytes after the last, as the engine's own tensors
    // do, so that a device's matmuls see one alignment everywhere.
    auto slice = [](size_t n) { return (n + 63) / 64 * 64; };
    size_t total = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      check(zero_param_data(&data[i], e_, ids[i]), "zero_param_data");
      total += slice(numel(unit, i));
    }
    std::vector<const float*> out;
    if (!bf16_) {
      for (void* p : data) out.push_back(static_cast<const float*>(p));
      return out;
    }
    float* scratch = widening_.scratch(unit, total);
    for (size_t i = 0; i < ids.size(); ++i) {
      const size_t n = numel(unit, i);
      widening_.widen(scratch, data[i], n);
      out.push_back(scratch);
      scratch += slice(n);
    }
    return out;
  }

  std::vector<float*> grads(int unit) {
    std::vector<float*> out;
    for (int32_t id : ids_[static_cast<size_t>(unit)]) {
      void* g = nullptr;
      check(zero_grad_data(&g, e_, id), "zero_grad_data");
      out.push_back(static_cast<float*>(g));  // fp32 gradient accumulation (the default) in every mode
    }
    return out;
  }

  zero_engine_t* e_;
  ModelConfig c_;
  bool bf16_;
  Widening widening_;
  Fail fail_;
  std::vector<std::vector<int32_t>> ids_;
  std::vector<float*> embedding_grads_;  // this micro-step's, between the head and the encoder
};

}  // namespace gpt
