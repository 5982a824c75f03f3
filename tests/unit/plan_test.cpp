// The placement plan (core/plan/plan.hpp): what each stage keeps where, on an uneven layout at N = 3, its byte totals
// against the ZeRO paper's formulas (plus the 16-bit params a mixed-precision run keeps beside its fp32 master),
// persistent stage-3 units, buckets, and the memory spaces and allocators the engine takes buffers from.
#include <gtest/gtest.h>

#include <memory>

#include "kernels/kernels.hpp"
#include "memory/allocator.hpp"
#include "memory/buffer.hpp"
#include "memory/ops.hpp"
#include "nvme/nvme_state.hpp"
#include "plan/plan.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

// Three units of odd sizes; unit 1 is small enough to persist at stage 3 with a threshold of 100.
std::vector<ParamShape> model() {
  return {{"a", {37, 5}, 0, 0}, {"b", {3}, 1, 0}, {"c", {7, 11}, 2, 0}, {"d", {129}, 2, 0}};
}

PlanSpec spec(int stage, DType compute, int world, int rank) {
  PlanSpec s;
  s.stage = stage;
  s.compute_dtype = compute;
  s.world_size = world;
  s.rank = rank;
  s.persistence_threshold = 100;
  s.bucket_elems = 200;
  return s;
}

TEST(Plan, EachStageKeepsWhatTheZeroPaperSays) {
  const auto params = model();
  const int world = 3;
  const Layout layout = build_layout(params, world);
  for (int stage = 0; stage <= 3; ++stage)
    for (int rank = 0; rank < world; ++rank) {
      const Plan plan = make_plan(spec(stage, DType::kF32, world, rank), layout);
      EXPECT_EQ(plan.stage, stage);
      EXPECT_EQ(plan.reduction, stage == 0   ? GradReduction::kAllReduceInStep
                                : stage == 1 ? GradReduction::kReduceScatterInStep
                                             : GradReduction::kBucketsInBackward);
      for (size_t u = 0; u < layout.units.size(); ++u) {
        const UnitPlan& up = plan.units[u];
        const size_t full = layout.units[u].padded_elems, shard = layout.units[u].shard_elems;
        const bool persistent = stage == 3 && layout.units[u].used_elems < 100;
        EXPECT_EQ(up.persistent, persistent) << "stage " << stage << " unit " << u;
        EXPECT_EQ(up.params.extent, stage == 3 && !persistent ? Extent::kShard : Extent::kFull);
        EXPECT_EQ(up.params.elems, up.params.extent == Extent::kShard ? shard : full);
        EXPECT_EQ(up.grads.elems, stage >= 2 ? shard : full);
        EXPECT_EQ(up.master.extent, Extent::kNone);  // fp32 params are the master
        EXPECT_EQ(up.state[0].elems, stage == 0 ? full : shard);
        EXPECT_EQ(up.state[1].elems, stage == 0 ? full : shard);
        EXPECT_EQ(up.update_begin, stage == 0 ? 0 : rank * shard);
        EXPECT_EQ(up.norm_begin, rank * shard);
        EXPECT_EQ(up.publish, stage == 0                  ? Publish::kNone
                              : stage == 3 && !persistent ? Publish::kGatherOnDemand
                                                          : Publish::kAllGatherAfterStep);
        // Where the update range sits inside the buffers: at its place in a full buffer, at 0 in a shard.
        EXPECT_EQ(up.update_in_params, up.params.extent == Extent::kFull ? up.update_begin : 0u);
        EXPECT_EQ(up.update_in_grads, stage >= 2 ? 0u : up.update_begin);
        EXPECT_EQ(up.norm_in_grads, stage >= 2 ? 0u : rank * shard);
      }
      EXPECT_EQ(plan.buckets.empty(), stage < 2);
      // The largest sharded unit, in bytes, and its elements for fetching ahead.
      EXPECT_EQ(plan.gathered.bytes(), stage == 3 ? layout.units[2].padded_elems * 4 : 0u);
      EXPECT_EQ(plan.gathered_elems, stage == 3 ? layout.units[2].padded_elems : 0u);
    }
}

