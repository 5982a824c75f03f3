// The checkpointer: zero_save_checkpoint and zero_load_checkpoint (docs/checkpoint-format.md). It reads and writes
// the model states through the parameter store's views (each rank's shard of every unit, whatever the stage), the
// registration (names, shapes, groups) and the stepper (step counter, loss scaler); every phase is a collective
// under the engine's CallGuard, so a failure on one rank is the same news on all of them.
#pragma once

#include <string>
#include <vector>

#include "comm/call_guard.hpp"
#include "comm/engine_comm.hpp"
#include "config/config.hpp"
#include "params/param_store.hpp"
#include "params/registration.hpp"
#include "step/stepper.hpp"

namespace zero {

class Checkpointer {
 public:
  Checkpointer(const Config& config, EngineComm& comm, CallGuard& guard, Registration& registration,
               ParameterStore& store, Stepper& stepper)
      : config_(config), comm_(comm), guard_(guard), registration_(registration), store_(store), stepper_(stepper) {}

  // Collective. `micro_steps` since the last zero_step must be 0 and no micro-step begun (`backward_started`: a
  // gradient asked for or declared since the last zero_backward_end): checkpoints are taken between steps.
  void save(const std::string& dir, const std::string& tag, int64_t micro_steps, bool backward_started);
  void load(const std::string& dir, const std::string& tag, int64_t micro_steps, bool backward_started);

 private:
  void agree_phase(const char* call, CallKind kind, int phase, const Error* local, int64_t check = 0,
                   const std::string& what = "");
  void require_step_boundary(const char* call, int64_t micro_steps, bool backward_started) const;
  void write_shard_files(const std::string& dir, std::vector<int64_t>& record);
  void write_consolidated(const std::string& path, uint64_t& bytes, uint64_t& xxh64);

  const Config& config_;
  EngineComm& comm_;
  CallGuard& guard_;
  Registration& registration_;
  ParameterStore& store_;
  Stepper& stepper_;
};

}  // namespace zero
