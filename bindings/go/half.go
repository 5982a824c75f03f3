package zero

import "math"

// BF16ToFloat32 widens bf16 bits exactly.
func BF16ToFloat32(bits uint16) float32 { return math.Float32frombits(uint32(bits) << 16) }

// Float32ToBF16 rounds to the nearest bf16, ties to even (NaN stays a quiet NaN).
func Float32ToBF16(value float32) uint16 {
	bits := math.Float32bits(value)
	if bits&0x7fffffff > 0x7f800000 {
		return uint16(bits>>16) | 0x0040
	}
	return uint16((bits + 0x7fff + (bits>>16)&1) >> 16)
}

// FP16ToFloat32 widens IEEE half-precision bits exactly.
func FP16ToFloat32(bits uint16) float32 {
	sign := uint32(bits&0x8000) << 16
	exponent := uint32(bits>>10) & 0x1f
	mantissa := uint32(bits & 0x3ff)
	switch {
	case exponent == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mantissa<<13)
	case exponent == 0:
		magnitude := float32(mantissa) * 0x1p-24
		if sign != 0 {
			return -magnitude
		}
		return magnitude
	}
	return math.Float32frombits(sign | (exponent+112)<<23 | mantissa<<13)
}

// Float32ToFP16 rounds to the nearest IEEE half, ties to even (overflow gives infinity, NaN stays NaN).
func Float32ToFP16(value float32) uint16 {
	bits := math.Float32bits(value)
	sign := uint16(bits>>16) & 0x8000
	abs := bits & 0x7fffffff
	switch {
	case abs > 0x7f800000:
		return sign | 0x7e00
	case abs >= 0x477ff000:
		return sign | 0x7c00
	case abs < 0x38800000: // a subnormal or zero: the value in units of 2^-24, rounded half to even
		return sign | uint16(math.RoundToEven(float64(math.Float32frombits(abs))*0x1p24))
	}
	half := (abs>>23-112)<<10 | (abs&0x7fffff)>>13
	rest := abs & 0x1fff
	if rest > 0x1000 || (rest == 0x1000 && half&1 != 0) {
		half++ // a carry into the exponent is right
	}
	return sign | uint16(half)
}

// ToFloat32s copies the view's elements as float32 whatever its dtype (bf16 and fp16 widened exactly).
func (v *View) ToFloat32s() ([]float32, error) {
	if v.dtype == FP32 {
		data, err := v.Float32()
		if err != nil {
			return nil, err
		}
		return append([]float32(nil), data...), nil
	}
	bits, err := v.Uint16()
	if err != nil {
		return nil, err
	}
	out := make([]float32, len(bits))
	for i, b := range bits {
		if v.dtype == BF16 {
			out[i] = BF16ToFloat32(b)
		} else {
			out[i] = FP16ToFloat32(b)
		}
	}
	return out, nil
}

// AddFloat32s adds values element-wise to a gradient view of any dtype: in float32, then stored in the view's dtype
// rounded to nearest even. With a 16-bit accumulation dtype every call rounds, so sum a micro-step's contributions
// first and add them once.
func (v *View) AddFloat32s(values []float32) error {
	if !v.gradient {
		return invalid("the view of param %d is read-only: AddFloat32s works on gradient views", v.param)
	}
	if len(values) != v.length {
		return invalid("the gradient view of param %d has %d elements, not %d", v.param, v.length, len(values))
	}
	if v.dtype == FP32 {
		data, err := v.Float32()
		if err != nil {
			return err
		}
		for i, x := range values {
			data[i] += x
		}
		return nil
	}
	bits, err := v.Uint16()
	if err != nil {
		return err
	}
	for i, x := range values {
		if v.dtype == BF16 {
			bits[i] = Float32ToBF16(BF16ToFloat32(bits[i]) + x)
		} else {
			bits[i] = Float32ToFP16(FP16ToFloat32(bits[i]) + x)
		}
	}
	return nil
}
