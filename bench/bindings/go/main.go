// The per-call cost of grad_ready / gather / release from Go (bench/bindings/README.md; run by bench/bindings/run.sh
// next to the C and Java versions).
package main

import (
	"fmt"
	"log"
	"os"
	"sort"
	"strconv"
	"time"

	"libzero"
)

func main() {
	params, rounds := 1000, 200
	if len(os.Args) > 1 {
		rounds, _ = strconv.Atoi(os.Args[1])
	}
	comm, err := zero.NewSingleComm()
	if err != nil {
		log.Fatal(err)
	}
	defer comm.Close()
	engine, err := zero.NewEngine(`{"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0, `+
		`"optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": 1}}`, comm)
	if err != nil {
		log.Fatal(err)
	}
	defer engine.Close()
	for p := 0; p < params; p++ {
		if _, err := engine.AddParam(zero.Param{Name: fmt.Sprintf("p%d", p), Shape: []int64{1}, Unit: p}); err != nil {
			log.Fatal(err)
		}
	}
	if err := engine.Finalize(); err != nil {
		log.Fatal(err)
	}
	var samples []float64
	for r := 0; r < rounds; r++ {
		start := time.Now()
		for p := 0; p < params; p++ {
			if err := engine.Gather(p); err != nil {
				log.Fatal(err)
			}
			if err := engine.GradReady(p); err != nil {
				log.Fatal(err)
			}
			if err := engine.Release(p); err != nil {
				log.Fatal(err)
			}
		}
		samples = append(samples, float64(time.Since(start).Nanoseconds())/float64(3*params))
		if err := engine.BackwardEnd(); err != nil {
			log.Fatal(err)
		}
		if _, err := engine.Step(); err != nil {
			log.Fatal(err)
		}
	}
	sort.Float64s(samples)
	fmt.Printf("go %.1f ns/call (median of %d rounds of %d gather + grad_ready + release)\n", samples[len(samples)/2], rounds, params)
}
