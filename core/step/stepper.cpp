#include "step/stepper.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "step/scheduler.hpp"
#include "util/error.hpp"
#include "util/log.hpp"

namespace zero {
namespace {

// Ranks on one node share its cores: each gets its share of OpenMP threads for the optimizer, so a node never
// runs more busy threads than cores. OMP_NUM_THREADS, when set, decides instead (0: OpenMP's own default).
int automatic_threads(int ranks_on_node) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return 0;
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, ranks_on_node));
}

}  // namespace

Stepper::Stepper(const Config& config, int rank, int ranks_on_node)
    : config_(config),
      isa_(active_isa()),
      rank_(rank),
      ranks_on_node_(ranks_on_node),
      scaler_(config.loss_scale, config.compute_dtype == DType::kF16) {
  set_threads(config.optimizer_threads);
}

void Stepper::set_threads(int requested) { threads_ = requested > 0 ? requested : automatic_threads(ranks_on_node_); }

void Stepper::allocate(const ParameterStore& store, size_t groups) {
  norm_scratch_.assign(store.norm_plan().largest_segment_blocks(), 0.0);
  if (device_context_ && !device_pass_) device_pass_ = std::make_unique<DevicePass>(device_context_);
  step_scalars_.resize(groups);
  if (log_enabled(ZERO_LOG_DEBUG))
    log_message(ZERO_LOG_DEBUG, rank_,
                store.norm_plan().in_update()
                    ? "zero_step: the gradient norm is summed in the optimizer pass"
                    : "zero_step: the gradient norm is summed before the update (as the reduced gradients are written "
                      "where a pass writes them, else in a pass of its own)");
}

double Stepper::norm_from(double sum_sq, const StepDecision& decision) {
  return std::sqrt(sum_sq / (decision.divisor * decision.divisor));
}

// Each rank sums the squares of its shard of the reduced gradients, at every stage (stage 0 holds every gradient,
// but sums only its shard: the same sums as stages 1-3). Squares of small multiples of 2^-10 and their sums are
// exact in fp64, so for those the norm does not depend on how shards split the sum.
double Stepper::local_sum_squares(ParameterStore& store, const std::function<const double*(int)>& folded) {
  if (device_pass_) return device_sum_squares(store);
  const size_t grad_size = dtype_size(config_.grad_accum_dtype);
  const int grad_index = static_cast<int>(config_.grad_accum_dtype);
  double sum_sq = 0.0;
  for (int u = 0; u < store.num_units(); ++u) {
    const std::vector<ShardSegment>& segments = store.unit(u).norm_segments;
    if (const double* sums = folded ? folded(u) : nullptr) {
      for (size_t i = 0; i < segments.size(); ++i) sum_sq += sums[i];
      continue;
    }
    const KernelTable& table = kernels(store.unit(u).grads.space(), isa_);
    const char* g = static_cast<const char*>(store.norm_grads(u));
    for (const ShardSegment& s : segments)
      sum_sq += parallel_sum_squares(table.sum_squares[grad_index], g + s.shard_offset * grad_size, grad_size, s.numel,
                                     threads_, norm_scratch_.data());
  }
  // Duplicates of params another model-parallel rank counts only say here whether they are finite, so that an
  // overflow on any rank skips the step everywhere.
  for (int u = 0; u < store.num_units(); ++u) {
    const std::vector<ShardSegment>& uncounted = store.unit(u).uncounted_segments;
    if (uncounted.empty()) continue;
    const KernelTable& table = kernels(store.unit(u).grads.space(), isa_);
    const char* g = static_cast<const char*>(store.norm_grads(u));
    for (const ShardSegment& s : uncounted) {
      const double sq = parallel_sum_squares(table.sum_squares[grad_index], g + s.shard_offset * grad_size, grad_size,
                                             s.numel, threads_, norm_scratch_.data());
      if (!std::isfinite(sq)) sum_sq += sq;
    }
  }
  return sum_sq;
}

