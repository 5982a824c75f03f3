package zero

import (
	"sync"

	"libzero/internal/capi"
)

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
