package zero

import (
	"fmt"
	"unsafe"

	"libzero/internal/capi"
)

// View is engine memory seen from Go without a copy: a param's values (valid while its unit stays gathered) or
// the buffer its gradient is added into (valid until GradReady for it). Float32 and Uint16 check that the view is
// still valid and return ErrStaleView otherwise; the slices they return alias engine memory, so use them only
// while the view is valid (the rule of zero_param_data in C).
type View struct {
	engine   *Engine
	gradient bool
	param    int
	unit     int
	epoch    uint64
	data     unsafe.Pointer
	length   int
	dtype    DType
}

// Valid reports whether the view's memory is still the caller's to use.
func (v *View) Valid() bool {
	e := v.engine
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.handle == 0 {
		return false
	}
	if v.gradient {
		return v.param < len(e.gradEpoch) && e.gradEpoch[v.param] == v.epoch
	}
	return v.unit < len(e.unitEpoch) && e.gathered[v.unit] && e.unitEpoch[v.unit] == v.epoch
}

// DType is the element type: the param dtype for params, the gradient accumulation dtype for gradients.
func (v *View) DType() DType { return v.dtype }

// Len is the number of elements.
func (v *View) Len() int { return v.length }

func (v *View) check(want string) error {
	if !v.Valid() {
		what := fmt.Sprintf("unit %d was released", v.unit)
		if v.gradient {
			what = "its gradient was declared ready (or the micro-step ended)"
		}
		if v.engine.closed() {
			what = "the engine is closed"
		}
		return fmt.Errorf("%w: the view of param %d (%s): %s", ErrStaleView, v.param, v.engine.name(v.param), what)
	}
	if (want == "fp32") != (v.dtype == FP32) {
		return fmt.Errorf("libzero: the view of param %d holds %v elements", v.param, v.dtype)
	}
	return nil
}

// Float32 is the fp32 elements, aliasing engine memory.
func (v *View) Float32() ([]float32, error) {
	if err := v.check("fp32"); err != nil {
		return nil, err
	}
	return unsafe.Slice((*float32)(v.data), v.length), nil
}

// Uint16 is the bf16 / fp16 elements' bits, aliasing engine memory.
func (v *View) Uint16() ([]uint16, error) {
	if err := v.check("16-bit"); err != nil {
		return nil, err
	}
	return unsafe.Slice((*uint16)(v.data), v.length), nil
}

func (e *Engine) closed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.handle == 0
}

func (e *Engine) name(param int) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if param >= 0 && param < len(e.names) {
		return e.names[param]
	}
	return "?"
}

func (e *Engine) view(gradient bool, param int) (*View, error) {
	h, err := e.lock()
	if err != nil {
		return nil, err
	}
	defer e.mu.Unlock()
	if _, err := id32(param, "param"); err != nil {
		return nil, err
	}
	var address uintptr
	info := capi.NewZero_param_info_t()
	defer capi.DeleteZero_param_info_t(info)
	err = call(func() error {
		if gradient {
			if err := capi.Zero_grad_data(&address, h, param); err != nil {
				return err
			}
		} else if err := capi.Zero_param_data(&address, h, param); err != nil {
			return err
		}
		return capi.Zero_param_info(info, h, param)
	})
	if err != nil {
		return nil, err
	}
	v := &View{engine: e, gradient: gradient, param: param, unit: info.GetUnit(), length: int(info.GetNumel()),
		data: unsafe.Pointer(address)}
	if gradient {
		v.dtype = DType(info.GetGrad_dtype())
		v.epoch = e.gradEpoch[param]
	} else {
		v.dtype = DType(info.GetParam_dtype())
		v.epoch = e.unitEpoch[v.unit]
	}
	return v, nil
}

// Param is a view of the param's values, valid while its unit stays gathered.
func (e *Engine) Param(param int) (*View, error) { return e.view(false, param) }

// Grad is a view of the buffer the param's gradient is added into (+=), valid until GradReady for it.
func (e *Engine) Grad(param int) (*View, error) { return e.view(true, param) }
