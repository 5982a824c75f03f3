// The accumulation window: the gradient_accumulation_steps micro-steps of one optimizer step. The engine owns it
// and advances it (zero_backward_end ends a micro-step, zero_step ends the window, a checkpoint's load starts a new
// one); the parts that behave differently depending on where a micro-step sits in its window read it by const
// reference: the reducer (the window's last micro-step sums the norm's squares as it writes the accumulators),
// the store (fetching ahead may reach into the next micro-step's first units when the params stay the same in
// between) and the checkpointer (checkpoints are taken between steps). The C API reports it
// (zero_engine_window), so bindings need not count micro-steps themselves.
#pragma once

#include <cstdint>

namespace zero {

class MicroStepWindow {
 public:
  explicit MicroStepWindow(int64_t accumulation_steps) : accumulation_steps_(accumulation_steps) {}

  int64_t accumulation_steps() const { return accumulation_steps_; }
  // Micro-steps ended (zero_backward_end) in this window.
  int64_t ended() const { return ended_; }
  // Micro-steps ended since finalize: the number the agreement of zero_backward_end carries.
  int64_t total_ended() const { return total_ended_; }
  // Every micro-step of the window has ended: zero_step's turn, and no gradient may come before it.
  bool complete() const { return ended_ == accumulation_steps_; }
  // The micro-step running now is the window's last.
  bool running_last() const { return ended_ == accumulation_steps_ - 1; }
  // Another micro-step of this window follows the one running now (the params do not change in between).
  bool next_in_window() const { return ended_ + 1 < accumulation_steps_; }

  void end_micro_step() { ended_ += 1, total_ended_ += 1; }
  // zero_step, and a checkpoint's load (which leaves no gradient behind).
  void start_window() { ended_ = 0; }

 private:
  int64_t accumulation_steps_;
  int64_t ended_ = 0;
  int64_t total_ended_ = 0;
};

}  // namespace zero
