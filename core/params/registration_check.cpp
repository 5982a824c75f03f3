// zero_engine_finalize's agreement check. Ranks that registered different params or parsed different configs
// would otherwise issue collectives of different sizes or counts and hang, or silently train different replicas;
// instead every rank exchanges fixed-size digests first and, on a difference, every rank learns which param,
// group or config key differs and what each side has.
#include <climits>
#include <cstring>
#include <sstream>

#include "params/registration.hpp"
#include "util/error.hpp"

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
  if (p.frozen) os << " frozen " << stored_name(p.stored);
  if (p.model_parallel_duplicate) os << " (a model-parallel duplicate)";
  return os.str();
}

std::string describe(const GroupSpec& g) {
  std::ostringstream os;
  os << "'" << g.name << "' lr " << exact_decimal(g.hyper.lr) << " weight_decay " << exact_decimal(g.hyper.weight_decay)
     << " betas (" << exact_decimal(g.hyper.beta1) << ", " << exact_decimal(g.hyper.beta2) << ") eps "
     << exact_decimal(g.hyper.eps);
  return os.str();
}

struct Difference {
  int64_t index = -1;  // -1: none
  int rank = 0;        // the lowest rank that differs from rank 0 at `index`
  std::string on_root, on_rank;
};

// Finds the first entry where some rank's list differs from rank 0's. Collective; all ranks get the same answer.
Difference first_difference(EngineComm& comm, const std::vector<std::string>& descriptions, const char* what) {
  const int world = comm.size(), rank = comm.rank();
  const std::string label = std::string("zero_engine_finalize: locating the first differing ") + what;
  int64_t root_count = static_cast<int64_t>(descriptions.size());
  comm.control_broadcast(&root_count, sizeof root_count, 0, label);
  std::vector<uint64_t> root_hashes(static_cast<size_t>(root_count));
  if (rank == 0)
    for (size_t i = 0; i < descriptions.size(); ++i) root_hashes[i] = fnv1a(descriptions[i]);
  if (root_count > 0) comm.control_broadcast(root_hashes.data(), root_hashes.size() * sizeof(uint64_t), 0, label);

  const int64_t mine = static_cast<int64_t>(descriptions.size());
  int64_t first = INT64_MAX;
  for (int64_t i = 0; i < std::min(mine, root_count); ++i)
    if (fnv1a(descriptions[i]) != root_hashes[i]) {
      first = i;
      break;
    }
  if (first == INT64_MAX && mine != root_count) first = std::min(mine, root_count);
  int64_t key = first == INT64_MAX ? INT64_MAX : first * world + rank;
  comm.control_min(&key, 1, label);

  Difference d;
  if (key == INT64_MAX) return d;
  d.index = key / world;
  d.rank = static_cast<int>(key % world);
  auto local = [&](int64_t i) {
    return i < mine ? descriptions[i] : "nothing (it has only " + std::to_string(mine) + " entries)";
  };
  d.on_root = comm.broadcast_text(local(d.index), 0, label);
  d.on_rank = comm.broadcast_text(local(d.index), d.rank, label);
  return d;
}

}  // namespace

