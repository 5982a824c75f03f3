#!/usr/bin/env bash
# The Python sdist (pyproject.toml at the checkout's root): the tree the binding builds, plus vendor/ with the two
# header-only libraries libzero compiles with (nlohmann/json and xxHash, from this machine's Debian packages, with
# their copyright files), so that a machine with only a compiler, CMake and Python builds it.
# Usage: make-sdist.sh <output dir> [python with scikit-build-core, else ZERO_SDIST_PYTHON, else a venv made here]
# (prints the sdist's path)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$1 python=${2:-${ZERO_SDIST_PYTHON:-python3}}
for needed in /usr/include/nlohmann/json.hpp /usr/include/xxhash.h; do
  [[ -e $needed ]] || { echo "make-sdist.sh: $needed is missing (scripts/install-deps.sh)" >&2; exit 1; }
done
work=$(mktemp -d /tmp/libzero-sdist.XXXXXX)
trap 'rm -rf "$work"' EXIT
# scikit-build-core writes the sdist: from the given Python, or a venv made for it here (Debian's Python has none).
if ! "$python" -c "import scikit_build_core" 2>/dev/null; then
  "$python" -m venv "$work/.venv" >&2
  "$work/.venv/bin/pip" install -q --disable-pip-version-check "scikit-build-core>=0.10" >&2
  python=$work/.venv/bin/python
fi
# The committed files as they are now (and new ones git does not ignore), never the checkout's build trees.
mkdir "$work/tree"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work/tree")
mkdir -p "$work/tree/vendor/include" "$work/tree/vendor/licenses"
cp -r /usr/include/nlohmann "$work/tree/vendor/include/"
cp /usr/include/xxhash.h "$work/tree/vendor/include/"
cp /usr/share/doc/nlohmann-json3-dev/copyright "$work/tree/vendor/licenses/nlohmann-json.copyright"
cp /usr/share/doc/libxxhash-dev/copyright "$work/tree/vendor/licenses/xxhash.copyright"
mkdir -p "$out"
out=$(cd "$out" && pwd)
(cd "$work/tree" && "$python" -c "import sys; from scikit_build_core.build import build_sdist; print(build_sdist(sys.argv[1]))" \
  "$out") | tail -1 | sed "s|^|$out/|"
