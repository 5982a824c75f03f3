#!/usr/bin/env bash
# The deliberate break of 0.3 (docs/abi.md): compared with the last baseline of generation 0 (libzero.so.0,
# releases 0.1-0.2, kept in capi/abi/ as history), abidiff must report an incompatible change — and the SONAME must
# have changed with it, so that no program built against libzero.so.0 ever loads this library.
#   check_break.sh LIBRARY GENERATED_INCLUDE_DIR
set -euo pipefail
lib=$1
generated=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
old="$root/capi/abi/libzero.so.0.abi"
current=$(mktemp --suffix=.abi)
report=$(mktemp)
trap 'rm -f "$current" "$report"' EXIT
bash "$here/abi_xml.sh" "$lib" "$generated" >"$current"
set +e
abidiff --no-show-locs "$old" "$current" >"$report"
rc=$?
set -e
head -12 "$report"
old_soname=$(grep -o "soname='[^']*'" "$old" | head -1)
new_soname=$(grep -o "soname='[^']*'" "$current" | head -1)
if (( rc & 3 )); then echo "abidiff could not compare (exit $rc)"; exit 1; fi
if (( !(rc & 8) )); then echo "expected abidiff to report the 0.2 -> 0.3 break as incompatible (exit $rc)"; exit 1; fi
if [[ "$old_soname" == "$new_soname" ]]; then echo "the ABI broke but the SONAME stayed $new_soname"; exit 1; fi
echo "break ok: abidiff reports 0.2 -> 0.3 as incompatible, and the SONAME changed ($old_soname -> $new_soname)"
