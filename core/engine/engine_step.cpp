// zero_step, top to bottom: the checks and the agreement, the reductions the plan leaves to the step, the norm
// (one pass over the rank's shard and one exchange of partial sums), the loss-scale and clip decisions, the fused
// optimizer pass (which also writes the compute-dtype params), and publishing the new params as the plan says.
#include <cstring>
#include <sstream>

#include "engine/device_call.hpp"
#include "engine/engine.hpp"
#include "util/error.hpp"
#include "util/log.hpp"
#include "util/test_hooks.hpp"

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

StepResult Engine::step(const StepOptions& options) {
  CallScope scope(guard_, "zero_step");
  // 0. Local checks, state and window included; a failing rank still joins the agreement so that the others
  //    return instead of waiting. The learning rates are set locally (zero_set_lr) and the options are the
  //    caller's; ranks that differ in either would silently train different replicas, so both are part of what
  //    the ranks agree on.
  CollectiveCall call(guard_, CallKind::kStep);
  call.check([&] {
    guard_.require(CallGuard::State::kReady);
    if ((options.partial_window != 0 && options.partial_window != 1) ||
        (options.loss_averaged != 0 && options.loss_averaged != 1))
      guard_.fail(ZERO_ERR_INVALID_ARGUMENT, "zero_step_options_t's partial_window and loss_averaged must be 0 or 1");
    if (options.partial_window && window_.ended() < 1)
      guard_.fail(ZERO_ERR_INVALID_STATE, "no call of zero_backward_end since the last step: nothing to average");
    if (!options.partial_window && !window_.complete())
      guard_.fail(ZERO_ERR_INVALID_STATE,
                  "expected gradient_accumulation_steps (" + std::to_string(config_.gradient_accumulation_steps) +
                      ") calls of zero_backward_end since the last step, got " + std::to_string(window_.ended()) +
                      " (zero_step_options_t.partial_window steps after fewer)");
    const int gathered = store_.first_gathered();
    if (gathered >= 0)
      guard_.fail(ZERO_ERR_INVALID_STATE,
                  "unit " + std::to_string(gathered) + " is still gathered; release every unit first");
    test_hooks::maybe_fail("step", comm_.rank());
  });
  const std::vector<GroupSpec>& groups = registration_.groups();
  // What must be equal on every rank: the options, then each group's learning rate.
  std::vector<double> agreed{static_cast<double>(options.partial_window), static_cast<double>(options.loss_averaged)};
  for (const GroupSpec& g : groups) agreed.push_back(g.base_lr);
  // Run by the group whose ranks differ: the data-parallel one, or the model-parallel one.
  auto explain = [&](EngineComm& ranks) {
    std::vector<double> all(agreed.size() * static_cast<size_t>(ranks.size()));
    std::memcpy(all.data() + agreed.size() * ranks.rank(), agreed.data(), agreed.size() * sizeof(double));
    ranks.control_all_gather(all.data(), agreed.size() * sizeof(double),
                             guard_.label("the ranks' step options and learning rates"));
    auto differs = [&](size_t k) {
      for (int r = 1; r < ranks.size(); ++r)
        if (all[agreed.size() * r + k] != all[k]) return true;
      return false;
    };
    auto by_rank = [&](size_t k, bool flag) {
      std::string text;
      for (int r = 0; r < ranks.size(); ++r) {
        const double v = all[agreed.size() * r + k];
        text += (r ? ", " : " ") + ranks.rank_name() + " " + std::to_string(r) + " " +
                (flag ? std::to_string(static_cast<int>(v)) : exact_decimal(v));
      }
      return text;
    };
    std::ostringstream os;
    if (differs(0) || differs(1)) {
      os << "the ranks passed different zero_step_options_t (every rank must step the same way):";
      if (differs(0)) os << " partial_window:" << by_rank(0, true) << ";";
      if (differs(1)) os << " loss_averaged:" << by_rank(1, true) << ";";
    } else {
      os << "the ranks set different learning rates (zero_set_lr must set the same value on every rank):";
      for (size_t g = 0; g < groups.size(); ++g)
        if (differs(2 + g)) os << " group " << g << " ('" << groups[g].name << "'):" << by_rank(2 + g, false) << ";";
    }
    std::string text = os.str();
    text.back() = '.';
    return text;
  };
  call.agree(stepper_.steps() + 1, window_.ended(), static_cast<int64_t>(digest_doubles(agreed)), explain);

  StepResult result;
  DeviceCall device_call(*this);
  call.move([&] {
    // 1. What was fetched ahead is stale once the params change: completed and given back. The reductions the
    //    plan leaves to the step (full gradient buffers); bucketed plans reduced during backward.
    store_.settle();
    reducer_.reduce_in_step();
    reducer_.before_update();
    // 2. The squared norm: each rank's partial sum over its shard, added over ranks in rank order (over the
    //    model-parallel group first, where there is one), so that every rank of the job computes the same norm bit
    //    for bit and takes the same clip and skip decisions (a non-finite partial sum makes the sum non-finite). Which
    //    pass sums the squares was decided at finalize (the store's NormPlan): the optimizer pass, when nothing decides
    //    with the norm (the partial sums are then added after it); else the pass that wrote the reduced values where
    //    there is one (GradientReducer::folded_squares), else a pass of its own. The same bits either way.
    const bool norm_in_update = store_.norm_plan().in_update();
    double sum_sq = 0.0;
    if (!norm_in_update) {
      int folded = 0;
      const double local = stepper_.local_sum_squares(store_, [&](int u) {
        const double* sums = reducer_.folded_squares(u);
        folded += sums != nullptr;
        return sums;
      });
      if (log_enabled(ZERO_LOG_DEBUG))
        log_message(
            ZERO_LOG_DEBUG, comm_.rank(),
            guard_.label("the squares of " + std::to_string(folded) + " of " + std::to_string(store_.num_units()) +
                         " units were summed as their reduced values were "
                         "written"));
      sum_sq = sum_over_job(local, "partial sums of squares");
    }
    // 3. Average, unscale and clip; the loss scale; the learning rate.
    const int64_t micro_steps = options.loss_averaged ? 1 : window_.ended();
    const StepDecision decision = stepper_.decide(sum_sq, comm_.size(), micro_steps, groups);
    result = decision.result;
    // 4. The fused optimizer pass over what this rank updates (skipped on overflow: weights, state, step counter
    //    and schedule untouched).
    double local_sq = 0.0;
    store_.check_nvme_files();
    if (!result.skipped)
      stepper_.update(store_, groups, decision, reducer_.clear_in_update(), norm_in_update ? &local_sq : nullptr);
    // With offloaded state the pass does I/O that may fail on one rank (a broken engine, an aborted communicator):
    // one small exchange lets every rank hear of it in this zero_step, even where nothing collective follows.
    if (store_.optimizer_on_nvme() || store_.plan().nvme_params.enabled) {
      int64_t nothing = 0;
      comm_.control_min(&nothing, 1, guard_.label("the end of the offloaded optimizer pass"));
    }
    if (norm_in_update)
      result.grad_norm = Stepper::norm_from(sum_over_job(local_sq, "partial sums of squares"), decision);
    // 5. Clear the gradients the optimizer pass did not (all of them after a skipped step); publish the new
    //    params where the plan says so.
    reducer_.after_step(result.skipped);
    if (!result.skipped) store_.publish("all-gather of the new params");
  });
  device_call.end("zero_step");
  window_.start_window();
  result.step = stepper_.steps();
  stepper_.account(result);
  return result;
}

}  // namespace zero
