#!/usr/bin/env bash
# The main job: trains a small GPT (examples/gpt) across 4 MPI ranks at ZeRO stage 3 on generated two-digit
# additions, then trains it briefly at stages 0-3 and prints per-rank memory next to the ZeRO formula. Installs
# missing Debian packages and builds first. Extra arguments go to the first run (see train_gpt --help).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target train_gpt

mpirun=(mpirun --oversubscribe -np 4)
if [[ $(id -u) -eq 0 ]]; then mpirun+=(--allow-run-as-root); fi
progress=lines
[[ -t 1 ]] && progress=redraw
"${mpirun[@]}" build/release/train_gpt --stage 3 --steps 200 --progress "$progress" --print-every 20 "$@"
echo
"${mpirun[@]}" build/release/train_gpt --compare-stages
