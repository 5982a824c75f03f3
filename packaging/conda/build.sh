#!/usr/bin/env bash
# conda build script: configure, build and install libzero into $PREFIX (conda sets PREFIX, SRC_DIR, CPU_COUNT
# and, on conda-forge, CMAKE_ARGS).
set -euo pipefail
cmake -S "$SRC_DIR" -B build-conda \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_INSTALL_LIBDIR=lib \
  -DZERO_BUILD_TESTS=OFF -DZERO_BUILD_EXAMPLES=OFF -DZERO_BUILD_BENCH=OFF -DZERO_WERROR=OFF -DZERO_BUILD_PYTHON=OFF -DZERO_JAVA=OFF -DZERO_GO=OFF ${CMAKE_ARGS:-}
cmake --build build-conda -j"${CPU_COUNT:-2}"
cmake --install build-conda
