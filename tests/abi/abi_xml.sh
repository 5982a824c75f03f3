#!/usr/bin/env bash
# Writes the ABI of a built libzero.so (public types only, no file paths) as abigail XML to stdout. The baseline
# capi/abi/libzero.so.0.abi is this output for the last released ABI; scripts/update-abi-baseline.sh rewrites it.
#   abi_xml.sh LIBRARY GENERATED_INCLUDE_DIR
set -euo pipefail
lib=$1
generated=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
abidw --exported-interfaces-only --drop-private-types --drop-undefined-syms --no-corpus-path --no-show-locs \
      --type-id-style hash --headers-dir "$root/capi/include/zero" --header-file "$generated/zero/zero_version.h" \
      "$lib"
