#!/usr/bin/env bash
# libzero.so must export only zero_* symbols (plus the version node), carry SONAME libzero.so.0, and leak no C++,
# nlohmann-json or MPI symbol.
set -euo pipefail
lib=$1
soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
if [[ "$soname" != "libzero.so.0" ]]; then
  echo "SONAME is '$soname', expected libzero.so.0"
  exit 1
fi
bad=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v -E '^(zero_[a-z0-9_]+@@ZERO_0\.1|ZERO_0\.1)$' || true)
if [[ -n "$bad" ]]; then
  echo "symbols other than zero_* are exported:"
  echo "$bad"
  exit 1
fi
echo "exports ok: $(nm -D --defined-only "$lib" | grep -c ' T zero_') zero_* functions, SONAME $soname"
