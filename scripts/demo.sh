#!/usr/bin/env bash
# The main job: trains a small MLP across 4 MPI ranks at ZeRO stage 3, then compares per-rank memory across
# stages 0-3 with the ZeRO formula. Installs missing Debian packages and builds first.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target train_demo

mpirun=(mpirun --oversubscribe -np 4)
if [[ $(id -u) -eq 0 ]]; then mpirun+=(--allow-run-as-root); fi
"${mpirun[@]}" build/release/train_demo --stage 3 "$@"
echo
"${mpirun[@]}" build/release/train_demo --compare-stages
