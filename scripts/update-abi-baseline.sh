#!/usr/bin/env bash
# Rewrites capi/abi/libzero.so.1.abi (the baseline of the current ABI generation) from a release build: do this only
# together with a deliberate, documented ABI change (docs/abi.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/configure-preset.sh release >/dev/null
cmake --build --preset release -j "$(nproc)" --target zero
bash tests/abi/abi_xml.sh build/release/libzero.so.1 build/release/include >capi/abi/libzero.so.1.abi
echo "wrote capi/abi/libzero.so.1.abi"
