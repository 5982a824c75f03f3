#!/usr/bin/env bash
# conda build script of the libzero-engine output: the Python package over the libzero output already in $PREFIX
# (ZERO_PYTHON_SYSTEM_LIBZERO: the extension alone, linked to $PREFIX/lib/libzero.so.1), installed by $PYTHON's pip
# without build isolation (conda provides scikit-build-core and pybind11 as host requirements).
set -euo pipefail
"$PYTHON" -m pip install "$SRC_DIR" --no-deps --no-build-isolation --disable-pip-version-check -q \
  --config-settings=cmake.define.ZERO_PYTHON_SYSTEM_LIBZERO=ON \
  --config-settings=cmake.define.Zero_DIR="$PREFIX/lib/cmake/Zero" \
  --config-settings=build-dir="${SRC_DIR}/build-conda-python"
