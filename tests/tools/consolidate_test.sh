#!/usr/bin/env bash
# zero-ckpt end to end: a 2-rank stage-3 checkpoint is inspected, verified and consolidated in three dtypes; the
# outputs are read by the Python safetensors package and compared with the engine's gathered weights; a
# corrupted copy is refused.
#   consolidate_test.sh MPIEXEC TEST_CHECKPOINT ZERO_CKPT PYTHON DIR
set -euo pipefail
mpiexec=$1 test_checkpoint=$2 zero_ckpt=$3 python=$4 dir=$5
here=$(cd "$(dirname "$0")" && pwd)
if [[ ! -x "$python" ]] || ! "$python" -c "import safetensors, numpy" 2>/dev/null; then
  echo "no Python with safetensors and numpy at $python; scripts/test.sh creates it (~/.cache/libzero/pyenv)"
  exit 1
fi
rm -rf "$dir"
"$mpiexec" -np 2 "$test_checkpoint" --mode export --stage 3 --dir "$dir"
"$zero_ckpt" inspect "$dir"
"$zero_ckpt" verify "$dir" --tag export
for dtype in fp32 bf16 fp16; do
  "$zero_ckpt" consolidate "$dir" --dtype "$dtype" -o "$dir/full-$dtype.safetensors"
done
"$python" "$here/check_consolidated.py" "$dir"

# A flipped byte: verify names the file and fails, consolidate refuses.
cp -r "$dir/export" "$dir/bad"
printf '\xff' | dd of="$dir/bad/master.rank00001-of-00002.safetensors" bs=1 seek=300 conv=notrunc status=none
if "$zero_ckpt" verify "$dir" --tag bad >"$dir/verify.txt"; then
  echo "verify accepted a corrupt checkpoint"; exit 1
fi
grep -q "CORRUPT .*master.rank00001-of-00002.safetensors: checksum" "$dir/verify.txt"
if "$zero_ckpt" consolidate "$dir" --tag bad --dtype fp32 -o "$dir/never.safetensors" 2>/dev/null; then
  echo "consolidate accepted a corrupt checkpoint"; exit 1
fi
echo "zero-ckpt ok: inspect, verify, consolidate (fp32, bf16, fp16), corruption refused"
