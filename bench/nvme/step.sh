#!/usr/bin/env bash
# The offloaded step against its limits, in one run: `rounds` times (1) bench_offload_step — zero_step of a
# P-million-param model in memory (the optimizer's own time) and with offload_optimizer to NVMe — and (2) fio with
# 1 MiB requests, queue depth 8 and O_DIRECT on a file of the offload file's size: writing it, reading it, and
# reading and writing it at once (rw, half each, twice the bytes: what one step moves, on one device). Medians, and
# the offloaded step against max(read, write, optimizer) (the goal: <= 1.2), against the mixed transfer
# (the device's own limit when reads and writes share it) and against read + write + optimizer (no overlap at all).
#   bench/nvme/step.sh [BUILD_DIR] [PARAMS_MILLIONS] [rounds] [DIR] [extra bench_offload_step args...]
set -euo pipefail
build=${1:-build/release}
params=${2:-64} rounds=${3:-3}
dir=${4:-$build}
shift $(($# < 4 ? $# : 4))
file=$dir/step-bench.$$
trap 'rm -f "$file"' EXIT
fio_seconds() { # rw bytes -> seconds to move `bytes` each way (rw: both at once)
  local total=$2
  [[ $1 == rw ]] && total=$((2 * $2))
  fio --name=bench --filename="$file" --size="$total" --bs=1m --iodepth=8 --ioengine=io_uring --direct=1 \
    --rw="$1" --rwmixread=50 --output-format=json 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print($total / (j['read']['bw_bytes'] + j['write']['bw_bytes']))"
}
declare -a mem off rd wr mx
for ((i = 0; i < rounds; ++i)); do
  out=$("$build/bench_offload_step" --dir "$dir" --params-millions "$params" "$@")
  [[ $i == 0 ]] && head -1 <<<"$out"
  line=$(grep '^RESULT' <<<"$out")
  mem+=("$(sed -E 's/.*mem_step_s=([0-9.]+).*/\1/' <<<"$line")")
  off+=("$(sed -E 's/.*off_step_s=([0-9.]+).*/\1/' <<<"$line")")
  bytes=$(sed -E 's/.*file_bytes=([0-9]+).*/\1/' <<<"$line")
  wr+=("$(fio_seconds write "$bytes")")
  rd+=("$(fio_seconds read "$bytes")")
  mx+=("$(fio_seconds rw "$bytes")")
  rm -f "$file"
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
M=$(median "${mem[@]}") O=$(median "${off[@]}") R=$(median "${rd[@]}") W=$(median "${wr[@]}") X=$(median "${mx[@]}")
ratio() { python3 -c "print('%.2f' % ($1))"; }
printf 'medians of %d rounds: optimizer in memory %.3f s; fio read %.3f s, write %.3f s, both at once %.3f s\n' \
  "$rounds" "$M" "$R" "$W" "$X"
printf 'offloaded zero_step %.3f s = %s x max(read, write, optimizer), %s x the mixed transfer, %s x read + write + optimizer\n' \
  "$O" "$(ratio "$O / max($M, $R, $W)")" "$(ratio "$O / max($M, $X)")" "$(ratio "$O / ($M + $R + $W)")"
