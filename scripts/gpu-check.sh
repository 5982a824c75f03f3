#!/usr/bin/env bash
# The GPU check (docs/architecture.md, "The device runtime and its emulator"), in two halves, because the GPU
# machine we get reaches no network, has no apt and none of Debian's -dev packages, and takes at most 64 MiB of
# files:
#
#   bash scripts/gpu-check.sh --prepare [--build DIR] [--out DIR]
#     On the CPU machine: builds (unless --build names a -DZERO_CUDA=ON build that has them) the test and benchmark
#     programs for sm_90 and collects them into a bundle (default build/gpu-bundle): the programs stripped of debug
#     information, the CUDA module, libzero.so.1 and every shared library they need but glibc's, found through
#     LD_LIBRARY_PATH=bundle/lib. Fails if the bundle is over 48 MiB (the repository travels beside it).
#
#   bash scripts/gpu-check.sh --run [--bundle DIR] [--reps N] [--emulator]
#     On the GPU machine, nothing built there: a probe (driver, CUDA, NCCL, torch), every GPU test (a skip is a
#     failure), the device engine against the CPU engine's bits, the kernel and ZeRO-Offload benchmarks, and one
#     table of what ran. --emulator is the CPU machine's check of the same bundle (CTest gpu-check.bundle): the
#     tests' emulator halves, and the GPU halves load and report themselves skipped.
#
#   bash scripts/gpu-check.sh [--reps N]
#     Where a GPU and the build's dependencies both are: --prepare, then --run.
#
# Not covered yet: the GPT example on the GPU (cuBLASLt), NCCL, several processes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=both build= out=$root/build/gpu-bundle bundle= reps=20 emulator=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --prepare) mode=prepare ;;
    --run) mode=run ;;
    --build) build=$2; shift ;;
    --out) out=$2; shift ;;
    --bundle) bundle=$2; shift ;;
    --reps) reps=$2; shift ;;
    --emulator) emulator=1 ;;
    *) echo "gpu-check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
bundle=${bundle:-$out}

programs=(tests/test_device_runtime tests/test_capi_device tests/test_gpu_kernels tests/zero_unit_tests bench_gpu_kernels
          bench_offload_pipeline)
modules=(libzero.so.1 libzero-cuda.so.1)
max_bytes=$((48 << 20))

