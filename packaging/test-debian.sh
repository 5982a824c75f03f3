#!/usr/bin/env bash
# Builds the Debian packages the way a distribution does and checks them the way a user gets them:
#  1. a clean Debian 12 chroot (debootstrap, minbase) gets build-essential and exactly the declared Build-Depends
#     (apt-get build-dep), and dpkg-buildpackage builds the binary packages there, running the package's tests;
#  2. lintian checks them (no errors allowed);
#  3. a second clean chroot installs them with apt (which pulls their declared dependencies) plus a compiler,
#     CMake, pkg-config and mpirun; the consumer program is built with find_package and with pkg-config and run,
#     over a one-rank communicator and over MPI at 2 ranks (the installed MPI module), and the tools run.
# Needs root (chroot, mounts) and the Debian mirror. The minbase root is debootstrapped once and kept as a tarball in
# ~/.cache/libzero (ZERO_DEBIAN_BASE overrides the path, ZERO_DEBIAN_MIRROR the mirror); so is the build root with its
# Build-Depends installed, keyed on debian/control and the minbase tarball (pbuilder's base.tgz: a changed control
# file or a new minbase prepares it anew, and the build still sees exactly the declared Build-Depends). When the
# caller builds with
# ccache (CMAKE_CXX_COMPILER_LAUNCHER=ccache, as scripts/test.sh does), the package build uses the same cache
# directory, bind-mounted, with ccache installed beside build-essential (as pbuilder and sbuild do it): the build
# environment is otherwise only the Build-Depends.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/packaging/chroots.sh"
enter_private_namespace "$@"
suite=bookworm
work=$(mktemp -d /var/tmp/libzero-deb.XXXXXX)
cleanup() {
  if [[ -n ${lintian_pid:-} ]]; then kill "$lintian_pid" 2>/dev/null || true; fi  # still running after a failure
  cleanup_roots && rm -rf --one-file-system "$work"
}
trap cleanup EXIT

# The sources as they are now, taken first: scripts/test.sh runs this beside the release build and suite, whose
# Python tests may write bytecode into the tree while a later copy would walk it.
mkdir -p "$work/source"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work/source")
base=$(minbase_tarball "$suite")

echo "== build in a clean $suite chroot with the declared Build-Depends ($SECONDS s)"
build=$work/build-root
cache_tool=
[[ ${CMAKE_CXX_COMPILER_LAUNCHER:-} == ccache ]] && cache_tool=ccache
# The root with build-essential, the compiler cache's tool and the Build-Depends, from the tarball kept for this
# control file and minbase, or installed now and kept.
key=$( (cat "$root/packaging/debian/control"; echo "$cache_tool"; stat -c '%s %Y' "$base") | sha256sum | cut -c1-16)
prepared=${base%.tar}-builddeps-$key.tar
if [[ -f $prepared ]]; then
  new_root "$build" "$prepared"
  echo "build root with the Build-Depends from $prepared"
else
  new_root "$build" "$base"
  mkdir -p "$build/src/prepare"
  cp -r "$root/packaging/debian" "$build/src/prepare/debian"  # apt-get build-dep reads its control file
  in_root "$build" "apt-get update -qq && apt-get install -y -qq --no-install-recommends build-essential dpkg-dev \
    $cache_tool >/dev/null && cd /src/prepare && apt-get build-dep -y -qq ./ >/dev/null && apt-get clean" \
    >"$work/deps.log" 2>&1 || {
    tail -30 "$work/deps.log"
    exit 1
  }
  rm -rf "$build/src/prepare"
  keep_root "$build" "$prepared"  # replacing an older control file's
  echo "build root with the Build-Depends installed ($SECONDS s), kept in $prepared"
fi
mkdir -p "$build/src"
mv "$work/source" "$build/src/libzero"
cp -r "$build/src/libzero/packaging/debian" "$build/src/libzero/debian"
cache_env=
if [[ -n $cache_tool ]]; then
  cache_dir=${CCACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ccache}
  bind_into "$build" "$cache_dir" /ccache
  cache_env="CCACHE_DIR=/ccache CCACHE_BASEDIR=/src CCACHE_NOHASHDIR=1 CMAKE_C_COMPILER_LAUNCHER=ccache \
    CMAKE_CXX_COMPILER_LAUNCHER=ccache"
fi
in_root "$build" "cd /src/libzero && $cache_env dpkg-buildpackage -us -uc -b -j$(nproc)" >"$work/build.log" 2>&1 || {
  tail -60 "$work/build.log"
  exit 1
}
grep -E "tests passed|Test +#" "$work/build.log" | grep -E "tests passed" || true
in_root "$build" "cd /src/libzero && javac --release 17 -d /src/quickstart-classes \
  -cp obj-*/bindings/java/libzero.jar examples/java/QuickStart.java"
mkdir -p "$work/out"
cp "$build/src"/*.deb "$build/src"/*.changes "$build/src"/*.buildinfo "$work/out/"
ls "$work/out"/*.deb

# lintian reads the packages while the second chroot installs and consumes them (one core each): its report and
# status are collected at the end.
echo "== lintian, in the background ($SECONDS s)"
lintian --fail-on error --info "$work/out"/*.changes >"$work/lintian.log" 2>&1 &
lintian_pid=$!

echo "== install with apt in a second clean chroot, build and run the consumer ($SECONDS s)"
inst=$work/install-root
new_root "$inst" "$base"
mkdir -p "$inst/debs" "$inst/consumer" "$inst/configs"
cp "$work/out"/*.deb "$inst/debs/"
cp "$root/tests/consumer"/* "$inst/consumer/"
cp "$root/examples/configs/zero2_fp32.json" "$inst/configs/"
cp "$root/examples/python/quickstart.py" "$inst/consumer/"
# The Java quick start, compiled in the build chroot against the jar just built (this one gets a JRE only):
# libzero-java must run it with the system's libzero, in one process and over MPI.
mkdir -p "$inst/consumer/java"
cp "$build/src/quickstart-classes"/*.class "$inst/consumer/java/"
in_root "$inst" "apt-get update -qq && apt-get install -y -qq --no-install-recommends /debs/*.deb \
  cmake gcc g++ make pkg-config mpi-default-bin default-jre-headless >/dev/null" >"$work/install.log" 2>&1 || {
  tail -30 "$work/install.log"
  exit 1
}
in_root "$inst" "bash /consumer/build_and_run.sh /usr /tmp/consumer && \
  mpirun --allow-run-as-root --oversubscribe -np 2 /tmp/consumer/cmake/consumer --mpi && \
  zero-config check /configs/zero2_fp32.json --world-size 4 >/dev/null && zero-ckpt --help >/dev/null && \
  java -cp /usr/share/java/libzero.jar:/consumer/java QuickStart && \
  mpirun --allow-run-as-root --oversubscribe -np 2 java -cp /usr/share/java/libzero.jar:/consumer/java QuickStart && \
  cd /tmp && python3 /consumer/quickstart.py && \
  mpirun --allow-run-as-root --oversubscribe -np 2 python3 /consumer/quickstart.py"
if ! wait "$lintian_pid"; then
  cat "$work/lintian.log"
  echo "lintian found errors" >&2
  exit 1
fi
cat "$work/lintian.log"
echo "debian packages ok: built in a clean $suite chroot with their Build-Depends (tests run), lintian clean of" \
  "errors, installed with apt in another, consumed with find_package, pkg-config and over MPI, from Java and Python"
