#!/usr/bin/env bash
# Every test: installs missing Debian packages; builds the release preset with GCC (warnings are errors) and runs
# the whole CTest suite (unit, C API, ABI, install, formatting, multi-process under mpirun), with the CUDA kernels
# compiled where nvcc is installed; builds the asan preset
# and runs the single-process tests under AddressSanitizer + UndefinedBehaviorSanitizer; builds with clang 14 under
# UBSan and runs the suite again, multi-process tests included; runs the fuzzers (libFuzzer, ASan + UBSan) for a
# minute each; builds, lints, installs and consumes the Debian packages (beside the release suite); builds the
# Python sdist and manylinux wheels and installs them in clean chroots; and tests the conda recipe's build scripts.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash scripts/install-deps.sh

# A compiler cache for every build the command makes (ccache's directory, ~/.cache/ccache, is kept between runs):
# a second run on the same machine compiles only what changed. CMake takes the launcher from these variables; the
# paths under the checkout are hashed relative to it, so another clone of the same commit hits the cache too. The
# pip wheel's build, the conda build script and the Debian chroot set their own base directory (they build
# elsewhere).
export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
ccache --zero-stats >/dev/null

# PyTorch (with Hugging Face transformers, for models built from configs, peft for LoRA, and DeepSpeed 0.19.8, run on
# CPU for the comparisons) for libzero.torch's tests, in a venv of its own outside the source tree, kept between runs.
# PyPI's torch wheel with its CUDA libraries is about 5 GB: on a fresh machine it downloads in the background while
# libzero builds. DeepSpeed's source package builds against the installed torch, so it comes second.
torchenv=${ZERO_TORCHENV:-${XDG_CACHE_HOME:-$HOME/.cache}/libzero/torchenv}
torch_log=$(mktemp)
torch_pid=
if ! "$torchenv/bin/python3" -c "import torch, numpy, pytest, transformers, peft, accelerate, deepspeed" 2>/dev/null; then
  echo "== installing torch, transformers, peft, accelerate and DeepSpeed from PyPI into $torchenv (in the background)"
  (if ! "$torchenv/bin/python3" -c "import torch" 2>/dev/null; then
     rm -rf "$torchenv" && mkdir -p "$(dirname "$torchenv")" &&
       /usr/bin/python3 -m venv --system-site-packages "$torchenv"
   fi &&
   "$torchenv/bin/pip" install --quiet --disable-pip-version-check torch numpy transformers peft accelerate &&
   DS_BUILD_OPS=0 "$torchenv/bin/pip" install --quiet --disable-pip-version-check deepspeed==0.19.8) \
    >"$torch_log" 2>&1 &
  torch_pid=$!
fi
wait_for_torch() {
  if [[ -n $torch_pid ]]; then
    wait "$torch_pid" || { echo "installing torch failed:"; cat "$torch_log"; exit 1; }
    torch_pid=
  fi
}

# Python, in a venv outside the source tree, with what PyPI has and Debian 12 lacks: safetensors (the checkpoint
# interoperability test), pybind11 (numpy-2 aware) and ml_dtypes (bf16 views) for the Python binding, whose wheel
# build also needs scikit-build-core. pytest and mpi4py come from Debian.
pyenv=${ZERO_PYENV:-${XDG_CACHE_HOME:-$HOME/.cache}/libzero/pyenv}
if ! "$pyenv/bin/python3" -c "import safetensors, numpy, pybind11, ml_dtypes, scikit_build_core, pytest, mpi4py" 2>/dev/null; then
  rm -rf "$pyenv"
  mkdir -p "$(dirname "$pyenv")"
  /usr/bin/python3 -m venv --system-site-packages "$pyenv"
  "$pyenv/bin/pip" install --quiet --disable-pip-version-check safetensors pybind11 ml_dtypes scikit-build-core
fi

# transformers and accelerate a year older than the newest (released 2025-11-25 and 2025-11-21), for the Trainer.
hfprev=${ZERO_HF_PREVIOUS_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/libzero/hf-previous}
hfprev_transformers=4.57.3
hfprev_accelerate=1.12.0

# The CUDA parts (core/cuda) compile in the release build wherever the toolkit is installed (/usr/local/cuda on the
# development and CI machines); without a GPU their tests report themselves skipped.
cuda=(-DZERO_CUDA=OFF)
if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  cuda=(-DZERO_CUDA=ON)
else
  echo "== nvcc not found: the CUDA parts are not built (install the CUDA toolkit in /usr/local/cuda)"
fi

# Tests run two per core: many are short MPI jobs that wait on process start-up and sockets more than they compute
# (the clang suite took 175 s at -j4 against 270 s at -j2 on this 2-core machine). The tests that keep every core
# busy by themselves (the GPT's learning runs, the wheel build, the multi-rank torch tests) say so with CTest's
# PROCESSORS property (never two of them at once; short tests go on beside them); the long ones carry a COST so they
# start first.
test_jobs=$((2 * jobs))

