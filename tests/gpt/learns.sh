#!/usr/bin/env bash
# The main job learns on every machine kind: the demo's recipe (examples/gpt/addition.args) at reduced steps, with
# one of libzero's SIMD paths (ZERO_SIMD) and one of OpenBLAS's kernel sets (OPENBLAS_CORETYPE) forced, must answer
# most held-out problems whole. A pair this CPU cannot run is reported skipped (exit 77). The threshold is set
# below the worst result measured over seeds and kernel sets (examples/gpt/README.md has the table).
#   learns.sh MPIEXEC TRAIN_GPT RECIPE WORKDIR SIMD BLAS STEPS THRESHOLD
set -euo pipefail
mpiexec=$1 train_gpt=$2 recipe_file=$3 work=$4 simd=$5 blas=$6 steps=$7 threshold=$8
rm -rf "$work" && mkdir -p "$work"
read -ra recipe <"$recipe_file" || [[ ${#recipe[@]} -gt 0 ]]
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2 || true) "
[[ -n ${flags// /} ]] || { echo "skipped: /proc/cpuinfo lists no x86 flags (OpenBLAS's x86 kernel sets do not apply)"; exit 77; }
has() { for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
case $blas in
  SkylakeX) needs=(avx512f avx512bw avx512vl avx512dq avx512cd) ;;
  Haswell | Zen) needs=(avx2 fma) ;;
  Sandybridge) needs=(avx) ;;
  Nehalem) needs=(sse4_2) ;;
  *) echo "unknown OpenBLAS core type $blas"; exit 2 ;;
esac
has "${needs[@]}" || { echo "skipped: OpenBLAS's $blas kernels need ${needs[*]}, which this CPU lacks"; exit 77; }
# The launcher's local ranks inherit the environment (Open MPI and MPICH alike).
export ZERO_SIMD=$simd OPENBLAS_CORETYPE=$blas
# The recipe's --steps comes first: the reduced count given after it replaces it.
if ! "$mpiexec" -np 4 "$train_gpt" --stage 3 "${recipe[@]}" --steps "$steps" --print-every 100 >"$work/log" 2>&1; then
  if grep -q "ZERO_SIMD=$simd but this CPU does not support it" "$work/log"; then
    echo "skipped: ZERO_SIMD=$simd is not supported by this CPU"
    exit 77
  fi
  cat "$work/log"
  exit 1
fi
# The kernel set OpenBLAS reports must be the one forced (a build without DYNAMIC_ARCH ignores the variable).
used=$(sed -nE 's/.*OpenBLAS kernels: ([A-Za-z0-9]+).*/\1/p' "$work/log" | head -1)
if [[ ${used,,} != "${blas,,}" ]]; then
  echo "skipped: OPENBLAS_CORETYPE=$blas was not taken: OpenBLAS ran its '${used:-unknown}' kernels"
  exit 77
fi
result=$(grep -m1 '^held-out loss' "$work/log") || { cat "$work/log"; echo "no held-out result"; exit 1; }
whole=$(sed -nE 's/.*whole answers right ([0-9.]+) %.*/\1/p' <<<"$result")
[[ -n $whole ]] || { echo "no whole-answer figure in: $result"; exit 1; }
echo "ZERO_SIMD=$simd OPENBLAS_CORETYPE=$blas, $steps steps: $result"
python3 -c "import sys; sys.exit(0 if $whole >= $threshold else 1)" ||
  { echo "whole answers right $whole % after $steps steps, expected at least $threshold %"; cat "$work/log"; exit 1; }
