// Sharded checkpoints (docs/checkpoint-format.md): what save and load share, and the save (the load is
// checkpoint_load.cpp).
//
// Save: every rank writes its shard of every unit (the fp32 master, and the optimizer state by name) into a
// temporary directory, fsyncs, and reports sizes and XXH64 checksums; rank 0 then writes the manifest, renames the
// directory into place and atomically updates `latest`. A failure anywhere (or a killed rank) leaves the previous
// checkpoint and `latest` untouched. With a model-parallel group, each of its ranks' data-parallel group saves its
// part in TAG/mp_rank_XX, and the job's first rank moves TAG into place once every part is written.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpointer.hpp"
#include "checkpoint/file_io.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/safetensors.hpp"
#include "memory/ops.hpp"
#include "util/error.hpp"
#include "util/log.hpp"
#include "util/test_hooks.hpp"
#include "zero/zero_version.h"

namespace zero {

using ckpt::Manifest;

int64_t Checkpointer::digest(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h >> 1);
}

void Checkpointer::check_tag(const std::string& tag) const {
  const std::string problem = ckpt::tag_problem(tag);
  if (!problem.empty()) guard_.fail(ZERO_ERR_INVALID_ARGUMENT, problem);
}

std::unique_ptr<Error> Checkpointer::attempt(const std::function<void()>& body) const {
  return capture_error(guard_.call(), body);
}

// On a difference in what every rank must agree on (where it saves, which checkpoint it loaded), every rank learns
// each rank's `what`.
EngineComm::ExplainCheck Checkpointer::explain_difference(const std::string& what) {
  return [this, what](EngineComm& ranks) {
    std::string text = guard_.label("the ranks do not agree on the checkpoint:");
    for (int r = 0; r < ranks.size(); ++r)
      text += (r ? "; " : " ") + ranks.rank_name() + " " + std::to_string(r) + " " +
              ranks.broadcast_text(what, r, guard_.label("what each rank has"));
    return text + ". Every rank must save to the same directory and tag, and load the same checkpoint.";
  };
}

// A checkpoint phase's agreement: a failure on one rank (a file it cannot write or read) is the same news for all,
// so every rank reports that rank's status (EngineComm::agree's share_status).
void Checkpointer::agree_phase(CallKind kind, CheckpointPhase phase, std::unique_ptr<Error> local) {
  CollectiveCall c(guard_, kind);
  c.check_failed(std::move(local));
  c.agree(static_cast<int64_t>(phase), 0, 0, {}, true);
}

void Checkpointer::require_step_boundary(bool backward_started) const {
  if (window_.ended() != 0)
    guard_.fail(ZERO_ERR_INVALID_STATE, std::to_string(window_.ended()) +
                                            " micro-steps have run since the last zero_step; save and load between "
                                            "steps");
  // A micro-step begun (its gradients in buckets, reductions in flight) would be left half-done by a load.
  if (backward_started)
    guard_.fail(ZERO_ERR_INVALID_STATE,
                "a micro-step has begun (zero_grad_data or zero_grad_ready since the last zero_backward_end); finish "
                "it with zero_backward_end and zero_step first");
  const int u = store_.first_gathered();
  if (u >= 0)
    guard_.fail(ZERO_ERR_INVALID_STATE, "unit " + std::to_string(u) + " is gathered; release every unit first");
}

bool Checkpointer::has_frozen() const {
  for (const UnitLayout& ul : store_.layout().units)
    if (ul.has_frozen()) return true;
  return false;
}