// The same sums for a device engine: the runs in device memory all queued, read back in one host wait; those in
// host memory (ZeRO-Offload's gradient shards) summed by the CPU's kernels; all added in the CPU's order.
double Stepper::device_sum_squares(ParameterStore& store) {
  const size_t grad_size = dtype_size(config_.grad_accum_dtype);
  const SumSquaresKernel host_squares =
      kernels(MemorySpace::kHost, isa_).sum_squares[static_cast<int>(config_.grad_accum_dtype)];
  struct Term {
    bool counted;             // else only checked for non-finite values (a model-parallel duplicate)
    long device_run;          // its index among the device's runs, or -1
    double host_value = 0.0;  // summed on the host
  };
  std::vector<Term> terms;
  std::vector<std::pair<const void*, size_t>> device_runs;
  auto add = [&](int u, const ShardSegment& s, bool counted) {
    const char* g = static_cast<const char*>(store.norm_grads(u)) + s.shard_offset * grad_size;
    if (host_addressable(store.unit(u).grads.space())) {
      terms.push_back(
          {counted, -1, parallel_sum_squares(host_squares, g, grad_size, s.numel, threads_, norm_scratch_.data())});
    } else {
      terms.push_back({counted, static_cast<long>(device_runs.size())});
      device_runs.push_back({g, s.numel});
    }
  };
  for (int u = 0; u < store.num_units(); ++u)
    for (const ShardSegment& s : store.unit(u).norm_segments) add(u, s, true);
  for (int u = 0; u < store.num_units(); ++u)
    for (const ShardSegment& s : store.unit(u).uncounted_segments) add(u, s, false);
  const std::vector<double> sums = device_pass_->sums_of_squares(config_.grad_accum_dtype, device_runs);
  double sum_sq = 0.0;
  for (const Term& t : terms) {
    const double v = t.device_run >= 0 ? sums[static_cast<size_t>(t.device_run)] : t.host_value;
    if (t.counted || !std::isfinite(v)) sum_sq += v;
  }
  return sum_sq;
}

// ZeRO-Offload: unit u's fp32 master and optimizer state are in host memory, where the CPU's kernels step them, run
// by run, through the pipeline's slots: the gradients come from the device where they are there (stage 1: the
// reduced full buffer; the unit is stepped once they have arrived, while the next unit's cross the bus), and the
// new params go back to the device (fp32: the updated master itself) while the CPU steps the next unit. Every
// element gets the CPU kernel with the same scalars: the bits of the engine that does not offload.
void Stepper::update_offloaded(ParameterStore& store, int u, const UpdateView& view, bool clear_grads) {
  size_t elems = 0;  // the updated range's runs, from its first element
  for (const ShardSegment& s : *view.segments) elems = std::max(elems, s.shard_offset + s.numel);
  if (elems == 0) return;  // frozen params only
  if (offload_ == nullptr) fail(ZERO_ERR_INTERNAL, "an offloaded unit without ZeRO-Offload's pipeline");
  const size_t grad_size = dtype_size(config_.grad_accum_dtype), compute_size = dtype_size(config_.compute_dtype);
  const MemorySpace params_space = store.unit(u).params.space();
  char* params = static_cast<char*>(store.copy(u));  // the updated range of the unit's params
  const StepKernel kernel = kernels(MemorySpace::kHost, isa_)
                                .step[static_cast<int>(config_.optimizer.kind)]
                                     [static_cast<int>(config_.grad_accum_dtype)][static_cast<int>(copy_mode())];
  const bool staged = copy_mode() != CopyMode::kNone;
  const std::string what = "the new params of unit " + std::to_string(u) + " to the device";
  // Steps the unit from `grads` (host memory, the updated range's first element); `clear` zeroes them as it reads.
  auto step_from = [this, view, params, params_space, kernel, staged, grad_size, compute_size, what](const char* grads,
                                                                                                     bool clear) {
    offload_->send_params(
        [&](char* slot, std::vector<OffloadPipeline::ToDevice>& copies) {
          for (const ShardSegment& s : *view.segments) {
            const size_t lo = s.shard_offset, n = s.numel;
            KernelArgs a;
            a.master = view.master + lo;
            a.state0 = view.state[0] == nullptr ? nullptr : view.state[0] + lo;
            a.state1 = view.state[1] == nullptr ? nullptr : view.state[1] + lo;
            a.grad = grads + lo * grad_size;
            a.grad_elem_size = grad_size;
            a.clear_grad = clear;
            // 16-bit params: written by the kernel into the slot, or straight into params in host memory
            // (offload_param); fp32 params are the updated master, copied from it.
            char* dst = params + lo * compute_size;
            const bool on_host = host_addressable(params_space);
            a.copy = !staged ? nullptr : on_host ? dst : slot + lo * compute_size;
            a.n = n;
            a.first_index = view.first_index + lo;
            a.s = step_scalars_[s.group];
            parallel_step(kernel, a, threads_);
            const void* src = staged ? a.copy : static_cast<const void*>(a.master);
            if (!on_host) {
              copies.push_back({dst, src, n * compute_size});
            } else if (!staged) {
              copy_bytes(params_space, dst, MemorySpace::kHost, src, n * compute_size);
            }
          }
        },
        what);
  };
  if (staged && !host_addressable(params_space) && elems * compute_size > offload_->param_slot_bytes())
    fail(ZERO_ERR_INTERNAL, "unit " + std::to_string(u) + "'s new params (" + std::to_string(elems * compute_size) +
                                " bytes) do not fit ZeRO-Offload's param slots");
  if (host_addressable(view.space)) return step_from(static_cast<const char*>(view.grads), clear_grads);
  offload_->stage_gradients(
      view.grads, elems * grad_size, [step_from](const char* host) { step_from(host, false); },
      "the reduced gradients of unit " + std::to_string(u) + " to the host");
  if (clear_grads) device_grads_to_clear_.push_back({const_cast<void*>(view.grads), elems * grad_size});
}

