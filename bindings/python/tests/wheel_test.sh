#!/usr/bin/env bash
# What a newcomer does (README.md, "Python"): `pip install .` into a fresh venv (pip fetches numpy,
# scikit-build-core and pybind11 from PyPI and builds libzero into the wheel), then the quick start exactly as the
# README prints it, in one process and under mpirun with 2 ranks, from outside the source tree.
# Usage: wheel_test.sh <source dir> <mpirun> <scratch dir>
set -euo pipefail
src=$1 mpirun=$2 work=$3
rm -rf "$work"
mkdir -p "$work"

# The README's quick start is examples/python/quickstart.py, character for character.
/usr/bin/python3 - "$src" <<'PY'
import pathlib, re, sys
src = pathlib.Path(sys.argv[1])
blocks = re.findall(r"```python\n(.*?)```", (src / "README.md").read_text(), re.S)
quick = [b for b in blocks if "libzero.Engine(" in b]
expected = (src / "examples/python/quickstart.py").read_text()
if not quick or quick[0] != expected:
    sys.exit("README.md's Python quick start differs from examples/python/quickstart.py")
PY

/usr/bin/python3 -m venv "$work/venv"
# scikit-build-core builds in a directory of its own choosing, a new temporary one each time: here a fixed one under
# the scratch directory, so that a compiler cache whose base directory holds both the sources and the scratch
# directory (scripts/test.sh) finds the same paths again in the next run; with every core, as the other builds.
mkdir -p "$work/tmp"
TMPDIR="$work/tmp" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  "$work/venv/bin/pip" install --quiet --disable-pip-version-check --config-settings=build-dir="$work/build" \
  "$src"
cp "$src/examples/python/quickstart.py" "$work/"
cd "$work"  # the installed package is what gets imported, not the source tree's
check() {  # every rank converged (mpirun may interleave the ranks' lines: count the reports, not the lines)
  local out=$1 ranks=$2
  echo "$out"
  local reports
  reports=$(grep -o "max |w - w_true| = [0-9.e+-]*" <<<"$out" | sed 's/.*= //')
  [[ $(wc -w <<<"$reports") == "$ranks" ]] || { echo "expected $ranks ranks' reports"; exit 1; }
  for r in $reports; do
    awk -v r="$r" 'BEGIN { exit !(r + 0 <= 1e-3) }' || { echo "the quick start did not converge ($r)"; exit 1; }
  done
}
check "$("$work/venv/bin/python" quickstart.py)" 1
check "$("$mpirun" -np 2 "$work/venv/bin/python" quickstart.py)" 2