// This rank's files: shard `rank` of every unit. Fills record = [bytes, xxh64] of each kind: master, optimizer,
// params (only with stochastic rounding, whose bf16 copy is not a function of the master), frozen (the frozen
// params' bytes, unless left out).
void Checkpointer::write_shard_files(const std::string& dir, bool with_frozen, std::vector<int64_t>& record) {
  const int rank = comm_.rank(), world = comm_.size();

  const int n_states = state_count(config_.optimizer);
  auto write_file = [&](const std::string& kind, std::vector<ckpt::TensorInfo> tensors, auto&& write_data, int slot) {
    ckpt::SafetensorsWriter w(dir + "/" + ckpt::shard_file_name(kind, rank, world), std::move(tensors),
                              {{"format", ckpt::kFormatName}, {"kind", kind}});
    if (test_hooks::active("save.enospc", rank))
      fail(ZERO_ERR_IO, "cannot write '" + w.file().path() + "': " + std::strerror(ENOSPC) + " (test hook)");
    write_data(w);
    w.finish();
    record[2 * slot] = static_cast<int64_t>(w.file().bytes_written());
    record[2 * slot + 1] = static_cast<int64_t>(w.file().xxh64());
  };
  const Layout& layout = store_.layout();
  const int units = store_.num_units();
  const size_t compute_size = dtype_size(config_.compute_dtype);
  std::vector<ckpt::TensorInfo> master_tensors, state_tensors, param_tensors, frozen_tensors;
  for (int u = 0; u < units; ++u) {
    const uint64_t shard = layout.units[u].shard_elems;
    const std::string base = "unit." + std::to_string(u);
    if (layout.units[u].has_frozen())
      frozen_tensors.push_back({base,
                                "U8",
                                {static_cast<int64_t>(layout.units[u].frozen_shard_bytes)},
                                0,
                                layout.units[u].frozen_shard_bytes});
    if (shard == 0) continue;  // frozen params only
    master_tensors.push_back({base, "F32", {static_cast<int64_t>(shard)}, 0, shard * 4});
    for (int s = 0; s < n_states; ++s)
      state_tensors.push_back(
          {base + "." + state_name(config_.optimizer, s), "F32", {static_cast<int64_t>(shard)}, 0, shard * 4});
    param_tensors.push_back(
        {base, ckpt::safetensors_dtype(config_.compute_dtype), {static_cast<int64_t>(shard)}, 0, shard * compute_size});
  }
  write_file(
      "master", master_tensors,
      [&](ckpt::SafetensorsWriter& w) {
        for (int u = 0; u < units; ++u)
          if (layout.units[u].shard_elems > 0)
            store_.read_shard(u, ShardKind::kMaster, [&](const void* p, size_t n) { w.write(p, n); });
      },
      0);
  write_file(
      "optimizer", state_tensors,
      [&](ckpt::SafetensorsWriter& w) {
        for (int u = 0; u < units; ++u)
          for (int s = 0; s < n_states && layout.units[u].shard_elems > 0; ++s)
            store_.read_shard(u, state_shard(s), [&](const void* p, size_t n) { w.write(p, n); });
      },
      1);
  if (config_.stochastic_rounding) {
    write_file(
        "params", param_tensors,
        [&](ckpt::SafetensorsWriter& w) {
          for (int u = 0; u < units; ++u)
            if (layout.units[u].shard_elems > 0)
              store_.read_params_shard(u, [&](const void* p, size_t n) { w.write(p, n); });
        },
        2);
  }
  if (with_frozen) {
    write_file(
        "frozen", frozen_tensors,
        [&](ckpt::SafetensorsWriter& w) {
          for (int u = 0; u < units; ++u)
            if (layout.units[u].has_frozen())
              store_.read_frozen_shard(u, [&](const void* p, size_t n) { w.write(p, n); });
        },
        3);
  }
  if (test_hooks::active("save.kill", rank)) ::_exit(9);  // die after writing, before the save completes
}

