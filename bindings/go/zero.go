// Package zero is libzero for Go: a ZeRO training engine that owns where every parameter, gradient and
// optimizer-state byte lives, the collectives that move them and the optimizer step, while the program owns forward
// and backward.
//
//	comm, err := zero.NewMPIComm()
//	engine, err := zero.NewEngine(config, comm)
//	w, err := engine.AddParam(zero.Param{Name: "w", Shape: []int64{16, 8}, Init: values})
//	err = engine.Finalize()
//	err = engine.Gather(0)           // forward: read engine.Param(w)
//	g, err := engine.Grad(w)         // backward: add into g.Float32()
//	err = engine.GradReady(w)
//	err = engine.Release(0)
//	err = engine.BackwardEnd()
//	info, err := engine.Step()
//
// Every call returns an error of type *Error (its Status is the C status code; errors.Is(err, zero.ErrRemote)
// tests for one). One goroutine at a time drives a communicator and every engine on it, making collective calls in
// the same order on every rank (calls on one engine are serialized); Abort and RecentCollectives may be called from
// any goroutine. Close engines and communicators when done: libzero's memory is not Go's, and no finalizer frees
// it.
//
// Leaving: Go exits without running C's atexit handlers, which is where libzero tells the other ranks that this one
// is leaving and finalises MPI. End an MPI program with Comm.Shutdown (collective), and leave on an error with
// zero.Exit(code) rather than os.Exit or log.Fatal: the other ranks then fail at once, naming this rank, instead
// of waiting out the collective timeout.
package zero

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"libzero/internal/capi"
)

// Error is a failed libzero call: Status is the C status code (zero_status_t), Code its name ("ZERO_ERR_REMOTE"),
// Message libzero's explanation of what went wrong and how to fix it.
type Error struct {
	Status  int32
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Is makes errors.Is(err, zero.ErrRemote) true for every error of that status: a target without a message
// matches by status.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Status == e.Status && (t.Message == "" || t.Message == e.Message)
}

func invalid(format string, args ...any) error {
	return &Error{Status: 1, Code: "ZERO_ERR_INVALID_ARGUMENT", Message: fmt.Sprintf(format, args...)}
}

// Targets for errors.Is, one per status code.
var (
	ErrInvalidArgument   = &Error{Status: 1}
	ErrInvalidState      = &Error{Status: 2}
	ErrConfig            = &Error{Status: 3}
	ErrUnsupported       = &Error{Status: 4}
	ErrMismatch          = &Error{Status: 5}
	ErrComm              = &Error{Status: 6}
	ErrOutOfMemory       = &Error{Status: 7}
	ErrInternal          = &Error{Status: 8}
	ErrCheckpointCorrupt = &Error{Status: 9}
	ErrIO                = &Error{Status: 10}
	ErrRemote            = &Error{Status: 11}
	ErrTimeout           = &Error{Status: 12}
	ErrAborted           = &Error{Status: 13}
)

// ErrStaleView is returned by a View used after its unit was released or its gradient declared ready.
var ErrStaleView = fmt.Errorf("libzero: stale view")

// ErrClosed is returned by calls on a closed Engine or Comm.
var ErrClosed = fmt.Errorf("libzero: closed")

// call runs a C call with the goroutine locked to its OS thread: zero_last_error(), which the status typemap reads
// right after the call, is per OS thread, and goroutines otherwise move between threads.
func call(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	err := f()
	if ce, ok := err.(*capi.Error); ok {
		return &Error{Status: ce.Status, Code: ce.Code, Message: ce.Message}
	}
	return err
}

// Exit ends the process through C's exit(), so that libzero's exit handlers run: they tell the other ranks this one
// is leaving (their collectives fail at once with ErrRemote naming it) and finalise MPI. Use it instead of
// os.Exit and log.Fatal in an MPI program; deferred functions do not run.
func Exit(code int) {
	capi.Zero_swig_exit(int(int32(code)))
}

// id32 checks that an id or count given as a Go int fits C's int32_t (the C API's type for ids).
func id32(v int, what string) (int, error) {
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, invalid("%s %d does not fit a 32-bit id", what, v)
	}
	return v, nil
}

// cString checks that a Go string can be passed as a C string (no NUL byte, which would cut it short).
func cString(s, what string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return invalid("%s contains a NUL byte: %q", what, s)
	}
	return nil
}

// DType is an element type of params and gradients.
type DType int32

const (
	FP32 DType = 0
	BF16 DType = 1
	FP16 DType = 2
)

func (d DType) String() string {
	switch d {
	case FP32:
		return "fp32"
	case BF16:
		return "bf16"
	case FP16:
		return "fp16"
	}
	return fmt.Sprintf("dtype(%d)", int32(d))
}

