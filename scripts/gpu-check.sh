#!/usr/bin/env bash
# The one script to run on a machine with an NVIDIA GPU (docs/architecture.md, "GPU kernels"): builds
# libzero with the CUDA parts (build/cuda, release, warnings are errors), runs every test labelled gpu — which
# must then run, not skip — and the kernel benchmark, and prints one table. A few minutes on an H200; the build is
# most of it.
#   bash scripts/gpu-check.sh [--reps N]
# What it does not cover yet (not built): the engine on device memory, NCCL, the engine's use of ZeRO-Offload's
# pipeline (the pipeline itself is tested here) and the GPT example on the GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=20
if [[ ${1:-} == --reps ]]; then reps=$2; fi
export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { echo "gpu-check: nvcc not found (install the CUDA toolkit)"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader ||
  { echo "gpu-check: nvidia-smi sees no GPU"; exit 1; }
bash scripts/install-deps.sh
arch=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)}
echo "== building with CUDA for sm_$arch"
cmake -S . -B build/cuda -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZERO_WERROR=ON -DZERO_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DZERO_BUILD_PYTHON=OFF -DZERO_JAVA=OFF -DZERO_GO=OFF >/dev/null
cmake --build build/cuda -j "$(nproc)" --target test_gpu_kernels test_device_runtime zero_cuda_module test_gpu_offload zero_unit_tests \
  bench_gpu_kernels bench_offload_pipeline
echo "== GPU tests (they must run: a skip here is a failure)"
log=$(mktemp)
./build/cuda/tests/test_gpu_kernels 2>&1 | tee "$log"
ZERO_TEST_REQUIRE_DEVICE=1 ZERO_CUDA_MODULE=$PWD/build/cuda/libzero-cuda.so.1 ./build/cuda/tests/test_device_runtime 2>&1 | tee -a "$log"
./build/cuda/tests/test_gpu_offload 2>&1 | tee -a "$log"
if grep -q "SKIPPED" "$log"; then echo "gpu-check: GPU tests skipped on a GPU machine"; exit 1; fi
./build/cuda/tests/zero_unit_tests --gtest_filter='LaunchTable.*:Kernels.*:OffloadPipeline.*:DevicePlan.*' --gtest_brief=1
echo "== kernel benchmark (each kernel against a device copy of the same bytes, same run)"
./build/cuda/bench_gpu_kernels --sizes 16,64,256 --segments 1,64 --reps "$reps"
echo "== ZeRO-Offload pipeline (device memory, pinned slots, CUDA streams) against the bus and the CPU alone"
./build/cuda/bench_offload_pipeline --queue cuda --params 256 --piece 16 --reps 5
