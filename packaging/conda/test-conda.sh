#!/usr/bin/env bash
# What can be tested of the conda recipe without conda: the recipe parses as YAML and pins run_exports to the
# SONAME policy, and its build script, run outside conda into a temporary prefix, produces a working install
# (the recipe's own test commands pass, and the consumer program builds against it both ways).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/libzero-conda.XXXXXX)
trap 'rm -rf "$work"' EXIT
# Debian's python3 with python3-yaml (scripts/install-deps.sh installs both).
python=${PYTHON:-/usr/bin/python3}

"$python" - "$root/packaging/conda/recipe.yaml" <<'PY'
import sys, yaml
recipe = yaml.safe_load(open(sys.argv[1]))
assert recipe["package"]["name"] == "libzero", recipe["package"]
assert recipe["build"]["script"] == "build.sh"
pins = recipe["requirements"]["run_exports"]
assert any("pin_subpackage('libzero', upper_bound='x.x')" in p for p in pins), pins
# Every library CMakeLists.txt requires is a host requirement (the examples, which need a BLAS, are not built).
host = recipe["requirements"]["host"]
for needed in ("openmpi", "nlohmann_json", "xxhash", "liburing"):
    assert needed in host, (needed, host)
assert recipe["build"]["skip"] == ["not linux"], recipe["build"]["skip"]
print("recipe.yaml parses; run_exports pinned to the ABI generation's minor version:", pins[0])
PY

mkdir "$work/src" "$work/prefix" "$work/work"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work/src")
# A compiler cache, when the caller set one up (scripts/test.sh), sees the paths relative to the scratch directory.
(cd "$work/work" && CCACHE_BASEDIR="$work" SRC_DIR="$work/src" PREFIX="$work/prefix" CPU_COUNT="$(nproc)" \
   bash "$root/packaging/conda/build.sh" >"$work/build.log" 2>&1) || { tail -40 "$work/build.log"; exit 1; }

# The recipe's tests, with $PREFIX set as conda would.
"$python" - "$root/packaging/conda/recipe.yaml" >"$work/tests.sh" <<'PY'
import sys, yaml
for test in yaml.safe_load(open(sys.argv[1]))["tests"]:
    for line in test["script"]:
        print(line)
PY
(export PREFIX="$work/prefix" PATH="$work/prefix/bin:$PATH"; set -e; source "$work/tests.sh") >/dev/null
bash "$root/tests/consumer/build_and_run.sh" "$work/prefix" "$work/consumer"
echo "conda recipe ok: parses, build.sh installs a working libzero into a prefix"