// Average and unscale (the sum over ranks and micro-steps divided once by N x G x scale: a correctly rounded
// division, exact whenever the average is representable, so N = 3 or G = 3 train exactly as N = 1 does on the
// same averaged gradient), then clip with a separate multiply.
StepDecision Stepper::decide(double sum_sq, int world_size, int64_t micro_steps, const std::vector<GroupSpec>& groups) {
  StepDecision d;
  StepResult& result = d.result;
  result.loss_scale = scaler_.scale();
  const double samples = static_cast<double>(world_size) * static_cast<double>(micro_steps);
  // The norm of the averaged gradients: sum_sq / D^2 with D = N x G x scale is exact when the averaged values'
  // squares are, so for the same averaged gradient every N and G compute the same norm (sqrt(sum_sq) / D would
  // round differently for D = 3).
  d.divisor = samples * scaler_.scale();
  result.grad_norm = norm_from(sum_sq, d);
  result.skipped = config_.skip_nonfinite_steps && !std::isfinite(sum_sq);
  const double scale_before = scaler_.scale();
  scaler_.update(result.skipped);
  if (scaler_.scale() != scale_before && rank_ == 0 && log_enabled(ZERO_LOG_INFO))
    log_message(ZERO_LOG_INFO, 0,
                "zero_step: loss scale " + exact_decimal(scale_before) + " -> " + exact_decimal(scaler_.scale()) +
                    (result.skipped ? " (gradients overflowed; step skipped)" : " (no overflow for a window)"));
  result.lr = scheduled_lr(config_.scheduler, groups[0].base_lr, steps_ + 1);
  // A non-finite norm that is not skipped (the check is off) clips every gradient to zero, inf and nan alike, as
  // DeepSpeed's ZeRO 1-2 do (tests/deepspeed/fixtures.json, "one_element"): the non-finite elements become nan.
  if (!result.skipped && config_.gradient_clipping > 0.0 &&
      (!std::isfinite(result.grad_norm) || result.grad_norm > config_.gradient_clipping))
    d.clip = std::isfinite(result.grad_norm) ? config_.gradient_clipping / (result.grad_norm + 1e-6) : 0.0;
  return d;
}

double Stepper::next_lr(double base_lr) const { return scheduled_lr(config_.scheduler, base_lr, steps_ + 1); }

