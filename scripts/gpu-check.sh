#!/usr/bin/env bash
# The GPU check (docs/architecture.md, "The device runtime and its emulator"), in two halves, because the GPU
# machine we get reaches no network, has no apt and none of Debian's -dev packages, and takes at most 64 MiB of
# files:
#
#   bash scripts/gpu-check.sh --prepare [--build DIR] [--out DIR]
#     On the CPU machine: builds (unless --build names a -DZERO_CUDA=ON build that has them) the test and benchmark
#     programs and the GPT example for sm_90 and collects them into a bundle (default build/gpu-bundle): the programs
#     stripped of debug information, the CUDA module, libzero.so.1 and every shared library they need but glibc's and
#     cuBLAS's (half a gigabyte: the GPU machine's own, torch's or the toolkit's, is found at --run), found through
#     LD_LIBRARY_PATH=bundle/lib; and in bundle/vendor what the lean build below needs that the GPU machine lacks
#     (nlohmann/json.hpp, xxhash.h, cmocka.h and its library, GoogleTest's source). Fails if the bundle is over
#     48 MiB (the repository travels beside it).
#
#   bash scripts/gpu-check.sh --run [--bundle DIR] [--reps N] [--emulator] [--lean] [--lean-dir DIR] [--python PY]
#     On the GPU machine, nothing built there: a probe (driver, CUDA, NCCL, torch), every GPU test (a skip is a
#     failure), the device engine against the CPU engine's bits, the kernel and ZeRO-Offload benchmarks, and one
#     table of what ran; the GPT example (examples/gpt/train_gpt_device.cpp) trains on the GPU at stages 0-3 (the
#     same weights at each), twice alike (the same weights: a run repeats itself bit for bit), and a larger model for
#     tokens/s; and at 2 and 3 processes on the one GPU (examples/gpt/launch_ranks.sh; each its own NCCL_HOSTID),
#     once with the data over NCCL (libzero-nccl.so.1 with the machine's libnccl.so.2: torch's nvidia-nccl wheel) and
#     once host-staged over shared memory, stages 0-3 each: all eight runs of a rank count give one digest (NCCL's
#     path has the host-staged path's bits, which are the CPU engine's). Parity (tests/mpi/parity.c built without MPI,
#     started by tests/mpi/shm_launch.sh): 1, 2 and 3 processes at stages 0-3 over shared memory, 2 and 3 over NCCL,
#     ZeRO-Offload at 2 over both, each ending with its single-process reference's weights bit for bit (so N = 1 and N = 2, 3
#     give the same weights). One rank failing (tests/mpi/failures.c without MPI): before a gather, a bucket and the
#     step, inside a group of reduce-scatters in flight, and stalled, host-staged and over NCCL. libzero.torch: the
#     Python extension compiled there for its python3 (--python) over the bundle's libzero.so.1 and headers (the
#     bundle's pybind11), then test_torch.py's parity test with the model on the GPU in one process and in two
#     (torchrun), host-staged and over NCCL, and the Python GPT example at two processes over each.
#     --emulator is the CPU machine's check of the
#     same bundle (CTest gpu-check.bundle): the tests' emulator halves and the GPT's CPU run (one process and two),
#     and the GPU halves load and report themselves skipped.
#     Where a prebuilt program does not load (another glibc, a missing library), or with --lean, it first builds
#     them there: the lean build (-DZERO_LEAN=ON: libzero, the CUDA module and these programs; no MPI, BLAS or
#     bindings) with the machine's nvcc, CMake and compiler and the bundle's vendored headers, in build/lean (or
#     --lean-dir), and runs that instead (CTest unit.gpu-check.lean does it here).
#
#   bash scripts/gpu-check.sh [--reps N]
#     Where a GPU and the build's dependencies both are: --prepare, then --run.
#
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=both build= out=$root/build/gpu-bundle bundle= reps=20 emulator=0 lean=0 lean_dir=$root/build/lean python=python3
while [[ $# -gt 0 ]]; do
  case $1 in
    --prepare) mode=prepare ;;
    --run) mode=run ;;
    --build) build=$2; shift ;;
    --out) out=$2; shift ;;
    --bundle) bundle=$2; shift ;;
    --reps) reps=$2; shift ;;
    --emulator) emulator=1 ;;
    --lean) lean=1 ;;
    --lean-dir) lean_dir=$2; shift ;;
    --python) python=$2; shift ;;
    *) echo "gpu-check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
