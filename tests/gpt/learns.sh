#!/usr/bin/env bash
# The main job learns on every machine kind: the demo's recipe (examples/gpt/addition.args) at reduced steps, with
# one of libzero's SIMD paths (ZERO_SIMD) or one of OpenBLAS's kernel sets (OPENBLAS_CORETYPE) forced, must answer
# most held-out problems whole. A path this CPU cannot run is reported skipped (exit 77). The threshold is set
# below the worst result measured over seeds and paths (examples/gpt/README.md has the table).
#   learns.sh MPIEXEC TRAIN_GPT RECIPE WORKDIR simd|blas PATH STEPS THRESHOLD
set -euo pipefail
mpiexec=$1 train_gpt=$2 recipe_file=$3 work=$4 kind=$5 path=$6 steps=$7 threshold=$8
rm -rf "$work" && mkdir -p "$work"
read -ra recipe <"$recipe_file"
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
case $kind in
  simd)
    export ZERO_SIMD=$path
    forward=(-x ZERO_SIMD)
    ;;
  blas)
    case $path in
      SkylakeX) needs=(avx512f avx512bw avx512vl avx512dq avx512cd) ;;
      Haswell | Zen) needs=(avx2 fma) ;;
      Sandybridge) needs=(avx) ;;
      Nehalem) needs=(sse4_2) ;;
      *) echo "unknown OpenBLAS core type $path"; exit 2 ;;
    esac
    has "${needs[@]}" || { echo "skipped: OpenBLAS's $path kernels need ${needs[*]}, which this CPU lacks"; exit 77; }
    export OPENBLAS_CORETYPE=$path
    forward=(-x OPENBLAS_CORETYPE)
    ;;
  *) echo "kind must be simd or blas"; exit 2 ;;
esac
# The recipe's --steps last: the reduced count replaces it.
if ! "$mpiexec" -np 4 "${forward[@]}" "$train_gpt" --stage 3 "${recipe[@]}" --steps "$steps" --print-every 100 \
  >"$work/log" 2>&1; then
  if [[ $kind == simd ]] && grep -q "does not support it" "$work/log"; then
    echo "skipped: ZERO_SIMD=$path is not supported by this CPU"
    exit 77
  fi
  cat "$work/log"
  exit 1
fi
result=$(grep -m1 '^held-out loss' "$work/log")
whole=$(sed -E 's/.*whole answers right ([0-9.]+) %.*/\1/' <<<"$result")
echo "$kind $path, $steps steps: $result"
python3 -c "import sys; sys.exit(0 if $whole >= $threshold else 1)" ||
  { echo "whole answers right $whole % after $steps steps, expected at least $threshold %"; cat "$work/log"; exit 1; }
