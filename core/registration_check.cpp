// zero_engine_finalize's agreement check. Ranks that registered different params would otherwise issue
// collectives of different sizes or counts and hang; instead every rank exchanges fixed-size digests first and,
// on a difference, every rank learns which param differs and what each side registered.
#include <cstring>
#include <sstream>

#include "engine.hpp"
#include "error.hpp"

namespace zero {
namespace {

uint64_t fnv1a(const std::string& text, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string describe(const ParamShape& p) {
  std::ostringstream os;
  os << "'" << p.name << "' shape [";
  for (size_t i = 0; i < p.dims.size(); ++i) os << (i ? ", " : "") << p.dims[i];
  os << "] unit " << p.unit << " group " << p.group;
  return os.str();
}

std::string describe(const GroupSpec& g) {
  std::ostringstream os;
  os << std::hexfloat << "'" << g.name << "' lr " << g.hyper.lr << " weight_decay " << g.hyper.weight_decay
     << " betas (" << g.hyper.beta1 << ", " << g.hyper.beta2 << ") eps " << g.hyper.eps;
  return os.str();
}

std::string describe(const Config& c) {
  std::ostringstream os;
  os << std::hexfloat << "stage " << c.stage << " reduce_bucket_size " << c.reduce_bucket_size
     << " persistence_threshold " << c.param_persistence_threshold << " gradient_accumulation_steps "
     << c.gradient_accumulation_steps << " gradient_clipping " << c.gradient_clipping << " optimizer "
     << static_cast<int>(c.optimizer.kind) << " " << c.optimizer.bias_correction;
  return os.str();
}

struct Difference {
  int64_t index = -1;  // -1: none
  int rank = 0;        // the lowest rank that differs from rank 0 at `index`
  std::string on_root, on_rank;
};

// Finds the first entry where some rank's list differs from rank 0's. Collective; all ranks get the same answer.
Difference first_difference(CountedComm& comm, const std::vector<std::string>& descriptions) {
  const int world = comm.size(), rank = comm.rank();
  int64_t root_count = static_cast<int64_t>(descriptions.size());
  comm.broadcast(&root_count, sizeof(root_count), 0);
  std::vector<uint64_t> root_hashes(static_cast<size_t>(root_count));
  if (rank == 0)
    for (size_t i = 0; i < descriptions.size(); ++i) root_hashes[i] = fnv1a(descriptions[i]);
  if (root_count > 0) comm.broadcast(root_hashes.data(), root_hashes.size() * sizeof(uint64_t), 0);

  const int64_t mine = static_cast<int64_t>(descriptions.size());
  int64_t first = INT64_MAX;
  for (int64_t i = 0; i < std::min(mine, root_count); ++i)
    if (fnv1a(descriptions[i]) != root_hashes[i]) {
      first = i;
      break;
    }
  if (first == INT64_MAX && mine != root_count) first = std::min(mine, root_count);
  int64_t key = first == INT64_MAX ? INT64_MAX : first * world + rank;
  comm.all_reduce_inplace(&key, 1, ElemType::kI64, ReduceOp::kMin);

  Difference d;
  if (key == INT64_MAX) return d;
  d.index = key / world;
  d.rank = static_cast<int>(key % world);
  auto local = [&](int64_t i) {
    return i < mine ? descriptions[i] : "nothing (it registered only " + std::to_string(mine) + " entries)";
  };
  d.on_root = comm.broadcast_text(local(d.index), 0);
  d.on_rank = comm.broadcast_text(local(d.index), d.rank);
  return d;
}

}  // namespace

void Engine::verify_registration_across_ranks() {
  CountedComm& comm = comm_;
  std::string local_error;
  zero_status_t local_status = ZERO_OK;
  try {
    if (params_.empty()) fail(ZERO_ERR_INVALID_STATE, "zero_engine_finalize: no params were registered");
    layout_ = build_layout(params_, comm.size());
  } catch (const Error& e) {
    local_error = e.what();
    local_status = e.status();
  }

  std::vector<std::string> param_text, group_text;
  for (const auto& p : params_) param_text.push_back(describe(p));
  for (const auto& g : groups_) group_text.push_back(describe(g));
  uint64_t params_digest = 0, groups_digest = 0;
  for (const auto& t : param_text) params_digest = fnv1a(t, params_digest ^ 0x9e3779b97f4a7c15ull);
  for (const auto& t : group_text) groups_digest = fnv1a(t, groups_digest ^ 0x9e3779b97f4a7c15ull);

  // One fixed-size exchange that every rank reaches, whatever it registered: [failed rank, digests...].
  enum { kFailedRank, kConfig, kParams, kGroups, kCount };
  int64_t lo[kCount], hi[kCount];
  lo[kFailedRank] = local_status == ZERO_OK ? INT64_MAX : comm.rank();
  lo[kConfig] = static_cast<int64_t>(fnv1a(describe(config_)));
  lo[kParams] = static_cast<int64_t>(params_digest);
  lo[kGroups] = static_cast<int64_t>(groups_digest);
  std::memcpy(hi, lo, sizeof(lo));
  comm.all_reduce_inplace(lo, kCount, ElemType::kI64, ReduceOp::kMin);
  comm.all_reduce_inplace(hi, kCount, ElemType::kI64, ReduceOp::kMax);

  if (local_status != ZERO_OK) fail(local_status, local_error);
  if (lo[kFailedRank] != INT64_MAX)
    fail(ZERO_ERR_INVALID_STATE, "zero_engine_finalize failed on rank " + std::to_string(lo[kFailedRank]) +
                                     " (see that rank's error); this rank stops too");
  if (lo[kConfig] != hi[kConfig])
    fail(ZERO_ERR_MISMATCH,
         "the config differs across ranks (stage, buckets, batch sizes, clipping or optimizer); every rank must "
         "create its engine from the same config");
  if (lo[kParams] != hi[kParams]) {
    Difference d = first_difference(comm, param_text);
    fail(ZERO_ERR_MISMATCH, "param registration differs across ranks at param #" + std::to_string(d.index) +
                                ": rank 0 registered " + d.on_root + ", rank " + std::to_string(d.rank) +
                                " registered " + d.on_rank +
                                ". Every rank must register the same params in the same order.");
  }
  if (lo[kGroups] != hi[kGroups]) {
    Difference d = first_difference(comm, group_text);
    fail(ZERO_ERR_MISMATCH, "param group registration differs across ranks at group #" + std::to_string(d.index) +
                                ": rank 0 has " + d.on_root + ", rank " + std::to_string(d.rank) + " has " + d.on_rank +
                                ".");
  }
}

}  // namespace zero
