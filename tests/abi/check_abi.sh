#!/usr/bin/env bash
# Compares the built library's ABI with a checked-in baseline of its generation: by default the current release's
# (capi/abi/libzero.so.1.abi), or an earlier release's. Fails on any incompatible change (abidiff's bit 8: a removed
# function, a changed struct layout or signature, ...); a compatible addition passes with a reminder to record it.
# Structs that grew at their end (the append rule: each leads with struct_size) are compatible. Experimental calls
# are left out. Prints abidiff's report either way.
#   check_abi.sh LIBRARY GENERATED_INCLUDE_DIR [BASELINE]
set -euo pipefail
lib=$1
generated=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
baseline=${3:-"$root/capi/abi/libzero.so.1.abi"}
current=$(mktemp --suffix=.abi)
suppr=$(mktemp --suffix=.suppr)
trap 'rm -f "$current" "$suppr"' EXIT
bash "$here/abi_xml.sh" "$lib" "$generated" >"$current"
bash "$here/experimental_suppr.sh" >"$suppr"

set +e
report=$(abidiff --no-show-locs --suppressions "$suppr" "$baseline" "$current")
rc=$?
set -e
echo "$report"
# abidiff calls some changes compatible that are not: a struct member whose type is a function pointer taking other
# arguments (a communicator callback) keeps the struct's size. Any changed or removed function counts here; only
# additions are compatible.
if grep -q -E "Functions changes summary: [1-9][0-9]* Removed" <<<"$report" ||
   grep -q -E "Variables changes summary: ([1-9]|[0-9]+ Removed, [1-9])" <<<"$report"; then
  rc=$((rc | 8))
fi
# A changed function is compatible only when what changed is structs grown at their end.
if grep -q -E "Functions changes summary: [0-9]+ Removed, [1-9][0-9]* Changed" <<<"$report"; then
  if python3 "$here/grown_structs.py" <<<"$report"; then
    rc=$(((rc & ~8) | 4))
  else
    rc=$((rc | 8))
  fi
fi
if (( rc & 3 )); then
  echo "abidiff could not compare (exit $rc)"
  exit 1
fi
if (( rc & 8 )); then
  echo "INCOMPATIBLE ABI CHANGE against ${baseline#"$root"/} (report above)."
  echo "Keep the ABI compatible, or follow docs/abi.md for a new ABI generation (SONAME)."
  exit 1
fi
if (( rc & 4 )); then
  echo "the ABI changed compatibly (report above); record it with scripts/update-abi-baseline.sh (docs/abi.md)"
fi
echo "abi ok: compatible with ${baseline#"$root"/}"
