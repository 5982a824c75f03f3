#!/usr/bin/env bash
# Every test: installs missing Debian packages; builds the release preset (warnings are errors) and runs the
# whole CTest suite (unit, C API, ABI, install, formatting, multi-process under mpirun); builds the asan preset
# and runs the single-process tests under AddressSanitizer + UndefinedBehaviorSanitizer; then builds, lints,
# installs and consumes the Debian packages, and tests the conda recipe's build script.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash scripts/install-deps.sh

# Python with the safetensors package (PyPI) for the checkpoint interoperability test; numpy comes from Debian.
if ! build/pyenv/bin/python3 -c "import safetensors, numpy" 2>/dev/null; then
  rm -rf build/pyenv
  /usr/bin/python3 -m venv --system-site-packages build/pyenv
  build/pyenv/bin/pip install --quiet --disable-pip-version-check safetensors
fi

echo "== release build and full test suite"
cmake --preset release
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"

echo "== ASan + UBSan build, single-process tests"
cmake --preset asan
cmake --build --preset asan -j "$jobs"
ctest --preset asan -j "$jobs"

echo "== Debian packages"
bash packaging/test-debian.sh

echo "== conda recipe"
bash packaging/conda/test-conda.sh
