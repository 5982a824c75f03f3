package zero

import "libzero/internal/capi"

// Gather makes units' full parameters available (stage 3: all-gathers them; collective there).
func (e *Engine) Gather(units ...int) error { return e.setUnits(units, true, capi.Zero_gather) }

// Release gives gathered units back; their views become stale. Local.
func (e *Engine) Release(units ...int) error { return e.setUnits(units, false, capi.Zero_release) }

// setUnits gathers or releases units in turn, recording each change for the views' validity.
func (e *Engine) setUnits(units []int, gathered bool, op func(uintptr, int) error) error {
	h, err := e.lock()
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	for _, u := range units {
		if _, err := id32(u, "unit"); err != nil {
			return err
		}
		if err := call(func() error { return op(h, u) }); err != nil {
			return err
		}
		e.unitEpoch[u]++
		e.gathered[u] = gathered
	}
	return nil
}

// Prefetch starts the all-gather of a stage-3 unit ahead of its Gather (experimental API). Collective.
func (e *Engine) Prefetch(unit int) error {
	if _, err := id32(unit, "unit"); err != nil {
		return err
	}
	return e.with(func(h uintptr) error { return call(func() error { return capi.Zero_prefetch(h, unit) }) })
}

// GradReady declares the param's gradient for this micro-step complete (stages 2-3: may start a reduction;
// collective there).
func (e *Engine) GradReady(param int) error {
	if _, err := id32(param, "param"); err != nil {
		return err
	}
	return e.with(func(h uintptr) error {
		if err := call(func() error { return capi.Zero_grad_ready(h, param) }); err != nil {
			return err
		}
		e.gradEpoch[param]++
		return nil
	})
}

func (e *Engine) endGradients() {
	for i := range e.gradEpoch {
		e.gradEpoch[i]++
	}
}

// BackwardEnd ends the micro-step, reducing every bucket still pending. Collective.
func (e *Engine) BackwardEnd() error {
	return e.with(func(h uintptr) error {
		defer e.endGradients()
		return call(func() error { return capi.Zero_backward_end(h) })
	})
}

// StepInfo is what Step did.
type StepInfo struct {
	Step      int64   // optimizer steps so far, this one included (skipped ones not)
	LossScale float64 // the loss scale used (1 without fp16)
	GradNorm  float64 // global L2 norm of the averaged gradients, before clipping
	Skipped   bool    // the step was skipped (fp16 overflow)
	LR        float64 // group 0's learning rate for this step
}

// Step runs the optimizer after gradient_accumulation_steps micro-steps. Collective.
func (e *Engine) Step() (StepInfo, error) {
	h, err := e.lock()
	if err != nil {
		return StepInfo{}, err
	}
	defer e.mu.Unlock()
	defer e.endGradients()
	out := capi.NewZero_step_info_t()
	defer capi.DeleteZero_step_info_t(out)
	if err := call(func() error { return capi.Zero_step(out, h) }); err != nil {
		return StepInfo{}, err
	}
	return StepInfo{Step: out.GetStep(), LossScale: out.GetLoss_scale(), GradNorm: out.GetGrad_norm(),
		Skipped: out.GetSkipped() != 0, LR: out.GetLr()}, nil
}

// LossScale is the factor to multiply the loss by before backward (fp16's loss scale; 1 otherwise).
func (e *Engine) LossScale() (float64, error) {
	var scale float64
	err := e.with(func(h uintptr) error { return call(func() error { return capi.Zero_loss_scale(&scale, h) }) })
	return scale, err
}

// SetLR sets a group's learning rate (group -1: every group); every rank must set the same value.
func (e *Engine) SetLR(group int, lr float64) error {
	if _, err := id32(group, "group"); err != nil {
		return err
	}
	return e.with(func(h uintptr) error { return call(func() error { return capi.Zero_set_lr(h, group, lr) }) })
}

// SetNumThreads sets this rank's optimizer threads (0: automatic). Results do not depend on it.
func (e *Engine) SetNumThreads(threads int) error {
	if _, err := id32(threads, "thread count"); err != nil {
		return err
	}
	return e.with(func(h uintptr) error {
		return call(func() error { return capi.Zero_engine_set_num_threads(h, threads) })
	})
}
