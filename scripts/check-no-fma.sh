#!/usr/bin/env bash
# The kernel translation units keep every multiply and add separate (core/kernels/no_fp_contraction.hpp) even when
# compiled with the compiler's most permissive default: GCC's -ffp-contract=fast, clang's -ffp-contract=on. Each
# kernel file is compiled that way with its instruction-set flags, and its object code must hold no FMA.
#   check-no-fma.sh CXX COMPILER_ID BUILD_INCLUDE_DIR
set -euo pipefail
cxx=$1 id=$2 build_include=$3
root=$(cd "$(dirname "$0")/.." && pwd)
contract=fast
[[ $id == *Clang* ]] && contract=on  # clang's "fast" disregards the pragma by definition
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
declare -A isa=([kernels_scalar]="-mavx2 -mfma" [kernels_avx2]="-mavx2 -mfma -mf16c"
                [kernels_avx512]="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma"
                [optimizer]="-mavx2 -mfma" [dispatch]="-mavx2 -mfma")
# A compiler launcher (ccache, from scripts/test.sh) caches these objects as it does the build's.
launcher=${CMAKE_CXX_COMPILER_LAUNCHER:-}
for tu in "${!isa[@]}"; do
  # shellcheck disable=SC2086
  $launcher "$cxx" -O2 -std=c++17 -fopenmp -DZERO_X86_KERNELS -I"$root/core" -I"$root/capi/include" -I"$build_include" \
    ${isa[$tu]} -ffp-contract=$contract -w -c "$root/core/kernels/$tu.cpp" -o "$tmp/$tu.o"
  n=$(objdump -d "$tmp/$tu.o" | grep -c 'vfn\?m\(add\|sub\)' || true)
  if [[ $n != 0 ]]; then
    echo "core/kernels/$tu.cpp compiled with -ffp-contract=$contract has $n FMA instructions" >&2
    exit 1
  fi
done
echo "no FMA in the kernel files, even with -ffp-contract=$contract and -mfma (${#isa[@]} files)"
