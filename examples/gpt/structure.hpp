// The GPT's structure, apart from its arithmetic: the model's size, its tensors unit by unit (one unit for the
// embeddings, the final norm and an untied head; one per transformer block), and the interface through which the
// layer code reads params and adds gradients. Shared by the CPU model (model.hpp) and the device one (device/).
#pragma once

#include <vector>

namespace gpt {

struct ModelConfig {
  int vocab = 256;  // byte-level tokens
  int seq_len = 64;
  int layers = 4;
  int heads = 6;
  int channels = 192;
  bool tied_head = true;  // the output head is wte (GPT-2), or a tensor of its own
};

// One transformer block's params (read) or gradients (added into), in registration order.
template <class P>
struct Block {
  P ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
};
constexpr int kBlockTensors = 12;

// Shapes of one block's tensors, in the order of Block's members.
inline std::vector<std::vector<int>> block_shapes(const ModelConfig& c) {
  const int C = c.channels;
  return {{C}, {C}, {3 * C, C}, {3 * C}, {C, C}, {C}, {C}, {C}, {4 * C, C}, {4 * C}, {C, 4 * C}, {C}};
}
inline const char* block_tensor_name(int i) {
  static const char* names[kBlockTensors] = {"ln1.weight",       "ln1.bias",       "attn.qkv.weight", "attn.qkv.bias",
                                             "attn.proj.weight", "attn.proj.bias", "ln2.weight",      "ln2.bias",
                                             "mlp.fc.weight",    "mlp.fc.bias",    "mlp.proj.weight", "mlp.proj.bias"};
  return names[i];
}

// Unit 0: the embeddings, the final norm and, untied, the output head.
template <class P>
struct Embedding {
  P wte, wpe, lnf_w, lnf_b;
  P head;  // [vocab, channels]: wte itself when tied
};
constexpr int kEmbeddingTensors = 5;  // untied; tied, the first four
inline std::vector<std::vector<int>> embedding_shapes(const ModelConfig& c) {
  std::vector<std::vector<int>> shapes = {{c.vocab, c.channels}, {c.seq_len, c.channels}, {c.channels}, {c.channels}};
  if (!c.tied_head) shapes.push_back({c.vocab, c.channels});
  return shapes;
}
inline const char* embedding_tensor_name(int i) {
  static const char* names[kEmbeddingTensors] = {"wte", "wpe", "lnf.weight", "lnf.bias", "head.weight"};
  return names[i];
}
// The unit's tensors in registration order as an Embedding (the head is the fifth, or wte).
template <class P>
Embedding<P> embedding_view(const std::vector<P>& tensors) {
  return {tensors[0], tensors[1], tensors[2], tensors[3], tensors.size() > 4 ? tensors[4] : tensors[0]};
}

// Where params come from and gradients go: libzero in the trainer, plain arrays in the gradient check. A unit is
// gathered around each use and released after; gradients of a unit are declared ready as soon as they are final.
template <class T>
struct ParamSource {
  virtual ~ParamSource() = default;
  virtual Embedding<const T*> gather_embedding() = 0;
  virtual void release_embedding() = 0;
  virtual Block<const T*> gather_block(int layer) = 0;
  virtual void release_block(int layer) = 0;
  virtual Embedding<T*> embedding_grads() = 0;
  virtual Block<T*> block_grads(int layer) = 0;
  virtual void block_grads_ready(int layer) = 0;
  virtual void final_norm_grads_ready() = 0;  // lnf (and an untied head): after the head
  virtual void embedding_grads_ready() = 0;   // wte, wpe: after the encoder
};

}  // namespace gpt
