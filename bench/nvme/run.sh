#!/usr/bin/env bash
# libzero's direct-I/O engine against fio with the same block size, queue depth and O_DIRECT, in one run:
# `rounds` times fio (io_uring: write, then read the same file, then write it again) and libzero's engine (both of
# its engines; io_uring also rewriting its file), and the
# medians with libzero / fio ratios (the goal: >= 0.9). The file lives in DIR (default: the build tree; not a
# tmpfs, which has no O_DIRECT).
#   bench/nvme/run.sh [BUILD_DIR] [SIZE_MIB] [BLOCK_KIB] [DEPTH] [rounds] [DIR]
set -euo pipefail
build=${1:-build/release}
size=${2:-1024} block=${3:-1024} depth=${4:-8} rounds=${5:-5}
dir=${6:-$build}
file=$dir/aio-bench.$$
trap 'rm -f "$file"' EXIT
fio_rate() { # rw -> GB/s
  fio --name=bench --filename="$file" --size="${size}M" --bs="${block}k" --iodepth="$depth" --ioengine=io_uring \
    --direct=1 --rw="$1" --output-format=json 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; k='$1'; print(j[k]['bw_bytes']/1e9)"
}
declare -a fw fr frw uw ur urw pw pr
for ((i = 0; i < rounds; ++i)); do
  fw+=("$(fio_rate write)")
  fr+=("$(fio_rate read)")
  frw+=("$(fio_rate write)")  # the same file again: a rewrite, what every step after the first does
  rm -f "$file"
  line=$("$build/bench_aio" "$file" "$size" "$block" "$depth" io_uring 3)  # median of 3 passes: rewrites
  urw+=("$(sed -E 's/.*write ([0-9.]+) GB.*/\1/' <<<"$line")")
  line=$("$build/bench_aio" "$file" "$size" "$block" "$depth" io_uring 1)
  uw+=("$(sed -E 's/.*write ([0-9.]+) GB.*/\1/' <<<"$line")")
  ur+=("$(sed -E 's/.*read ([0-9.]+) GB.*/\1/' <<<"$line")")
  line=$("$build/bench_aio" "$file" "$size" "$block" "$depth" posix 1)
  pw+=("$(sed -E 's/.*write ([0-9.]+) GB.*/\1/' <<<"$line")")
  pr+=("$(sed -E 's/.*read ([0-9.]+) GB.*/\1/' <<<"$line")")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
FW=$(median "${fw[@]}") FR=$(median "${fr[@]}") FRW=$(median "${frw[@]}") URW=$(median "${urw[@]}")
UW=$(median "${uw[@]}") UR=$(median "${ur[@]}") PW=$(median "${pw[@]}") PR=$(median "${pr[@]}")
echo "direct I/O, ${size} MiB file, ${block} KiB blocks, queue depth ${depth}, medians of ${rounds} rounds (GB/s)"
printf '%-26s %8s %8s %10s %10s\n' "" write read "vs fio w" "vs fio r"
printf '%-26s %8.3f %8.3f\n' "fio (io_uring)" "$FW" "$FR"
printf '%-26s %8.3f %8.3f %10.2f %10.2f\n' "libzero io_uring" "$UW" "$UR" "$(echo "$UW / $FW" | bc -l)" \
  "$(echo "$UR / $FR" | bc -l)"
printf '%-26s %8.3f %8.3f %10.2f %10.2f\n' "libzero pread/pwrite" "$PW" "$PR" "$(echo "$PW / $FW" | bc -l)" \
  "$(echo "$PR / $FR" | bc -l)"
printf '%-26s %8.3f %8s %10.2f\n' "libzero io_uring rewrite" "$URW" "" "$(echo "$URW / $FRW" | bc -l)"
printf '%-26s %8.3f\n' "fio (io_uring) rewrite" "$FRW"
