#!/usr/bin/env bash
# Starts N processes of a program the way torchrun does (RANK and WORLD_SIZE in the environment; no MPI, and no
# launcher that kills the others when one dies), for the shared-memory communicator's tests:
#   shm_launch.sh N KILLED PROGRAM ARGS...
# An argument @JOB@ becomes a name of this job's own (the same on every rank), for --shm-name. Passes when every rank
# exits 0, except rank KILLED (-1: none), which must die of SIGKILL.
set -uo pipefail
world=$1 killed=$2
shift 2
args=("${@//@JOB@/libzero-test-$$-$RANDOM}")
pids=()
for ((r = 0; r < world; r++)); do
  RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r "${args[@]}" &
  pids+=($!)
done
status=0
for ((r = 0; r < world; r++)); do
  wait "${pids[$r]}"
  rc=$?
  if [[ $r == "$killed" ]]; then
    [[ $rc == 137 ]] || { echo "rank $r: exit status $rc, expected death by SIGKILL (137)"; status=1; }
  elif [[ $rc != 0 ]]; then
    echo "rank $r: exit status $rc"
    status=1
  fi
done
exit $status