prepare() {
  if [[ -z $build ]]; then
    build=$root/build/gpu
    export PATH=/usr/local/cuda/bin:$PATH
    command -v nvcc >/dev/null || { echo "gpu-check: nvcc not found (install the CUDA toolkit)"; exit 1; }
    bash "$root/scripts/install-deps.sh"
    echo "== building for sm_${CUDA_ARCH:-90} in $build"
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZERO_WERROR=ON -DZERO_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DZERO_BUILD_PYTHON=OFF -DZERO_JAVA=OFF -DZERO_GO=OFF >/dev/null
    cmake --build "$build" -j "$(nproc)" --target test_device_runtime test_capi_device test_gpu_kernels \
      zero_unit_tests bench_gpu_kernels bench_offload_pipeline zero zero_cuda_module
  fi
  rm -rf "$out"
  mkdir -p "$out/bin" "$out/lib"
  for p in "${programs[@]}"; do
    [[ -x $build/$p ]] || { echo "gpu-check: $build/$p is missing (a -DZERO_CUDA=ON build makes it)"; exit 1; }
    strip --strip-debug -o "$out/bin/$(basename "$p")" "$build/$p"
  done
  for m in "${modules[@]}"; do strip --strip-debug -o "$out/lib/$m" "$build/$m"; done
  # Every shared library they load but glibc's own, so that the bundle runs on another distribution's image.
  local libs
  libs=$(for f in "$out"/bin/* "$out"/lib/*; do ldd "$f"; done | awk '$3 ~ /^\// {print $3}' | sort -u)
  for l in $libs; do
    case $(basename "$l") in
      libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libzero*) ;;
      *) cp -L "$l" "$out/lib/" ;;
    esac
  done
  cat >"$out/MANIFEST" <<EOF
libzero GPU check bundle
commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
built on: $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)
device code: $( (cuobjdump --list-elf "$out/lib/libzero-cuda.so.1" 2>/dev/null || true) | grep -o 'sm_[0-9a-z]*' | sort -u | tr '\n' ' ')
EOF
  local bytes
  bytes=$(du -sb "$out" | cut -f1)
  echo "gpu-check: bundle $out: $((bytes >> 20)) MiB ($bytes bytes) of at most $((max_bytes >> 20)) MiB"
  ls -l "$out/bin" "$out/lib" | awk 'NF > 5 {print "  " $5 "\t" $9}'
  if ((bytes > max_bytes)); then echo "gpu-check: the bundle is too large to travel"; exit 1; fi
}

run() {
  [[ -f $bundle/MANIFEST ]] || { echo "gpu-check: no bundle at $bundle (--prepare makes one)"; exit 1; }
  export LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export ZERO_CUDA_MODULE=$bundle/lib/libzero-cuda.so.1
  local bin=$bundle/bin logs
  logs=$(mktemp -d)
  echo "== probe"
  cat "$bundle/MANIFEST"
  echo "running on: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: no GPU"
  (command -v nvcc >/dev/null && nvcc --version | tail -1) || echo "nvcc: not found"
  python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPU', torch.cuda.is_available(),
'NCCL', torch.cuda.nccl.version() if torch.cuda.is_available() else None)" 2>/dev/null || echo "torch: not importable"
  if ((emulator)); then
    unset ZERO_TEST_REQUIRE_DEVICE
  else
    export ZERO_TEST_REQUIRE_DEVICE=1  # a GPU test that skips here fails instead
  fi
  local -a rows=() failed=()
  check() {  # check NAME EXPECT COMMAND...: EXPECT is "pass" or "skip" (every test reports itself skipped)
    local name=$1 expect=$2 start rc=0 verdict
    shift 2
    start=$(date +%s%N)
    "$@" >"$logs/$name.log" 2>&1 || rc=$?
    local ms=$((($(date +%s%N) - start) / 1000000))
    local secs=$((ms / 1000)).$((ms % 1000 / 100))
    if ((rc != 0)); then
      verdict="FAILED (exit $rc)"
    elif grep -q "Running 0 tests" "$logs/$name.log"; then
      verdict="FAILED (no test matched)"
    elif [[ $expect == pass ]] && grep -q "SKIPPED\|no CUDA device" "$logs/$name.log"; then
      verdict="FAILED (skipped: $( ((emulator)) && echo "no GPU here" || echo "on a GPU machine"))"
    elif [[ $expect == skip ]] && ! grep -q "SKIPPED\|no CUDA device" "$logs/$name.log"; then
      verdict="FAILED (ran where no GPU is)"
    else
      verdict="ok ($expect)"
    fi
    [[ $verdict == ok* ]] || { failed+=("$name"); tail -30 "$logs/$name.log"; }
    rows+=("$(printf "%-34s %-36s %7s s" "$name" "$verdict" "$secs")")
  }
  echo "== tests"
  if ((emulator)); then
    check device-runtime.emulator pass "$bin/test_device_runtime" --gtest_filter='*emulator*:DeviceEmulator*:DeviceEngineFaults*'
    check device-runtime.cuda skip "$bin/test_device_runtime" --gtest_filter='*cuda*'
    check gpu-kernels skip "$bin/test_gpu_kernels" --gtest_filter='Gpu.*'
  else
    check device-runtime.cuda pass "$bin/test_device_runtime" --gtest_filter='*cuda*'
    check device-runtime.emulator pass "$bin/test_device_runtime" --gtest_filter='*emulator*:DeviceEmulator*:DeviceEngineFaults*'
    check gpu-kernels pass "$bin/test_gpu_kernels" --gtest_filter='Gpu.*'
  fi
  check gpu-arguments pass "$bin/test_gpu_kernels" --gtest_filter='GpuArguments.*'
  check device-capi pass "$bin/test_capi_device"
  check unit.kernels-and-plans pass "$bin/zero_unit_tests" \
    --gtest_filter='LaunchTable.*:Kernels.*:OffloadPipeline.*:DevicePlan.*' --gtest_brief=1
  if ((!emulator)); then
    echo "== benchmarks"
    check bench.kernels pass "$bin/bench_gpu_kernels" --sizes 16,64,256 --segments 1,64 --reps "$reps"
    check bench.offload pass "$bin/bench_offload_pipeline" --queue cuda --params 256 --piece 16 --reps 5
    # The device engine's whole zero_step against torch's fused AdamW on the same GPU (the machine's torch).
    check bench.step-vs-torch pass python3 "$root/bench/step_vs_torch.py" --lib "$bundle/lib/libzero.so.1" \
      --device cuda --sizes 16,64,256 --reps 5
    cat "$logs/bench.kernels.log" "$logs/bench.offload.log" "$logs/bench.step-vs-torch.log"
  fi
  echo "== gpu-check: $( ((emulator)) && echo "the bundle on the emulator (no GPU)" || echo "on the GPU")"
  printf "%s\n" "${rows[@]}"
  rm -rf "$logs"
  if ((${#failed[@]})); then echo "gpu-check: FAILED: ${failed[*]}"; exit 1; fi
  echo "gpu-check: all passed"
}

case $mode in
  prepare) prepare ;;
  run) run ;;
  both) prepare && run ;;
esac
