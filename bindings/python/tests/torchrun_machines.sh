#!/usr/bin/env bash
# Starts a torchrun job over M "machines" on this one, as a multi-node torchrun job is started: one agent per
# machine (--nnodes M --node-rank k, the static rendezvous at 127.0.0.1), each with L ranks and
# ZERO_TORCH_MACHINE_ID=machine-k, so that libzero takes each agent's ranks for a machine of their own (shared memory
# within it, TCP between them).
#   torchrun_machines.sh TORCHRUN M L SCRIPT ARGS...
# Passes when every agent exits 0.
set -uo pipefail
torchrun=$1 machines=$2 per_machine=$3
shift 3
port=$("$(dirname "$torchrun")/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for ((k = 0; k < machines; k++)); do
  ZERO_TORCH_MACHINE_ID=machine-$k "$torchrun" --nnodes "$machines" --node-rank "$k" --nproc-per-node "$per_machine" \
    --master-addr 127.0.0.1 --master-port "$port" "$@" &
  pids+=($!)
done
status=0
for ((k = 0; k < machines; k++)); do
  wait "${pids[$k]}" || { echo "machine $k: torchrun exit status $?"; status=1; }
done
exit $status
