#!/usr/bin/env bash
# The main job: trains a small GPT (examples/gpt) across 4 MPI ranks at ZeRO stage 3 on generated two-digit
# additions until it answers held-out problems (about a minute and a half on 2 cores), prints some of its answers,
# writes the loss curve (build/demo/loss.csv and loss.png), then trains the default-size model briefly at stages 0-3
# and prints per-rank memory next to the ZeRO formula, tokens/s per stage and the stage-3 / stage-0 step time.
# Installs missing Debian packages (gnuplot for the plot) and builds first. Extra arguments go to the first run
# (see train_gpt --help).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh gnuplot-nox
bash scripts/configure-preset.sh release >/dev/null
cmake --build --preset release -j "$(nproc)" --target train_gpt

mpirun=(mpirun --oversubscribe -np 4)
if [[ $(id -u) -eq 0 ]]; then mpirun+=(--allow-run-as-root); fi
progress=lines
[[ -t 1 ]] && progress=redraw
out=build/demo
mkdir -p "$out"
# The recipe (examples/gpt/addition.args, which the learning test mpi.gpt.learns.* trains too): 2 blocks of 64
# channels with an untied output head, one problem per sequence (10 bytes), 48 problems per rank per step, the
# learning rate decaying linearly to 0 over 1500 steps (DeepSpeed's WarmupDecayLR). examples/gpt/README.md says why
# and has its results over seeds and BLAS kernels.
read -ra recipe <examples/gpt/addition.args || [[ ${#recipe[@]} -gt 0 ]]
"${mpirun[@]}" build/release/train_gpt --stage 3 "${recipe[@]}" --progress "$progress" --print-every 100 --eval-every 500 \
  --csv "$out/loss.csv" "$@"
gnuplot -e "set terminal png size 800,480 noenhanced; set output '$out/loss.png'; set datafile separator ',';
  set title 'train_gpt: two-digit additions, 4 ranks, ZeRO stage 3'; set xlabel 'step';
  set ylabel 'training loss (answer characters, nats)'; set logscale y; set grid;
  plot '$out/loss.csv' using 1:2 skip 1 with lines title 'loss'"
echo "loss curve: $out/loss.csv, $out/loss.png"
echo
"${mpirun[@]}" build/release/train_gpt --compare-stages
