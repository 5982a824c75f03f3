// The checkpointer: zero_save_checkpoint and zero_load_checkpoint (docs/checkpoint-format.md). It reads and writes
// the model states through the parameter store's views (each rank's shard of every unit, whatever the stage), the
// registration (names, shapes, groups) and the stepper (step counter, loss scaler); every phase is a collective
// under the engine's CallGuard, so a failure on one rank is the same news on all of them.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/call_guard.hpp"
#include "comm/engine_comm.hpp"
#include "config/config.hpp"
#include "params/param_store.hpp"
#include "params/registration.hpp"
#include "plan/micro_step_window.hpp"
#include "step/stepper.hpp"

namespace zero {

// The agreements of a save and a load, in order (their ids in the agreement, and in a divergence's message).
enum class CheckpointPhase : int64_t {
  kSaveBegin = 0,          // the call's checks; every rank saves to the same place
  kSaveDirectory = 1,      // rank 0 made the temporary directory
  kSaveShards = 2,         // every rank wrote and synced its shard files
  kSaveManifest = 3,       // rank 0 wrote the manifest and moved the directory into place
  kSaveParts = 4,          // with a model-parallel group: every part's manifest is written (before the move)
  kConsolidatedOpen = 10,  // rank 0 opened the consolidated weights' file
  kConsolidatedDone = 11,  // every unit was gathered and written
  kLoadManifest = 0,       // the call's checks, the manifest, its fit with the registration; the same checkpoint
  kLoadVerify = 1,         // sizes and checksums of every file
  kLoadRead = 2,           // every rank read its element ranges
};

// The kinds of shard file, in the order of a rank's record of sizes and checksums.
constexpr int kShardKinds = 4;
inline constexpr const char* kShardKind[kShardKinds] = {"master", "optimizer", "params", "frozen"};

class Checkpointer {
 public:
  Checkpointer(const Config& config, EngineComm& comm, CallGuard& guard, Registration& registration,
               ParameterStore& store, Stepper& stepper, const MicroStepWindow& window)
      : config_(config),
        comm_(comm),
        guard_(guard),
        registration_(registration),
        store_(store),
        stepper_(stepper),
        window_(window) {}

  // Collective, between steps: no micro-step of the window ended and none begun (`backward_started`: a gradient
  // asked for or declared since the last zero_backward_end).
  // `exclude_frozen`: the frozen params' bytes are left out (zero_save_options_t.exclude_frozen).
  void save(const std::string& dir, const std::string& tag, bool backward_started, bool exclude_frozen = false);
  void load(const std::string& dir, const std::string& tag, bool backward_started);

 private:
  EngineComm::ExplainCheck explain_difference(const std::string& what);
  void agree_phase(CallKind kind, CheckpointPhase phase, std::unique_ptr<Error> local);
  void require_step_boundary(bool backward_started) const;
  void check_tag(const std::string& tag) const;
  std::unique_ptr<Error> attempt(const std::function<void()>& body) const;
  static int64_t digest(const std::string& text);
  int model_parallel_size() const { return guard_.model_parallel() ? guard_.model_parallel()->size() : 1; }
  int model_parallel_rank() const { return guard_.model_parallel() ? guard_.model_parallel()->rank() : 0; }
  // Where this rank's part of checkpoint `dir`/`tag` is (the tag's directory, or its mp_rank_XX), checked against
  // the layout the checkpoint has: a checkpoint of another model-parallel size is ZERO_ERR_MISMATCH naming both.
  std::string part_to_load(const std::string& dir, const std::string& tag) const;
  void write_shard_files(const std::string& dir, bool with_frozen, std::vector<int64_t>& record);
  bool has_frozen() const;
  void write_consolidated(const std::string& path, uint64_t& bytes, uint64_t& xxh64);

  const Config& config_;
  EngineComm& comm_;
  CallGuard& guard_;
  Registration& registration_;
  ParameterStore& store_;
  Stepper& stepper_;
  const MicroStepWindow& window_;
};

}  // namespace zero
