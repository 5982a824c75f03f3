#!/usr/bin/env bash
# Prints an abigail suppression file for the calls of zero.h's experimental section (version node
# ZERO_EXPERIMENTAL in capi/exports.txt): they may change in any release, so the ABI baseline and the comparison
# with it leave them out (docs/abi.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
for symbol in $(awk '$1 == "ZERO_EXPERIMENTAL" {print $2}' "$root/capi/exports.txt"); do
  printf '[suppress_function]\n  symbol_name = %s\n  drop = yes\n' "$symbol"
done