// The whole model in the compute dtype, one tensor per param, streamed one unit at a time (stage 3 gathers each
// unit; rank 0 writes). Collective.
void Checkpointer::write_consolidated(const std::string& path, uint64_t& bytes, uint64_t& xxh64) {
  const Layout& layout = store_.layout();
  const size_t compute_size = dtype_size(config_.compute_dtype);
  std::unique_ptr<ckpt::SafetensorsWriter> w;
  std::unique_ptr<Error> error;
  if (comm_.rank() == 0) {
    error = attempt([&] {
      std::vector<ckpt::TensorInfo> tensors;
      for (const UnitLayout& ul : layout.units) {
        for (int p : ul.params)
          tensors.push_back({registration_.param(p).name, ckpt::safetensors_dtype(config_.compute_dtype),
                             registration_.param(p).dims, 0, layout.params[p].numel * compute_size});
        for (int p : ul.frozen_params)  // in their own dtype, as they are
          tensors.push_back({registration_.param(p).name, stored_safetensors_dtype(registration_.param(p).stored),
                             registration_.param(p).dims, 0, layout.params[p].bytes});
      }
      w = std::make_unique<ckpt::SafetensorsWriter>(
          path, tensors, std::map<std::string, std::string>{{"format", "pt"}, {"producer", "libzero"}});
    });
  }
  agree_phase(CallKind::kSaveCheckpoint, CheckpointPhase::kConsolidatedOpen, std::move(error));
  for (int u = 0; u < store_.num_units(); ++u) {
    store_.gather(u);
    if (comm_.rank() == 0 && !error)
      error = attempt([&] {
        const MemorySpace space = store_.gathered_space(u);
        auto write = [&](const void* p, size_t n) { w->write(p, n); };
        for (int p : layout.units[u].params)
          store_.sink_bytes(space, static_cast<char*>(store_.gathered(u)) + layout.params[p].offset * compute_size,
                            layout.params[p].numel * compute_size, write);
        for (int p : layout.units[u].frozen_params)
          store_.sink_bytes(space, static_cast<char*>(store_.gathered_frozen(u)) + layout.params[p].offset,
                            layout.params[p].bytes, write);
      });
    store_.release(u);
  }
  if (comm_.rank() == 0 && !error) error = attempt([&] { w->finish(); });
  agree_phase(CallKind::kSaveCheckpoint, CheckpointPhase::kConsolidatedDone, std::move(error));
  if (comm_.rank() == 0) bytes = w->file().bytes_written(), xxh64 = w->file().xxh64();
}

