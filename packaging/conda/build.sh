#!/usr/bin/env bash
# conda build script: configure, build and install libzero into $PREFIX (conda sets PREFIX, SRC_DIR, CPU_COUNT
# and, on conda-forge, CMAKE_ARGS).
# The nompi variant (ZERO_CONDA_MPI=nompi, from the recipe) builds no MPI module even where an MPI is installed.
set -euo pipefail
mpi_args=()
[[ ${ZERO_CONDA_MPI:-} == nompi ]] && mpi_args=(-DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON)
cmake -S "$SRC_DIR" -B build-conda \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_INSTALL_LIBDIR=lib \
  -DZERO_BUILD_TESTS=OFF -DZERO_BUILD_EXAMPLES=OFF -DZERO_BUILD_BENCH=OFF -DZERO_WERROR=OFF -DZERO_BUILD_PYTHON=OFF -DZERO_JAVA=OFF -DZERO_GO=OFF "${mpi_args[@]}" ${CMAKE_ARGS:-}
cmake --build build-conda -j"${CPU_COUNT:-2}"
cmake --install build-conda
