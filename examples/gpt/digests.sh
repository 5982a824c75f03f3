#!/usr/bin/env bash
# The trained weights' digests of a fixed set of short GPT runs: every stage, fp32 and bf16, 2 and 3 ranks,
# gradient accumulation 1 and 2; then configs with overlap_comm (buckets in flight, units fetched ahead) and bf16
# stochastic rounding. Two builds that print the same lines
# train the same weights, bit for bit (a refactoring must not change one).
#   bash examples/gpt/digests.sh build/release [steps]
set -euo pipefail
build=${1:?usage: digests.sh BUILD_DIR [STEPS]}
steps=${2:-12}
mpirun=(mpirun --allow-run-as-root --oversubscribe)
small=(--layers 2 --channels 64 --heads 4 --micro-batch 4 --steps "$steps" --print-every 1000 --digest)
for ranks in 2 3; do
  for dtype in fp32 bf16; do
    for accum in 1 2; do
      for stage in 0 1 2 3; do
        flags=(--stage "$stage" --grad-accum "$accum")
        [[ $dtype == bf16 ]] && flags+=(--bf16)
        digest=$(OMP_NUM_THREADS=1 "${mpirun[@]}" -np "$ranks" "$build/train_gpt" "${small[@]}" "${flags[@]}" |
                 sed -n 's/^weights digest //p')
        echo "ranks $ranks $dtype accum $accum stage $stage: $digest"
      done
    done
  done
done
config=$(mktemp)
trap 'rm -f "$config"' EXIT
for stage in 2 3; do
  cat >"$config" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
 "bf16": {"enabled": true, "stochastic_rounding": true, "stochastic_rounding_seed": 7},
 "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.1}},
 "zero_optimization": {"stage": $stage, "overlap_comm": true, "reduce_bucket_size": 20000,
                       "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 50000}}
JSON
  digest=$(OMP_NUM_THREADS=1 "${mpirun[@]}" -np 3 "$build/train_gpt" "${small[@]}" --config "$config" |
           sed -n 's/^weights digest //p')
  echo "ranks 3 config stage $stage (overlap_comm, prefetch, stochastic rounding): $digest"
done