bundle=${bundle:-$out}

programs=(tests/test_device_runtime tests/test_capi_device tests/test_gpu_kernels tests/zero_unit_tests bench_gpu_kernels
          bench_offload_pipeline train_gpt_device bench_nccl tests/test_parity_launch tests/test_failures_launch)
modules=(libzero.so.1 libzero-cuda.so.1 libzero-nccl.so.1)
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
      zero_unit_tests bench_gpu_kernels bench_offload_pipeline train_gpt_device bench_nccl test_parity_launch \
      test_failures_launch zero zero_cuda_module zero_nccl_module
  fi
  collect "$build" "$out"
  vendor "$out/vendor"
  local bytes
  bytes=$(du -sb "$out" | cut -f1)
  echo "gpu-check: bundle $out: $((bytes >> 20)) MiB ($bytes bytes) of at most $((max_bytes >> 20)) MiB"
  ls -l "$out/bin" "$out/lib" | awk 'NF > 5 {print "  " $5 "\t" $9}'
  if ((bytes > max_bytes)); then echo "gpu-check: the bundle is too large to travel"; exit 1; fi
}

stripped() {  # stripped FROM TO: a copy without debug information (a plain copy where binutils is not installed)
  if command -v strip >/dev/null; then strip --strip-debug -o "$2" "$1"; else cp "$1" "$2"; fi
}

