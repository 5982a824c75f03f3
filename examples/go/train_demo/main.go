// examples/demo/train_demo.c in Go: the same two-layer softsign MLP, data, config and order of float operations,
// so its final weights equal the C program's bit for bit (tests/bindings/three_languages.sh compares checksums).
//
//	mpirun -np 2 build/release/bindings/go/train_demo --stage 3 --steps 100
//
// Products are converted to float32 explicitly before they are added: Go may fuse x*y+z into one FMA otherwise,
// and an explicit conversion rounds, which forbids that (the Go spec, "Floating-point operators").
package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	"libzero"
)

const (
	inputs = 64
	batch  = 32
)

// uniform is xorshift64*, as in the C demo.
func uniform(state *uint64) float64 {
	*state ^= *state >> 12
	*state ^= *state << 25
	*state ^= *state >> 27
	return float64((*state*2685821657736338717)>>11)/9007199254740992.0*2.0 - 1.0
}

func abs32(a float32) float32 { return math.Float32frombits(math.Float32bits(a) &^ (1 << 31)) }

func softsign(a float32) float32 { return a / (1.0 + abs32(a)) }

func teacher(x []float32) float32 {
	var y float32
	for i := 0; i < inputs; i++ {
		y += float32(float32((i*7)%13-6) / 8.0 * x[i])
	}
	return softsign(y) + float32(float32(0.5*x[0])*x[1])
}

// must leaves through zero.Exit on an error: unlike log.Fatal it runs C's exit handlers, which tell the other
// ranks this one is leaving (they fail at once instead of waiting out the timeout).
func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		zero.Exit(1)
	}
}

func main() {
	stage := flag.Int("stage", 3, "ZeRO stage 0-3")
	steps := flag.Int("steps", 300, "optimizer steps")
	hidden := flag.Int("hidden", 512, "hidden units")
	flag.Parse()
	H := *hidden
	config := fmt.Sprintf(`{"train_micro_batch_size_per_gpu": %d, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,`+
		` "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.01}},`+
		` "zero_optimization": {"stage": %d, "stage3_param_persistence_threshold": 0}}`, batch, *stage)
	comm, err := zero.NewMPIComm()
	must(err)
	defer comm.Close()
	engine, err := zero.NewEngine(config, comm)
	must(err)
	defer engine.Close()
	rank := comm.Rank()
	noDecay, err := engine.AddParamGroup("no_decay", zero.WeightDecay(0))
	must(err)
	w1Init := make([]float32, H*inputs)
	w2Init := make([]float32, H)
	seed := uint64(42)
	for i := range w1Init {
		w1Init[i] = float32(uniform(&seed) / math.Sqrt(float64(inputs)))
	}
	for i := range w2Init {
		w2Init[i] = float32(uniform(&seed) / math.Sqrt(float64(H)))
	}
	w1, err := engine.AddParam(zero.Param{Name: "layer1.weight", Shape: []int64{int64(H), inputs}, Unit: 0, Init: w1Init})
	must(err)
	b1, err := engine.AddParam(zero.Param{Name: "layer1.bias", Shape: []int64{int64(H)}, Unit: 0, Group: noDecay})
	must(err)
	w2, err := engine.AddParam(zero.Param{Name: "layer2.weight", Shape: []int64{1, int64(H)}, Unit: 1, Init: w2Init})
	must(err)
	b2, err := engine.AddParam(zero.Param{Name: "layer2.bias", Shape: []int64{1}, Unit: 1, Group: noDecay})
	must(err)
	must(engine.Finalize())

	x := make([]float32, batch*inputs)
	h := make([]float32, batch*H)
	out := make([]float32, batch)
	target := make([]float32, batch)
	dataSeed := uint64(1000 + rank)
	if rank == 0 {
		fmt.Printf("training a %d-parameter MLP at ZeRO stage %d on %d ranks (Go)\n", H*(inputs+2)+1, *stage, comm.Size())
	}
	view := func(v *zero.View, err error) []float32 {
		must(err)
		data, err := v.Float32()
		must(err)
		return data
	}
	t0 := time.Now()
	for step := 1; step <= *steps; step++ {
		for s := 0; s < batch; s++ {
			for i := 0; i < inputs; i++ {
				x[s*inputs+i] = float32(uniform(&dataSeed))
			}
			target[s] = teacher(x[s*inputs : (s+1)*inputs])
		}
		must(engine.Gather(0, 1))
		mw1, mb1 := view(engine.Param(w1)), view(engine.Param(b1))
		mw2, mb2 := view(engine.Param(w2)), view(engine.Param(b2))
		loss := 0.0
		for s := 0; s < batch; s++ {
			y := mb2[0]
			for j := 0; j < H; j++ {
				a := mb1[j]
				for i := 0; i < inputs; i++ {
					a += float32(mw1[j*inputs+i] * x[s*inputs+i])
				}
				h[s*H+j] = softsign(a)
				y += float32(mw2[j] * h[s*H+j])
			}
			out[s] = y
			d := float64(out[s] - target[s])
			loss += 0.5 * d * d / batch
		}
		gw2, gb2 := view(engine.Grad(w2)), view(engine.Grad(b2))
		for s := 0; s < batch; s++ {
			dy := (out[s] - target[s]) / batch
			gb2[0] += dy
			for j := 0; j < H; j++ {
				gw2[j] += float32(dy * h[s*H+j])
			}
		}
		must(engine.GradReady(w2))
		must(engine.GradReady(b2))
		gw1, gb1 := view(engine.Grad(w1)), view(engine.Grad(b1))
		for s := 0; s < batch; s++ {
			dy := (out[s] - target[s]) / batch
			for j := 0; j < H; j++ {
				slope := 1.0 - abs32(h[s*H+j])
				dh := float32(float32(dy*mw2[j]) * float32(slope*slope))
				gb1[j] += dh
				for i := 0; i < inputs; i++ {
					gw1[j*inputs+i] += float32(dh * x[s*inputs+i])
				}
			}
		}
		must(engine.GradReady(w1))
		must(engine.GradReady(b1))
		must(engine.Release(1, 0))
		must(engine.BackwardEnd())
		info, err := engine.Step()
		must(err)
		if rank == 0 && (step == 1 || step%20 == 0 || step == *steps) {
			fmt.Printf("step %4d  loss %.5f (rank 0)  grad_norm %.4f  %.2f ms/step\n", step, loss, info.GradNorm,
				float64(time.Since(t0).Microseconds())/1e3/float64(step))
		}
	}
	checksum := weightsChecksum(engine, []int{w1, b1, w2, b2})
	if rank == 0 {
		fmt.Printf("final weights checksum %016x\n", checksum)
	}
	must(engine.Close())
	// Collective teardown: it finalises MPI, which libzero initialised. Go exits without running C's atexit
	// handlers, so libzero's own finalisation at exit never runs in a Go program: call Shutdown.
	must(comm.Shutdown())
}

// weightsChecksum is FNV-1a over every param's bytes in id order (little-endian fp32), as the C demo computes it.
func weightsChecksum(engine *zero.Engine, ids []int) uint64 {
	hash := uint64(14695981039346656037)
	must(engine.Gather(0, 1))
	for _, id := range ids {
		v, err := engine.Param(id)
		must(err)
		data, err := v.Float32()
		must(err)
		for _, value := range data {
			bits := math.Float32bits(value)
			for b := 0; b < 4; b++ {
				hash ^= uint64((bits >> (8 * b)) & 0xff)
				hash *= 1099511628211
			}
		}
	}
	must(engine.Release(1, 0))
	return hash
}