CopyMode Stepper::copy_mode() const {
  switch (config_.compute_dtype) {
    case DType::kBF16:
      return config_.stochastic_rounding ? CopyMode::kBf16Stochastic : CopyMode::kBf16Rne;
    case DType::kF16:
      return CopyMode::kFp16Rne;
    case DType::kF32:
    case DType::kU8:
      break;
  }
  return CopyMode::kNone;
}

// One fused pass per run of one group's elements: reads the gradient (any accumulation dtype), updates master and
// state, writes the compute-dtype params.
void Stepper::update(ParameterStore& store, const std::vector<GroupSpec>& groups, const StepDecision& decision,
                     bool clear_grads, double* sum_sq) {
  if (sum_sq != nullptr && !store.norm_plan().in_update())
    fail(ZERO_ERR_INTERNAL, "Stepper::update: the norm was asked of a pass that cannot compute it");
  steps_ += 1;
  for (size_t g = 0; g < groups.size(); ++g) {
    OptimizerHyper h = groups[g].hyper;
    h.lr = scheduled_lr(config_.scheduler, groups[g].base_lr, steps_);
    step_scalars_[g] = make_step_scalars(h, steps_, decision.divisor, decision.clip);
    step_scalars_[g].seed = sr_step_seed(config_.stochastic_rounding_seed, static_cast<uint64_t>(steps_));
  }
  const int grad_index = static_cast<int>(config_.grad_accum_dtype);
  const size_t grad_size = dtype_size(config_.grad_accum_dtype), compute_size = dtype_size(config_.compute_dtype);
  std::vector<KernelArgs> device_segments;  // a device engine's runs
  // One run of one group's elements [lo, hi) of unit u's updated range; `master`, `state0`, `state1` point at
  // element lo.
  auto run = [&](int u, const UpdateView& view, const ShardSegment& s, size_t lo, size_t hi, float* master,
                 float* state0, float* state1) {
    char* copy = static_cast<char*>(store.copy(u));
    KernelArgs a;
    a.master = master;
    a.grad = static_cast<const char*>(view.grads) + lo * grad_size;
    a.grad_elem_size = grad_size;
    a.state0 = state0;
    a.state1 = state1;
    a.copy = copy == nullptr ? nullptr : copy + lo * compute_size;
    a.clear_grad = clear_grads;  // the next micro-step adds into zeros; no pass of its own
    a.n = hi - lo;
    a.first_index = view.first_index + lo;
    a.s = step_scalars_[s.group];
    if (device_pass_) {  // queued below, all runs in one launch
      a.clear_grad = false;
      device_segments.push_back(a);
      return;
    }
    if (sum_sq != nullptr) a.block_sums = norm_scratch_.data();
    parallel_step(kernels(view.space, isa_)
                      .step[static_cast<int>(config_.optimizer.kind)][grad_index][static_cast<int>(copy_mode())],
                  a, threads_);
    if (sum_sq != nullptr) {  // block order, then segment order: local_sum_squares's sums
      double segment = 0.0;
      for (size_t b = 0; b < sum_squares_blocks(a.n); ++b) segment += norm_scratch_[b];
      *sum_sq += segment;
    }
  };
  if (store.optimizer_on_nvme()) {
    // The master (when separate) and the state stream through the NVMe state's window, a chunk at a time: every
    // element gets the same per-element operations as in memory, so the bits are the same.
    const NvmeOptimizerPlan& o = store.plan().nvme_optimizer;
    const std::optional<int> ma = store.file_array(ShardKind::kMaster);
    const int states = o.arrays - (o.master ? 1 : 0);
    const std::optional<int> s0 = states > 0 ? store.file_array(ShardKind::kState0) : std::nullopt;
    const std::optional<int> s1 = states > 1 ? store.file_array(ShardKind::kState1) : std::nullopt;
    int unit = -1;  // the unit whose new params are being written (end_copy once its last piece is done)
    store.nvme()->stream([&](const io::NvmeState::Piece& p, float* const* arrays) {
      if (p.unit != unit) {
        if (unit >= 0) store.end_copy(unit);
        store.begin_copy(unit = p.unit);
      }
      const UpdateView view = store.update(p.unit);
      for (const ShardSegment& s : *view.segments) {
        const size_t lo = std::max(s.shard_offset, p.begin), hi = std::min(s.shard_offset + s.numel, p.begin + p.n);
        if (lo >= hi) continue;
        const size_t at = lo - p.begin;
        run(p.unit, view, s, lo, hi, ma ? arrays[*ma] + at : view.master + lo, s0 ? arrays[*s0] + at : nullptr,
            s1 ? arrays[*s1] + at : nullptr);
      }
    });
    if (unit >= 0) store.end_copy(unit);
    return;
  }
  device_grads_to_clear_.clear();
  for (int u = 0; u < store.num_units(); ++u) {
    const UpdateView view = store.update(u);
    if (device_pass_ && host_addressable(view.master_space)) {
      update_offloaded(store, u, view, clear_grads);
      continue;
    }
    store.begin_copy(u);
    for (const ShardSegment& s : *view.segments)
      run(u, view, s, s.shard_offset, s.shard_offset + s.numel, view.master + s.shard_offset,
          view.state[0] == nullptr ? nullptr : view.state[0] + s.shard_offset,
          view.state[1] == nullptr ? nullptr : view.state[1] + s.shard_offset);
    store.end_copy(u);
  }
  if (offload_ != nullptr) {
    // Every unit has arrived and been stepped, and its params are on the device before what follows reads them;
    // the device's gradients are cleared once their copies have read them.
    offload_->finish_gradients();
    offload_->finish_params();
    for (const auto& [grads, bytes] : device_grads_to_clear_) fill_zero(MemorySpace::kDevice, grads, bytes);
  }
  if (device_pass_) {
    // Params in device memory are their own copy buffers (begin_copy and end_copy move nothing there), so the
    // pass may run after them; it is ordered on the engine's stream before what follows.
    device_pass_->step(config_.optimizer.kind, config_.grad_accum_dtype, copy_mode(), device_segments, clear_grads);
  }
}