# CTest starts first the tests it measured as long (Testing/Temporary/CTestCostData.txt, else their COST). A clean
# clone has no measurements, so each suite's are kept under ~/.cache and put back on the next run on this machine:
# without them the ASan suite's longest test (73 s) was started last, behind 80 s of others on two cores.
ctest_costs=${XDG_CACHE_HOME:-$HOME/.cache}/libzero/ctest-costs
run_ctest() {
  local preset=$1
  shift
  local data=build/$preset/Testing/Temporary/CTestCostData.txt rc=0
  mkdir -p "$ctest_costs" "$(dirname "$data")"
  if [[ ! -f $data && -f $ctest_costs/$preset.txt ]]; then cp "$ctest_costs/$preset.txt" "$data"; fi
  ctest --preset "$preset" "$@" || rc=$?
  if [[ -f $data ]]; then cp "$data" "$ctest_costs/$preset.txt"; fi
  return $rc
}

# The Debian packages are built and checked in chroots of their own (packaging/test-debian.sh) beside the release
# build and suite: that phase waits on apt, dpkg and lintian for most of its time (118 s of CPU in 173 s), time the
# suite's tests use. It runs in a session of its own, so that the command, ending early on a failure elsewhere, stops
# all of it (setsid does not fork here, without job control: $! is the session's id); it is waited for before the
# fuzzers, whose minute each must have the cores.
debian_log=$(mktemp)
setsid bash packaging/test-debian.sh >"$debian_log" 2>&1 &
debian_pid=$!
trap 'if [[ -n ${debian_pid:-} ]]; then kill -- "-$debian_pid" 2>/dev/null || true; fi; rm -f "$torch_log" "$debian_log"' EXIT

echo "== release build (GCC) and full test suite"
bash scripts/configure-preset.sh release -DZERO_TEST_PYTHON="$pyenv/bin/python3" -DZERO_BUILD_PYTHON=ON \
  -DZERO_TORCH_PYTHON="$torchenv/bin/python3" -DZERO_HF_PREVIOUS_PYTHON="$hfprev/bin/python3" -DZERO_JAVA=ON \
  -DZERO_GO=ON "${cuda[@]}"
cmake --build --preset release -j "$jobs"
wait_for_torch
# The Trainer's tests also run with the transformers and accelerate of a year before (their private methods move),
# in a venv that sees the torch venv's packages through a .pth file and holds only those two (and their
# dependencies) itself.
if ! "$hfprev/bin/python3" -c "import transformers, accelerate, torch, deepspeed, peft; \
    assert transformers.__version__ == '$hfprev_transformers'" 2>/dev/null; then
  rm -rf "$hfprev"
  /usr/bin/python3 -m venv --system-site-packages "$hfprev"
  "$torchenv/bin/python3" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
    >"$("$hfprev/bin/python3" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/libzero-torchenv.pth"
  # pip warns that the torch venv's newer packages want a newer huggingface-hub: this venv's own copy shadows it.
  "$hfprev/bin/pip" install --quiet --disable-pip-version-check "transformers==$hfprev_transformers" \
    "accelerate==$hfprev_accelerate" >"$torch_log" 2>&1 || { cat "$torch_log"; exit 1; }
fi
run_ctest release -j "$test_jobs"

echo "== ASan + UBSan build, single-process tests"
# The JVM and the Go runtime would need the sanitizer runtime preloaded: the bindings are tested in the other builds.
bash scripts/configure-preset.sh asan -DZERO_TEST_PYTHON="$pyenv/bin/python3" -DZERO_BUILD_PYTHON=OFF -DZERO_JAVA=OFF -DZERO_GO=OFF
cmake --build --preset asan -j "$jobs"
run_ctest asan -j "$jobs"

echo "== clang 14 build with UBSan, full test suite (the 2 GiB unit test, the pip install, the torch, fine-tuning, training-loop and Trainer tests and the GPT's learning on each SIMD path and BLAS kernel set ran in the release suite)"
bash scripts/configure-preset.sh clang -DZERO_TEST_PYTHON="$pyenv/bin/python3" -DZERO_BUILD_PYTHON=ON \
  -DZERO_TORCH_PYTHON="$torchenv/bin/python3" -DZERO_JAVA=ON -DZERO_GO=ON
cmake --build --preset clang -j "$jobs"
run_ctest clang -j "$test_jobs" \
  -E '^mpi\.large_unit\.|^python\.pip-install$|^python\.(torch|finetune|loop|trainer|example)\.|^python\.resolve-auto$|^mpi\.gpt\.learns\.'

echo "== Debian packages (built and checked beside the release suite)"
debian_rc=0
wait "$debian_pid" || debian_rc=$?
debian_pid=
cat "$debian_log"
[[ $debian_rc == 0 ]] || { echo "packaging/test-debian.sh failed ($debian_rc)"; exit 1; }

echo "== Python distributions: the sdist and manylinux wheels, built in a Debian 11 chroot, installed in clean ones"
ZERO_SDIST_PYTHON="$pyenv/bin/python3" bash packaging/python/test-python.sh "$torchenv"

echo "== fuzzers"
bash scripts/run-fuzzers.sh

echo "== conda recipe"
bash packaging/conda/test-conda.sh

echo "== compiler cache"
ccache --show-stats | grep -E "Hits|Misses|Cache size" || true
