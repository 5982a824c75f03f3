package zero

import "fmt"

// DType is an element type of params and gradients.
type DType int32

const (
	FP32 DType = 0
	BF16 DType = 1
	FP16 DType = 2
)

func (d DType) String() string {
	switch d {
	case FP32:
		return "fp32"
	case BF16:
		return "bf16"
	case FP16:
		return "fp16"
	}
	return fmt.Sprintf("dtype(%d)", int32(d))
}

// Size is the bytes per element.
func (d DType) Size() int {
	if d == FP32 {
		return 4
	}
	return 2
}
