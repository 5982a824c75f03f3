// libzero's direct-I/O engine writing then reading one file (bench/nvme/run.sh runs fio with the same block size,
// queue depth and O_DIRECT in the same run and prints the ratios).
//   bench_aio FILE SIZE_MIB BLOCK_KIB QUEUE_DEPTH [posix|io_uring] [passes]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "nvme/aio.hpp"
#include "util/error.hpp"

int main(int argc, char** argv) {
  using zero::io::AioSettings;
  using zero::io::EngineKind;
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s FILE SIZE_MIB BLOCK_KIB QUEUE_DEPTH [posix|io_uring] [passes]\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  const size_t bytes = std::strtoull(argv[2], nullptr, 10) << 20;
  AioSettings settings;
  settings.block_size = std::strtoull(argv[3], nullptr, 10) << 10;
  settings.queue_depth = std::atoi(argv[4]);
  EngineKind kind = EngineKind::kAuto;
  if (argc > 5 && std::strcmp(argv[5], "posix") == 0) kind = EngineKind::kPosix;
  if (argc > 5 && std::strcmp(argv[5], "io_uring") == 0) kind = EngineKind::kIoUring;
  const int passes = argc > 6 ? std::atoi(argv[6]) : 3;
  try {
    auto engine = zero::io::make_engine(settings, kind);
    auto file = zero::io::DirectFile::create(path, bytes);
    zero::io::AlignedBuffer buffer(64 << 20);  // a 64 MiB window, moved again and again: what a step streams through
    std::memset(buffer.data(), 0x5a, buffer.size());
    const bool fixed = engine->register_buffer(buffer.data(), buffer.size());  // as an NVMe state does
    std::vector<double> write_s, read_s;
    for (int pass = 0; pass < passes; ++pass) {
      for (int w = 0; w < 2; ++w) {
        const auto start = std::chrono::steady_clock::now();
        // The whole file in one batch through the same window (its contents do not matter here), so that the
        // queue stays full as in fio; a step's pipeline alternates windows instead.
        for (size_t done = 0; done < bytes; done += buffer.size()) {
          const size_t n = std::min(buffer.size(), bytes - done);
          if (w == 0)
            engine->start_write(file, buffer.data(), n, done);
          else
            engine->start_read(file, buffer.data(), n, done);
        }
        engine->finish();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        (w == 0 ? write_s : read_s).push_back(s);
      }
    }
    std::sort(write_s.begin(), write_s.end());
    std::sort(read_s.begin(), read_s.end());
    std::printf(
        "libzero %s%s: write %.3f GB/s, read %.3f GB/s (median of %d passes, %zu MiB, %zu KiB blocks, depth %d)\n",
        engine->name(), fixed ? " (fixed buffer)" : "", bytes / write_s[write_s.size() / 2] / 1e9,
        bytes / read_s[read_s.size() / 2] / 1e9, passes, bytes >> 20, settings.block_size >> 10, settings.queue_depth);
    std::remove(path.c_str());
  } catch (const zero::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::remove(path.c_str());
    return 1;
  }
  return 0;
}
