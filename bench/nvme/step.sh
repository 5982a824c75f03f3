#!/usr/bin/env bash
# The offloaded step against its limits, in one run: `rounds` times (1) bench_offload_step — zero_step of a
# P-million-param model in memory (the optimizer's own time) and with offload_optimizer to NVMe — and (2) fio with
# the same block size, queue depth and O_DIRECT writing and reading a file of the offload file's size (the disk's
# time for the bytes one step must move). Medians, and the ratio of the offloaded step to max(read, write,
# optimizer) (goal of issue 17: <= 1.2) and to read + write + optimizer (what a pass with no overlap would take).
#   bench/nvme/step.sh [BUILD_DIR] [PARAMS_MILLIONS] [rounds] [DIR] [extra bench_offload_step args...]
set -euo pipefail
build=${1:-build/release}
params=${2:-64} rounds=${3:-3}
dir=${4:-$build}
shift $(($# < 4 ? $# : 4))
file=$dir/step-bench.$$
trap 'rm -f "$file"' EXIT
fio_seconds() { # rw bytes -> seconds
  fio --name=bench --filename="$file" --size="$2" --bs=1m --iodepth=8 --ioengine=io_uring --direct=1 --rw="$1" \
    --output-format=json 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; k='$1'; print($2 / j[k]['bw_bytes'])"
}
declare -a mem off rd wr
for ((i = 0; i < rounds; ++i)); do
  out=$("$build/bench_offload_step" --dir "$dir" --params-millions "$params" "$@")
  [[ $i == 0 ]] && head -1 <<<"$out"
  line=$(grep '^RESULT' <<<"$out")
  mem+=("$(sed -E 's/.*mem_step_s=([0-9.]+).*/\1/' <<<"$line")")
  off+=("$(sed -E 's/.*off_step_s=([0-9.]+).*/\1/' <<<"$line")")
  bytes=$(sed -E 's/.*file_bytes=([0-9]+).*/\1/' <<<"$line")
  wr+=("$(fio_seconds write "$bytes")")
  rd+=("$(fio_seconds read "$bytes")")
  rm -f "$file"
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
M=$(median "${mem[@]}") O=$(median "${off[@]}") R=$(median "${rd[@]}") W=$(median "${wr[@]}")
limit=$(python3 -c "print(max($M, $R, $W))")
serial=$(python3 -c "print($M + $R + $W)")
echo "medians of ${rounds} rounds (seconds): optimizer in memory $M, fio read $R, fio write $W (1 MiB, depth 8)"
printf 'offloaded zero_step %.3f s = %.2f x max(read, write, optimizer) = %.2f x (read + write + optimizer)\n' \
  "$O" "$(python3 -c "print($O / $limit)")" "$(python3 -c "print($O / $serial)")"
