// zero_step: finish the reduction, one fused norm/overflow pass and one exchange of the partial sums, the
// loss-scale decision, the fused optimizer pass (which also writes the compute-dtype params), and publishing the
// new parameters.
#include <cmath>
#include <cstring>
#include <sstream>

#include "engine.hpp"
#include "error.hpp"
#include "log.hpp"
#include "scheduler.hpp"
#include "test_hooks.hpp"

namespace zero {
namespace {

uint64_t digest_doubles(const std::vector<double>& values) {
  uint64_t h = 1469598103934665603ull;
  for (double v : values) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    for (int i = 0; i < 8; ++i) h = (h ^ ((bits >> (8 * i)) & 0xffu)) * 1099511628211ull;
  }
  return h;
}

}  // namespace

StepResult Engine::step() {
  const char* call = "zero_step";
  // Local checks, state and window included; a failing rank still joins the agreement so that the others return
  // instead of waiting.
  std::unique_ptr<Error> local = local_checks(call, [&] {
    require_state(State::kReady, call);
    if (micro_steps_ != config_.gradient_accumulation_steps)
      fail(ZERO_ERR_INVALID_STATE,
           "zero_step: expected gradient_accumulation_steps (" + std::to_string(config_.gradient_accumulation_steps) +
               ") calls of zero_backward_end since the last step, got " + std::to_string(micro_steps_));
    for (size_t u = 0; u < units_.size(); ++u)
      if (units_[u].gathered != nullptr)
        fail(ZERO_ERR_INVALID_STATE,
             "zero_step: unit " + std::to_string(u) + " is still gathered; release every unit first");
    test_hooks::maybe_fail("step", comm_.rank());
  });
  // The learning rates are set locally (zero_set_lr); ranks that set different ones would silently train
  // different replicas, so they are part of what the ranks agree on.
  std::vector<double> lrs(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) lrs[g] = groups_[g].base_lr;
  const CallTag tag{CallKind::kStep, steps_ + 1, micro_steps_, static_cast<int64_t>(digest_doubles(lrs))};
  auto explain_lrs = [&]() {
    std::vector<double> all(lrs.size() * static_cast<size_t>(comm_.size()));
    std::memcpy(all.data() + lrs.size() * comm_.rank(), lrs.data(), lrs.size() * sizeof(double));
    comm_.control_all_gather(all.data(), lrs.size() * sizeof(double), "zero_step: the ranks' learning rates");
    std::ostringstream os;
    os << "the ranks set different learning rates (zero_set_lr must set the same value on every rank):";
    for (size_t g = 0; g < lrs.size(); ++g) {
      bool differs = false;
      for (int r = 1; r < comm_.size(); ++r) differs |= all[lrs.size() * r + g] != all[g];
      if (!differs) continue;
      os << " group " << g << " ('" << groups_[g].name << "'):";
      for (int r = 0; r < comm_.size(); ++r)
        os << (r ? "," : "") << " rank " << r << " " << exact_decimal(all[lrs.size() * r + g]);
      os << ";";
    }
    std::string text = os.str();
    text.back() = '.';
    return text;
  };
  agree(call, tag, local.get(), explain_lrs);

  const int stage = config_.stage;
  const KernelTable& table = kernels(isa_);
  const int grad_index = static_cast<int>(config_.grad_accum_dtype);
  StepResult result;
  result.loss_scale = scaler_.scale();
  moving_data([&] {
    // 1. Stages 0-1 reduce now; stages 2-3 reduced bucket by bucket during backward.
    if (stage <= 1)
      for (size_t u = 0; u < units_.size(); ++u) reduce_full_grads(static_cast<int>(u));

    // 2. One pass over this rank's shard of the gradients: the sum of squares, in fp64, which is also the overflow
    //    test (an inf or nan anywhere makes it non-finite; finite fp32 squares cannot overflow fp64). The ranks'
    //    partial sums are exchanged and added in rank order, so every rank computes the same norm bit for bit, at
    //    every stage (stage 0 holds every gradient, but sums only its shard: the same sums as stages 1-3). Squares
    //    of small multiples of 2^-10 and their sums are exact in fp64, so for those the norm does not depend on
    //    how shards split the sum.
    double sum_sq = 0.0;
    for (size_t u = 0; u < units_.size(); ++u) {
      const UnitState& us = units_[u];
      const char* g = static_cast<const char*>(us.grads.data()) +
                      (stage <= 1 ? us.norm_begin : 0) * grad_size();  // stages 2-3 keep only the shard
      for (const ShardSegment& s : us.norm_segments)
        sum_sq += parallel_sum_squares(table.sum_squares[grad_index], g + s.shard_offset * grad_size(), grad_size(),
                                       s.numel, threads_, norm_scratch_.data());
    }
    sum_sq = comm_.sum_over_ranks(sum_sq, "zero_step: partial sums of squares");

    // 3. Average and unscale (the sum over ranks and micro-steps divided once by N x G x scale: a correctly rounded
    //    division, exact whenever the average is representable, so N = 3 or G = 3 train exactly as N = 1 does on
    //    the same averaged gradient), then clip with a separate multiply.
    const double samples = static_cast<double>(comm_.size()) * static_cast<double>(config_.gradient_accumulation_steps);
    const double scale = scaler_.scale();
    // The norm of the averaged gradients: sum_sq / D^2 with D = N x G x scale is exact when the averaged values'
    // squares are, so for the same averaged gradient every N and G compute the same norm (sqrt(sum_sq) / D would
    // round differently for D = 3).
    const double divisor = samples * scale;
    result.grad_norm = std::sqrt(sum_sq / (divisor * divisor));
    result.skipped = !std::isfinite(sum_sq);
    const double scale_before = scaler_.scale();
    scaler_.update(result.skipped);
    if (scaler_.scale() != scale_before && comm_.rank() == 0 && log_enabled(ZERO_LOG_INFO))
      log_message(ZERO_LOG_INFO, 0,
                  "zero_step: loss scale " + exact_decimal(scale_before) + " -> " + exact_decimal(scaler_.scale()) +
                      (result.skipped ? " (gradients overflowed; step skipped)" : " (no overflow for a window)"));
    result.lr = scheduled_lr(config_.scheduler, groups_[0].base_lr, steps_ + 1);
    if (!result.skipped) {
      double clip = 1.0;
      if (config_.gradient_clipping > 0.0 && result.grad_norm > config_.gradient_clipping)
        clip = config_.gradient_clipping / (result.grad_norm + 1e-6);
      steps_ += 1;

      // 4. The fused optimizer pass over each run of one group's elements.
      std::vector<StepScalars>& scalars = step_scalars_;
      for (size_t g = 0; g < groups_.size(); ++g) {
        OptimizerHyper h = groups_[g].hyper;
        h.lr = scheduled_lr(config_.scheduler, groups_[g].base_lr, steps_);
        scalars[g] = make_step_scalars(h, steps_, divisor, clip);
        scalars[g].seed = sr_step_seed(config_.stochastic_rounding_seed, static_cast<uint64_t>(steps_));
      }
      const StepKernel kernel_for_mode =
          table.step[static_cast<int>(config_.optimizer.kind)][grad_index][static_cast<int>(copy_mode())];
      for (size_t u = 0; u < units_.size(); ++u) {
        UnitState& us = units_[u];
        float* master = master_of(static_cast<int>(u));
        char* copy = static_cast<char*>(copy_of(static_cast<int>(u)));
        const char* grads = static_cast<const char*>(grads_of(static_cast<int>(u)));
        for (const ShardSegment& s : us.segments) {
          KernelArgs a;
          a.master = master + s.shard_offset;
          a.grad = grads + s.shard_offset * grad_size();
          a.grad_elem_size = grad_size();
          a.state0 = us.state[0].empty() ? nullptr : us.state[0].f32() + s.shard_offset;
          a.state1 = us.state[1].empty() ? nullptr : us.state[1].f32() + s.shard_offset;
          a.copy = copy == nullptr ? nullptr : copy + s.shard_offset * compute_size();
          a.n = s.numel;
          a.first_index = us.element_base + us.update_begin + s.shard_offset;
          a.s = scalars[s.group];
          parallel_step(kernel_for_mode, a, threads_);
        }
      }
    }

    // 5. Clear the gradients and publish the new parameters (stages 1-2 and resident stage-3 units).
    for (size_t u = 0; u < units_.size(); ++u) {
      UnitState& us = units_[u];
      us.grads.zero();
      if (stage >= 1 && us.full_params && !result.skipped)
        comm_.all_gather(us.params.data(), layout_.units[u].shard_elems, elem_type(config_.compute_dtype),
                         "zero_step: all-gather of the new params of unit " + std::to_string(u));
    }
  });
  micro_steps_ = 0;
  result.step = steps_;
  if (result.skipped)
    report_skipped_step(result);
  else
    consecutive_skips_ = 0;
  return result;
}

// A skipped step is news, and many in a row end the run: training must never skip steps forever without a word.
// With fp16 the scaler lowers the scale, and only overflows at the minimum scale count (DeepSpeed stops at the
// first); in bf16 and fp32 there is no scale to lower, so every non-finite step counts. Every rank takes the same
// decision (the norm is the same everywhere), after the step, with the engine consistent.
void Engine::report_skipped_step(const StepResult& result) {
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
  log_message(ZERO_LOG_WARNING, comm_.rank(),
              "zero_step: step skipped: " + what + " (" + std::to_string(consecutive_skips_) + " in a row; zero_step " +
                  "gives up after " + std::to_string(limit) + ")");
}

}  // namespace zero