# collect BUILD OUT: the programs and modules of BUILD, stripped, with every library they load but glibc's and
# cuBLAS's, into OUT/bin and OUT/lib.
collect() {
  local build=$1 out=$2
  rm -rf "$out"
  mkdir -p "$out/bin" "$out/lib"
  for p in "${programs[@]}"; do
    [[ -x $build/$p ]] || { echo "gpu-check: $build/$p is missing (a -DZERO_CUDA=ON build makes it)"; exit 1; }
    stripped "$build/$p" "$out/bin/$(basename "$p")"
  done
  for m in "${modules[@]}"; do stripped "$build/$m" "$out/lib/$m"; done
  # The public header's generated half, for the Python extension compiled at --run (the rest is in the repository).
  mkdir -p "$out/include/zero"
  cp "$build/include/zero/zero_version.h" "$out/include/zero/"
  # Every shared library they load but glibc's own, so that the bundle runs on another distribution's image.
  local libs
  libs=$(for f in "$out"/bin/* "$out"/lib/*; do ldd "$f"; done | awk '$3 ~ /^\// {print $3}' | sort -u)
  for l in $libs; do
    case $(basename "$l") in
      libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libzero*|libcublas*|libnccl*) ;;
      *) cp -L "$l" "$out/lib/" ;;
    esac
  done
  cat >"$out/MANIFEST" <<EOF
libzero GPU check bundle
commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
built on: $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)
cuBLASLt: the GPU machine's own (torch's nvidia-cublas wheel or a CUDA toolkit), found at --run
device code: $(if command -v cuobjdump >/dev/null; then
  cuobjdump --list-elf "$out/lib/libzero-cuda.so.1" 2>/dev/null | grep -o 'sm_[0-9a-z]*' | sort -u | tr '\n' ' '
else echo "sm_${CUDA_ARCH:-90} (cuobjdump is not installed to confirm it)"; fi)
EOF
}

# vendor DIR: what the lean build needs from this machine's Debian packages: nlohmann-json3-dev's, libxxhash-dev's
# and libcmocka-dev's headers, CMocka's library, googletest's source (libgtest-dev); the toolkit's nccl.h (the
# NCCL module's only build dependency: NCCL itself is loaded at run time); and pybind11's headers (from the Python
# that builds the bindings here: scripts/test.sh's venv, or python3), for the extension compiled at --run.
vendor() {
  local dir=$1 header cmocka py pybind=
  mkdir -p "$dir/include" "$dir/lib" "$dir/nccl/include"
  [[ -e /usr/local/cuda/include/nccl.h ]] || { echo "gpu-check: /usr/local/cuda/include/nccl.h is missing"; exit 1; }
  cp /usr/local/cuda/include/nccl.h "$dir/nccl/include/"
  for header in nlohmann xxhash.h cmocka.h; do
    [[ -e /usr/include/$header ]] || { echo "gpu-check: /usr/include/$header is missing (scripts/install-deps.sh)"; exit 1; }
    cp -r "/usr/include/$header" "$dir/include/"
  done
  cmocka=$(ldconfig -p | awk '/libcmocka\.so\.0 / && !found {print $NF; found = 1}')
  [[ -n $cmocka ]] || { echo "gpu-check: libcmocka.so.0 is missing (libcmocka-dev)"; exit 1; }
  # Under both names, as files (links may not travel): the linker's, and the SONAME the programs then load.
  cp -L "$cmocka" "$dir/lib/libcmocka.so"
  cp -L "$cmocka" "$dir/lib/libcmocka.so.0"
  [[ -d /usr/src/googletest ]] || { echo "gpu-check: /usr/src/googletest is missing (libgtest-dev)"; exit 1; }
  cp -r /usr/src/googletest "$dir/googletest"
  for py in "${ZERO_PYENV:-${XDG_CACHE_HOME:-$HOME/.cache}/libzero/pyenv}/bin/python3" python3; do
    pybind=$("$py" -c "import pybind11; print(pybind11.get_include())" 2>/dev/null) && break
  done
  [[ -d $pybind/pybind11 ]] || { echo "gpu-check: pybind11's headers are missing (pip install pybind11)"; exit 1; }
  mkdir -p "$dir/pybind11"
  cp -r "$pybind/pybind11" "$dir/pybind11/"
}

# python_package DIR: libzero's Python package for --python's interpreter in DIR/libzero: the sources as they are,
# and the extension compiled here over the bundle's libzero.so.1 (the same recipe as bindings/python/CMakeLists.txt:
# two C++ files against zero.h and pybind11, whose headers the bundle carries).
python_package() {
  local dir=$1 include suffix
  include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])') || return 1
  [[ -e $include/Python.h ]] || { echo "gpu-check: $python has no Python.h (in $include)"; return 1; }
  suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  rm -rf "$dir" && mkdir -p "$dir"
  cp -r "$root/bindings/python/libzero" "$dir/"
  "${CXX:-c++}" -O2 -std=c++17 -shared -fPIC -fvisibility=hidden -I"$include" -I"$bundle/vendor/pybind11" \
    -I"$root/capi/include" -I"$bundle/include" "$root/bindings/python/src/module.cpp" \
    "$root/bindings/python/src/dlpack.cpp" -o "$dir/libzero/_native$suffix" -L"$bundle/lib" -l:libzero.so.1 \
    -Wl,-rpath,"$bundle/lib"
  PYTHONPATH=$dir "$python" -c 'import libzero; print("libzero", libzero.__version__, "for Python", __import__("sys").version.split()[0])'
}

# The fallback build on the GPU machine, from the repository beside the bundle and the bundle's vendor directory:
# the programs are collected into LEAN_DIR-bundle (with the vendor directory), which the run then uses.
lean_build() {
  local dir=$lean_dir nvcc gen=()
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  [[ -x $nvcc ]] || { echo "gpu-check: the lean build needs nvcc (on PATH or in /usr/local/cuda)"; exit 1; }
  command -v cmake >/dev/null || { echo "gpu-check: the lean build needs cmake"; exit 1; }
  local need have
  need=$(sed -n 's/^cmake_minimum_required(VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
  have=$(cmake --version | sed -n 's/^cmake version \([0-9.]*\).*/\1/p')
  if [[ $(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1) != "$need" ]]; then
    echo "gpu-check: the lean build needs CMake $need or later; this machine has $have (pip install cmake)"
    exit 1
  fi
  [[ -d $bundle/vendor ]] || { echo "gpu-check: $bundle/vendor is missing (--prepare makes it)"; exit 1; }
  command -v ninja >/dev/null && gen=(-G Ninja)
  echo "== the lean build in $dir (sm_${CUDA_ARCH:-90})"
  local start=$SECONDS vendored
  vendored=$(cd "$bundle/vendor" && pwd)
  # Warnings are not errors here: another compiler may warn where ours does not, and this build only runs tests.
  mkdir -p "$dir"
  cmake -S "$root" -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DZERO_LEAN=ON -DZERO_CUDA=ON -DZERO_WERROR=OFF \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DZERO_VENDOR_DIR="$vendored" \
    >"$dir/lean.log" 2>&1 || { tail -30 "$dir/lean.log"; echo "gpu-check: the lean build's configure failed"; exit 1; }
  cmake --build "$dir" -j "$(nproc)" --target test_device_runtime test_capi_device test_gpu_kernels zero_unit_tests \
    bench_gpu_kernels bench_offload_pipeline train_gpt_device bench_nccl test_parity_launch test_failures_launch zero \
    zero_cuda_module zero_nccl_module \
    >>"$dir/lean.log" 2>&1 ||
    { tail -40 "$dir/lean.log"; echo "gpu-check: the lean build failed (log: $dir/lean.log)"; exit 1; }
  echo "gpu-check: the lean build took $((SECONDS - start)) s"
  # Collected with the vendored CMocka found (test_capi_device needs libcmocka.so.0, which the machine lacks).
  LD_LIBRARY_PATH=$vendored/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} collect "$dir" "$dir-bundle"
  cp -r "$vendored" "$dir-bundle/vendor"
  bundle=$dir-bundle
}

