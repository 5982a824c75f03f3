package zero

import (
	"math"
	"strings"
)

// id32 checks that an id or count given as a Go int fits C's int32_t (the C API's type for ids).
func id32(v int, what string) (int, error) {
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, invalid("%s %d does not fit a 32-bit id", what, v)
	}
	return v, nil
}

// cString checks that a Go string can be passed as a C string (no NUL byte, which would cut it short).
func cString(s, what string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return invalid("%s contains a NUL byte: %q", what, s)
	}
	return nil
}
