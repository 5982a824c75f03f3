#!/usr/bin/env bash
# Every test: installs missing Debian packages; builds the release preset with GCC (warnings are errors) and runs
# the whole CTest suite (unit, C API, ABI, install, formatting, multi-process under mpirun); builds the asan preset
# and runs the single-process tests under AddressSanitizer + UndefinedBehaviorSanitizer; builds with clang 14 under
# UBSan and runs the suite again, multi-process tests included; runs the fuzzers (libFuzzer, ASan + UBSan) for a
# minute each; then builds, lints, installs and consumes the Debian packages, and tests the conda recipe's build
# script.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash scripts/install-deps.sh

# Python with the safetensors package (PyPI) for the checkpoint interoperability test, in a venv outside the source
# tree (numpy comes from Debian).
pyenv=${ZERO_PYENV:-${XDG_CACHE_HOME:-$HOME/.cache}/libzero/pyenv}
if ! "$pyenv/bin/python3" -c "import safetensors, numpy" 2>/dev/null; then
  rm -rf "$pyenv"
  mkdir -p "$(dirname "$pyenv")"
  /usr/bin/python3 -m venv --system-site-packages "$pyenv"
  "$pyenv/bin/pip" install --quiet --disable-pip-version-check safetensors
fi

echo "== release build (GCC) and full test suite"
cmake --preset release -DZERO_TEST_PYTHON="$pyenv/bin/python3"
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"

echo "== ASan + UBSan build, single-process tests"
cmake --preset asan -DZERO_TEST_PYTHON="$pyenv/bin/python3"
cmake --build --preset asan -j "$jobs"
ctest --preset asan -j "$jobs"

echo "== clang 14 build with UBSan, full test suite (the 2 GiB unit test ran in the release suite)"
cmake --preset clang -DZERO_TEST_PYTHON="$pyenv/bin/python3"
cmake --build --preset clang -j "$jobs"
ctest --preset clang -j "$jobs" -E '^mpi\.large_unit\.'

echo "== fuzzers"
bash scripts/run-fuzzers.sh

echo "== Debian packages"
bash packaging/test-debian.sh

echo "== conda recipe"
bash packaging/conda/test-conda.sh
