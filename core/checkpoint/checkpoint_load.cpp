// zero_load_checkpoint (docs/checkpoint-format.md): every rank reads the manifest of its part, checks it matches the
// registered params, verifies a 1/N share of the files' sizes and checksums, reads exactly the element ranges it now
// owns (whatever the saved rank count and stage) into staging buffers, and only when every rank succeeded commits
// them. The shards in the files are always the saved world's equal partition of each unit, so the format does not
// depend on the stage.
#include <cmath>
#include <cstring>
#include <memory>

#include "checkpoint/checkpointer.hpp"
#include "checkpoint/file_io.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/safetensors.hpp"
#include "memory/ops.hpp"
#include "util/error.hpp"
#include "util/log.hpp"
#include "util/test_hooks.hpp"

namespace zero {

using ckpt::Manifest;

std::string Checkpointer::part_to_load(const std::string& dir, const std::string& tag) const {
  const std::string whole = dir + "/" + tag, first_part = whole + "/" + ckpt::model_parallel_dir_name(0);
  const int size = model_parallel_size();
  auto refuse = [&](int saved) {
    guard_.fail(ZERO_ERR_MISMATCH, "checkpoint '" + whole + "' was saved with model-parallel size " +
                                       std::to_string(saved) + ", this job has model-parallel size " +
                                       std::to_string(size) +
                                       " (checkpoints reshard along the data-parallel dimension only)");
  };
  if (ckpt::path_exists(whole + "/manifest.json") || !ckpt::path_exists(first_part + "/manifest.json")) {
    if (size > 1 && ckpt::path_exists(whole + "/manifest.json")) refuse(1);
    return whole;  // without a manifest, reading it says what is missing
  }
  const int saved = ckpt::read_manifest(first_part).model_parallel_size;
  if (saved != size) refuse(saved);
  return whole + "/" + ckpt::model_parallel_dir_name(model_parallel_rank());
}

void Checkpointer::load(const std::string& dir, const std::string& tag_in, bool backward_started) {
  const int rank = comm_.rank(), world = comm_.size();
  const std::vector<ParamShape>& params = registration_.params();
  {
    // 1. The call's preconditions, the manifest, and whether it fits what this engine registered; every rank must
    //    have read the same manifest (the same checkpoint: a digest of its text).
    Manifest m;
    std::string path, manifest_text;
    CollectiveCall first(guard_, CallKind::kLoadCheckpoint);
    first.check([&] { guard_.require(CallGuard::State::kReady); });
    first.check([&] {
      if (dir.empty()) guard_.fail(ZERO_ERR_INVALID_ARGUMENT, "dir is NULL or empty");
      require_step_boundary(backward_started);
      test_hooks::maybe_fail("load", rank);
      std::string tag = tag_in;
      if (tag.empty()) {
        const std::string latest = dir + "/latest";
        if (!ckpt::path_exists(latest))
          guard_.fail(ZERO_ERR_CHECKPOINT_CORRUPT,
                      std::string("'") + latest + "' does not exist (no checkpoint saved in '" + dir + "'?)");
        tag = ckpt::read_text_file(latest);
        while (!tag.empty() && (tag.back() == '\n' || tag.back() == ' ')) tag.pop_back();
        const std::string problem = ckpt::tag_problem(tag);
        if (!problem.empty())
          guard_.fail(ZERO_ERR_CHECKPOINT_CORRUPT, "'" + latest + "' names no checkpoint: " + problem);
      }
      check_tag(tag);
      path = part_to_load(dir, tag);
      m = ckpt::read_manifest(path, &manifest_text);
      if (m.model_parallel_size != model_parallel_size() || m.model_parallel_rank != model_parallel_rank())
        guard_.fail(ZERO_ERR_CHECKPOINT_CORRUPT,
                    "the manifest of '" + path + "' is model-parallel rank " + std::to_string(m.model_parallel_rank) +
                        " of " + std::to_string(m.model_parallel_size) + ", where model-parallel rank " +
                        std::to_string(model_parallel_rank()) + " of " + std::to_string(model_parallel_size()) +
                        " belongs");
      if (m.params.size() != params.size())
        guard_.fail(ZERO_ERR_MISMATCH, std::string("the checkpoint has ") + std::to_string(m.params.size()) +
                                           " params, this engine registered " + std::to_string(params.size()));
      auto shape_text = [](const std::vector<int64_t>& dims) {
        std::string t = "[";
        for (size_t i = 0; i < dims.size(); ++i) t += (i ? ", " : "") + std::to_string(dims[i]);
        return t + "]";
      };
      for (size_t p = 0; p < params.size(); ++p) {
        const ckpt::ManifestParam& mp = m.params[p];
        std::string differs;
        if (mp.name != params[p].name)
          differs = "name '" + mp.name + "' in the checkpoint, '" + params[p].name + "' in this engine";
        else if (mp.shape != params[p].dims)
          differs =
              "shape " + shape_text(mp.shape) + " in the checkpoint, " + shape_text(params[p].dims) + " in this engine";
        else if (mp.unit != params[p].unit)
          differs = "unit " + std::to_string(mp.unit) + " in the checkpoint, " + std::to_string(params[p].unit) +
                    " in this engine";
        else if (mp.frozen != params[p].frozen)
          differs = std::string(mp.frozen ? "frozen" : "trained") + " in the checkpoint, " +
                    (params[p].frozen ? "frozen" : "trained") +
                    " in this engine (whether a param trains is fixed at registration)";
        else if (mp.frozen && mp.dtype != stored_name(params[p].stored))
          differs = "dtype " + mp.dtype + " in the checkpoint, " + stored_name(params[p].stored) + " in this engine";
        else if (mp.offset_in_unit != store_.layout().params[p].offset)
          differs = "its place in the unit (the params before it differ)";
        if (!differs.empty())
          guard_.fail(ZERO_ERR_MISMATCH, std::string("param #") + std::to_string(p) + " '" + params[p].name +
                                             "': " + differs + "; register the same params in the same order");
      }
      if (m.optimizer != optimizer_name(config_.optimizer.kind))
        guard_.fail(ZERO_ERR_MISMATCH, std::string("the checkpoint holds ") + m.optimizer +
                                           " state, this engine runs " + optimizer_name(config_.optimizer.kind));
      if (m.groups.size() != registration_.groups().size())
        guard_.fail(ZERO_ERR_MISMATCH, std::string("the checkpoint has ") + std::to_string(m.groups.size()) +
                                           " param groups, this engine " +
                                           std::to_string(registration_.groups().size()));
      if (m.units.size() != static_cast<size_t>(store_.num_units()))
        guard_.fail(ZERO_ERR_MISMATCH, std::string("the checkpoint has ") + std::to_string(m.units.size()) +
                                           " units, this engine " +
                                           std::to_string(static_cast<size_t>(store_.num_units())));
      for (int r = 0; r < m.world_size; ++r)
        for (const char* kind : {"master", "optimizer", "frozen"})
          if (m.file(kind, r) == nullptr && (std::string(kind) != "frozen" || (m.has_frozen() && m.frozen_saved)))
            guard_.fail(ZERO_ERR_CHECKPOINT_CORRUPT, std::string("the manifest of '") + path + "' lists no " + kind +
                                                         " file for rank " + std::to_string(r));
    });
    // The parts of a model-parallel job differ in their manifests, not in the save they come from.
    const std::string save = m.tag + '\0' + std::to_string(m.step) + '\0' + std::to_string(m.world_size) + '\0' +
                             exact_decimal(m.loss_scale) + '\0' + std::to_string(m.scaler_iteration);
    first.agree(static_cast<int64_t>(CheckpointPhase::kLoadManifest), 0, first.failed() ? 0 : digest(manifest_text),
                explain_difference("loads '" + path + "' (step " + std::to_string(m.step) + ")"), true,
                first.failed() ? 0 : digest(save));

    // 2. Sizes and checksums, each rank verifying every world-th file, before anything is read.
    std::unique_ptr<Error> error = attempt([&] {
      for (size_t i = static_cast<size_t>(rank); i < m.files.size(); i += static_cast<size_t>(world)) {
        const ckpt::ManifestFile& f = m.files[i];
        const std::string file_path = path + "/" + f.name;
        if (!ckpt::path_exists(file_path))
          fail(ZERO_ERR_CHECKPOINT_CORRUPT, "checkpoint file '" + file_path + "' is missing");
        const ckpt::FileDigest d = ckpt::digest_file(file_path);
        if (d.bytes != f.bytes)
          fail(ZERO_ERR_CHECKPOINT_CORRUPT, "checkpoint file '" + file_path + "' has " + std::to_string(d.bytes) +
                                                " bytes, the manifest says " + std::to_string(f.bytes) +
                                                " (truncated?)");
        if (d.xxh64 != f.xxh64)
          fail(ZERO_ERR_CHECKPOINT_CORRUPT, "checkpoint file '" + file_path + "' fails its checksum (xxh64 " +
                                                ckpt::hex64(d.xxh64) + ", manifest " + ckpt::hex64(f.xxh64) + ")");
      }
    });
    agree_phase(CallKind::kLoadCheckpoint, CheckpointPhase::kLoadVerify, std::move(error));

    // 3. This rank's element ranges, from whichever saved shards hold them, into staging buffers.
    const int n_states = state_count(config_.optimizer);
    const bool load_params = config_.stochastic_rounding && m.file("params", 0) != nullptr &&
                             m.param_dtype == dtype_name(config_.compute_dtype);
    std::vector<std::vector<float>> master(static_cast<size_t>(store_.num_units()));
    std::vector<std::vector<std::vector<float>>> states(static_cast<size_t>(store_.num_units()));
    std::vector<std::vector<uint16_t>> params16(static_cast<size_t>(store_.num_units()));
    // The frozen bytes this rank keeps of each unit, unless the checkpoint left them out (the engine's stay).
    const bool load_frozen = m.has_frozen() && m.frozen_saved;
    std::vector<std::vector<char>> frozen(static_cast<size_t>(store_.num_units()));
    // An offloaded engine streams what lives in its file into a new file of the same layout, a piece at a time,
    // instead of staging it in memory (which may not hold it).
    std::unique_ptr<io::NvmeState> incoming;
    const std::optional<int> master_array = store_.file_array(ShardKind::kMaster);
    std::vector<float> piece;
    error = attempt([&] {
      if (store_.optimizer_on_nvme()) {
        incoming = store_.new_optimizer_file();
        piece.resize(size_t{1} << 20);
      }
      // Elements [lo, hi) of unit u from saved rank k's tensor `name` at byte `offset`, into `array` of the
      // incoming file (elements from `begin`), through `piece`.
      auto stream = [&](ckpt::SafetensorsReader& r, const std::string& name, uint64_t offset, size_t u, int array,
                        uint64_t lo, uint64_t hi, uint64_t begin) {
        for (uint64_t at = lo; at < hi; at += piece.size()) {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(piece.size(), hi - at));
          r.read(name, offset + (at - lo) * 4, piece.data(), n * 4);
          incoming->write(static_cast<int>(u), array, at - begin, piece.data(), n);
        }
      };
      std::vector<std::unique_ptr<ckpt::SafetensorsReader>> readers(kShardKinds * static_cast<size_t>(m.world_size));
      auto reader = [&](int kind, int r) -> ckpt::SafetensorsReader& {
        auto& slot = readers[static_cast<size_t>(kShardKinds * r + kind)];
        if (!slot) slot = std::make_unique<ckpt::SafetensorsReader>(path + "/" + m.file(kShardKind[kind], r)->name);
        return *slot;
      };
      for (size_t u = 0; u < static_cast<size_t>(store_.num_units()); ++u) {
        const std::string base = "unit." + std::to_string(u);
        if (load_frozen && m.units[u].frozen_shard_bytes > 0) {
          const uint64_t begin = store_.frozen_kept_begin(static_cast<int>(u));
          const uint64_t end = begin + store_.frozen_kept_bytes(static_cast<int>(u));
          const uint64_t old_shard = m.units[u].frozen_shard_bytes;
          frozen[u].assign(static_cast<size_t>(end - begin), 0);
          for (int k = 0; k < m.world_size; ++k) {
            // Beyond the saved padding (more ranks pad further) the bytes stay zero, as padding is.
            const uint64_t lo = std::max(begin, k * old_shard), hi = std::min(end, (k + 1) * old_shard);
            if (lo < hi) reader(3, k).read(base, lo - k * old_shard, frozen[u].data() + (lo - begin), hi - lo);
          }
        }
        if (store_.layout().units[u].shard_elems == 0) continue;  // frozen params only
        const UnitPlan& us = store_.unit_plan(static_cast<int>(u));
        const uint64_t begin = us.update_begin, end = us.update_begin + us.update_elems;
        const uint64_t old_shard = m.units[u].shard_elems;
        if (!master_array) master[u].assign(us.update_elems, 0.0f);
        if (!incoming) states[u].assign(static_cast<size_t>(n_states), std::vector<float>(us.update_elems, 0.0f));
        if (load_params) params16[u].assign(us.update_elems, 0);
        for (int k = 0; k < m.world_size; ++k) {
          const uint64_t lo = std::max(begin, k * old_shard), hi = std::min(end, (k + 1) * old_shard);
          if (lo >= hi) continue;
          const uint64_t offset = (lo - k * old_shard) * 4, n = hi - lo;
          if (!master_array)
            reader(0, k).read(base, offset, master[u].data() + (lo - begin), n * 4);
          else
            stream(reader(0, k), base, offset, u, *master_array, lo, hi, begin);
          for (int s = 0; s < n_states; ++s) {
            const std::string name = base + "." + state_name(config_.optimizer, s);
            if (incoming)
              stream(reader(1, k), name, offset, u, *store_.file_array(state_shard(s)), lo, hi, begin);
            else
              reader(1, k).read(name, offset, states[u][s].data() + (lo - begin), n * 4);
          }
          if (load_params) reader(2, k).read(base, offset / 2, params16[u].data() + (lo - begin), n * 2);
        }
      }
    });
    agree_phase(CallKind::kLoadCheckpoint, CheckpointPhase::kLoadRead, std::move(error));

    // 4. Every rank has what it needs: commit.
    // (Into the NVMe file when the state is offloaded: an I/O failure there leaves the state partly loaded, so it
    // breaks the engine.)
    guard_.moving_data([&] {
      if (incoming) store_.adopt_optimizer_file(std::move(incoming));  // the old file goes
      for (int u = 0; u < store_.num_units(); ++u) {
        if (!frozen[u].empty()) store_.write_frozen_kept(u, frozen[u].data());
        if (store_.layout().units[u].shard_elems == 0) continue;
        if (!master_array) store_.write_updated(u, ShardKind::kMaster, master[u].data());
        if (!store_.optimizer_on_nvme())
          for (int s = 0; s < n_states; ++s) store_.write_updated(u, state_shard(s), states[u][s].data());
      }
    });
    guard_.moving_data([&] {
      store_.write_params_from_master();
      if (!load_params) store_.publish("all-gather of the loaded params");
      if (load_params) {
        for (int u = 0; u < store_.num_units(); ++u) store_.write_params_shard(u, params16[u].data());
        store_.publish("all-gather of the stochastically rounded params");
      }
    });
    stepper_.set_steps(m.step);
    stepper_.restore_scaler(
        LossScaler::State{m.loss_scale, m.hysteresis_left, m.scaler_iteration, m.scaler_last_overflow});
    for (size_t g = 0; g < registration_.groups().size(); ++g)
      registration_.set_base_lr(static_cast<int>(g), m.groups[g].lr);
    if (rank == 0)
      log_message(
          ZERO_LOG_INFO, 0,
          guard_.label("loaded '" + path + "' (step " + std::to_string(m.step) + ", saved by " +
                       std::to_string(m.world_size) + " ranks, loaded by " + std::to_string(comm_.size()) + ")"));
  }
}

}  // namespace zero
