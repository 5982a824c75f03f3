// The hierarchical collectives (core/comm/hierarchy.cpp) over TCP column links (core/comm/tcp_link.cpp), in one
// process: M "nodes" of L ranks as threads, each node's window in memory its threads share, the columns connected
// over loopback. A reduce-scatter gives every block the bits of the one rank-order sum over all N ranks
// (sum_in_rank_order, what every other path computes), in fp32 and bf16; an all-gather gives every rank every block.
// The cross-node collectives over them (core/comm/cross_node.cpp): a broadcast reaches every rank from every root, an
// all-reduce folds in rank order, and a broadcast the machines disagree on fails on both sides of the link.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/cross_node.hpp"
#include "comm/hierarchy.hpp"
#include "comm/rank_order_sum.hpp"
#include "comm/tcp_link.hpp"
#include "numeric/dtype.hpp"

namespace zero {
namespace {

constexpr size_t kHalf = 16 << 10;  // small chunks: many of them, and several in flight per hop

// Every rank's window and column link (rank = node * locals + local), ready to be stepped.
struct Parts {
  std::vector<std::unique_ptr<NodeWindow>> windows;
  std::vector<std::unique_ptr<TcpColumnLink>> links;
};

Parts make_parts(int nodes, int locals, std::vector<std::vector<char>>& memory) {
  const int size = nodes * locals;
  Parts parts;
  // Each node's window: its ranks' slots in one allocation the node's threads share.
  memory.assign(static_cast<size_t>(nodes), std::vector<char>(NodeWindow::slot_bytes(kHalf) * locals + 64));
  for (int r = 0; r < size; ++r) {
    const int node = r / locals;
    char* base = memory[static_cast<size_t>(node)].data();
    base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
    std::vector<char*> slots;
    for (int l = 0; l < locals; ++l) slots.push_back(base + static_cast<size_t>(l) * NodeWindow::slot_bytes(kHalf));
    parts.windows.push_back(std::make_unique<NodeWindow>(r % locals, locals, kHalf, slots, nullptr));
    parts.windows.back()->reset_line();
    parts.windows.back()->set_single_copy(false, "");
  }
  // Each column's links, set up side by side.
  std::vector<std::unique_ptr<TcpListener>> listeners;
  for (int r = 0; r < size; ++r) listeners.push_back(std::make_unique<TcpListener>("127.0.0.1"));
  parts.links.resize(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      std::vector<std::string> addresses;
      for (int n = 0; n < nodes; ++n)
        addresses.push_back(listeners[static_cast<size_t>(n * locals + r % locals)]->address());
      parts.links[static_cast<size_t>(r)] = std::make_unique<TcpColumnLink>(
          *listeners[static_cast<size_t>(r)], r / locals, nodes, addresses, "column-" + std::to_string(r % locals), 10);
    });
  for (std::thread& t : threads) t.join();
  return parts;
}

// One Hierarchy per rank.
std::vector<std::unique_ptr<Hierarchy>> make_job(int nodes, int locals, std::vector<std::vector<char>>& memory) {
  Parts parts = make_parts(nodes, locals, memory);
  std::vector<std::unique_ptr<Hierarchy>> job;
  for (int r = 0; r < nodes * locals; ++r)
    job.push_back(std::make_unique<Hierarchy>(std::move(parts.windows[static_cast<size_t>(r)]),
                                              std::move(parts.links[static_cast<size_t>(r)]), r / locals, nodes));
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

// One CrossNode per rank.
std::vector<std::unique_ptr<CrossNode>> make_cross_job(int nodes, int locals, std::vector<std::vector<char>>& memory) {
  Parts parts = make_parts(nodes, locals, memory);
  std::vector<std::unique_ptr<CrossNode>> job;
  for (int r = 0; r < nodes * locals; ++r)
    job.push_back(
        std::make_unique<CrossNode>(std::shared_ptr<NodeWindow>(std::move(parts.windows[static_cast<size_t>(r)])),
                                    std::move(parts.links[static_cast<size_t>(r)]), r / locals, nodes));
  return job;
}

// Steps one collective on every rank (a thread each, `begin` starting rank r's) until each is done or failed, or,
// once the ranks `decisive` names have all ended, until `patience` has passed for the others (a rank left waiting
// on a peer that failed: in a communicator its stop would end the wait).
std::vector<CrossNode::Progress> run_cross(std::vector<std::unique_ptr<CrossNode>>& job,
                                           const std::function<CrossNode::Op(int)>& begin,
                                           std::vector<std::string>* errors, const std::vector<int>& decisive = {}) {
  std::vector<CrossNode::Progress> result(job.size(), CrossNode::Progress::kWaiting);
  errors->assign(job.size(), "");
  std::atomic<int> decided{0};
  std::vector<std::thread> threads;
  for (size_t r = 0; r < job.size(); ++r)
    threads.emplace_back([&, r] {
      CrossNode::Op op = begin(static_cast<int>(r));
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      const bool counts = std::find(decisive.begin(), decisive.end(), static_cast<int>(r)) != decisive.end();
      auto given_up = deadline;
      while ((result[r] = job[r]->step(op)) == CrossNode::Progress::kWaiting) {
        const auto now = std::chrono::steady_clock::now();
        if (now > deadline || now > given_up) break;
        if (!decisive.empty() && decided.load() == static_cast<int>(decisive.size()) && given_up == deadline)
          given_up = now + std::chrono::milliseconds(300);
        std::this_thread::yield();
      }
      if (counts) ++decided;
      (*errors)[r] = job[r]->error();
    });
  for (std::thread& t : threads) t.join();
  return result;
}

TEST(CrossNodeOverTcp, ABroadcastReachesEveryRankAndAnAllReduceFoldsInRankOrder) {
  for (const auto& [nodes, locals] : {std::pair<int, int>{2, 2}, {3, 2}}) {
    std::vector<std::vector<char>> memory;
    auto job = make_cross_job(nodes, locals, memory);
    const int size = nodes * locals;
    uint64_t sequence = 1;
    std::vector<std::string> errors;
    for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{70001}})
      for (int root = 0; root < size; ++root) {
        std::vector<std::vector<float>> bufs(static_cast<size_t>(size), std::vector<float>(count, -1.0f));
        for (uint64_t i = 0; i < count; ++i) bufs[static_cast<size_t>(root)][i] = static_cast<float>(root * 100003 + i);
        const auto result = run_cross(
            job,
            [&](int r) {
              return job[static_cast<size_t>(r)]->begin(sequence, ZERO_COLL_BROADCAST, ZERO_DTYPE_FP32,
                                                        bufs[static_cast<size_t>(r)].data(), count, 4, ZERO_REDUCE_SUM,
                                                        root);
            },
            &errors);
        ++sequence;
        for (int r = 0; r < size; ++r) {
          ASSERT_EQ(result[static_cast<size_t>(r)], CrossNode::Progress::kDone) << "rank " << r << ": " << errors[r];
          EXPECT_EQ(bufs[static_cast<size_t>(r)], bufs[static_cast<size_t>(root)])
              << nodes << "x" << locals << " root " << root << " rank " << r << " count " << count;
        }
      }
    // A sum whose bits show the order of the additions: rank 0's value, plus rank 1's, and so on.
    const uint64_t count = 4099;
    const auto value = [](int r, uint64_t i) {
      std::mt19937 rng(static_cast<unsigned>(r * 7919 + i));
      return std::ldexp(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng), static_cast<int>(rng() % 41) - 20);
    };
    std::vector<std::vector<float>> bufs(static_cast<size_t>(size), std::vector<float>(count));
    std::vector<float> expected(count);
    for (uint64_t i = 0; i < count; ++i) {
      float sum = value(0, i);
      for (int r = 1; r < size; ++r) sum += value(r, i);
      expected[i] = sum;
      for (int r = 0; r < size; ++r) bufs[static_cast<size_t>(r)][i] = value(r, i);
    }
    const auto result = run_cross(
        job,
        [&](int r) {
          return job[static_cast<size_t>(r)]->begin(sequence, ZERO_COLL_ALL_REDUCE, ZERO_DTYPE_FP32,
                                                    bufs[static_cast<size_t>(r)].data(), count, 4, ZERO_REDUCE_SUM, 0);
        },
        &errors);
    ++sequence;
    for (int r = 0; r < size; ++r) {
      ASSERT_EQ(result[static_cast<size_t>(r)], CrossNode::Progress::kDone) << "rank " << r << ": " << errors[r];
      EXPECT_EQ(std::memcmp(bufs[static_cast<size_t>(r)].data(), expected.data(), count * 4), 0) << "rank " << r;
    }
    for (auto& c : job) c->free();
  }
}

