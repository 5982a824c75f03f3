package zero

import (
	"sync"

	"libzero/internal/capi"
)

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
