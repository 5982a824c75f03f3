#!/usr/bin/env bash
# Starts a torchrun job over M "machines" on this one, as a multi-node torchrun job is started: one agent per
# machine (--nnodes M --node-rank k, the static rendezvous at 127.0.0.1), each with L ranks and
# ZERO_TORCH_MACHINE_ID=machine-k, so that libzero takes each agent's ranks for a machine of their own (shared memory
# within it, TCP between them).
#   torchrun_machines.sh TORCHRUN M L SCRIPT ARGS...
# Passes when every agent exits 0. (The master port is drawn free here and taken by agent 0 a moment later.)
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
# An agent that fails ends the others (one left waiting in the rendezvous would wait for the test's timeout).
status=0
while ((${#pids[@]} > 0)); do
  rc=0
  wait -n -p done "${pids[@]}" || rc=$?
  if ((rc != 0)); then
    echo "a torchrun agent exited with status $rc: stopping the others"
    status=1
    kill "${pids[@]}" 2>/dev/null
  fi
  for i in "${!pids[@]}"; do [[ ${pids[$i]} == "$done" ]] && unset 'pids[i]'; done
done
exit $status
