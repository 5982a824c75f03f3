#!/usr/bin/env bash
# The Python distributions checked as users get them (part of `bash scripts/test.sh`; needs root and the mirrors):
#  1. build-wheels.sh makes the sdist and the manylinux wheels (in a clean Debian 11 chroot);
#  2. auditwheel's tag is the intended one;
#  3. each wheel is installed with pip into a fresh venv in a clean chroot of the Debian release whose Python it is
#     for (3.9: 11, 3.11: 12, 3.13: 13) that has Python and Open MPI's runtime and no compiler or -dev package; the
#     README's quick start runs there alone and on 2 ranks, and on Debian 12 libzero.torch trains with PyPI's torch
#     (the torch venv scripts/test.sh keeps, seen through a .pth file) alone and on 2 ranks;
#  4. the sdist is installed with pip in a clean Debian 12 chroot that has a compiler, CMake, Python and Open MPI's
#     development files only (no nlohmann-json, xxHash or liburing: the sdist's vendor/ and the fallbacks stand in),
#     and the quick start runs alone and on 2 ranks.
# Usage (root): test-python.sh [torch venv, by default ~/.cache/libzero/torchenv]
# Every run in a chroot is bounded (`timeout`): a launch that hangs fails the check instead of holding CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/packaging/chroots.sh"
enter_private_namespace "$@"
torchenv=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/libzero/torchenv}
# Its site-packages is seen by the Debian 12 chroot's Python: it must be a 3.11 venv with torch (scripts/test.sh's).
"$torchenv/bin/python3" -c "import sys, torch; assert sys.version_info[:2] == (3, 11)" 2>/dev/null || {
  echo "test-python.sh: $torchenv is not a Python 3.11 venv with torch (scripts/test.sh makes one)" >&2
  exit 1
}
work=$(mktemp -d /var/tmp/libzero-python.XXXXXX)
trap 'cleanup_roots && rm -rf --one-file-system "$work"' EXIT
plat=manylinux_2_31_x86_64
declare -A suite_of=([39]=bullseye [311]=bookworm [313]=trixie)

bash "$root/packaging/python/build-wheels.sh" "$work/dist"
sdist=$(ls "$work"/dist/*.tar.gz)

# The quick start's report on every rank: the weights it learned within 1e-3 of the true ones.
converged() {
  local log=$1 ranks=$2 reports
  cat "$log"
  reports=$(grep -o "max |w - w_true| = [0-9.e+-]*" "$log" | sed 's/.*= //')
  [[ $(wc -w <<<"$reports") == "$ranks" ]] || { echo "expected $ranks ranks' reports" >&2; return 1; }
  for r in $reports; do
    awk -v r="$r" 'BEGIN { exit !(r + 0 <= 1e-3) }' || { echo "the quick start did not converge ($r)" >&2; return 1; }
  done
}
mpirun="mpirun --allow-run-as-root --oversubscribe -np 2"
bounded="timeout 600"

for wheel in "$work"/dist/*.whl; do
  name=$(basename "$wheel")
  [[ $name == *-$plat.whl ]] || { echo "$name: not tagged $plat" >&2; exit 1; }
  abi=$(sed -E 's/.*-cp([0-9]+)-cp[0-9]+-.*/\1/' <<<"$name")
  suite=${suite_of[$abi]:?"no Debian release for cp$abi"}
  echo "== $name in a clean $suite chroot: Python and Open MPI's runtime, no compiler ($SECONDS s)"
  dir=$work/$suite
  minbase=$(minbase_tarball "$suite")
  new_root "$dir" "$minbase"
  mkdir -p "$dir/dist" "$dir/check"
  cp "$wheel" "$dir/dist/"
  cp "$root/examples/python/quickstart.py" "$root/packaging/python/torch_smoke.py" "$dir/check/"
  in_root "$dir" "apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 python3-venv \
    openmpi-bin ca-certificates >/dev/null" >"$work/$suite-apt.log" 2>&1 || { tail -30 "$work/$suite-apt.log"; exit 1; }
  in_root "$dir" "if command -v cc || command -v c++ || ls /usr/include/*.h >/dev/null 2>&1; then
    echo 'the chroot has a compiler or headers'; exit 1; fi"
  in_root "$dir" "python3 -m venv /venv && $bounded /venv/bin/pip install -q /dist/$name" >"$work/$suite-pip.log" 2>&1 ||
    { tail -30 "$work/$suite-pip.log"; exit 1; }
  in_root "$dir" "cd /check && $bounded /venv/bin/python quickstart.py" >"$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
  converged "$work/one.log" 1
  in_root "$dir" "cd /check && $bounded $mpirun /venv/bin/python quickstart.py" >"$work/two.log" 2>&1 ||
    { cat "$work/two.log"; exit 1; }
  converged "$work/two.log" 2
  if [[ $suite == bookworm ]]; then
    purelib=$("$torchenv/bin/python3" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    bind_into "$dir" "$purelib" /torch-site ro
    in_root "$dir" "echo /torch-site > \$(/venv/bin/python -c \"import sysconfig; print(sysconfig.get_paths()['purelib'])\")/torch.pth
      cd /check && $bounded /venv/bin/python torch_smoke.py && $bounded $mpirun /venv/bin/python torch_smoke.py"
  fi
done

echo "== the sdist in a clean bookworm chroot: a compiler, CMake, Python and Open MPI only ($SECONDS s)"
dir=$work/sdist-root
minbase=$(minbase_tarball bookworm)
new_root "$dir" "$minbase"
mkdir -p "$dir/dist" "$dir/check"
cp "$sdist" "$dir/dist/"
cp "$root/examples/python/quickstart.py" "$dir/check/"
in_root "$dir" "apt-get update -qq && apt-get install -y -qq --no-install-recommends g++ make cmake python3-dev \
  python3-venv libopenmpi-dev openmpi-bin ca-certificates >/dev/null" >"$work/sdist-apt.log" 2>&1 ||
  { tail -30 "$work/sdist-apt.log"; exit 1; }
in_root "$dir" "for header in nlohmann/json.hpp xxhash.h liburing.h; do [[ ! -e /usr/include/\$header ]]; done"
in_root "$dir" "python3 -m venv /venv && CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout 1200 /venv/bin/pip install -q \
  /dist/$(basename "$sdist")" >"$work/sdist-pip.log" 2>&1 || { tail -40 "$work/sdist-pip.log"; exit 1; }
in_root "$dir" "cd /check && $bounded /venv/bin/python quickstart.py" >"$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
converged "$work/one.log" 1
in_root "$dir" "cd /check && $bounded $mpirun /venv/bin/python quickstart.py" >"$work/two.log" 2>&1 || { cat "$work/two.log"; exit 1; }
converged "$work/two.log" 2
echo "python distributions ok ($SECONDS s): $(cd "$work/dist" && ls | tr '\n' ' ')"
