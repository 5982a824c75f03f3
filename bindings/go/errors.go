package zero

import (
	"fmt"
	"runtime"

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