Layout Registration::agree_across_ranks(EngineComm& comm, const Config& config, const Error* precheck) const {
  Layout layout;
  std::string local_error = precheck != nullptr ? precheck->what() : "";
  zero_status_t local_status = precheck != nullptr ? precheck->status() : ZERO_OK;
  if (precheck == nullptr) try {
      if (params_.empty()) fail(ZERO_ERR_INVALID_STATE, "no params were registered");
      layout = build_layout(params_, comm.size());
    } catch (const Error& e) {
      local_error = std::string("zero_engine_finalize: ") + e.what();
      local_status = e.status();
    }

  std::vector<std::string> param_text, group_text;
  for (const auto& p : params_) param_text.push_back(describe(p));
  for (const auto& g : groups_) group_text.push_back(describe(g));
  const std::vector<std::string> config_text = result_settings(config);
  uint64_t params_digest = 0, groups_digest = 0, config_digest = 0;
  for (const auto& t : param_text) params_digest = fnv1a(t, params_digest ^ 0x9e3779b97f4a7c15ull);
  for (const auto& t : group_text) groups_digest = fnv1a(t, groups_digest ^ 0x9e3779b97f4a7c15ull);
  for (const auto& t : config_text) config_digest = fnv1a(t, config_digest ^ 0x9e3779b97f4a7c15ull);

  // One fixed-size exchange that every rank reaches, whatever it registered: the failed rank, and each digest
  // next to its negation, so that one MIN all-reduce gives every digest's minimum and maximum.
  enum { kFailedRank, kConfig, kConfigNeg, kParams, kParamsNeg, kGroups, kGroupsNeg, kCount };
  int64_t v[kCount];
  v[kFailedRank] = local_status == ZERO_OK ? INT64_MAX : comm.rank();
  // Digests are halved so that negating one never overflows.
  v[kConfig] = static_cast<int64_t>(config_digest >> 1), v[kConfigNeg] = -v[kConfig];
  v[kParams] = static_cast<int64_t>(params_digest >> 1), v[kParamsNeg] = -v[kParams];
  v[kGroups] = static_cast<int64_t>(groups_digest >> 1), v[kGroupsNeg] = -v[kGroups];
  comm.control_min(v, kCount, "zero_engine_finalize: registration digests");

  if (v[kFailedRank] != INT64_MAX) {
    // The lowest failed rank's status and message reach every rank.
    const int root = static_cast<int>(v[kFailedRank]);
    int64_t status = local_status;
    comm.control_broadcast(&status, sizeof status, root, "zero_engine_finalize: the failed rank's status");
    const std::string message = comm.broadcast_text(local_error, root, "zero_engine_finalize: its message");
    if (local_status != ZERO_OK) fail(local_status, local_error);
    fail(ZERO_ERR_REMOTE, "rank " + std::to_string(root) + " failed in zero_engine_finalize (" +
                              status_name(static_cast<zero_status_t>(status)) + "): " + message);
  }
  if (v[kConfig] != -v[kConfigNeg]) {
    Difference d = first_difference(comm, config_text, "config setting");
    fail(ZERO_ERR_MISMATCH, "the config differs across ranks: rank 0 has " + d.on_root + ", rank " +
                                std::to_string(d.rank) + " has " + d.on_rank +
                                ". Every rank must create its engine from the same config.");
  }
  if (v[kParams] != -v[kParamsNeg]) {
    Difference d = first_difference(comm, param_text, "param");
    fail(ZERO_ERR_MISMATCH, "param registration differs across ranks at param #" + std::to_string(d.index) +
                                ": rank 0 registered " + d.on_root + ", rank " + std::to_string(d.rank) +
                                " registered " + d.on_rank +
                                ". Every rank must register the same params in the same order.");
  }
  if (v[kGroups] != -v[kGroupsNeg]) {
    Difference d = first_difference(comm, group_text, "param group");
    fail(ZERO_ERR_MISMATCH, "param group registration differs across ranks at group #" + std::to_string(d.index) +
                                ": rank 0 has " + d.on_root + ", rank " + std::to_string(d.rank) + " has " + d.on_rank +
                                ".");
  }
  return layout;
}

// The model-parallel group's ranks hold different params (their parts of the model) but take one step together:
// what changes a step (the config, the param groups, the data-parallel size that averages the gradients) must be
// the same on all of them, and so must their data-parallel rank (the groups form a grid). `local` is this rank's
// failure so far (its data-parallel group's registration), carried to the group so that no rank waits for it.
void Registration::agree_across_model_parallel(EngineComm& group, const Config& config, int data_parallel_size,
                                               int data_parallel_rank, const Error* local) const {
  std::vector<std::string> text = result_settings(config);
  text.push_back("the data-parallel size = " + std::to_string(data_parallel_size));
  // One replica's parts hold the same data-parallel rank: otherwise the norm's partial sums would be added in a
  // different order on different ranks (and a model-parallel communicator over the data-parallel ranks would count
  // every gradient N times).
  text.push_back("the data-parallel rank = " + std::to_string(data_parallel_rank));
  for (const auto& g : groups_) text.push_back("param group " + describe(g));
  uint64_t digest = 0;
  for (const auto& t : text) digest = fnv1a(t, digest ^ 0x9e3779b97f4a7c15ull);
  enum { kFailedRank, kDigest, kDigestNeg, kCount };
  int64_t v[kCount];
  v[kFailedRank] = local == nullptr ? INT64_MAX : group.rank();
  v[kDigest] = static_cast<int64_t>(digest >> 1), v[kDigestNeg] = -v[kDigest];
  const char* label = "zero_engine_finalize: the model-parallel group's settings";
  group.control_min(v, kCount, label);
  if (v[kFailedRank] != INT64_MAX) {
    const int root = static_cast<int>(v[kFailedRank]);
    int64_t status = local != nullptr ? local->status() : ZERO_OK;
    group.control_broadcast(&status, sizeof status, root, label);
    const std::string message = group.broadcast_text(local != nullptr ? local->what() : "", root, label);
    if (local != nullptr) throw *local;
    fail(ZERO_ERR_REMOTE, "model-parallel rank " + std::to_string(root) + " failed in zero_engine_finalize (" +
                              status_name(static_cast<zero_status_t>(status)) + "): " + message);
  }
  if (v[kDigest] == -v[kDigestNeg]) return;
  Difference d = first_difference(group, text, "model-parallel setting");
  fail(ZERO_ERR_MISMATCH,
       "zero_engine_finalize: the model-parallel ranks of one model replica must step alike, "
       "but model-parallel rank 0 has " +
           d.on_root + " and model-parallel rank " + std::to_string(d.rank) + " has " + d.on_rank +
           " (the config, the param groups and the data-parallel size must be the same on every rank of the job, and a "
           "model-parallel group's ranks must have one data-parallel rank: the groups form a grid)");
}

}  // namespace zero
