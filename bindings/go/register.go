package zero

import (
	"fmt"
	"math"
	"unsafe"

	"libzero/internal/capi"
)

// GroupOption sets one hyper-parameter of a param group (LR, WeightDecay, Betas, Eps); what no option sets inherits
// the config's optimizer.params. Values are checked by libzero (a negative learning rate is an error).
type GroupOption func(*groupSettings)

type groupSettings struct {
	set    [5]bool
	values [5]float64
}

func (g *groupSettings) put(i int, v float64) { g.set[i], g.values[i] = true, v }

// LR sets the group's learning rate.
func LR(v float64) GroupOption { return func(g *groupSettings) { g.put(0, v) } }

// WeightDecay sets the group's weight decay.
func WeightDecay(v float64) GroupOption { return func(g *groupSettings) { g.put(1, v) } }

// Betas sets the group's Adam betas.
func Betas(b1, b2 float64) GroupOption { return func(g *groupSettings) { g.put(2, b1); g.put(3, b2) } }

// Eps sets the group's Adam epsilon.
func Eps(v float64) GroupOption { return func(g *groupSettings) { g.put(4, v) } }

// Param is a parameter to register. Unit is its gather unit (units are numbered 0..U-1 in forward order), Group 0 or
// an id from AddParamGroup. Init holds its fp32 initial values (row-major) or is nil for zeros; only rank 0's are
// used, and they are copied at AddParam.
type Param struct {
	Name  string
	Shape []int64
	Unit  int
	Group int
	Init  []float32
}

// AddParamGroup adds a param group and returns its id (1, 2, ... in call order). Before Finalize. Local.
func (e *Engine) AddParamGroup(name string, options ...GroupOption) (int, error) {
	h, err := e.lock()
	if err != nil {
		return 0, err
	}
	defer e.mu.Unlock()
	if err := cString(name, "the group name"); err != nil {
		return 0, err
	}
	var g groupSettings
	for _, option := range options {
		option(&g)
	}
	desc := capi.NewZero_param_group_desc_t()
	defer capi.DeleteZero_param_group_desc_t(desc)
	if name != "" {
		desc.Set_name(name)
	}
	setters := []func(float64){desc.SetLr, desc.SetWeight_decay, desc.SetBeta1, desc.SetBeta2, desc.SetEps}
	for i, set := range setters {
		if g.set[i] {
			if g.values[i] == -1 { // ZERO_INHERIT in C: refuse rather than silently inherit
				return 0, invalid("param group %q: -1 is not a valid value (leave the option out to inherit)", name)
			}
			set(g.values[i])
		}
	}
	var id int32
	err = call(func() error { return capi.Zero_engine_add_param_group(&id, h, desc) })
	return int(id), err
}

// AddParam registers a param and returns its id (0, 1, ... in call order). Before Finalize. Local.
func (e *Engine) AddParam(p Param) (int, error) {
	if err := cString(p.Name, "the param name"); err != nil {
		return 0, err
	}
	if _, err := id32(p.Unit, "unit"); err != nil {
		return 0, err
	}
	if _, err := id32(p.Group, "group"); err != nil {
		return 0, err
	}
	// The number of initial values is checked on every rank (only rank 0's are copied): a rank that passed the
	// wrong number fails here, not in Finalize on the others.
	numel := int64(1)
	for _, d := range p.Shape {
		if d <= 0 || numel > math.MaxInt64/d {
			numel = -1 // libzero explains a bad shape
			break
		}
		numel *= d
	}
	if p.Init != nil && numel >= 0 && int64(len(p.Init)) != numel {
		return 0, invalid("param %q has %d elements but %d initial values", p.Name, numel, len(p.Init))
	}
	h, err := e.lock()
	if err != nil {
		return 0, err
	}
	defer e.mu.Unlock()
	desc := capi.NewZero_param_desc_t()
	defer capi.DeleteZero_param_desc_t(desc)
	desc.Set_name(p.Name)
	desc.Set_shape(p.Shape)
	desc.SetUnit(p.Unit)
	desc.SetGroup(p.Group)
	var init int64
	if p.Init != nil && numel >= 0 && e.rank == 0 { // only rank 0's values are read (finalize broadcasts them)
		init = capi.Zero_swig_alloc(4 * numel)
		if init == 0 {
			return 0, fmt.Errorf("libzero: no memory for the initial values of %q", p.Name)
		}
		copy(unsafe.Slice((*float32)(unsafe.Pointer(uintptr(init))), len(p.Init)), p.Init)
		desc.Set_init_address(init)
		desc.SetInit_dtype(int(FP32))
	}
	var id int32
	if err := call(func() error { return capi.Zero_engine_add_param(&id, h, desc) }); err != nil {
		if init != 0 {
			capi.Zero_swig_free(init)
		}
		return 0, err
	}
	if init != 0 {
		e.inits = append(e.inits, init) // read during Finalize
	}
	e.names = append(e.names, p.Name)
	return int(id), nil
}

// Finalize checks that every rank registered the same params and config, allocates the stage's buffers and
// broadcasts rank 0's initial values. Collective.
func (e *Engine) Finalize() error {
	h, err := e.lock()
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	if err := call(func() error { return capi.Zero_engine_finalize(h) }); err != nil {
		return err
	}
	e.freeInits()
	info, err := e.info(h)
	if err != nil {
		return err
	}
	e.unitEpoch = make([]uint64, info.NumUnits)
	e.gathered = make([]bool, info.NumUnits)
	e.gradEpoch = make([]uint64, len(e.names))
	return nil
}

func (e *Engine) freeInits() {
	for _, init := range e.inits {
		capi.Zero_swig_free(init)
	}
	e.inits = nil
}
