// Byte-level training data that needs no download: a generated corpus of two-digit additions ("37+48=85\n"),
// whose held-out answers show whether the model learns, or any text file. Deterministic per seed; each rank draws
// its own windows.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpt {

inline uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline std::string addition_lines(uint64_t seed, int count) {
  std::string text;
  for (int i = 0; i < count; ++i) {
    const uint64_t r = splitmix(seed * 1000003ull + static_cast<uint64_t>(i));
    const int a = static_cast<int>(r % 100), b = static_cast<int>((r >> 20) % 100);
    text += std::to_string(a) + "+" + std::to_string(b) + "=" + std::to_string(a + b) + "\n";
  }
  return text;
}

struct Corpus {
  std::string train, heldout;
  bool arithmetic = false;

  static Corpus generated(uint64_t seed) {
    Corpus c;
    c.train = addition_lines(seed, 200000);
    c.heldout = addition_lines(seed + 7777, 2000);  // other problems, for the accuracy check
    c.arithmetic = true;
    return c;
  }
  static Corpus from_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read --data " + path);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    if (text.size() < 4096) throw std::runtime_error("--data " + path + " is too short (need at least 4096 bytes)");
    Corpus c;
    const size_t split = text.size() * 9 / 10;  // the last tenth is held out
    c.train = text.substr(0, split);
    c.heldout = text.substr(split);
    return c;
  }

  // B windows of T + 1 bytes for (step, micro-step, rank): inputs and next-byte targets. The windows depend only
  // on these numbers, not on the ZeRO stage, so every stage sees the same data.
  void batch(uint64_t seed, int64_t step, int micro, int rank, int B, int T, std::vector<int>& tokens,
             std::vector<int>& targets) const {
    tokens.resize(static_cast<size_t>(B) * T);
    targets.resize(static_cast<size_t>(B) * T);
    for (int b = 0; b < B; ++b) {
      const uint64_t key = splitmix(seed ^ splitmix(static_cast<uint64_t>(step) * 1009 + micro * 131 + rank * 17 + b));
      const size_t start = key % (train.size() - static_cast<size_t>(T) - 1);
      for (int t = 0; t < T; ++t) {
        tokens[static_cast<size_t>(b) * T + t] = static_cast<unsigned char>(train[start + t]);
        targets[static_cast<size_t>(b) * T + t] = static_cast<unsigned char>(train[start + t + 1]);
      }
    }
  }

  // The held-out text cut into B windows of T + 1 bytes (the same on every rank).
  void heldout_batch(int B, int T, std::vector<int>& tokens, std::vector<int>& targets) const {
    tokens.resize(static_cast<size_t>(B) * T);
    targets.resize(static_cast<size_t>(B) * T);
    for (int b = 0; b < B; ++b) {
      const size_t start = (static_cast<size_t>(b) * (T + 1)) % (heldout.size() - static_cast<size_t>(T) - 1);
      for (int t = 0; t < T; ++t) {
        tokens[static_cast<size_t>(b) * T + t] = static_cast<unsigned char>(heldout[start + t]);
        targets[static_cast<size_t>(b) * T + t] = static_cast<unsigned char>(heldout[start + t + 1]);
      }
    }
  }
};

}  // namespace gpt