// Size is the bytes per element.
func (d DType) Size() int {
	if d == FP32 {
		return 4
	}
	return 2
}

// ---- Communicators ------------------------------------------------------------------------------------------------

// Comm is the set of ranks that train together. Engines keep their communicator alive, so closing it first is safe.
// Calls on a communicator and on every engine using it are serialized (libzero initialises MPI with
// MPI_THREAD_SERIALIZED); collective calls must still come in the same order on every rank, so drive all engines of
// one communicator from one goroutine.
type Comm struct {
	mu     sync.Mutex // held by every call on the communicator and on its engines
	handle uintptr
	rank   int
	size   int
}

// NewMPIComm is the whole MPI job (MPI_COMM_WORLD); libzero initialises MPI (MPI_THREAD_SERIALIZED) if the program
// has not. Collective.
func NewMPIComm() (*Comm, error) { return NewMPICommFromFortran(-1) }

// NewMPICommFromFortran wraps an MPI communicator given by its Fortran handle (MPI_Comm_c2f), or -1 for
// MPI_COMM_WORLD. libzero duplicates it. Collective.
func NewMPICommFromFortran(handle int64) (*Comm, error) {
	var h uintptr
	if err := call(func() error { return capi.Zero_comm_create_mpi(&h, handle) }); err != nil {
		return nil, err
	}
	return newComm(h)
}

// NewSingleComm is one process without MPI.
func NewSingleComm() (*Comm, error) {
	var h uintptr
	if err := call(func() error { return capi.Zero_comm_create_single(&h) }); err != nil {
		return nil, err
	}
	return newComm(h)
}

func newComm(h uintptr) (*Comm, error) {
	var rank, size int32
	err := call(func() error {
		if err := capi.Zero_comm_rank(&rank, h); err != nil {
			return err
		}
		return capi.Zero_comm_size(&size, h)
	})
	if err != nil {
		capi.Zero_comm_destroy(h)
		return nil, err
	}
	return &Comm{handle: h, rank: int(rank), size: int(size)}, nil
}

// Rank is this process's rank.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks.
func (c *Comm) Size() int { return c.size }

// Shutdown is the collective teardown (zero_comm_finalize): it agrees with every rank that the communicator is
// done and finalises MPI if libzero initialised it. Afterwards only Close is valid. A Go program on MPI must call
// it before it exits: Go exits without running C's atexit handlers, where libzero would otherwise finalise MPI.
func (c *Comm) Shutdown() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.handle == 0 {
		return ErrClosed
	}
	return call(func() error { return capi.Zero_comm_finalize(c.handle) })
}

// Close releases this reference (local). Closing twice is harmless. An MPI communicator closed without Shutdown keeps
// its duplicated MPI communicator (tens of KB) until MPI is finalised: Shutdown frees it.
func (c *Comm) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.handle != 0 {
		capi.Zero_comm_destroy(c.handle)
		c.handle = 0
	}
	return nil
}

// ---- Configs ------------------------------------------------------------------------------------------------------

// ConfigFromMap turns a DeepSpeed config given as Go values (maps, slices, strings, numbers, bools) into its JSON.
func ConfigFromMap(config map[string]any) (string, error) {
	text, err := json.Marshal(config)
	if err != nil {
		return "", fmt.Errorf("libzero: the config cannot be written as JSON: %w", err)
	}
	return string(text), nil
}

// ConfigFromFile reads a ds_config.json.
func ConfigFromFile(path string) (string, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("libzero: reading the config: %w", err)
	}
	return string(text), nil
}

// CheckConfig reports what libzero will do with config for worldSize ranks (the text `zero-config check` prints).
func CheckConfig(config string, worldSize int) (string, error) {
	if err := cString(config, "the config"); err != nil {
		return "", err
	}
	if _, err := id32(worldSize, "world size"); err != nil {
		return "", err
	}
	var report string
	err := call(func() error { return capi.Zero_config_check(&report, config, worldSize) })
	return report, err
}

// ---- Registration -------------------------------------------------------------------------------------------------

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

// ---- The engine ---------------------------------------------------------------------------------------------------

// Engine is one rank's ZeRO engine.
type Engine struct {
	mu      *sync.Mutex // the communicator's: one call at a time on a communicator (MPI_THREAD_SERIALIZED)
	handle  uintptr     // under mu
	abortMu sync.Mutex  // Abort and the destroy in Close, which must never run concurrently
	abortH  uintptr     // under abortMu: the handle Abort may use (a blocked call holds mu)
	comm    *Comm
	rank    int
	names   []string
	inits   []int64 // C memory holding initial values until Finalize
	// Go-side validity of views: bumped on every gather/release of a unit and every end of a gradient.
	unitEpoch []uint64
	gathered  []bool
	gradEpoch []uint64
}

