// What a stage-2 bucket reduction on one node costs in memory traffic alone, on this machine, and how close the
// engine's pattern is to the least traffic such a reduction can move. Each rank is a thread here (the ranks of one
// node share the memory bus as threads do), owns a bucket of one block per rank and an fp32 accumulator of one
// block, and first touches its whole bucket as a backward pass writes it. Then all ranks at once:
//   engine  sums its block in rank order in place, in 128 KiB pieces as the shared window does, reading the peers'
//           pieces where they lie (the shared arena), then writes its accumulator from the block (0 + x), as
//           libzero's reduction and Bucket::finish do;
//   fused   the same, each piece written into the accumulator right after its sum, from cache;
//   stream  fused, with the accumulator written by non-temporal stores (no read for ownership);
//   floor   the sum stored straight into the accumulator with non-temporal stores: two reads and one write per
//           element at two ranks, the least traffic a reduction into an accumulator moves.
// Prints medians over repetitions (ms, the slowest rank) and each one's ratio to `engine`, paired per repetition.
//
//   bench_reduction_floor [--ranks 2] [--mib 128] [--reps 7]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace {

constexpr size_t kPiece = (128 << 10) / sizeof(float);
const char* const kModes[] = {"engine", "fused", "stream", "floor"};
constexpr int kNumModes = 4;

// Stores 0 + x, with non-temporal stores where `stream` (and the CPU has them), as the accumulator's first write.
void write_into_zero(float* acc, const float* x, size_t n, bool stream) {
#if defined(__SSE2__)
  if (stream && reinterpret_cast<uintptr_t>(acc) % 16 == 0 && n % 4 == 0) {
    for (size_t i = 0; i < n; i += 4) _mm_stream_ps(acc + i, _mm_add_ps(_mm_setzero_ps(), _mm_loadu_ps(x + i)));
    return;
  }
#endif
  for (size_t i = 0; i < n; ++i) acc[i] = 0.0f + x[i];
}

// dst = src[0] + ... + src[n-1], in that order (dst may be src[k]); pass by pass over a small local array so that
// the passes vectorise, as libzero's sum_in_rank_order does.
void sum_in_order(float* dst, const std::vector<const float*>& src, size_t at, size_t n) {
  constexpr size_t kChunk = 512;
  float sum[kChunk];
  for (size_t begin = 0; begin < n; begin += kChunk) {
    const size_t m = std::min(kChunk, n - begin);
    const float* first = src[0] + at + begin;
    for (size_t i = 0; i < m; ++i) sum[i] = first[i];
    for (size_t k = 1; k < src.size(); ++k) {
      const float* next = src[k] + at + begin;
      for (size_t i = 0; i < m; ++i) sum[i] += next[i];
    }
    std::memcpy(dst + begin, sum, m * sizeof(float));
  }
}

#if defined(__SSE2__)
void sum_into_zero_streamed(float* acc, const std::vector<const float*>& src, size_t at, size_t n) {
  for (size_t i = 0; i < n; i += 4) {
    __m128 s = _mm_loadu_ps(src[0] + at + i);
    for (size_t k = 1; k < src.size(); ++k) s = _mm_add_ps(s, _mm_loadu_ps(src[k] + at + i));
    _mm_stream_ps(acc + i, _mm_add_ps(_mm_setzero_ps(), s));
  }
}
#endif

