#!/usr/bin/env bash
# Builds the libFuzzer targets (the "fuzz" preset: clang 14, AddressSanitizer + UBSan) and runs each for
# ZERO_FUZZ_SECONDS seconds (default 60) from its seed corpus in fuzz/corpus. New inputs go to a scratch directory
# outside the source tree; a crash, sanitizer report, leak or timeout fails the run and leaves the input in
# build/fuzz/artifacts (fuzz/README.md says how to reproduce it).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${ZERO_FUZZ_SECONDS:-60}
bash scripts/configure-preset.sh fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)"
scratch=$(mktemp -d /tmp/libzero-fuzz.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
artifacts=$PWD/build/fuzz/artifacts
mkdir -p "$artifacts"
# The targets run side by side (each fuzzer is one process on one core): the same minute each, half the wall time
# on two cores.
run_target() {
  local target=$1
  mkdir -p "$scratch/$target"
  if ! build/fuzz/fuzz/fuzz_$target -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix="$artifacts/$target-" "$scratch/$target" "fuzz/corpus/$target" >"$scratch/$target.log" 2>&1; then
    grep -v "^#" "$scratch/$target.log" | tail -60
    echo "fuzz_$target failed: the input is in $artifacts" >&2
    return 1
  fi
}
targets=(config checkpoint)
pids=()
for target in "${targets[@]}"; do
  echo "fuzz_$target: ${seconds} s from fuzz/corpus/$target"
  run_target "$target" &
  pids+=($!)
done
failed=0
for i in "${!targets[@]}"; do
  if wait "${pids[$i]}"; then
    echo -n "fuzz_${targets[$i]}: "
    grep -E "^stat::number_of_executed_units|^Done" "$scratch/${targets[$i]}.log" | tr '\n' ' '
    echo
  else
    failed=1
  fi
done
[[ $failed == 0 ]] || exit 1
echo "fuzzers ok: config and checkpoint, ${seconds} s each, no crash, sanitizer report, leak or timeout"