// NewEngine creates an engine from a DeepSpeed JSON config on comm (local). Unknown keys and wrong types are
// errors naming the key.
func NewEngine(config string, comm *Comm) (*Engine, error) {
	if comm == nil {
		return nil, invalid("NewEngine: comm is nil")
	}
	if err := cString(config, "the config"); err != nil {
		return nil, err
	}
	comm.mu.Lock()
	ch := comm.handle
	comm.mu.Unlock()
	if ch == 0 {
		return nil, ErrClosed
	}
	var h uintptr
	if err := call(func() error { return capi.Zero_engine_create(&h, config, ch) }); err != nil {
		return nil, err
	}
	return &Engine{mu: &comm.mu, handle: h, abortH: h, comm: comm, rank: comm.rank}, nil
}

// lock takes the engine for one call and returns its handle, or ErrClosed.
func (e *Engine) lock() (uintptr, error) {
	e.mu.Lock()
	if e.handle == 0 {
		e.mu.Unlock()
		return 0, ErrClosed
	}
	return e.handle, nil
}

// with runs one C call (or a few) under the engine's lock, with its handle; ErrClosed after Close.
func (e *Engine) with(f func(h uintptr) error) error {
	h, err := e.lock()
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	return f(h)
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

// SaveCheckpoint saves a sharded checkpoint as dir/tag and points dir/latest at it. Collective.
func (e *Engine) SaveCheckpoint(dir, tag string) error {
	if err := paths(dir, tag); err != nil {
		return err
	}
	return e.with(func(h uintptr) error {
		return call(func() error { return capi.Zero_save_checkpoint(h, dir, tag) })
	})
}

// LoadCheckpoint loads dir/tag (tag "": the latest), whatever rank count saved it. Collective.
func (e *Engine) LoadCheckpoint(dir, tag string) error {
	if err := paths(dir, tag); err != nil {
		return err
	}
	return e.with(func(h uintptr) error {
		return call(func() error { return capi.Zero_load_checkpoint(h, dir, tag) })
	})
}

func paths(dir, tag string) error {
	if err := cString(dir, "the checkpoint directory"); err != nil {
		return err
	}
	return cString(tag, "the checkpoint tag")
}

// EngineInfo is the engine's shape.
type EngineInfo struct {
	Rank, WorldSize, Stage, GradientAccumulationSteps int
	ParamDType, GradDType, CommDType                  DType
	NumParams, NumUnits, OptimizerThreads             int
	Deterministic                                     bool
	TimeoutSeconds                                    float64
}

func (e *Engine) info(h uintptr) (EngineInfo, error) {
	out := capi.NewZero_engine_info_t()
	defer capi.DeleteZero_engine_info_t(out)
	if err := call(func() error { return capi.Zero_engine_info(out, h) }); err != nil {
		return EngineInfo{}, err
	}
	return EngineInfo{Rank: out.GetRank(), WorldSize: out.GetWorld_size(), Stage: out.GetStage(),
		GradientAccumulationSteps: out.GetGradient_accumulation_steps(), ParamDType: DType(out.GetParam_dtype()),
		GradDType: DType(out.GetGrad_dtype()), CommDType: DType(out.GetComm_dtype()), NumParams: out.GetNum_params(),
		NumUnits: out.GetNum_units(), OptimizerThreads: out.GetOptimizer_threads(),
		Deterministic: out.GetDeterministic() != 0, TimeoutSeconds: out.GetTimeout_s()}, nil
}

// Info describes the engine.
func (e *Engine) Info() (EngineInfo, error) {
	h, err := e.lock()
	if err != nil {
		return EngineInfo{}, err
	}
	defer e.mu.Unlock()
	return e.info(h)
}

// MemoryStats is the bytes this rank allocated per category, padding included.
type MemoryStats struct {
	ParamBytes, GradBytes, MasterParamBytes, OptimizerStateBytes, BucketBytes, GatheredBytes, TotalBytes uint64
}

// MemoryStats reports this rank's allocations (after Finalize).
func (e *Engine) MemoryStats() (MemoryStats, error) {
	h, err := e.lock()
	if err != nil {
		return MemoryStats{}, err
	}
	defer e.mu.Unlock()
	out := capi.NewZero_memory_stats_t()
	defer capi.DeleteZero_memory_stats_t(out)
	if err := call(func() error { return capi.Zero_memory_stats(out, h) }); err != nil {
		return MemoryStats{}, err
	}
	return MemoryStats{ParamBytes: out.GetParam_bytes(), GradBytes: out.GetGrad_bytes(),
		MasterParamBytes: out.GetMaster_param_bytes(), OptimizerStateBytes: out.GetOptimizer_state_bytes(),
		BucketBytes: out.GetBucket_bytes(), GatheredBytes: out.GetGathered_bytes(), TotalBytes: out.GetTotal_bytes()}, nil
}

// RecentCollectives is the engine's last collectives as JSON (experimental API), for a framework's hang reports.
// Unlike the other calls it does not wait for a call in progress: it is for reporting one that is stuck.
func (e *Engine) RecentCollectives() (string, error) {
	e.abortMu.Lock()
	defer e.abortMu.Unlock()
	if e.abortH == 0 {
		return "", ErrClosed
	}
	var text string
	err := call(func() error { return capi.Zero_engine_recent_collectives(&text, e.abortH) })
	return text, err
}

// Abort makes the engine unusable now: a call blocked in a collective on another goroutine returns ErrAborted, and
// the other ranks' collectives fail naming this rank. Any goroutine; never waits for a call in progress.
func (e *Engine) Abort() {
	e.abortMu.Lock()
	defer e.abortMu.Unlock()
	if e.abortH != 0 {
		capi.Zero_engine_abort(e.abortH)
	}
}

// Close destroys the engine and its buffers; views become stale. It waits for a call in progress on another
// goroutine (Abort first to cut a collective short). Closing twice is harmless.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.handle == 0 {
		return nil
	}
	e.abortMu.Lock()
	h := e.handle
	e.handle = 0
	e.abortH = 0
	capi.Zero_engine_destroy(h)
	e.abortMu.Unlock()
	e.freeInits()
	return nil
}