// Node 0 broadcasts from rank 0, node 1 from rank 2: each of the two column ranks sends its buffer and gets the
// other's header back where it waits for an acknowledgement. Both fail in this collective, as ranks in different
// collectives, rather than the root's machine completing and learning of it only later.
TEST(CrossNodeOverTcp, ABroadcastTheMachinesDisagreeOnFailsOnBothSides) {
  std::vector<std::vector<char>> memory;
  auto job = make_cross_job(2, 2, memory);
  std::vector<std::vector<float>> bufs(4, std::vector<float>(100, 1.0f));
  std::vector<std::string> errors;
  const auto result = run_cross(job,
                                [&](int r) {
                                  return job[static_cast<size_t>(r)]->begin(1, ZERO_COLL_BROADCAST, ZERO_DTYPE_FP32,
                                                                            bufs[static_cast<size_t>(r)].data(), 100, 4,
                                                                            ZERO_REDUCE_SUM, r < 2 ? 0 : 2);
                                },
                                &errors, {0, 2});
  for (int r : {0, 2}) {
    EXPECT_EQ(result[static_cast<size_t>(r)], CrossNode::Progress::kMismatch) << "rank " << r << ": " << errors[r];
    EXPECT_NE(errors[static_cast<size_t>(r)].find("answered that it is in collective #1"), std::string::npos)
        << errors[r];
  }
}

}  // namespace
}  // namespace zero
