#!/usr/bin/env bash
# The largest model a 2-rank job trains on this machine with and without NVMe offload, under a memory limit per
# rank (RLIMIT_AS, `ulimit -v`: every byte a rank maps counts, MPI's and OpenMP's included). For each candidate size
# (millions of params, ascending) one run of bench_offload_step: stage 3, bf16 params with an fp32 master, AdamW,
# 16 units, one warm-up step and one timed step; the largest size that finalizes and steps is the answer.
# A sixth argument, "params", also puts the param shards on NVMe (offload_param) in the offloaded runs.
#   bench/nvme/largest.sh [BUILD_DIR] [LIMIT_GIB] [DIR] "MEMORY_SIZES" "OFFLOAD_SIZES" [params]
set -uo pipefail
build=${1:-build/release}
limit=${2:-4}
dir=${3:-$build}
memory_sizes=${4-"150 200 250 300"}
offload_sizes=${5:-"400 600 800 1000"}
params_nvme=0
[[ ${6:-} == params ]] && params_nvme=1
try() { # only size -> the bench's first line, or nothing when it fails
  (
    ulimit -v $((limit * 1024 * 1024))
    "$build/tests/zero-mpirun" -np 2 "$build/bench_offload_step" --dir "$dir" --params-millions "$2" --stage 3 \
      --steps 1 --units 16 --only "$1" --comm mpi --params-nvme "$params_nvme" 2>/dev/null | grep -m1 '^trained'
  )
}
kinds="memory offload"
[[ -z $memory_sizes ]] && kinds=offload
for only in $kinds; do
  sizes=$memory_sizes
  [[ $only == offload ]] && sizes=$offload_sizes
  best=""
  for p in $sizes; do
    line=$(try "$only" "$p")
    if [[ -z $line ]]; then
      echo "$only: $p M params did not train under ${limit} GiB per rank"
      break
    fi
    echo "$only: $line"
    best=$p
  done
  echo "largest ($only): ${best:-none} M params under ${limit} GiB per rank"
done
