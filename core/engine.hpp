// The ZeRO engine: owns every parameter, gradient and optimizer-state byte of one rank and runs stages 0-3.
// See docs/architecture.md for the data flow of one step per stage and for the failure-safety rules every
// collective call follows (local checks and allocation first, then the agreement, then data; a failure after data
// moved breaks the engine). The implementation is split by phase: engine.cpp (registration, layout, allocation,
// initial values, information), engine_micro_step.cpp (gather, release, gradients and their buckets) and
// engine_step.cpp (norm, loss scale, optimizer, publishing parameters).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "buffer.hpp"
#include "comm/engine_comm.hpp"
#include "config.hpp"
#include "layout.hpp"
#include "loss_scaler.hpp"
#include "optim/hyper.hpp"
#include "optim/kernels.hpp"

namespace zero {

struct GroupSpec {
  std::string name;
  OptimizerHyper hyper;
  double base_lr = 0.0;  // the configured rate; a scheduler derives each step's rate from it
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
  double loss_scale = 1.0;
  bool skipped = false;
};

struct ParamInit {
  const void* data = nullptr;
  DType dtype = DType::kF32;
};

struct UnitInfo {
  bool gathered = false;
  int num_params = 0;
  uint64_t generation = 0;
  uint64_t numel = 0;
};

class Engine {
 public:
  Engine(Config config, std::shared_ptr<Communicator> comm);
  ~Engine();

  int add_param_group(const std::string& name, double lr, double weight_decay, double beta1, double beta2, double eps);
  int add_param(ParamShape shape, ParamInit init);
  void finalize();

  void* param_data(int param);
  void* grad_data(int param);
  void gather(int unit);
  void release(int unit);
  void grad_ready(int param);
  void backward_end();
  StepResult step();
  void set_lr(int group, double lr);
  // Collective. See core/checkpoint/checkpoint.cpp and docs/checkpoint-format.md.
  void save_checkpoint(const std::string& dir, const std::string& tag);
  void load_checkpoint(const std::string& dir, const std::string& tag);
  double loss_scale() const { return scaler_.scale(); }
  // zero_engine_abort: any thread.
  void abort();
  void set_num_threads(int threads);

  MemoryStats memory_stats() const;
  const CommStats& comm_stats() const { return comm_.stats(); }
  std::string recent_collectives() const { return comm_.recent_json(); }
  const Config& config() const { return config_; }
  const Layout& layout() const { return layout_; }
  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.size(); }
  bool deterministic() const { return comm_.deterministic(); }
  double timeout() const { return comm_.timeout(); }
  int num_params() const { return static_cast<int>(params_.size()); }
  int num_units() const { return state_ == State::kRegistering ? 0 : static_cast<int>(layout_.units.size()); }
  const ParamShape& param_shape(int param) const;
  UnitInfo unit_info(int unit) const;
  int optimizer_threads() const { return threads_; }
  Isa isa() const { return isa_; }

 private:
  enum class State { kRegistering, kReady, kBroken };

  // What one rank keeps of one unit. Which members are allocated depends on the stage and dtypes (allocate()).
  struct UnitState {
    Buffer params;    // compute dtype: the full unit (stages 0-2, persistent stage-3 units) or this rank's shard
    Buffer master;    // fp32 master of what this rank updates; empty when params are fp32 (they are the master)
    Buffer grads;     // accumulation dtype: the full unit (stages 0-1) or the reduced shard (stages 2-3)
    Buffer state[2];  // fp32 optimizer state of what this rank updates
    void* gathered = nullptr;  // while gathered: the full params (a pooled buffer at stage 3)
    uint64_t generation = 0;   // bumped by every gather and release (views in bindings check it)
    bool full_params = false;  // params holds the full unit
    bool persistent = false;   // a stage-3 unit small enough to stay resident (stage3_param_persistence_threshold)
    int bucket = -1;           // stages 2-3
    size_t offset_in_bucket = 0;
    size_t update_begin = 0;             // first element of the unit this rank updates
    size_t update_elems = 0;             // how many
    uint64_t global_offset = 0;          // the unit's first element among all units' padded elements (checkpoints)
    uint64_t element_base = 0;           // the same without padding: independent of the rank count (rounding keys)
    std::vector<ShardSegment> segments;  // what the optimizer updates on this rank, relative to update_begin
    // What this rank adds to the squared gradient norm: its shard at every stage (stage 0 too, so that every rank
    // computes the same norm from the same partial sums), relative to norm_begin.
    size_t norm_begin = 0;
    std::vector<ShardSegment> norm_segments;
  };

  // Stage 2-3 gradient bucket of the current micro-step. A bucket is reduced as soon as every param it expects is
  // declared ready; it expects the params that had a gradient (on any rank) in the previous micro-step — all of
  // them in the first one — so that an unused or frozen param does not hold its bucket, and every later one, back
  // until zero_backward_end. A gradient that arrives after its bucket was reduced (a param unused last time) goes
  // into a fresh buffer that zero_backward_end reduces again.
  struct BucketState {
    void* buffer = nullptr;      // from the bucket pool while it holds gradients not reduced yet
    size_t params_ready = 0;     // expected params declared ready
    size_t params_expected = 0;  // params the bucket waits for
    size_t params_total = 0;
    bool reduced = false;
  };