// A frozen param (a LoRA base, a packed quantized weight) lives beside its unit's trained params as bytes: whole at
// stages 0-2, sharded at stage 3 with its unit, counted in frozen_param_bytes and in the gathered buffer, and
// without gradient, master or optimizer state; a unit of frozen params only has no trained elements at all.
TEST(Plan, FrozenParamsAreBytesBesideTheirUnit) {
  std::vector<ParamShape> params = model();
  ParamShape base{"base", {50, 40}, 2, 0};  // 2000 bf16 elements in unit 2
  base.frozen = true;
  base.stored = StoredType::kBF16;
  ParamShape packed{"packed", {300}, 3, 0};  // a unit of its own, uint8
  packed.frozen = true;
  packed.stored = StoredType::kU8;
  params.push_back(base);
  params.push_back(packed);
  const int world = 3;
  const Layout layout = build_layout(params, world);
  ASSERT_EQ(layout.units.size(), 4u);
  const UnitLayout& u2 = layout.units[2];
  EXPECT_EQ(u2.params, (std::vector<int>{2, 3}));
  EXPECT_EQ(u2.frozen_params, (std::vector<int>{4}));
  EXPECT_EQ(u2.frozen_used_bytes, 4000u);
  EXPECT_EQ(u2.frozen_shard_bytes % kFrozenAlignBytes, 0u);
  EXPECT_EQ(u2.frozen_padded_bytes, u2.frozen_shard_bytes * world);
  EXPECT_GE(u2.frozen_padded_bytes, 4000u);
  EXPECT_EQ(layout.params[4].bytes, 4000u);
  EXPECT_TRUE(layout.params[4].frozen);
  const UnitLayout& u3 = layout.units[3];
  EXPECT_EQ(u3.padded_elems, 0u);
  EXPECT_EQ(u3.shard_elems, 0u);
  EXPECT_EQ(u3.frozen_padded_bytes, 3u * 128u);  // 100 bytes per rank, rounded to 64
  // Units without trained params have no gradients: in no bucket.
  for (const BucketLayout& b : build_buckets(layout, 200))
    for (int u : b.units) EXPECT_NE(u, 3);

  for (int stage = 0; stage <= 3; ++stage)
    for (int rank = 0; rank < world; ++rank) {
      PlanSpec s = spec(stage, DType::kBF16, world, rank);
      s.persistence_threshold = 1000;  // unit 2 (2200 elements with its base) is sharded at stage 3, unit 3 not
      const Plan plan = make_plan(s, layout);
      const UnitPlan& p2 = plan.units[2];
      const UnitPlan& p3 = plan.units[3];
      EXPECT_EQ(p2.sharded_params(), stage == 3);
      EXPECT_EQ(p2.frozen.bytes(), stage == 3 ? u2.frozen_shard_bytes : u2.frozen_padded_bytes);
      EXPECT_EQ(p3.sharded_params(), false);  // 300 elements: persistent
      EXPECT_EQ(p3.frozen.bytes(), u3.frozen_padded_bytes);
      EXPECT_EQ(p3.params.extent, Extent::kNone);
      EXPECT_EQ(p3.grads.extent, Extent::kNone);
      EXPECT_EQ(p3.master.extent, Extent::kNone);
      EXPECT_EQ(p3.state[0].extent, Extent::kNone);
      const MemoryStats m = plan.bytes();
      EXPECT_EQ(m.frozen_param_bytes, p2.frozen.bytes() + p3.frozen.bytes());
      EXPECT_EQ(m.total(), m.param_bytes + m.grad_bytes + m.master_param_bytes + m.optimizer_state_bytes +
                               m.bucket_bytes + m.gathered_bytes + m.frozen_param_bytes);
      if (stage == 3) {  // the gathered buffer: unit 2's params, then its frozen bytes at a 64-byte boundary
        EXPECT_EQ(p2.gathered_frozen_offset % kFrozenAlignBytes, 0u);
        EXPECT_GE(p2.gathered_frozen_offset, u2.padded_elems * 2);
        EXPECT_EQ(plan.gathered.bytes(), p2.gathered_frozen_offset + u2.frozen_padded_bytes);
        EXPECT_EQ(plan.gathered_elems, u2.padded_elems + 2000u);
      }
    }
  // Persistence counts frozen elements as DeepSpeed counts a param's: with them, unit 2 is past a threshold its
  // trained elements alone are not.
  PlanSpec s = spec(3, DType::kBF16, world, 0);
  s.persistence_threshold = 1000;
  EXPECT_TRUE(make_plan(s, build_layout(model(), world)).units[2].persistent);
  EXPECT_FALSE(make_plan(s, layout).units[2].persistent);
}

TEST(Plan, BytesFollowTheFormulasWithTheSixteenBitCopy) {
  // One large unit (no persistence): Psi padded elements, N = 3.
  const std::vector<ParamShape> params = {{"w", {1000, 999}, 0, 0}};
  const int world = 3;
  const Layout layout = build_layout(params, world);
  const uint64_t psi = layout.units[0].padded_elems, shard = psi / world;
  for (DType compute : {DType::kF32, DType::kBF16}) {
    const uint64_t p = dtype_size(compute), master = compute == DType::kF32 ? 0 : 4;
    const uint64_t expected[4] = {
        (p + 4 + master + 8) * psi,            // stage 0: everything whole
        (p + 4) * psi + (master + 8) * shard,  // stage 1: master and Adam sharded
        p * psi + (4 + master + 8) * shard,    // stage 2: gradients too
        (p + 4 + master + 8) * shard,          // stage 3: params too
    };
    for (int stage = 0; stage <= 3; ++stage) {
      const MemoryStats m = make_plan(spec(stage, compute, world, 1), layout).bytes(0, 0);
      EXPECT_EQ(m.total(), expected[stage]) << dtype_name(compute) << " stage " << stage;
    }
    // The transient buffers: one bucket (the whole unit, larger than bucket_elems) and one gathered unit.
    const MemoryStats m3 = make_plan(spec(3, compute, world, 1), layout).bytes();
    EXPECT_EQ(m3.bucket_bytes, 4 * psi);
    EXPECT_EQ(m3.gathered_bytes, p * psi);
  }
}

