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
