#!/usr/bin/env bash
# Builds tests/consumer against an installed libzero both ways — CMake's find_package and pkg-config — and runs
# each result. PREFIX is the install prefix ("/usr" for the Debian packages).
#   build_and_run.sh PREFIX WORKDIR
set -euo pipefail
prefix=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"

cmake -S "$here" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake" >/dev/null
LD_LIBRARY_PATH="$(pkg-config --variable=libdir --with-path="$prefix/lib/pkgconfig" --with-path="$prefix/lib/$(gcc -print-multiarch)/pkgconfig" zero 2>/dev/null || true)" \
  "$work/cmake/consumer"

pc_path="$prefix/lib/pkgconfig:$prefix/lib/$(gcc -print-multiarch)/pkgconfig:$prefix/share/pkgconfig"
cflags=$(PKG_CONFIG_PATH="$pc_path" pkg-config --cflags zero)
libs=$(PKG_CONFIG_PATH="$pc_path" pkg-config --libs zero)
libdir=$(PKG_CONFIG_PATH="$pc_path" pkg-config --variable=libdir zero)
# shellcheck disable=SC2086
cc -std=c99 -Wall -Wextra -Werror $cflags "$here/main.c" -o "$work/consumer_pkgconfig" $libs
LD_LIBRARY_PATH="$libdir" "$work/consumer_pkgconfig"
echo "consumer built and ran with find_package(Zero) and with pkg-config against $prefix"