# Whether the bundle's programs load here: the dynamic loader finds every library, symbol version and symbol they
# need (ldd -r). cuBLASLt must be found too (cublas_dir: the one the programs were linked with, by its SONAME).
loads() {
  local p out missing
  for p in "$bundle"/bin/* "$bundle"/lib/libzero*; do
    out=$(LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ldd -r "$p" 2>&1) || true
    missing=$(grep -E "not found|undefined symbol|not a dynamic" <<<"$out" || true)
    if [[ -n $missing ]]; then
      echo "gpu-check: $(basename "$p") does not load here: $(head -3 <<<"$missing" | tr -s ' \t\n' ' ')"
      return 1
    fi
  done
}

# The cuBLASLt the GPT example was linked with (its SONAME, e.g. libcublasLt.so.13): PyPI's (torch's
# nvidia-cublas wheel) or a CUDA toolkit's. Prints its directory, or nothing.
find_cublas() {
  local soname d sub
  soname=$( (readelf -d "$bundle/bin/train_gpt_device" 2>/dev/null || true) | sed -n 's/.*NEEDED.*\[\(libcublasLt[^]]*\)\]/\1/p')
  [[ -n $soname ]] || return 0
  for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) /usr/local/cuda/lib64 \
    /usr/local/cuda/lib; do
    for sub in nvidia/cu13/lib nvidia/cublas/lib .; do
      if [[ -e $d/$sub/$soname ]]; then
        (cd "$d/$sub" && pwd)
        return 0
      fi
    done
  done
}

# NCCL for the NCCL module: torch's nvidia-nccl wheel's libnccl.so.2, or the system's. Prints its path, or nothing.
find_nccl() {
  local d sub
  for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    for sub in nvidia/nccl/lib nvidia/cu13/lib; do
      if [[ -e $d/$sub/libnccl.so.2 ]]; then
        echo "$(cd "$d/$sub" && pwd)/libnccl.so.2"
        return 0
      fi
    done
  done
  ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / && !found {print $NF; found = 1}'
}

run() {
  [[ -f $bundle/MANIFEST ]] || { echo "gpu-check: no bundle at $bundle (--prepare makes one)"; exit 1; }
  # cuBLASLt for the GPT example: the one PyPI's torch brings (nvidia-cublas), or a CUDA toolkit's. Where none
  # matches the prebuilt program's, loads() fails and the lean build links the machine's own.
  local cublas_dir
  cublas_dir=$(find_cublas)
  [[ -n $cublas_dir ]] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$cublas_dir
  if ((lean)); then
    lean_build
  elif ! loads; then
    echo "gpu-check: falling back on the lean build"
    lean_build
    cublas_dir=$(find_cublas)
    [[ -n $cublas_dir ]] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$cublas_dir
  fi
  export LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export ZERO_CUDA_MODULE=$bundle/lib/libzero-cuda.so.1
  export ZERO_NCCL_MODULE=$bundle/lib/libzero-nccl.so.1
  local nccl
  nccl=$(find_nccl)
  [[ -n $nccl ]] && export ZERO_NCCL_LIBRARY=$nccl
  local bin=$bundle/bin logs
  logs=$(mktemp -d)
  echo "== probe"
  cat "$bundle/MANIFEST"
  echo "running on: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  echo "cuBLASLt: ${cublas_dir:-not found (the GPT example cannot load)}"
  echo "NCCL: ${nccl:-not found (the NCCL checks fail)}"
  echo "cmake: $( (cmake --version 2>/dev/null || echo "not found") | head -1)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: no GPU"
  (command -v nvcc >/dev/null && nvcc --version | tail -1) || echo "nvcc: not found"
  "$python" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPU', torch.cuda.is_available(),
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
    if ((rc == 77)) && [[ $expect == skip ]]; then
      verdict="ok (skip)"
    elif ((rc != 0)); then
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
  # rank_dies COMM: two ranks train (the data over COMM); rank 1 is killed after 20 s; rank 0 must end with an
  # error within 90 s (libzero's timeout is 30 s here: NCCL's socket or the shared memory should tell it sooner).
  rank_dies() {
    local job="gpt-dies-$$-$1" pids=() r rc=0 start
    for r in 0 1; do
      ZERO_TIMEOUT_S=30 NCCL_HOSTID="$job-$r" "$bin/train_gpt_device" "${small[@]}" --steps 1000000 --print-every 100 \
        --world 2 --rank "$r" --job "$job" --comm "$1" &
      pids+=($!)
    done
    sleep 20
    kill -9 "${pids[1]}"
    start=$SECONDS
    while kill -0 "${pids[0]}" 2>/dev/null && ((SECONDS - start < 90)); do sleep 1; done
    if kill -0 "${pids[0]}" 2>/dev/null; then
      kill -9 "${pids[0]}"
      echo "rank 0 still ran $((SECONDS - start)) s after rank 1 was killed"
      return 1
    fi
    wait "${pids[0]}" || rc=$?
    echo "rank 0 ended with status $rc, $((SECONDS - start)) s after rank 1 was killed"
    ((rc != 0))
  }
  # parity N ARGS...: N processes of tests/mpi/parity.c (built without MPI) end with the weights of its
  # single-process reference, bit for bit (every rank count and stage, so N = 1 and N = 2, 3 alike); bf16, three
  # micro-steps per window with partial windows.
  parity() {
    local n=$1
    shift
    timeout -k 10 180 bash "$root/tests/mpi/shm_launch.sh" "$n" -1 "$bin/test_parity_launch" --job @JOB@ --gas 3 \
      --dtype bf16 --partial 1 "$@"
  }
  echo "== parity"
  local n stage
  if ((emulator)); then
    for n in 1 2 3; do check "parity.emulator.n$n.stage3" pass parity "$n" --device emulator --comm shm --stage 3; done
  else
    # Over shared memory (one process: no collective; several: host-staged), and the data over NCCL.
    for n in 1 2 3; do
      for stage in 0 1 2 3; do
        check "parity.n$n.stage$stage" pass parity "$n" --device cuda --comm shm --stage "$stage"
      done
    done
    for n in 2 3; do
      for stage in 0 1 2 3; do
        check "parity.nccl.n$n.stage$stage" pass parity "$n" --device cuda --comm nccl --stage "$stage"
      done
    done
    # ZeRO-Offload at two processes, host-staged and over NCCL: the optimizer on the CPU, and stage 3's param
    # shards too.
    local via
    for via in shm nccl; do
      check "parity.$via.offload.n2.stage2" pass parity 2 --device cuda --comm "$via" --stage 2 --offload optimizer
      check "parity.$via.offload-all.n2.stage3" pass parity 2 --device cuda --comm "$via" --stage 3 --offload all \
        --overlap 1
    done
  fi
  # failing N SCENARIO STAGE ARGS...: tests/mpi/failures.c (built without MPI): the last rank fails at a point of
  # SCENARIO; it gets its own error and every other rank ZERO_ERR_REMOTE naming it within seconds (or, stalled, a
  # timeout naming the collective), whichever call waits. fail-in-group and fail-in-flight run at stage 2, stall at
  # stage 1, whatever STAGE says. Each run (parity's too) is bounded: a rank stuck on the GPU ends the run, not the
  # check.
  failing() {
    local n=$1 scenario=$2 stage=$3
    shift 3
    timeout -k 10 180 bash "$root/tests/mpi/shm_launch.sh" "$n" -1 "$bin/test_failures_launch" --scenario \
      "$scenario" --stage "$stage" --shm-name @JOB@ "$@"
  }
  echo "== one rank failing"
  local case scenario
  if ((emulator)); then
    check failures.emulator.fail-in-group.n2 pass failing 2 fail-in-group 2 --device emulator
  else
    # Before a gather, a bucket, the step; inside a group of reduce-scatters in flight (waited for at once, or later
    # with overlap_comm); stuck past the 2 s timeout: host-staged, and with the data over NCCL.
    for case in fail-at:gather:3 fail-at:bucket:2 fail-at:step:2 fail-in-group:2 fail-in-flight:2 stall:1; do
      scenario=${case%:*}
      check "failures.${scenario/:/.}.n2" pass failing 2 "$scenario" "${case##*:}" --device cuda
      check "failures.nccl.${scenario/:/.}.n2" pass failing 2 "$scenario" "${case##*:}" --device cuda --nccl 1
    done
    check failures.nccl.fail-in-group.n3 pass failing 3 fail-in-group 2 --device cuda --nccl 1
    check failures.nccl.stall.n3 pass failing 3 stall 1 --device cuda --nccl 1
  fi
  local small=(--layers 2 --channels 64 --heads 4 --seq-len 10 --micro-batch 16) launch=$root/examples/gpt/launch_ranks.sh
  if ((emulator)); then
    check gpt.cpu pass "$bin/train_gpt_device" --device cpu "${small[@]}" --compare-stages --compare-steps 3 --digest
    check gpt.cpu.n2 pass bash "$launch" 2 "$bin/train_gpt_device" --device cpu "${small[@]}" --compare-stages \
      --compare-steps 3 --digest
    check gpt.cuda skip "$bin/train_gpt_device" --device cuda --steps 1
  else
    check gpt.stages pass "$bin/train_gpt_device" "${small[@]}" --compare-stages --compare-steps 30 --digest
    check gpt.repeat.1 pass "$bin/train_gpt_device" --steps 60 --bf16 --digest
    check gpt.repeat.2 pass "$bin/train_gpt_device" --steps 60 --bf16 --digest
    check gpt.learns pass "$bin/train_gpt_device" "${small[@]}" --micro-batch 64 --steps 300 --lr 5e-3 \
      --untied-head --print-every 100
    check gpt.larger pass "$bin/train_gpt_device" --layers 12 --channels 768 --heads 12 --seq-len 256 \
      --micro-batch 8 --steps 30 --print-every 10
    # Several processes on the one GPU: data over NCCL, and host-staged over shared memory; bf16 at 3 ranks (the
    # module's block exchange and device sum; fp32 at 2 ranks is NCCL's own reduce-scatter).
    local extra
    for n in 2 3; do
      extra=()
      ((n == 3)) && extra=(--bf16)
      check "gpt.nccl.n$n" pass bash "$launch" "$n" "$bin/train_gpt_device" "${small[@]}" "${extra[@]}" \
        --compare-stages --compare-steps 20 --digest --comm nccl
      check "gpt.staged.n$n" pass bash "$launch" "$n" "$bin/train_gpt_device" "${small[@]}" "${extra[@]}" \
        --compare-stages --compare-steps 20 --digest --comm shm
    done
    # One rank dies (SIGKILL) in the middle of training: the other fails, naming it, instead of waiting forever.
    check gpt.nccl.rank-dies pass rank_dies nccl
    check gpt.staged.rank-dies pass rank_dies shm
  fi
  # libzero.torch: the package built here for --python, then test_torch.py's parity test (every stage, fp32 and
  # bf16: the one-process reference's bits) with the model on the GPU in one process and in two (torchrun; each
  # rank's NCCL_HOSTID its own), host-staged and over NCCL, and the Python GPT example at two over each. On the
  # emulator (no GPU): the same package and launches on the CPU, where --python has torch.
  echo "== libzero.torch"
  local pkg=$logs/python torch_test=$root/bindings/python/tests/test_torch.py
  local -a torchrun=(timeout -k 10 300 "$python" -m torch.distributed.run --standalone --nproc-per-node 2 --no-python
    bash "$logs/per_rank.sh")
  local -a pytest=(timeout -k 10 300 "$python" -m pytest -q -rs -p no:cacheprovider)
  cat >"$logs/per_rank.sh" <<'RANK'
export NCCL_HOSTID="${NCCL_HOSTID:-libzero}-$LOCAL_RANK"
exec "$@"
RANK
  local lacks
  lacks=$("$python" -c '
import importlib.util, os, sysconfig
lacks = [m for m in ("torch", "numpy", "pytest") if importlib.util.find_spec(m) is None]
if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
    lacks.append("Python.h")
print(" ".join(lacks))' 2>/dev/null) || lacks="a working interpreter"
  if [[ -n $lacks ]]; then
    if ((emulator)); then
      rows+=("$(printf "%-34s %-36s" libzero.torch "not run ($python lacks $lacks)")")
    else
      failed+=(libzero.torch)
      rows+=("$(printf "%-34s %-36s" libzero.torch "FAILED ($python lacks $lacks)")")
    fi
  fi
  if [[ -z $lacks ]]; then check python.package pass python_package "$pkg"; fi
  # The launches need the package: where it did not build, that one failure is the report.
  if [[ -z $lacks && ${failed[*]:-} != *python.package* ]]; then
    if ((emulator)); then
      local cpu_case=$torch_test::test_every_stage_and_rank_count_gives_the_one_process_weights[3-bf16]
      check torch.cpu.n1 pass env PYTHONPATH="$pkg" "${pytest[@]}" "$cpu_case"
      check torch.cpu.shm.n2 pass env PYTHONPATH="$pkg" ZERO_TORCH_TRANSPORT=shm "${torchrun[@]}" "${pytest[@]}" \
        "$cpu_case"
    else
      check torch.cuda.n1 pass env PYTHONPATH="$pkg" ZERO_TEST_TORCH_DEVICE=cuda "${pytest[@]}" "$torch_test" -k every_stage
      for via in shm nccl; do
        check "torch.cuda.$via.n2" pass env PYTHONPATH="$pkg" ZERO_TEST_TORCH_DEVICE=cuda ZERO_TORCH_TRANSPORT="$via" \
          NCCL_HOSTID="torch-$$" "${torchrun[@]}" "${pytest[@]}" "$torch_test" -k every_stage
        check "gpt-python.cuda.$via.n2" pass env PYTHONPATH="$pkg" ZERO_TORCH_TRANSPORT="$via" NCCL_HOSTID="gpt-$$" \
          "${torchrun[@]}" "$python" "$root/examples/python/train_gpt.py" --device cuda --stage 3 --steps 300
      done
    fi
  fi
  # The GPT's stages give the same weights, and a run repeats itself (both logs carry the weights' digest).
  gpt_same() {  # gpt_same NAME COUNT LOG...: the logs hold COUNT digests, all the same
    local name=$1 count=$2 all digests
    shift 2
    all=$(cat "$@" 2>/dev/null | awk '/weights digest [0-9a-f]+$/ {print $NF} $1 ~ /^[0-3]$/ && NF == 10 {print $NF}')
    digests=$(sort -u <<<"$all")
    if [[ -n $all && $(wc -l <<<"$all") == "$count" && $(wc -l <<<"$digests") == 1 ]]; then
      rows+=("$(printf "%-34s %-36s %7s" "$name" "ok (one digest: $digests)" "")")
    else
      failed+=("$name")
      rows+=("$(printf "%-34s %-36s" "$name" "FAILED (digests: $(echo "$digests" | tr '\n' ' '))")")
    fi
  }
  if ((emulator)); then
    gpt_same gpt.cpu.stages-agree 4 "$logs/gpt.cpu.log"
    gpt_same gpt.cpu.n2.stages-agree 4 "$logs/gpt.cpu.n2.log"
  else
    gpt_same gpt.stages-agree 4 "$logs/gpt.stages.log"
    gpt_same gpt.run-repeats 2 "$logs/gpt.repeat.1.log" "$logs/gpt.repeat.2.log"
    gpt_same gpt.nccl-is-staged.n2 8 "$logs/gpt.nccl.n2.log" "$logs/gpt.staged.n2.log"
    gpt_same gpt.nccl-is-staged.n3 8 "$logs/gpt.nccl.n3.log" "$logs/gpt.staged.n3.log"
    # It learns the additions' answer digits: from 5.6 to below 1.6. The same recipe on the CPU (--device cpu, its
    # other summation order) ends at a held-out loss of 0.165 with 83.6 % of the answers right, after a plateau
    # near 1.1 that it leaves at an order-dependent step, so the bound asks for learning, not for that step.
    local heldout
    heldout=$(awk '/^held-out loss/ {print $3}' "$logs/gpt.learns.log" 2>/dev/null)
    if [[ -n $heldout ]] && awk -v l="$heldout" 'BEGIN {exit !(l < 1.6)}'; then
      rows+=("$(printf "%-34s %-36s" gpt.learned "ok (held-out loss $heldout < 1.6)")")
    else
      failed+=(gpt.learned)
      rows+=("$(printf "%-34s %-36s" gpt.learned "FAILED (held-out loss ${heldout:-missing})")")
    fi
  fi
  if ((!emulator)); then
    echo "== benchmarks"
    check bench.kernels pass "$bin/bench_gpu_kernels" --sizes 16,64,256 --segments 1,64 --reps "$reps"
    check bench.offload pass "$bin/bench_offload_pipeline" --queue cuda --params 256 --piece 16 --reps 5
    # The NCCL module against NCCL's own calls, two processes on the GPU (bus bandwidth, and the deterministic
    # reduce-scatter's cost).
    check bench.nccl pass bash "$launch" 2 "$bin/bench_nccl" --sizes 4,16,64,256 --reps 10
    # The device engine's whole zero_step against torch's fused AdamW on the same GPU (the machine's torch).
    check bench.step-vs-torch pass python3 "$root/bench/step_vs_torch.py" --lib "$bundle/lib/libzero.so.1" \
      --device cuda --sizes 16,64,256 --reps 5
    cat "$logs/bench.kernels.log" "$logs/bench.offload.log" "$logs/bench.nccl.log" "$logs/bench.step-vs-torch.log" \
      "$logs/gpt.stages.log" \
      "$logs/gpt.learns.log" "$logs/gpt.larger.log" "$logs/gpt.nccl.n2.log" "$logs/gpt.staged.n2.log" \
      "$logs/gpt.nccl.n3.log" "$logs/gpt.staged.n3.log" "$logs/gpt-python.cuda.shm.n2.log" \
      "$logs/gpt-python.cuda.nccl.n2.log" 2>/dev/null || true
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
