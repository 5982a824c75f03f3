#!/usr/bin/env bash
# The CUDA kernels perform exactly the CPU's operations, each rounded on its own: compiled with nvcc's permissive
# default (-fmad=true, which fuses a plain multiply and add into an FMA), their PTX must hold no floating-point
# fma/mad and no floating-point add, sub or mul without an explicit rounding modifier (PTX lets ptxas fuse only
# those: an instruction with .rn is never contracted).
#   check-cuda-rounding.sh NVCC ARCH BUILD_INCLUDE_DIR
set -euo pipefail
nvcc=$1 arch=$2 build_include=$3
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
files=(step_kernels norm_kernels convert_kernels)
for tu in "${files[@]}"; do
  "$nvcc" -std=c++17 -arch="sm_$arch" -ptx -I"$root/core" -I"$root/capi/include" -I"$build_include" \
    "$root/core/cuda/$tu.cu" -o "$tmp/$tu.ptx"
  fused=$(grep -cE '^\s*(fma|mad)(\.[a-z]+)*\.f(16|32|64)\b' "$tmp/$tu.ptx" || true)
  plain=$(grep -cE '^\s*(add|sub|mul)(\.ftz|\.sat)*\.f(32|64)\b' "$tmp/$tu.ptx" || true)
  if [[ $fused != 0 || $plain != 0 ]]; then
    echo "core/cuda/$tu.cu: $fused fused and $plain unrounded floating-point instructions in its PTX:" >&2
    grep -nE '^\s*((fma|mad)(\.[a-z]+)*\.f(16|32|64)|(add|sub|mul)(\.ftz|\.sat)*\.f(32|64))\b' "$tmp/$tu.ptx" | head >&2
    exit 1
  fi
done
echo "no contractible floating-point instruction in the CUDA kernels' PTX (${#files[@]} files, sm_$arch)"