void Checkpointer::save(const std::string& dir, const std::string& tag, bool backward_started, bool exclude_frozen) {
  const int rank = comm_.rank(), world = comm_.size();
  const bool frozen = has_frozen(), with_frozen = frozen && !exclude_frozen;
  const std::string final_dir = dir + "/" + tag, tmp_dir = dir + "/.tmp." + tag;
  // With a model-parallel group, each of its ranks' parts in a directory of its own inside the tag's; the job's first
  // rank makes the tag's directory and moves it into place.
  const int mp_size = model_parallel_size(), mp_rank = model_parallel_rank();
  const bool job_root = rank == 0 && mp_rank == 0;
  const std::string part_dir = mp_size > 1 ? tmp_dir + "/" + ckpt::model_parallel_dir_name(mp_rank) : tmp_dir;
  {
    // 0. Every rank checks the call — its state, arguments and step boundary — and that all ranks save to the same
    //    place (a rank whose call is wrong must not leave the others waiting), 1. rank 0 prepares a fresh
    //    temporary directory next to the final one.
    CollectiveCall first(guard_, CallKind::kSaveCheckpoint);
    first.check([&] {
      guard_.require(CallGuard::State::kReady);
      if (dir.empty()) guard_.fail(ZERO_ERR_INVALID_ARGUMENT, "dir is NULL or empty");
      require_step_boundary(backward_started);
      check_tag(tag);
      test_hooks::maybe_fail("save", rank);
    });
    first.agree(
        static_cast<int64_t>(CheckpointPhase::kSaveBegin), 0, digest(dir + '\0' + tag + (exclude_frozen ? "\1" : "")),
        explain_difference("saves to '" + final_dir + "'" + (exclude_frozen ? " without the frozen params" : "")),
        true);
    std::unique_ptr<Error> error;
    if (job_root)
      error = attempt([&] {
        ckpt::make_directories(dir);
        if (ckpt::path_exists(final_dir))
          guard_.fail(ZERO_ERR_INVALID_ARGUMENT, "checkpoint '" + final_dir +
                                                     "' already exists; choose a new tag (checkpoints are never "
                                                     "overwritten)");
        ckpt::remove_tree(tmp_dir);
        ckpt::make_directories(tmp_dir);
        for (int r = 0; mp_size > 1 && r < mp_size; ++r)
          ckpt::make_directories(tmp_dir + "/" + ckpt::model_parallel_dir_name(r));
      });
    agree_phase(CallKind::kSaveCheckpoint, CheckpointPhase::kSaveDirectory, std::move(error));

    // 2. Every rank writes and syncs its shard files; the sizes and checksums go to every rank.
    constexpr size_t kRecord = 2 * kShardKinds;
    std::vector<int64_t> record(kRecord, 0);
    try {
      agree_phase(CallKind::kSaveCheckpoint, CheckpointPhase::kSaveShards,
                  attempt([&] { write_shard_files(part_dir, with_frozen, record); }));
    } catch (const Error&) {
      if (job_root) ckpt::remove_tree(tmp_dir);
      throw;
    }
    std::vector<int64_t> records(kRecord * static_cast<size_t>(world), 0);
    std::memcpy(records.data() + kRecord * rank, record.data(), kRecord * sizeof(int64_t));
    comm_.control_all_gather(records.data(), kRecord * sizeof(int64_t), guard_.label("file sizes and checksums"));

    // 3. Optionally the consolidated weights, unit by unit.
    uint64_t consolidated_bytes = 0, consolidated_xxh = 0;
    try {
      if (config_.gather_16bit_weights_on_save)
        write_consolidated(part_dir + "/model.safetensors", consolidated_bytes, consolidated_xxh);
    } catch (const Error&) {
      if (job_root) ckpt::remove_tree(tmp_dir);
      throw;
    }

    // 4. Rank 0: the manifest (with its checksum), then the directory moves into place atomically. Until the
    //    rename, a failure leaves nothing behind.
    bool renamed = false;
    if (rank == 0)
      error = attempt([&] {
        Manifest m;
        m.library_version = ZERO_VERSION_STRING;
        m.tag = tag;
        m.world_size = world;
        m.stage = store_.plan().stage;
        m.step = stepper_.steps();
        m.param_dtype = dtype_name(config_.compute_dtype);
        m.optimizer = optimizer_name(config_.optimizer.kind);
        for (int s = 0; s < state_count(config_.optimizer); ++s)
          m.state_names.push_back(state_name(config_.optimizer, s));
        const LossScaler::State ls = stepper_.scaler_state();
        m.loss_scale = ls.scale;
        m.hysteresis_left = ls.hysteresis_left;
        m.scaler_iteration = ls.iteration;
        m.scaler_last_overflow = ls.last_overflow_iteration;
        for (const GroupSpec& g : registration_.groups())
          m.groups.push_back({g.name, g.base_lr, g.hyper.weight_decay, g.hyper.beta1, g.hyper.beta2, g.hyper.eps});
        const Layout& layout = store_.layout();
        for (int u = 0; u < store_.num_units(); ++u) {
          const UnitLayout& ul = layout.units[u];
          ckpt::ManifestUnit mu;
          mu.index = u;
          mu.padded_elems = ul.padded_elems;
          mu.shard_elems = ul.shard_elems;
          mu.global_offset = store_.unit_plan(u).global_offset;
          mu.frozen_padded_bytes = ul.frozen_padded_bytes;
          mu.frozen_shard_bytes = ul.frozen_shard_bytes;
          m.units.push_back(mu);
        }
        for (int p = 0; p < registration_.num_params(); ++p) {
          const ParamPlacement& pl = layout.params[p];
          const ParamShape& shape = registration_.param(p);
          ckpt::ManifestParam mp;
          mp.name = shape.name;
          mp.shape = shape.dims;
          mp.unit = pl.unit;
          mp.group = shape.group;
          mp.offset_in_unit = pl.offset;
          mp.numel = pl.numel;
          mp.global_offset = pl.frozen ? 0 : store_.unit_plan(pl.unit).global_offset + pl.offset;
          if (pl.frozen) {
            mp.frozen = true;
            mp.dtype = stored_name(shape.stored);
            mp.bytes = pl.bytes;
          }
          m.params.push_back(mp);
        }
        m.frozen_saved = with_frozen;
        for (int r = 0; r < world; ++r)
          for (int k = 0; k < kShardKinds; ++k) {
            if ((k == 2 && !config_.stochastic_rounding) || (k == 3 && !with_frozen)) continue;
            m.files.push_back({ckpt::shard_file_name(kShardKind[k], r, world), kShardKind[k], r,
                               static_cast<uint64_t>(records[kRecord * r + 2 * k]),
                               static_cast<uint64_t>(records[kRecord * r + 2 * k + 1])});
          }
        if (config_.gather_16bit_weights_on_save)
          m.files.push_back({"model.safetensors", "consolidated", -1, consolidated_bytes, consolidated_xxh});
        m.config_json = config_.source_json;
        m.model_parallel_size = mp_size;
        m.model_parallel_rank = mp_rank;
        if (test_hooks::active("save.manifest-enospc", rank))
          fail(ZERO_ERR_IO, "cannot write '" + part_dir + "/manifest.json': " + std::strerror(ENOSPC) + " (test hook)");
        ckpt::write_manifest(part_dir, m);
        ckpt::fsync_directory(part_dir);
      });
    if (mp_size > 1) {
      // Every part's manifest is written before the tag's directory moves into place.
      try {
        agree_phase(CallKind::kSaveCheckpoint, CheckpointPhase::kSaveParts, std::move(error));
      } catch (const Error&) {
        if (job_root) ckpt::remove_tree(tmp_dir);
        throw;
      }
    }
    if (job_root && !error)
      error = attempt([&] {
        ckpt::fsync_directory(tmp_dir);
        ckpt::rename_path(tmp_dir, final_dir);
        renamed = true;
        ckpt::fsync_directory(dir);
      });
    if (job_root && error && !renamed) ckpt::remove_tree(tmp_dir);
    // 5. `latest`, before the agreement so that no rank returns before it names the new checkpoint. The
    //    checkpoint is complete and loadable by its tag whatever happens now, so a failure to point `latest` at it
    //    (a full disk) is reported, not returned as a failed save.
    if (job_root && renamed) {
      std::unique_ptr<Error> latest_error = attempt([&] {
        if (test_hooks::active("save.latest-enospc", rank))
          fail(ZERO_ERR_IO, "cannot write '" + dir + "/latest': " + std::strerror(ENOSPC) + " (test hook)");
        ckpt::write_text_file_atomically(dir + "/latest", tag + "\n");
      });
      if (latest_error)
        log_message(
            ZERO_LOG_ERROR, rank,
            guard_.label("checkpoint '" + final_dir + "' is complete, but '" + dir + "/latest' could not be updated (" +
                         latest_error->what() + "); it still names the previous checkpoint: load this one by its tag"),
            true);
    }
    agree_phase(CallKind::kSaveCheckpoint, CheckpointPhase::kSaveManifest, std::move(error));
    if (rank == 0)
      log_message(ZERO_LOG_INFO, 0,
                  guard_.label("saved '" + final_dir + "' (step " + std::to_string(stepper_.steps()) + ", " +
                               std::to_string(comm_.size()) + " ranks)"));
  }
}

}  // namespace zero
