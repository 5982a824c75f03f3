// Included first by every translation unit whose floating-point results are promised bit for bit (the optimizer
// kernels and the step constants): no multiply and add may fuse into one FMA. CMake passes -ffp-contract=off
// everywhere, but a build that compiles these files with its own flags would otherwise get kernels whose results
// differ by ISA and from the tests' references: GCC's default is -ffp-contract=fast, which the GCC pragma below
// overrides; clang's default (-ffp-contract=on) honours the standard pragma. An explicit clang -ffp-contract=fast
// disregards pragmas by definition and cannot be countered here (scripts/check-no-fma.sh checks both defaults).
#pragma once

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