// A skipped step is news, and many in a row end the run: training must never skip steps forever without a word.
// With fp16 the scaler lowers the scale, and only overflows at the minimum scale count (DeepSpeed stops at the
// first); in bf16 and fp32 there is no scale to lower, so every non-finite step counts. Every rank takes the same
// decision (the norm is the same everywhere), after the step, with the engine consistent.
void Stepper::account(const StepResult& result) {
  if (!result.skipped) {
    consecutive_skips_ = 0;
    if (!std::isfinite(result.grad_norm) && rank_ == 0)
      log_message(ZERO_LOG_WARNING, rank_,
                  "zero_step: step " + std::to_string(result.step) +
                      " applied with a non-finite gradient norm: the check that would skip it is off "
                      "(bf16.check_grad_overflow or zero_optimization.compute_grad_norm is false)");
    return;
  }
  const bool fp16 = config_.compute_dtype == DType::kF16 && config_.loss_scale.static_scale == 0.0;
  consecutive_skips_ = fp16 ? scaler_.skips_at_minimum() : consecutive_skips_ + 1;
  if (consecutive_skips_ == 0) return;
  const int limit = LossScaler::kMaxSkipsAtMinimum;
  const std::string what = fp16 ? "the gradients overflow even at the minimum loss scale (fp16.min_loss_scale = " +
                                      exact_decimal(config_.loss_scale.min_scale) + ")"
                                : "the gradients are not finite (inf or nan) and there is no loss scale to lower";
  if (consecutive_skips_ >= limit)
    fail(ZERO_ERR_INVALID_STATE, "zero_step: " + what + " for " + std::to_string(limit) +
                                     " consecutive steps, all skipped; training cannot go on (DeepSpeed stops at the "
                                     "first such step). The weights are those of step " +
                                     std::to_string(result.step));
  log_message(ZERO_LOG_WARNING, rank_,
              "zero_step: step skipped: " + what + " (" + std::to_string(consecutive_skips_) + " in a row; zero_step " +
                  "gives up after " + std::to_string(limit) + ")");
}

}  // namespace zero