// ParamInfo describes a registered param.
type ParamInfo struct {
	Name                  string
	Shape                 []int64
	Unit, Group           int
	Numel                 uint64
	ParamDType, GradDType DType
}

// ParamInfo describes param id (any time after AddParam). Local.
func (e *Engine) ParamInfo(param int) (ParamInfo, error) {
	h, err := e.lock()
	if err != nil {
		return ParamInfo{}, err
	}
	defer e.mu.Unlock()
	if _, err := id32(param, "param"); err != nil {
		return ParamInfo{}, err
	}
	out := capi.NewZero_param_info_t()
	defer capi.DeleteZero_param_info_t(out)
	if err := call(func() error { return capi.Zero_param_info(out, h, param) }); err != nil {
		return ParamInfo{}, err
	}
	shape := make([]int64, out.GetNdim())
	for i := range shape {
		shape[i] = out.Dim(i)
	}
	return ParamInfo{Name: out.Param_name(), Shape: shape, Unit: out.GetUnit(), Group: out.GetGroup(),
		Numel: out.GetNumel(), ParamDType: DType(out.GetParam_dtype()), GradDType: DType(out.GetGrad_dtype())}, nil
}

// CommKindStats is one collective kind's traffic: calls, payload bytes as nccl-tests counts them, and the bytes one
// rank sends in a bandwidth-optimal algorithm.
type CommKindStats struct{ Calls, Bytes, WireBytes uint64 }

// CommStats is the engine's collective traffic since Finalize.
type CommStats struct {
	Sequence                                                uint64
	AllGather, ReduceScatter, AllReduce, Broadcast, Control CommKindStats
}

// CommStats reports the engine's collective traffic since Finalize.
func (e *Engine) CommStats() (CommStats, error) {
	h, err := e.lock()
	if err != nil {
		return CommStats{}, err
	}
	defer e.mu.Unlock()
	out := capi.NewZero_comm_stats_t()
	defer capi.DeleteZero_comm_stats_t(out)
	if err := call(func() error { return capi.Zero_comm_stats(out, h) }); err != nil {
		return CommStats{}, err
	}
	kind := func(k capi.Zero_comm_kind_stats_t) CommKindStats {
		return CommKindStats{Calls: k.GetCalls(), Bytes: k.GetBytes(), WireBytes: k.GetWire_bytes()}
	}
	return CommStats{Sequence: out.GetSequence(), AllGather: kind(out.GetAll_gather()),
		ReduceScatter: kind(out.GetReduce_scatter()), AllReduce: kind(out.GetAll_reduce()),
		Broadcast: kind(out.GetBroadcast()), Control: kind(out.GetControl())}, nil
}

// Version is the libzero library's version as major*10000 + minor*100 + patch.
func Version() int { return int(capi.Zero_get_version()) }
