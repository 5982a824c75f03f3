package zero_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"libzero"
)

func sgd(t *testing.T, stage, accumulation int) string {
	t.Helper()
	config, err := zero.ConfigFromMap(map[string]any{
		"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": accumulation, "gradient_clipping": 0.0,
		"optimizer":         map[string]any{"type": "SGD", "params": map[string]any{"lr": 0.25}},
		"zero_optimization": map[string]any{"stage": stage, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 8},
	})
	if err != nil {
		t.Fatal(err)
	}
	return config
}

func ramp(n int, start float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = start + float32(i)
	}
	return v
}

func check(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// views turns (*View, error) into the view's fp32 data, failing the test on an error: views{t}.of(engine.Grad(p)).
type views struct{ t *testing.T }

func (c views) of(v *zero.View, err error) []float32 {
	c.t.Helper()
	check(c.t, err)
	data, err := v.Float32()
	check(c.t, err)
	return data
}

// mpiWorld is the communicator of the MPI tests: they run when ZERO_GO_MPI=1 (under mpirun, tests/CMakeLists.txt).
func mpiWorld(t *testing.T) *zero.Comm {
	if os.Getenv("ZERO_GO_MPI") != "1" {
		t.Skip("MPI tests run under mpirun with ZERO_GO_MPI=1")
	}
	if world == nil {
		c, err := zero.NewMPIComm()
		check(t, err)
		world = c
	}
	return world
}

var world *zero.Comm

// TestMain shuts the MPI communicator down after the tests: Go exits without C's atexit handlers, so MPI must be
// finalised explicitly (Comm.Shutdown), or mpirun reports the ranks as having exited improperly.
func TestMain(m *testing.M) {
	code := m.Run()
	if world != nil {
		if err := world.Shutdown(); err != nil {
			fmt.Fprintln(os.Stderr, "shutdown:", err)
			code = 1
		}
		world.Close()
	}
	os.Exit(code)
}

func grad(rank, micro, param, index int) float32 { return float32((rank+1)*(index+1) + micro - param) }

// TestEveryStageGivesTheExactUpdate: ranks add small-integer gradients, so every sum is exact and the averaged SGD
// update is computed here exactly; at every stage and accumulation count the weights equal it bit for bit. Odd
// sizes, units interleaved with registration order, a param unused on rank 0. One process runs it too (N = 1).
func TestEveryStageGivesTheExactUpdate(t *testing.T) {
	var comm *zero.Comm
	if os.Getenv("ZERO_GO_MPI") == "1" {
		comm = mpiWorld(t)
	} else {
		c, err := zero.NewSingleComm()
		check(t, err)
		defer c.Close()
		comm = c
	}
	rank, size := comm.Rank(), comm.Size()
	sizes := []int{7, 1, 13, 4}
	units := []int{1, 0, 1, 2}
	for stage := 0; stage <= 3; stage++ {
		for accumulation := 1; accumulation <= 2; accumulation++ {
			name := fmt.Sprintf("stage %d accumulation %d", stage, accumulation)
			engine, err := zero.NewEngine(sgd(t, stage, accumulation), comm)
			check(t, err)
			ids := make([]int, len(sizes))
			for p := range sizes {
				ids[p], err = engine.AddParam(zero.Param{Name: fmt.Sprintf("p%d", p), Shape: []int64{int64(sizes[p])},
					Unit: units[p], Init: ramp(sizes[p], float32(p))})
				check(t, err)
			}
			check(t, engine.Finalize())
			for micro := 0; micro < accumulation; micro++ {
				check(t, engine.Gather(0, 1, 2))
				for p := len(sizes) - 1; p >= 0; p-- {
					if p == 1 && rank == 0 {
						continue
					}
					g := views{t}.of(engine.Grad(ids[p]))
					for i := range g {
						g[i] += grad(rank, micro, p, i)
					}
					check(t, engine.GradReady(ids[p]))
				}
				check(t, engine.Release(2, 1, 0))
				check(t, engine.BackwardEnd())
			}
			info, err := engine.Step()
			check(t, err)
			if info.Step != 1 || info.Skipped {
				t.Fatalf("%s: step info %+v", name, info)
			}
			check(t, engine.Gather(0, 1, 2))
			for p := range sizes {
				got := views{t}.of(engine.Param(ids[p]))
				for i := range got {
					var sum float32
					for r := 0; r < size; r++ {
						for m := 0; m < accumulation; m++ {
							if !(p == 1 && r == 0) {
								sum += grad(r, m, p, i)
							}
						}
					}
					want := float32(p+i) - float32(0.25*(sum/float32(size*accumulation)))
					if got[i] != want {
						t.Fatalf("%s: param %d element %d = %v, want %v", name, p, i, got[i], want)
					}
				}
			}
			check(t, engine.Release(0, 1, 2))
			check(t, engine.Close())
		}
	}
}

func TestViewsOfReleasedUnitsAreStale(t *testing.T) {
	comm, err := zero.NewSingleComm()
	check(t, err)
	defer comm.Close()
	engine, err := zero.NewEngine(sgd(t, 3, 1), comm)
	check(t, err)
	defer engine.Close()
	p, err := engine.AddParam(zero.Param{Name: "p", Shape: []int64{4}, Init: ramp(4, 1)})
	check(t, err)
	check(t, engine.Finalize())
	if _, err := engine.Param(p); !errors.Is(err, zero.ErrInvalidState) || !strings.Contains(err.Error(), "not gathered") {
		t.Fatalf("param of a released unit: %v", err)
	}
	check(t, engine.Gather(0))
	v, err := engine.Param(p)
	check(t, err)
	if data, _ := v.Float32(); data[1] != 2 {
		t.Fatalf("param[1] = %v", data[1])
	}
	g, err := engine.Grad(p)
	check(t, err)
	check(t, engine.GradReady(p))
	if _, err := g.Float32(); !errors.Is(err, zero.ErrStaleView) {
		t.Fatalf("gradient view after GradReady: %v", err)
	}
	check(t, engine.Release(0))
	if _, err := v.Float32(); !errors.Is(err, zero.ErrStaleView) || !strings.Contains(err.Error(), "released") {
		t.Fatalf("view of a released unit: %v", err)
	}
	check(t, engine.Gather(0))
	if v.Valid() {
		t.Fatal("a view from an earlier gather must stay stale")
	}
	check(t, engine.Release(0))
}

func TestErrorsCarryStatusAndMessage(t *testing.T) {
	comm, err := zero.NewSingleComm()
	check(t, err)
	defer comm.Close()
	_, err = zero.NewEngine(`{"zero_optimization": {"stage": 2, "no_such_key": 1}}`, comm)
	var zerr *zero.Error
	if !errors.As(err, &zerr) || zerr.Status != 3 || zerr.Code != "ZERO_ERR_CONFIG" ||
		!strings.Contains(zerr.Message, "no_such_key") || !errors.Is(err, zero.ErrConfig) {
		t.Fatalf("bad config: %#v", err)
	}
	engine, err := zero.NewEngine(sgd(t, 1, 1), comm)
	check(t, err)
	if _, err := engine.Step(); !errors.Is(err, zero.ErrInvalidState) {
		t.Fatalf("step before finalize: %v", err)
	}
	if _, err := engine.AddParam(zero.Param{Name: "", Shape: []int64{3}}); !errors.Is(err, zero.ErrInvalidArgument) {
		t.Fatalf("empty name: %v", err)
	}
	if _, err := engine.AddParam(zero.Param{Name: "nine", Shape: []int64{1, 1, 1, 1, 1, 1, 1, 1, 1}}); !errors.Is(err, zero.ErrInvalidArgument) {
		t.Fatalf("nine dimensions: %v", err)
	}
	if _, err := engine.AddParam(zero.Param{Name: "y", Shape: []int64{3}, Init: make([]float32, 2)}); err == nil {
		t.Fatal("three elements with two initial values must fail")
	}
	check(t, engine.Close())
	check(t, engine.Close())
	if err := engine.Gather(0); !errors.Is(err, zero.ErrClosed) {
		t.Fatalf("call on a closed engine: %v", err)
	}
	report, err := zero.CheckConfig(sgd(t, 3, 1), 4)
	check(t, err)
	if !strings.Contains(report, "zero stage") {
		t.Fatalf("report: %s", report)
	}
}

func TestAbortAndCheckpoint(t *testing.T) {
	comm, err := zero.NewSingleComm()
	check(t, err)
	defer comm.Close()
	dir := t.TempDir()
	engine, err := zero.NewEngine(sgd(t, 3, 1), comm)
	check(t, err)
	p, err := engine.AddParam(zero.Param{Name: "p", Shape: []int64{5}, Init: ramp(5, 1)})
	check(t, err)
	check(t, engine.Finalize())
	check(t, engine.Gather(0))
	g := views{t}.of(engine.Grad(p))
	copy(g, ramp(5, 1))
	check(t, engine.Release(0))
	check(t, engine.BackwardEnd())
	_, err = engine.Step()
	check(t, err)
	check(t, engine.SaveCheckpoint(dir, "global_step1"))
	check(t, engine.Gather(0))
	trained := append([]float32(nil), views{t}.of(engine.Param(p))...)
	check(t, engine.Release(0))
	engine.Abort()
	if err := engine.Gather(0); !errors.Is(err, zero.ErrAborted) {
		t.Fatalf("gather after abort: %v", err)
	}
	check(t, engine.Close())

	// Abort took the communicator down with the engine (as ncclCommAbort does): a new one for the restore.
	comm2, err := zero.NewSingleComm()
	check(t, err)
	defer comm2.Close()
	if _, err := zero.NewEngine(sgd(t, 1, 1), comm); !errors.Is(err, zero.ErrAborted) {
		t.Fatalf("engine on an aborted communicator: %v", err)
	}
	engine, err = zero.NewEngine(sgd(t, 1, 1), comm2)
	check(t, err)
	defer engine.Close()
	p, err = engine.AddParam(zero.Param{Name: "p", Shape: []int64{5}})
	check(t, err)
	check(t, engine.Finalize())
	check(t, engine.LoadCheckpoint(dir, "")) // "" = the latest
	check(t, engine.Gather(0))
	restored := views{t}.of(engine.Param(p))
	for i, v := range restored {
		if v != trained[i] {
			t.Fatalf("restored %v, saved %v", v, trained[i])
		}
	}
	check(t, engine.Release(0))
	if err := engine.LoadCheckpoint(dir, "no_such_tag"); err == nil {
		t.Fatal("loading a missing tag must fail")
	}
}

// TestOneRankFailingReachesEveryRank: the last rank gathers a unit that does not exist; every other rank's gather
// fails with ErrRemote naming it.
func TestOneRankFailingReachesEveryRank(t *testing.T) {
	comm := mpiWorld(t)
	engine, err := zero.NewEngine(sgd(t, 3, 1), comm)
	check(t, err)
	defer engine.Close()
	_, err = engine.AddParam(zero.Param{Name: "p", Shape: []int64{5}, Unit: 0})
	check(t, err)
	_, err = engine.AddParam(zero.Param{Name: "q", Shape: []int64{3}, Unit: 1})
	check(t, err)
	check(t, engine.Finalize())
	check(t, engine.Gather(0))
	bad := comm.Size() - 1
	if comm.Rank() == bad {
		if err := engine.Gather(7); !errors.Is(err, zero.ErrInvalidArgument) {
			t.Fatalf("gather of unit 7: %v", err)
		}
	} else if err := engine.Gather(1); !errors.Is(err, zero.ErrRemote) || !strings.Contains(err.Error(), fmt.Sprintf("rank %d", bad)) {
		t.Fatalf("rank %d: %v", comm.Rank(), err)
	}
}

func TestRegistrationMismatchIsAnErrorEverywhere(t *testing.T) {
	comm := mpiWorld(t)
	engine, err := zero.NewEngine(sgd(t, 2, 1), comm)
	check(t, err)
	defer engine.Close()
	_, err = engine.AddParam(zero.Param{Name: "w", Shape: []int64{int64(4 + comm.Rank()%2)}})
	check(t, err)
	if err := engine.Finalize(); !errors.Is(err, zero.ErrMismatch) {
		t.Fatalf("finalize with different shapes: %v", err)
	}
}

func TestBadArgumentsAreErrorsNotPanics(t *testing.T) {
	comm, err := zero.NewSingleComm()
	check(t, err)
	defer comm.Close()
	if _, err := zero.NewEngine(sgd(t, 1, 1), nil); !errors.Is(err, zero.ErrInvalidArgument) {
		t.Fatalf("nil comm: %v", err)
	}
	engine, err := zero.NewEngine(sgd(t, 3, 1), comm)
	check(t, err)
	defer engine.Close()
	if _, err := engine.AddParam(zero.Param{Name: "a\x00b", Shape: []int64{2}}); !errors.Is(err, zero.ErrInvalidArgument) {
		t.Fatalf("NUL in a name: %v", err)
	}
	if _, err := engine.AddParam(zero.Param{Name: "u", Shape: []int64{2}, Unit: 1 << 32}); !errors.Is(err, zero.ErrInvalidArgument) {
		t.Fatalf("unit 1<<32: %v", err)
	}
	if _, err := engine.AddParamGroup("g", zero.LR(-1)); !errors.Is(err, zero.ErrInvalidArgument) {
		t.Fatalf("LR(-1): %v", err)
	}
	p, err := engine.AddParam(zero.Param{Name: "p", Shape: []int64{2}})
	check(t, err)
	check(t, engine.Finalize())
	for _, f := range []func() error{
		func() error { return engine.Gather(1 << 32) },
		func() error { return engine.Release(1 << 32) },
		func() error { return engine.GradReady(1 << 32) },
		func() error { _, err := engine.Grad(1 << 32); return err },
		func() error { return engine.SetNumThreads(1 << 32) },
		func() error { return engine.Gather(-1) },
	} {
		if err := f(); !errors.Is(err, zero.ErrInvalidArgument) {
			t.Fatalf("out-of-range id: %v", err)
		}
	}
	check(t, engine.Gather(0))
	check(t, engine.GradReady(p))
	if err := engine.GradReady(p); !errors.Is(err, zero.ErrInvalidState) {
		t.Fatalf("second GradReady: %v", err)
	}
	info, err := engine.ParamInfo(p)
	check(t, err)
	if info.Name != "p" || len(info.Shape) != 1 || info.Shape[0] != 2 || info.ParamDType != zero.FP32 {
		t.Fatalf("param info %+v", info)
	}
	if zero.Version() < 300 {
		t.Fatalf("version %d", zero.Version())
	}
}

// TestInitLengthIsCheckedOnEveryRank: every rank, not only rank 0 (whose values are used), refuses initial values
// of the wrong length, so no rank goes on to wait in Finalize for one that failed.
func TestInitLengthIsCheckedOnEveryRank(t *testing.T) {
	comm := mpiWorld(t)
	engine, err := zero.NewEngine(sgd(t, 2, 1), comm)
	check(t, err)
	defer engine.Close()
	if _, err := engine.AddParam(zero.Param{Name: "w", Shape: []int64{4}, Init: make([]float32, 3)}); !errors.Is(err, zero.ErrInvalidArgument) {
		t.Fatalf("rank %d: %v", comm.Rank(), err)
	}
}

// TestRecentCollectivesDoesNotWaitForABlockedCall: a hang report is asked for while the engine's goroutine is
// blocked in a collective (rank 1 arrives 2 s late); it must come back at once and show the collective waiting.
func TestRecentCollectivesDoesNotWaitForABlockedCall(t *testing.T) {
	comm := mpiWorld(t)
	engine, err := zero.NewEngine(sgd(t, 3, 1), comm)
	check(t, err)
	defer engine.Close()
	_, err = engine.AddParam(zero.Param{Name: "p", Shape: []int64{5}})
	check(t, err)
	check(t, engine.Finalize())
	if comm.Rank() != 0 {
		time.Sleep(2 * time.Second)
		check(t, engine.Gather(0))
		return
	}
	report := make(chan string, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		start := time.Now()
		text, err := engine.RecentCollectives()
		if err != nil || time.Since(start) > time.Second {
			report <- fmt.Sprintf("error %v after %v", err, time.Since(start))
			return
		}
		report <- text
	}()
	check(t, engine.Gather(0))
	if text := <-report; !strings.Contains(text, "waiting") {
		t.Fatalf("report while blocked: %s", text)
	}
}

func TestHalfConversions(t *testing.T) {
	for bits := 0; bits < 0x10000; bits++ { // every finite fp16 value survives the round trip
		if bits&0x7c00 != 0x7c00 && zero.Float32ToFP16(zero.FP16ToFloat32(uint16(bits))) != uint16(bits) {
			t.Fatalf("fp16 %#04x", bits)
		}
	}
	for _, c := range []struct {
		in   float32
		fp16 uint16
		bf16 uint16
	}{{1, 0x3c00, 0x3f80}, {0x1p-24, 0x0001, 0x3380}, {0x1p-26, 0x0000, 0x3280}, {65504, 0x7bff, 0x4780},
		{65520, 0x7c00, 0x4780}, {1 + 0x1p-11, 0x3c00, 0x3f80}, {1 + 3*0x1p-11, 0x3c02, 0x3f80}, {1 + 0x1p-8, 0x3c04, 0x3f80},
		{-2.5, 0xc100, 0xc020}} {
		if got := zero.Float32ToFP16(c.in); got != c.fp16 {
			t.Fatalf("fp16(%v) = %#04x, want %#04x", c.in, got, c.fp16)
		}
		if got := zero.Float32ToBF16(c.in); got != c.bf16 {
			t.Fatalf("bf16(%v) = %#04x, want %#04x", c.in, got, c.bf16)
		}
	}
}

func TestSixteenBitViews(t *testing.T) {
	comm, err := zero.NewSingleComm()
	check(t, err)
	defer comm.Close()
	for _, dtype := range []string{"bf16", "fp16"} {
		config, err := zero.ConfigFromMap(map[string]any{"train_micro_batch_size_per_gpu": 1, dtype: map[string]any{"enabled": true},
			"gradient_clipping": 0.0, "data_types": map[string]any{"grad_accum_dtype": dtype},
			"optimizer":         map[string]any{"type": "SGD", "params": map[string]any{"lr": 1.0}},
			"zero_optimization": map[string]any{"stage": 2}})
		check(t, err)
		engine, err := zero.NewEngine(config, comm)
		check(t, err)
		p, err := engine.AddParam(zero.Param{Name: "p", Shape: []int64{3}, Init: []float32{1.5, -3, 0.1}})
		check(t, err)
		check(t, engine.Finalize())
		check(t, engine.Gather(0))
		pv, err := engine.Param(p)
		check(t, err)
		values, err := pv.ToFloat32s()
		check(t, err)
		want := float32(0.10009765625)
		if dtype == "fp16" {
			want = 0.0999755859375
		}
		if values[0] != 1.5 || values[1] != -3 || values[2] != want {
			t.Fatalf("%s param %v", dtype, values)
		}
		if err := pv.AddFloat32s([]float32{1, 1, 1}); !errors.Is(err, zero.ErrInvalidArgument) {
			t.Fatalf("adding to a param view: %v", err)
		}
		g, err := engine.Grad(p)
		check(t, err)
		check(t, g.AddFloat32s([]float32{0.5, 0.25, 0}))
		check(t, g.AddFloat32s([]float32{0.5, 0, 0}))
		got, err := g.ToFloat32s()
		check(t, err)
		if got[0] != 1 || got[1] != 0.25 || got[2] != 0 {
			t.Fatalf("%s gradient %v", dtype, got)
		}
		check(t, engine.Release(0))
		check(t, engine.Close())
	}
}
