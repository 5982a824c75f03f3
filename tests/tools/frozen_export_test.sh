#!/usr/bin/env bash
# Frozen params leave a checkpoint as they are: a 3-rank stage-3 run with stage3_gather_16bit_weights_on_model_save
# writes model.safetensors, and zero-ckpt consolidates the sharded checkpoint; in both the frozen params have their
# own dtypes and rank 0's bytes (NaN payloads included), read back by the Python safetensors package. A checkpoint
# saved without them is refused by consolidate unless --skip-frozen.
#   frozen_export_test.sh MPIEXEC TEST_FROZEN ZERO_CKPT PYTHON DIR
set -euo pipefail
mpiexec=$1 test_frozen=$2 zero_ckpt=$3 python=$4 dir=$5
here=$(cd "$(dirname "$0")" && pwd)
if [[ ! -x "$python" ]] || ! "$python" -c "import safetensors, numpy" 2>/dev/null; then
  echo "no Python with safetensors and numpy at $python; scripts/test.sh creates it (~/.cache/libzero/pyenv)"
  exit 1
fi
rm -rf "$dir"
"$mpiexec" -np 3 "$test_frozen" --mode export --stage 3 --dir "$dir"
"$zero_ckpt" inspect "$dir" --tag export | tee "$dir/inspect.txt"
grep -q "^frozen  *7 of them, .* bytes, saved as they are" "$dir/inspect.txt"
"$zero_ckpt" consolidate "$dir" --tag export --dtype bf16 -o "$dir/consolidated.safetensors"
"$zero_ckpt" consolidate "$dir" --tag export --dtype fp32 --skip-frozen -o "$dir/trained.safetensors"
"$python" "$here/check_frozen_export.py" "$dir"
echo "frozen export ok: model.safetensors and zero-ckpt consolidate keep the frozen params' dtypes and bytes"
