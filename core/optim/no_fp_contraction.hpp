// Included first by every translation unit whose floating-point results are promised bit for bit (the optimizer
// kernels and the step constants): no multiply and add may fuse into one FMA, whatever flags the including build
// uses. CMake passes -ffp-contract=off everywhere, but a consumer that compiles these files with its own flags
// (GCC defaults to -ffp-contract=fast) would otherwise get kernels whose results differ by ISA and from the
// tests' references. GCC ignores the standard pragma, so it gets its own.
#pragma once

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