TEST(Plan, ABadStageIsAnError) {
  const Layout layout = build_layout(model(), 2);
  EXPECT_THROW(make_plan(spec(4, DType::kF32, 2, 0), layout), Error);
}

// An allocator that counts what it hands out, as a framework's pool would.
struct CountingAllocator : Allocator {
  size_t live_bytes = 0, calls = 0;
  void* allocate(size_t bytes, size_t alignment) override {
    calls += 1;
    live_bytes += bytes;
    return host_allocator().allocate(bytes, alignment);
  }
  void deallocate(void* p, size_t bytes) noexcept override {
    live_bytes -= bytes;
    host_allocator().deallocate(p, bytes);
  }
  std::string name() const override { return "counting"; }
};

TEST(Memory, BuffersComeFromTheirSpacesAllocatorAndGoBack) {
  auto counting = std::make_shared<CountingAllocator>();
  {
    Buffer b;
    b.allocate(MemorySpace::kHost, 1000, DType::kBF16, counting);
    EXPECT_EQ(counting->live_bytes, 2048u);  // rounded up to the 64-byte alignment
    EXPECT_EQ(b.n_bytes(), 2000u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
    Buffer moved = std::move(b);
    EXPECT_TRUE(b.empty());
    EXPECT_EQ(counting->live_bytes, 2048u);
  }
  EXPECT_EQ(counting->live_bytes, 0u);
  EXPECT_EQ(counting->calls, 1u);
}

TEST(Memory, ASpaceWithoutAllocatorOrKernelsIsAClearError) {
  Allocators allocators;
  EXPECT_NO_THROW(allocators.get(MemorySpace::kHost, "the params"));
  try {
    allocators.get(MemorySpace::kDevice, "the params");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ZERO_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(e.what()).find("the placement plan puts the params in device memory"), std::string::npos)
        << e.what();
  }
  int x = 1, y = 0;
  EXPECT_THROW(copy_bytes(MemorySpace::kDevice, &y, MemorySpace::kHost, &x, sizeof x), Error);
  EXPECT_THROW(element_ops(MemorySpace::kNvme), Error);
  EXPECT_THROW(kernels(MemorySpace::kDevice, Isa::kScalar), Error);
  copy_bytes(MemorySpace::kPinnedHost, &y, MemorySpace::kHost, &x, sizeof x);  // host-addressable: a plain copy
  EXPECT_EQ(y, 1);
}

}  // namespace
}  // namespace zero

namespace zero {
namespace {

// The NVMe state's geometry: units padded to 4 KiB, chunks of sub_group_size rounded up to 1024 elements, a window
// of at most buffer_count of them — and never much larger than the file when the whole state fits in the window.
TEST(Plan, OffloadGeometryBoundsTheWindowByTheFile) {
  using io::NvmeState;
  NvmeState::Geometry g = NvmeState::geometry({5000, 1, 0, 3000}, 3, 1500, 4);
  EXPECT_EQ(g.positions, 5120u + 1024u + 0u + 3072u);
  EXPECT_EQ(g.chunk_elems, 2048u);
  EXPECT_EQ(g.chunks(), 5u);
  EXPECT_EQ(g.slots, 4);
  EXPECT_EQ(g.file_bytes(), 3u * 9216u * 4u);
  EXPECT_EQ(g.staging_bytes(), 4u * 2048u * 3u * 4u);
  // A 100,352-position state in chunks of 65,536 and 5 buffers: two chunks, evened out to 50,176 each, so the
  // window equals the file instead of exceeding it by 30 %.
  g = NvmeState::geometry({100000}, 2, 65536, 5);
  EXPECT_EQ(g.chunk_elems, 50176u);
  EXPECT_EQ(g.slots, 2);
  EXPECT_EQ(g.staging_bytes(), g.file_bytes());
  // DeepSpeed's sub_group_size (1e9): one chunk, the whole state (finalize warns).
  g = NvmeState::geometry({100000}, 2, 1000000000, 4);
  EXPECT_EQ(g.chunks(), 1u);
  EXPECT_EQ(g.staging_bytes(), g.file_bytes());
  // Nothing to offload.
  g = NvmeState::geometry({100000}, 0, 1024, 4);
  EXPECT_EQ(g.file_bytes(), 0u);
  EXPECT_EQ(g.staging_bytes(), 0u);
}

}  // namespace
}  // namespace zero
