#!/usr/bin/env bash
# Builds the Debian packages from a copy of the tree (dpkg-buildpackage -us -uc -b), runs lintian on them (no
# errors allowed), installs them, builds and runs the consumer program against the installed packages, runs
# zero-config from zero-tools, and removes the packages again.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/libzero-deb.XXXXXX)
trap 'rm -rf "$work"' EXIT

src="$work/libzero"
mkdir "$src"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$src")
cp -r "$root/packaging/debian" "$src/debian"
(cd "$src" && dpkg-buildpackage -us -uc -b -j"$(nproc)" >"$work/build.log" 2>&1) || {
  tail -50 "$work/build.log"
  exit 1
}
ls "$work"/*.deb

echo "== lintian"
lintian --fail-on error --info "$work"/*.changes

echo "== install the packages and consume them"
dpkg -i "$work"/libzero1_*.deb "$work"/libzero-mpi1_*.deb "$work"/libzero-dev_*.deb "$work"/zero-tools_*.deb >/dev/null
trap 'dpkg -r zero-tools libzero-dev libzero-mpi1 libzero1 >/dev/null || true; rm -rf "$work"' EXIT
bash "$root/tests/consumer/build_and_run.sh" /usr "$work/consumer"
zero-config check "$root/examples/configs/zero2_fp32.json" --world-size 4 >/dev/null
zero-ckpt --help >/dev/null
echo "debian packages ok: built, lintian clean of errors, installed, consumed with find_package and pkg-config"
