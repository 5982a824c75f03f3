package main

import (
	"fmt"
	"math"
	"math/rand"
	"os"

	"libzero"
)

func main() {
	config := `{"train_batch_size": 64, "zero_optimization": {"stage": 2},
	            "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}}`
	comm, err := zero.NewMPIComm()
	check(err)
	defer comm.Shutdown() // collective; finalises MPI (Go skips C's atexit handlers)
	engine, err := zero.NewEngine(config, comm)
	check(err)
	defer engine.Close()
	w, err := engine.AddParam(zero.Param{Name: "w", Shape: []int64{16}}) // starts at zero
	check(err)
	check(engine.Finalize()) // collective: every rank registered the same params
	target := func(i int) float32 { return -1 + 2*float32(i)/15 }
	rng := rand.New(rand.NewSource(int64(comm.Rank())))
	var info zero.StepInfo
	for step := 0; step < 300; step++ {
		check(engine.Gather(0))
		weights := data(engine.Param(w))
		grad := data(engine.Grad(w))             // your backward adds the gradient here
		for sample := 0; sample < 32; sample++ { // this rank's batch
			var x [16]float32
			var e float32
			for i := range x {
				x[i] = float32(rng.NormFloat64())
				e += x[i] * (weights[i] - target(i))
			}
			for i := range x {
				grad[i] += 2 * e * x[i] / 32
			}
		}
		check(engine.GradReady(w))
		check(engine.Release(0))
		check(engine.BackwardEnd())
		info, err = engine.Step()
		check(err)
	}
	check(engine.Gather(0))
	worst := 0.0
	for i, v := range data(engine.Param(w)) {
		worst = math.Max(worst, math.Abs(float64(v-target(i))))
	}
	check(engine.Release(0))
	fmt.Printf("rank %d/%d: step %d, max |w - w_true| = %.1e\n", comm.Rank(), comm.Size(), info.Step, worst)
}

func data(v *zero.View, err error) []float32 {
	check(err)
	values, err := v.Float32()
	check(err)
	return values
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		zero.Exit(1) // not log.Fatal: C's exit tells the other ranks this one is leaving
	}
}
