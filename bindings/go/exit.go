package zero

import "libzero/internal/capi"

// Exit ends the process through C's exit(), so that libzero's exit handlers run: they tell the other ranks this one
// is leaving (their collectives fail at once with ErrRemote naming it) and finalise MPI. Use it instead of
// os.Exit and log.Fatal in an MPI program; deferred functions do not run.
func Exit(code int) {
	capi.Zero_swig_exit(int(int32(code)))
}
