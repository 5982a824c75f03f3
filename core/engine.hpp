// The ZeRO engine: owns every parameter, gradient and optimizer-state byte of one rank and runs stages 0-3.
// See docs/architecture.md for the data flow of one step per stage.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "buffer.hpp"
#include "comm/counted_comm.hpp"
#include "config.hpp"
#include "layout.hpp"
#include "optim/adam.hpp"

namespace zero {

struct GroupSpec {
  std::string name;
  AdamHyper hyper;
};

struct MemoryStats {
  uint64_t param_bytes = 0, grad_bytes = 0, master_param_bytes = 0, optimizer_state_bytes = 0, bucket_bytes = 0,
           gathered_bytes = 0;
  uint64_t total() const {
    return param_bytes + grad_bytes + master_param_bytes + optimizer_state_bytes + bucket_bytes + gathered_bytes;
  }
};

struct StepResult {
  int64_t step = 0;
  double grad_norm = 0.0;
  double lr = 0.0;
  bool skipped = false;
};

class Engine {
 public:
  Engine(Config config, std::shared_ptr<Communicator> comm);

  int add_param_group(const std::string& name, double lr, double weight_decay, double beta1, double beta2, double eps);
  int add_param(ParamShape shape, const void* init_data);
  void finalize();

  float* param_data(int param);
  float* grad_data(int param);
  void gather(int unit);
  void release(int unit);
  void grad_ready(int param);
  void backward_end();
  StepResult step();
  void set_lr(int group, double lr);

  MemoryStats memory_stats() const;
  const CommStats& comm_stats() const { return comm_.stats(); }
  const Config& config() const { return config_; }
  const Layout& layout() const { return layout_; }
  int stage() const { return config_.stage; }

 private:
  enum class State { kRegistering, kReady, kBroken };

  // What one rank keeps of one unit. Which members are allocated depends on the stage (see finalize()).
  struct UnitState {
    FloatBuffer full_params;   // stages 0-2 and persistent stage-3 units
    FloatBuffer shard_params;  // stage 3: this rank's shard, which is also the fp32 master
    FloatBuffer full_grads;    // stages 0-1
    FloatBuffer grad_shard;    // stages 2-3: fp32 accumulator of the reduced gradient shard
    FloatBuffer exp_avg, exp_avg_sq;
    float* gathered = nullptr;  // stage 3 while gathered: a buffer from the gathered pool
    bool persistent = false;    // stage 3 unit small enough to stay resident (stage3_param_persistence_threshold)
    int bucket = -1;            // stages 2-3
    size_t offset_in_bucket = 0;
    std::vector<ShardSegment> segments;  // what the optimizer updates on this rank
  };

  // Stage 2-3 gradient bucket of the current micro-step.
  struct BucketState {
    float* buffer = nullptr;  // from the bucket pool while the bucket is being filled
    size_t params_ready = 0;
    size_t params_total = 0;
    bool reduced = false;
  };

  // Buffers handed out and taken back without per-step allocation.
  class Pool {
   public:
    void set_capacity(size_t elems) { capacity_ = elems; }
    float* acquire();
    void give_back(float* buffer);
    uint64_t allocated_bytes() const;

   private:
    size_t capacity_ = 0;
    std::vector<std::unique_ptr<FloatBuffer>> all_;
    std::vector<float*> free_;
  };

  void require_state(State wanted, const char* call) const;
  void check_param(int param, const char* call) const;
  void check_unit(int unit, const char* call) const;
  bool sharded_params(int unit) const { return config_.stage == 3 && !units_[unit].persistent; }
  bool bucketed_grads() const { return config_.stage >= 2; }
  void verify_registration_across_ranks();
  void allocate();
  void load_initial_values();
  void reduce_ready_buckets();
  void reduce_bucket(int bucket);
  float* unit_params_shard(int unit);
  float* unit_grads_shard(int unit);
  const std::string& param_name(int p) const { return params_[p].name; }
  [[noreturn]] void broken(const std::exception& e);

  Config config_;
  CountedComm comm_;
  State state_ = State::kRegistering;
  std::vector<GroupSpec> groups_;
  std::vector<ParamShape> params_;
  std::vector<const void*> init_data_;
  Layout layout_;
  std::vector<Bucket> buckets_;
  std::vector<UnitState> units_;
  std::vector<BucketState> bucket_states_;
  std::vector<char> param_ready_;  // per param, this micro-step
  Pool gathered_pool_;
  Pool bucket_pool_;
  int next_bucket_to_reduce_ = 0;
  int64_t micro_steps_ = 0;  // completed in the current accumulation window
  int64_t steps_ = 0;
  std::string broken_reason_;
};

}  // namespace zero
