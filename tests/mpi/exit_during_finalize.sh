#!/usr/bin/env bash
# Runs the exit-during-finalize scenario of test_failures many times: rank 1 exits from another thread at a random
# moment of its zero_engine_finalize. Every run must end with rank 1's status (1), no rank killed by a signal, and the
# other ranks' checks passed (rank 0 prints "exit-during-finalize: ok").
#
#   exit_during_finalize.sh MPIRUN TEST_FAILURES RANKS RUNS
set -u
mpirun=$1 test_failures=$2 ranks=$3 runs=$4
for ((run = 1; run <= runs; ++run)); do
  out=$("$mpirun" -np "$ranks" "$test_failures" --scenario exit-during-finalize --stage 3 2>&1)
  rc=$?
  if [[ $rc -ne 1 ]] || grep -qiE "signal|segmentation|core dumped" <<<"$out" ||
     ! grep -q "exit-during-finalize: ok" <<<"$out"; then
    echo "run $run of $runs at $ranks ranks: exit status $rc"
    echo "$out"
    exit 1
  fi
done
echo "$runs runs at $ranks ranks: rank 1 exited with its status every time, and the others named it"
