#!/usr/bin/env bash
# What can be tested of the conda recipe without conda (which PyPI does not have): the recipe parses as YAML, has
# its two outputs, MPI variants and pins, and rattler-build's renderer (its Python package) renders every variant;
# its build scripts, run outside conda into
# temporary prefixes (the openmpi variant, with this machine's Open MPI, and nompi), produce working installs, on
# which the recipe's own test commands pass (the consumer program builds against the library both ways, the Python
# output runs the quick start alone and on 2 ranks).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/libzero-conda.XXXXXX)
trap 'rm -rf "$work"' EXIT
# Debian's python3 with python3-yaml (scripts/install-deps.sh installs both).
python=${PYTHON:-/usr/bin/python3}

"$python" - "$root/packaging/conda/recipe.yaml" "$root/packaging/conda/variants.yaml" <<'PY'
import sys, yaml
recipe, variants = (yaml.safe_load(open(path)) for path in sys.argv[1:3])
outputs = {o["package"]["name"]: o for o in recipe["outputs"]}
assert set(outputs) == {"libzero", "libzero-engine"}, outputs
assert recipe["build"]["skip"] == ["not linux"], recipe["build"]["skip"]
lib, py = outputs["libzero"], outputs["libzero-engine"]
assert lib["build"]["script"]["file"] == "build.sh" and py["build"]["script"] == "build-python.sh"
pins = lib["requirements"]["run_exports"]
assert any("pin_subpackage('libzero', upper_bound='x.x')" in p for p in pins), pins
# Every library CMakeLists.txt requires is a host requirement (the examples, which need a BLAS, are not built); the
# MPI is the variant's, none in nompi.
host = lib["requirements"]["host"]
for needed in ("nlohmann_json", "xxhash", "liburing"):
    assert needed in host, (needed, host)
assert {"if": 'mpi != "nompi"', "then": ["${{ mpi }}"]} in host, host
assert variants["mpi"] == ["nompi", "openmpi", "mpich"], variants
assert "mpi_prefix" in lib["build"]["string"] and "mpi_prefix" in py["build"]["string"]
assert "version_to_buildstring" in py["build"]["string"]
# The Python output builds over the library output and runs with it, exactly that build.
for section in ("host", "run"):
    assert "${{ pin_subpackage('libzero', exact=True) }}" in py["requirements"][section], py["requirements"]
print("recipe.yaml parses: outputs", sorted(outputs), "variants mpi", variants["mpi"], "python", variants["python"])
PY

# rattler-build's renderer (py-rattler-build, from PyPI, in a venv kept under ~/.cache/libzero) renders the recipe
# with its variants as a conda build would.
tools=${XDG_CACHE_HOME:-$HOME/.cache}/libzero/conda-tools
if ! "$tools/bin/python" -c "import rattler_build" 2>/dev/null; then
  rm -rf "$tools"
  /usr/bin/python3 -m venv "$tools"
  "$tools/bin/pip" install -q --disable-pip-version-check py-rattler-build==0.73.0
fi
"$tools/bin/python" "$root/packaging/conda/render_check.py" "$root/packaging/conda/recipe.yaml" \
  "$root/packaging/conda/variants.yaml"

mkdir "$work/src" "$work/work" "$work/work-nompi"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work/src")
# A compiler cache, when the caller set one up (scripts/test.sh), sees the paths relative to the scratch directory.
# build.sh run as conda runs it: the openmpi variant (this machine's MPI) and nompi, each into a prefix of its own.
for variant in openmpi nompi; do
  mkdir -p "$work/prefix-$variant" "$work/work-$variant"
  (cd "$work/work-$variant" && CCACHE_BASEDIR="$work" SRC_DIR="$work/src" PREFIX="$work/prefix-$variant"      CPU_COUNT="$(nproc)" ZERO_CONDA_MPI=$variant bash "$root/packaging/conda/build.sh" >"$work/build.log" 2>&1) ||
    { tail -40 "$work/build.log"; exit 1; }
done

# The recipe's tests of an output and a variant, with $PREFIX set as conda would (the `if: mpi != "nompi"` blocks
# resolved for the variant).
recipe_tests() {
  "$python" - "$root/packaging/conda/recipe.yaml" "$1" "$2" <<'PY'
import sys, yaml
recipe, output, mpi = yaml.safe_load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
def lines(items):
    for item in items:
        if isinstance(item, dict):
            yield from lines(item["then"] if mpi != "nompi" else item.get("else", []))
        else:
            yield item
for o in recipe["outputs"]:
    if o["package"]["name"] == output:
        for test in o["tests"]:
            if "script" in test:
                print("\n".join(lines(test["script"])))
            if "python" in test:
                print("\n".join(f"python -c 'import {m}'" for m in test["python"]["imports"]))
PY
}
for variant in openmpi nompi; do
  recipe_tests libzero "$variant" >"$work/tests.sh"
  (export PREFIX="$work/prefix-$variant" PATH="$work/prefix-$variant/bin:$PATH"; set -e; source "$work/tests.sh") >/dev/null
done
bash "$root/tests/consumer/build_and_run.sh" "$work/prefix-openmpi" "$work/consumer"

# The libzero-engine output: build-python.sh with a Python that has the host requirements (scikit-build-core and
# pybind11 from PyPI, Debian's numpy to run), over the openmpi variant's prefix; then its tests, from the source tree's root as
# rattler-build copies the test files, with that Python first on PATH.
"$python" -m venv --system-site-packages "$work/python-env"
"$work/python-env/bin/pip" install -q --disable-pip-version-check "scikit-build-core>=0.8" "pybind11>=2.10"
(cd "$work/src" && CCACHE_BASEDIR="$work" SRC_DIR="$work/src" PREFIX="$work/prefix-openmpi"    PYTHON="$work/python-env/bin/python" bash "$root/packaging/conda/build-python.sh" >"$work/build-python.log" 2>&1) ||
  { tail -40 "$work/build-python.log"; exit 1; }
[[ ! -e $(ls -d "$work"/python-env/lib/python3*/site-packages/libzero)/libzero.so.1 ]] ||
  { echo "libzero-engine carries a libzero of its own" >&2; exit 1; }
recipe_tests libzero-engine openmpi >"$work/tests.sh"
(cd "$work/src" && export PATH="$work/python-env/bin:$PATH" OMPI_ALLOW_RUN_AS_ROOT=1 \
   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 && set -e && source "$work/tests.sh") >"$work/python-tests.log" 2>&1 ||
  { cat "$work/python-tests.log"; exit 1; }
[[ $(grep -o "max |w - w_true|" "$work/python-tests.log" | wc -l) == 3 ]] || { cat "$work/python-tests.log"; exit 1; }
echo "conda recipe ok: parses; build.sh (openmpi and nompi) and build-python.sh install working outputs; their tests pass"
