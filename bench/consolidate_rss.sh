#!/usr/bin/env bash
# Peak resident memory of `zero-ckpt consolidate` on a checkpoint of at least 100 M params, next to the size of the
# largest param (the bound the format promises: the largest param plus I/O buffers; the tool streams, so it needs
# only its buffers). Run from the repository root after a release build.
#   bash bench/consolidate_rss.sh [PARAMS_MILLIONS] [UNITS]
set -euo pipefail
millions=${1:-120}
units=${2:-4}
dir=/tmp/zero-bench-ckpt
command -v /usr/bin/time >/dev/null || { apt-get update -qq && apt-get install -y -qq time >/dev/null; }
mpirun=(mpirun --oversubscribe -np 2)
[[ $(id -u) -eq 0 ]] && mpirun+=(--allow-run-as-root)
"${mpirun[@]}" build/release/bench_checkpoint_io --params-millions "$millions" --units "$units" --dir "$dir"
for dtype in fp32 bf16; do
  /usr/bin/time -f "%M" -o /tmp/zero-rss.txt build/release/zero-ckpt consolidate "$dir" --dtype "$dtype" \
    -o "$dir/full-$dtype.safetensors" >/dev/null
  rss_kib=$(cat /tmp/zero-rss.txt)
  largest_mib=$(python3 -c "print(round($millions * 1e6 / $units * 4 / 2**20, 1))")
  echo "consolidate --dtype $dtype: peak RSS $((rss_kib / 1024)) MiB; largest param ${largest_mib} MiB (fp32);" \
       "output $(du -m "$dir/full-$dtype.safetensors" | cut -f1) MiB"
done
rm -rf "$dir"