class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void wait() {
    const int generation = generation_.load();
    if (arrived_.fetch_add(1) + 1 == n_) {
      arrived_.store(0);
      generation_.fetch_add(1);
    } else {
      while (generation_.load() == generation) std::this_thread::yield();
    }
  }

 private:
  int n_;
  std::atomic<int> arrived_{0}, generation_{0};
};

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2, reps = 7;
  size_t mib = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--ranks") ranks = std::atoi(argv[i + 1]);
    if (flag == "--mib") mib = static_cast<size_t>(std::atol(argv[i + 1]));
    if (flag == "--reps") reps = std::atoi(argv[i + 1]);
  }
  if (ranks < 2 || reps < 1 || mib < 1) {
    std::fprintf(stderr, "usage: bench_reduction_floor [--ranks N>=2] [--mib M] [--reps R]\n");
    return 2;
  }
  const size_t block = mib * (1 << 20) / sizeof(float) / kPiece * kPiece;
  std::vector<std::unique_ptr<float[]>> buckets, accs;
  for (int r = 0; r < ranks; ++r) {
    buckets.emplace_back(new float[block * static_cast<size_t>(ranks)]);
    accs.emplace_back(new float[block + 16]);
  }
  std::vector<std::vector<double>> ms(kNumModes * static_cast<size_t>(reps), std::vector<double>(ranks));
  SpinBarrier barrier(ranks);
  auto rank_main = [&](int r) {
    float* bucket = buckets[static_cast<size_t>(r)].get();
    float* acc = accs[static_cast<size_t>(r)].get();
    acc += (16 - reinterpret_cast<uintptr_t>(acc) / sizeof(float) % 16) % 16;  // 64-byte aligned, as the engine's
    std::memset(acc, 0, block * sizeof(float));
    std::vector<const float*> sources(static_cast<size_t>(ranks));
    for (int k = 0; k < ranks; ++k)
      sources[static_cast<size_t>(k)] = buckets[static_cast<size_t>(k)].get() + static_cast<size_t>(r) * block;
    float* mine = bucket + static_cast<size_t>(r) * block;
    for (int rep = 0; rep < reps; ++rep)
      for (int mode = 0; mode < kNumModes; ++mode) {
        for (size_t i = 0; i < block * static_cast<size_t>(ranks); ++i)  // a backward pass's gradients
          bucket[i] = static_cast<float>((i + static_cast<size_t>(rep)) % 1024) * 0.25f;
        barrier.wait();
        const auto begin = std::chrono::steady_clock::now();
        for (size_t at = 0; at < block; at += kPiece) {
          if (mode == 3) {
#if defined(__SSE2__)
            sum_into_zero_streamed(acc + at, sources, at, kPiece);
#else
            sum_in_order(acc + at, sources, at, kPiece);
#endif
            continue;
          }
          sum_in_order(mine + at, sources, at, kPiece);
          if (mode != 0) write_into_zero(acc + at, mine + at, kPiece, mode == 2);
        }
        if (mode == 0) write_into_zero(acc, mine, block, false);
#if defined(__SSE2__)
        _mm_sfence();
#endif
        ms[static_cast<size_t>(rep * kNumModes + mode)][static_cast<size_t>(r)] =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
        barrier.wait();  // nobody rewrites its bucket while a peer still reads it
      }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < ranks; ++r) threads.emplace_back(rank_main, r);
  rank_main(0);
  for (std::thread& t : threads) t.join();

  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  std::printf(
      "%d ranks (threads), %zu MiB block per rank, %d repetitions: ms (slowest rank), median; ratio to engine\n", ranks,
      block * sizeof(float) >> 20, reps);
  std::printf("%-8s %8s %8s %8s  %s\n", "mode", "median", "min", "max", "ratio (paired, median)");
  for (int mode = 0; mode < kNumModes; ++mode) {
    std::vector<double> slowest, ratio;
    for (int rep = 0; rep < reps; ++rep) {
      const auto& row = ms[static_cast<size_t>(rep * kNumModes + mode)];
      const auto& engine = ms[static_cast<size_t>(rep * kNumModes)];
      slowest.push_back(*std::max_element(row.begin(), row.end()));
      ratio.push_back(slowest.back() / *std::max_element(engine.begin(), engine.end()));
    }
    std::printf("%-8s %8.1f %8.1f %8.1f  %.2f\n", kModes[mode], median(slowest),
                *std::min_element(slowest.begin(), slowest.end()), *std::max_element(slowest.begin(), slowest.end()),
                median(ratio));
  }
  // Each rank reads every rank's piece of its block and writes its accumulator once.
  const double floor_bytes = static_cast<double>(ranks + 1) * static_cast<double>(block * sizeof(float)) * ranks;
  std::printf("floor traffic: %.0f MB per run of a mode, all ranks together\n", floor_bytes / 1e6);
#if !defined(__SSE2__)
  std::printf("no SSE2 here: stream and floor store as usual (no non-temporal stores)\n");
#endif
  return 0;
}
