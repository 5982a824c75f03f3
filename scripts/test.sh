#!/usr/bin/env bash
# Every test: installs missing Debian packages, builds the release preset (warnings are errors) and runs the
# whole CTest suite (unit, C API, formatting, multi-process under mpirun), then builds the asan preset and runs
# the single-process tests under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash scripts/install-deps.sh

echo "== release build and full test suite"
cmake --preset release
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"

echo "== ASan + UBSan build, single-process tests"
cmake --preset asan
cmake --build --preset asan -j "$jobs"
ctest --preset asan -j "$jobs"
