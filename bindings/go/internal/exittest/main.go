// A test program (CTest go.exit.n2): the last rank leaves with zero.Exit while the others wait in a stage-3
// gather; they must fail at once with ErrRemote naming it, not after the collective timeout (60 s here).
package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"libzero"
)

func main() {
	comm, err := zero.NewMPIComm()
	if err != nil {
		fmt.Println(err)
		zero.Exit(1)
	}
	engine, err := zero.NewEngine(`{"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0,
		"optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "libzero": {"timeout_s": 60},
		"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}`, comm)
	if err == nil {
		_, err = engine.AddParam(zero.Param{Name: "p", Shape: []int64{5}})
	}
	if err == nil {
		err = engine.Finalize()
	}
	if err != nil {
		fmt.Println(err)
		zero.Exit(1)
	}
	leaver := comm.Size() - 1
	if comm.Rank() == leaver {
		time.Sleep(500 * time.Millisecond)
		zero.Exit(3)
	}
	start := time.Now()
	err = engine.Gather(0)
	waited := time.Since(start)
	if errors.Is(err, zero.ErrRemote) && waited < 20*time.Second {
		fmt.Printf("rank %d: gather failed after %.1f s: %v\nexit reached every rank\n", comm.Rank(),
			waited.Seconds(), err)
		zero.Exit(0)
	}
	fmt.Printf("rank %d: gather returned %v after %.1f s\n", comm.Rank(), err, waited.Seconds())
	os.Exit(1)
}