  // Buffers handed out and taken back without per-step allocation. reserve() allocates before any collective
  // needs one, so a collective never allocates.
  class Pool {
   public:
    void set_capacity(size_t elems, DType dtype) { capacity_ = elems, dtype_ = dtype; }
    void reserve(size_t buffers);
    bool has_free() const { return !free_.empty(); }
    void* acquire();  // reserve() first
    void give_back(void* buffer) { free_.push_back(buffer); }
    uint64_t allocated_bytes() const;
    void trim(size_t keep);  // frees buffers beyond `keep` (all of them back in the pool)
    void leak();             // after a timeout a backend may still write into the buffers

   private:
    size_t capacity_ = 0;
    DType dtype_ = DType::kF32;
    std::vector<std::unique_ptr<Buffer>> all_;
    std::vector<void*> free_;
  };

  void require_state(State wanted, const char* call) const;
  // Whether this rank can take part in an agreement at all: not after an abort, a failure after data moved, or
  // zero_comm_finalize (the other ranks learn of those through the communicator).
  bool can_agree() const {
    return !aborted_.load() && state_ != State::kBroken && !comm_.backend().aborted() && !comm_.backend().finalized();
  }
  // The local checks of a collective call, argument and state checks included: a failure is returned, to be
  // shared through the agreement — so that a rank whose call is wrong still tells the others — unless this rank
  // cannot agree (can_agree()), which throws at once.
  template <typename Checks>
  std::unique_ptr<Error> local_checks(const char* call, Checks&& checks) {
    if (!can_agree()) require_state(State::kReady, call);
    try {
      checks();
    } catch (const Error& e) {
      return std::make_unique<Error>(e);
    } catch (const std::bad_alloc&) {
      return std::make_unique<Error>(ZERO_ERR_OUT_OF_MEMORY, std::string(call) + ": out of memory");
    }
    return nullptr;
  }
  void check_param(int param, const char* call) const;
  void check_unit(int unit, const char* call) const;
  void check_window(const char* call) const;
  bool sharded_params(int unit) const { return config_.stage == 3 && !units_[unit].persistent; }
  bool bucketed_grads() const { return config_.stage >= 2; }
  bool separate_master() const { return config_.compute_dtype != DType::kF32; }
  size_t compute_size() const { return dtype_size(config_.compute_dtype); }
  size_t grad_size() const { return dtype_size(config_.grad_accum_dtype); }
  void verify_registration_across_ranks(const Error* local_error);
  void allocate();
  void load_initial_values();
  void reduce_ready_buckets(const char* call);
  void reduce_bucket(int bucket, bool again, const char* call);
  void reduce_pending_buckets(const char* call);
  void reduce_full_grads(int unit);
  float* master_of(int unit);
  void* copy_of(int unit);
  void* grads_of(int unit);
  CopyMode copy_mode() const;
  const std::string& param_name(int p) const { return params_[p].name; }
  // A failure after data started moving: the ranks' states may differ now, so the engine is unusable and the
  // communicator is aborted (the other ranks' collectives fail promptly, naming this rank). Rethrows.
  [[noreturn]] void broken(const std::exception& e);
  // Runs `body` (data movement) and breaks the engine if it throws.
  template <typename Body>
  void moving_data(Body&& body) {
    try {
      body();
    } catch (const std::exception& e) {
      broken(e);
    }
  }
  // The agreement before a collective call moves data (EngineComm::agree); a divergence or a communication
  // failure breaks the engine.
  void agree(const char* call, const CallTag& tag, const Error* local, const EngineComm::ExplainCheck& explain = {},
             bool share_status = false);
  void agree_checkpoint(const char* call, CallKind kind, int phase, const Error* local, int64_t check = 0,
                        const std::string& what = "");
  void require_step_boundary(const char* call) const;
  void write_shard_files(const std::string& dir, std::vector<int64_t>& record);
  void write_consolidated(const std::string& path, uint64_t& bytes, uint64_t& xxh64);
  void publish_params_from_master();
  void report_skipped_step(const StepResult& result);
  std::string label(const char* call, const std::string& what) const { return std::string(call) + ": " + what; }

  Config config_;
  EngineComm comm_;
  Isa isa_;
  int threads_ = 1;                        // optimizer threads per rank
  int threads_requested_ = 0;              // zero_engine_set_num_threads / libzero.optimizer_threads; 0 = auto
  std::vector<StepScalars> step_scalars_;  // per group, reused: zero_step allocates nothing
  std::vector<double> norm_scratch_;       // block sums of the norm (parallel_sum_squares)
  State state_ = State::kRegistering;
  std::atomic<bool> aborted_{false};
  std::vector<GroupSpec> groups_;
  std::vector<ParamShape> params_;
  std::vector<ParamInit> init_;
  Layout layout_;
  std::vector<Bucket> buckets_;
  std::vector<UnitState> units_;
  std::vector<BucketState> bucket_states_;
  std::vector<char> param_ready_;     // per param, this micro-step
  std::vector<char> param_touched_;   // per param: zero_grad_data was called in this micro-step
  std::vector<char> param_expected_;  // per param: its bucket waits for it (BucketState)
  Pool gathered_pool_;
  Pool bucket_pool_;
  LossScaler scaler_;
  int next_bucket_to_reduce_ = 0;
  int64_t micro_steps_ = 0;       // completed in the current accumulation window
  int64_t micro_step_count_ = 0;  // completed since finalize (the agreement's micro-step number)
  int64_t steps_ = 0;             // optimizer steps taken (skipped ones excluded)
  int consecutive_skips_ = 0;     // skipped steps in a row that count toward giving up (report_skipped_step)
  std::string broken_reason_;
};

}  // namespace zero
