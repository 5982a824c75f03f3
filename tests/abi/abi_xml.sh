#!/usr/bin/env bash
# Writes the ABI of a built libzero.so (public types only, no file paths, no experimental calls) as abigail XML to
# stdout. The baseline capi/abi/libzero.so.1.abi is this output for the current ABI generation;
# scripts/update-abi-baseline.sh rewrites it.
#   abi_xml.sh LIBRARY GENERATED_INCLUDE_DIR
set -euo pipefail
lib=$1
generated=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
suppr=$(mktemp --suffix=.suppr)
trap 'rm -f "$suppr"' EXIT
bash "$here/experimental_suppr.sh" >"$suppr"
# The experimental calls' ELF symbol entries (one line each) and declarations (<function-decl> ... </function-decl>)
# are left out of the XML.
experimental=$(awk '$1 == "ZERO_EXPERIMENTAL" {print $2}' "$root/capi/exports.txt" | paste -sd '|')
abidw --exported-interfaces-only --drop-private-types --drop-undefined-syms --no-corpus-path --no-show-locs \
      --type-id-style hash --headers-dir "$root/capi/include/zero" --header-file "$generated/zero/zero_version.h" \
      --suppressions "$suppr" "$lib" |
  awk -v names="$experimental" '
    BEGIN { pattern = "^ *<(elf-symbol|function-decl) name=.(" names ")." }
    skipping { if ($0 ~ /<\/function-decl>/) skipping = 0; next }
    names != "" && $0 ~ pattern {
      if ($0 ~ /<function-decl/ && $0 !~ /\/>$/) skipping = 1
      next
    }
    { print }'
