// Byte-level training data that needs no download: a generated corpus of two-digit additions, whose held-out
// answers show whether the model learns, or any text file. Deterministic per seed; each rank draws its own windows.
//
// The additions are written the way a small model learns them fastest: fixed width, zero-padded, and the sum's
// digits reversed — "07+48=550\n" is 7 + 48 = 55 — so that every answer digit is produced after the digits it
// depends on (the carry flows from the ones to the hundreds, as the model writes them). Windows start at a line,
// so every position of a window has the same role in every batch; a window of one line (T = 10) is one problem,
// which the model learns fastest (in longer windows its learned absolute positions must learn the sum at each line's
// place on its own). The loss counts only the answer and its newline (targets of -1 are ignored): the operands are
// random, there is nothing in them to learn.
#pragma once

#include <cstdint>
#include <cstdio>
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

constexpr int kAdditionLine = 10;  // "07+48=550\n"
constexpr int kAnswerAt = 6;       // the answer's first digit's column

// a, b in [0, 100).
inline std::string addition_line(int a, int b) {
  const int s = a + b;
  auto digit = [](int d) { return static_cast<char>('0' + d); };
  return {digit(a / 10),      digit(a % 10),  '+', digit(b / 10), digit(b % 10), '=', digit(s % 10),
          digit(s / 10 % 10), digit(s / 100), '\n'};
}

inline std::string addition_lines(uint64_t seed, int count) {
  std::string text;
  for (int i = 0; i < count; ++i) {
    const uint64_t r = splitmix(seed * 1000003ull + static_cast<uint64_t>(i));
    text += addition_line(static_cast<int>(r % 100), static_cast<int>((r >> 20) % 100));
  }
  return text;
}

// "07+48=550" -> "7 + 48 = 55" (what the reversed answer means).
inline std::string readable_addition(const std::string& line, const std::string& answer) {
  const int a = std::stoi(line.substr(0, 2)), b = std::stoi(line.substr(3, 2));
  std::string digits(answer.rbegin(), answer.rend());
  size_t nz = digits.find_first_not_of('0');
  return std::to_string(a) + " + " + std::to_string(b) + " = " +
         (nz == std::string::npos ? std::string("0") : digits.substr(nz));
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
      size_t start = key % (train.size() - static_cast<size_t>(T) - 1);
      if (arithmetic) start -= start % kAdditionLine;
      window(train, start, T, tokens.data() + static_cast<size_t>(b) * T, targets.data() + static_cast<size_t>(b) * T);
    }
  }

  // T + 1 bytes from `start`: inputs and next-byte targets (arithmetic: only the answers' targets count).
  void window(const std::string& text, size_t start, int T, int* tokens, int* targets) const {
    for (int t = 0; t < T; ++t) {
      tokens[t] = static_cast<unsigned char>(text[start + t]);
      targets[t] = static_cast<unsigned char>(text[start + t + 1]);
      if (arithmetic && static_cast<int>((start + t + 1) % kAdditionLine) < kAnswerAt) targets[t] = -1;
    }
  }

  // Batch `index` of the held-out text cut into windows of T + 1 bytes (the same on every rank).
  void heldout_batch(int B, int T, std::vector<int>& tokens, std::vector<int>& targets, int index = 0) const {
    tokens.resize(static_cast<size_t>(B) * T);
    targets.resize(static_cast<size_t>(B) * T);
    for (int b = 0; b < B; ++b) {
      const size_t w = static_cast<size_t>(index) * B + b;
      size_t start = (w * (T + 1)) % (heldout.size() - static_cast<size_t>(T) - 1);
      if (arithmetic) start -= start % kAdditionLine;
      window(heldout, start, T, tokens.data() + static_cast<size_t>(b) * T,
             targets.data() + static_cast<size_t>(b) * T);
    }
  }
};

}  // namespace gpt
