// Functions compiled for both the CPU and the GPU. The per-element arithmetic that libzero promises bit for bit (the
// optimizer step, the rounding conversions, the norm's squares) is written once and marked ZERO_HD: the C++ compiler
// sees plain inline functions, nvcc compiles the same source for the device as well, so the CPU tests pin the GPU's
// arithmetic (docs/architecture.md, "GPU kernels").
#pragma once

#if defined(__CUDACC__)
#define ZERO_HD __host__ __device__
#define ZERO_HD_FORCEINLINE __host__ __device__ __forceinline__
#else
#define ZERO_HD
#define ZERO_HD_FORCEINLINE inline __attribute__((always_inline))
#endif
