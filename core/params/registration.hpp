// Registration: the params and param groups a framework declares before zero_engine_finalize, their initial
// values, and finalize's agreement that every rank registered the same ones from the same config
// (registration_check.cpp). Once finalized, the registration is read-only except for the groups' learning rates.
#pragma once

#include <string>
#include <vector>

#include "comm/engine_comm.hpp"
#include "config/config.hpp"
#include "kernels/optimizer.hpp"
#include "plan/layout.hpp"

namespace zero {

struct GroupSpec {
  std::string name;
  OptimizerHyper hyper;
  double base_lr = 0.0;  // the configured rate; a scheduler derives each step's rate from it
};

struct ParamInit {
  const void* data = nullptr;
  DType dtype = DType::kF32;
};

class Registration {
 public:
  explicit Registration(const OptimizerHyper& config_optimizer);

  int add_group(const std::string& name, double lr, double weight_decay, double beta1, double beta2, double eps);
  int add_param(ParamShape shape, ParamInit init);

  const std::vector<ParamShape>& params() const { return params_; }
  const ParamShape& param(int p) const { return params_[p]; }
  int num_params() const { return static_cast<int>(params_.size()); }
  const std::vector<GroupSpec>& groups() const { return groups_; }
  const ParamInit& init(int p) const { return init_[p]; }
  // After finalize moved the initial values: the caller's pointers are no longer needed, nor valid.
  void forget_initial_values() { init_.assign(init_.size(), ParamInit{}); }
  // Empty when `param` is a registered id, else what is wrong with it.
  std::string unknown_param(int param) const;

  // zero_set_lr (group -1: every group) and checkpoint loading.
  void set_base_lr(int group, double lr);

  // finalize: every rank exchanges digests of its registration and config, and on a difference every rank learns
  // which param, group or config key differs and what each side has (ZERO_ERR_MISMATCH). `local_error` is this
  // rank's failure so far (or null): it reaches every rank (ZERO_ERR_REMOTE on the others). Returns the layout.
  Layout agree_across_ranks(EngineComm& comm, const Config& config, const Error* local_error) const;
  // finalize, with a model-parallel group: its ranks check that they step alike (the config, the param groups and
  // `data_parallel_size`) and form a grid with the data-parallel groups (one `data_parallel_rank`); a difference is
  // ZERO_ERR_MISMATCH naming the setting and both values. `local_error` as above. Throws on every rank of the group or
  // returns on all.
  void agree_across_model_parallel(EngineComm& group, const Config& config, int data_parallel_size,
                                   int data_parallel_rank, const Error* local_error) const;

 private:
  std::vector<GroupSpec> groups_;
  std::vector<ParamShape> params_;
  std::vector<ParamInit> init_;
};

}  // namespace zero
