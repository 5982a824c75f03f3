#!/usr/bin/env bash
# Installs the Debian packages libzero needs to build and test, only if some are missing. Run as root (or with
# sudo available) on Debian 12.
set -euo pipefail

# cmake, g++, make: the toolchain (usually present already); ninja-build: the generator the CMake presets use.
# Open MPI: it yields when ranks outnumber cores, where MPICH busy-polls. nlohmann-json: the DeepSpeed config.
# GoogleTest, CMocka: unit and C API tests.
# clang-format: the formatting check. abigail-tools, pkg-config: the ABI and install checks. debhelper, dpkg-dev,
# lintian: the Debian packages. python3-yaml: parsing the conda recipe. python3-numpy, python3-venv: the checkpoint
# interoperability test (scripts/test.sh adds the safetensors package from PyPI in a venv under ~/.cache/libzero). libxxhash-dev:
# checkpoint checksums. libopenblas-dev: the GPT example's matmuls. clang-14, libclang-rt-14-dev: the clang build,
# its sanitizers and libFuzzer. debootstrap: the clean Debian roots the packages are built and installed in. curl:
# the CPython sources the Python wheels' build root compiles (packaging/python/build-wheels.sh).
# python3-dev, python3-pytest, python3-mpi4py: the Python binding's build and tests (pybind11, ml_dtypes and
# scikit-build-core come from PyPI into the venv scripts/test.sh makes). swig, openjdk-17-jdk-headless, junit4,
# golang-go: the Java and Go bindings and their tests (JUnit 4 from Debian; Go builds with no module downloads).
# liburing-dev: io_uring for NVMe offload's direct I/O; fio: its benchmark's reference (bench/nvme/run.sh). ccache:
# the compiler cache scripts/test.sh builds with.
packages=(cmake g++ make ninja-build libopenmpi-dev openmpi-bin nlohmann-json3-dev libxxhash-dev libgtest-dev libcmocka-dev clang-format
          abigail-tools pkg-config debhelper dpkg-dev lintian python3 python3-yaml python3-numpy python3-venv
          python3-dev python3-pytest python3-mpi4py
          swig openjdk-17-jdk-headless junit4 golang-go liburing-dev fio
          libopenblas-dev clang-14 libclang-rt-14-dev debootstrap curl ccache)
packages+=("$@")  # what a caller needs beyond these (scripts/demo.sh: gnuplot for the loss plot)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "installing missing Debian packages: ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
