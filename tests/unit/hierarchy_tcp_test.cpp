// The hierarchical collectives (core/comm/hierarchy.cpp) over TCP column links (core/comm/tcp_link.cpp), in one
// process: M "nodes" of L ranks as threads, each node's window in memory its threads share, the columns connected
// over loopback. A reduce-scatter gives every block the bits of the one rank-order sum over all N ranks
// (sum_in_rank_order, what every other path computes), in fp32 and bf16; an all-gather gives every rank every block.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/hierarchy.hpp"
#include "comm/rank_order_sum.hpp"
#include "comm/tcp_link.hpp"
#include "numeric/dtype.hpp"

namespace zero {
namespace {

constexpr size_t kHalf = 16 << 10;  // small chunks: many of them, and several in flight per hop

// One Hierarchy per rank (rank = node * locals + local), ready to step.
std::vector<std::unique_ptr<Hierarchy>> make_job(int nodes, int locals, std::vector<std::vector<char>>& memory) {
  const int size = nodes * locals;
  // Each node's window: its ranks' slots in one allocation the node's threads share.
  memory.assign(static_cast<size_t>(nodes), std::vector<char>(NodeWindow::slot_bytes(kHalf) * locals + 64));
  std::vector<std::unique_ptr<NodeWindow>> windows;
  for (int r = 0; r < size; ++r) {
    const int node = r / locals;
    char* base = memory[static_cast<size_t>(node)].data();
    base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
    std::vector<char*> slots;
    for (int l = 0; l < locals; ++l) slots.push_back(base + static_cast<size_t>(l) * NodeWindow::slot_bytes(kHalf));
    windows.push_back(std::make_unique<NodeWindow>(r % locals, locals, kHalf, slots, nullptr));
    windows.back()->reset_line();
    windows.back()->set_single_copy(false, "");
  }
  // Each column's links, set up side by side.
  std::vector<std::unique_ptr<TcpListener>> listeners;
  for (int r = 0; r < size; ++r) listeners.push_back(std::make_unique<TcpListener>("127.0.0.1"));
  std::vector<std::unique_ptr<TcpColumnLink>> links(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      std::vector<std::string> addresses;
      for (int n = 0; n < nodes; ++n)
        addresses.push_back(listeners[static_cast<size_t>(n * locals + r % locals)]->address());
      links[static_cast<size_t>(r)] = std::make_unique<TcpColumnLink>(
          *listeners[static_cast<size_t>(r)], r / locals, nodes, addresses, "column-" + std::to_string(r % locals), 10);
    });
  for (std::thread& t : threads) t.join();
  std::vector<std::unique_ptr<Hierarchy>> job;
  for (int r = 0; r < size; ++r)
    job.push_back(std::make_unique<Hierarchy>(std::move(windows[static_cast<size_t>(r)]),
                                              std::move(links[static_cast<size_t>(r)]), r / locals, nodes));
  return job;
}

// Runs one collective on every rank (a thread each) to completion.
void run(std::vector<std::unique_ptr<Hierarchy>>& job, uint64_t sequence, int32_t kind, int32_t dtype,
         std::vector<std::vector<uint8_t>>& bufs, uint64_t count, size_t esize) {
  std::vector<std::thread> threads;
  std::vector<Hierarchy::Progress> result(job.size(), Hierarchy::Progress::kWaiting);
  std::vector<std::string> errors(job.size());
  for (size_t r = 0; r < job.size(); ++r)
    threads.emplace_back([&, r] {
      Hierarchy::Op op = job[r]->begin(sequence, kind, dtype, bufs[r].data(), count, esize);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while ((result[r] = job[r]->step(op)) == Hierarchy::Progress::kWaiting &&
             std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
      errors[r] = job[r]->error();
    });
  for (std::thread& t : threads) t.join();
  for (size_t r = 0; r < job.size(); ++r)
    ASSERT_EQ(result[r], Hierarchy::Progress::kDone) << "rank " << r << ": " << errors[r];
}

TEST(HierarchyOverTcp, AReduceScatterHasTheBitsOfOneRankOrderSum) {
  for (const auto& [nodes, locals] : {std::pair<int, int>{2, 2}, {3, 2}}) {
    std::vector<std::vector<char>> memory;
    auto job = make_job(nodes, locals, memory);
    const int size = nodes * locals;
    uint64_t sequence = 1;
    for (int32_t dtype : {ZERO_DTYPE_FP32, ZERO_DTYPE_BF16}) {
      const size_t esize = dtype == ZERO_DTYPE_FP32 ? 4 : 2;
      for (uint64_t count : {uint64_t{1}, uint64_t{1000}, uint64_t{70001}}) {
        // Values of many magnitudes and signs, so that the order of the additions shows in the bits.
        std::mt19937 rng(static_cast<unsigned>(count * 7 + dtype));
        std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
        std::uniform_int_distribution<int> expo(-20, 20);
        std::vector<std::vector<uint8_t>> bufs(static_cast<size_t>(size), std::vector<uint8_t>(count * esize * size));
        for (auto& b : bufs)
          for (size_t i = 0; i < count * size; ++i) {
            const float v = std::ldexp(mant(rng), expo(rng));
            if (dtype == ZERO_DTYPE_FP32) {
              std::memcpy(&b[4 * i], &v, 4);
            } else {
              const uint16_t h = float_to_bf16_rne(v);
              std::memcpy(&b[2 * i], &h, 2);
            }
          }
        const std::vector<std::vector<uint8_t>> inputs = bufs;
        run(job, sequence++, ZERO_COLL_REDUCE_SCATTER, dtype, bufs, count, esize);
        for (int r = 0; r < size; ++r) {
          std::vector<const void*> sources;
          for (int s = 0; s < size; ++s) sources.push_back(inputs[static_cast<size_t>(s)].data() + r * count * esize);
          std::vector<uint8_t> expected(count * esize);
          sum_in_rank_order(expected.data(), sources.data(), size, count, dtype);
          EXPECT_EQ(
              std::memcmp(expected.data(), bufs[static_cast<size_t>(r)].data() + r * count * esize, expected.size()), 0)
              << nodes << "x" << locals << " rank " << r << " dtype " << dtype << " count " << count;
        }
      }
    }
    // An all-gather after them (the window's chunk numbers and the links carry on).
    const uint64_t count = 5003;
    std::vector<std::vector<uint8_t>> bufs(static_cast<size_t>(size), std::vector<uint8_t>(count * 4 * size, 0));
    for (int r = 0; r < size; ++r)
      for (size_t i = 0; i < count * 4; ++i)
        bufs[static_cast<size_t>(r)][r * count * 4 + i] = static_cast<uint8_t>(r * 31 + i);
    run(job, sequence++, ZERO_COLL_ALL_GATHER, ZERO_DTYPE_FP32, bufs, count, 4);
    for (int r = 0; r < size; ++r)
      for (int b = 0; b < size; ++b)
        for (size_t i = 0; i < count * 4; i += 97)
          ASSERT_EQ(bufs[static_cast<size_t>(r)][b * count * 4 + i], static_cast<uint8_t>(b * 31 + i))
              << "rank " << r << " block " << b;
    for (auto& h : job) h->free();
  }
}

}  // namespace
}  // namespace zero
