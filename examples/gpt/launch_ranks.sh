#!/usr/bin/env bash
# Starts N ranks of train_gpt_device on this machine, as torchrun would: rank r gets --world N --rank r --job NAME (a
# name unique to this launch) and NCCL_HOSTID=NAME-r, so that NCCL treats processes that share a GPU as separate
# hosts (its socket transport) instead of refusing them. Rank 0 prints; the exit status is the first failing rank's.
#
#   examples/gpt/launch_ranks.sh N path/to/train_gpt_device [options...]
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 N program [options...]" >&2
  exit 2
fi
ranks=$1
shift
job="gpt-$$-$RANDOM"
pids=()
for ((rank = 0; rank < ranks; rank++)); do
  NCCL_HOSTID="$job-$rank" "$@" --world "$ranks" --rank "$rank" --job "$job" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid"
  rc=$?
  if [ "$status" -eq 0 ] && [ "$rc" -ne 0 ]; then status=$rc; fi
done
exit "$status"
