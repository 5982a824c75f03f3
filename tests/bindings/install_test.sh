#!/usr/bin/env bash
# The bindings as installed by `cmake --install`, used the way docs/bindings.md tells a newcomer: the jar from
# <prefix>/share/java with nothing else on the class path, and the Go module from <prefix>/share/gocode/src/libzero
# in a program of one's own (go.mod replace, cgo through the installed zero.pc), outside the source and build trees.
#   install_test.sh BUILD_DIR SOURCE_DIR WORK_DIR "JAVA [OPTIONS]" GO
set -euo pipefail
build=$1 src=$2 work=$3 go=$5
IFS=';' read -r -a java <<<"$4"
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name 'libzero.so.1' | head -1)")

echo "== Java: the installed jar"
"${java[@]}" -cp "$prefix/share/java/libzero.jar" "$src/examples/java/QuickStart.java"

echo "== Go: a program of one's own against the installed module"
app=$work/app
mkdir -p "$app"
cp "$src/examples/go/quickstart/main.go" "$app/"
cat >"$app/go.mod" <<GOMOD
module example.com/app

go 1.19

require libzero v0.0.0

replace libzero => $prefix/share/gocode/src/libzero
GOMOD
(cd "$app" && env PKG_CONFIG_PATH="$libdir/pkgconfig" GOCACHE="$work/gocache" GOPATH="$work/gopath" GOPROXY=off \
  GOFLAGS=-mod=mod "$go" build -o app .)
# A prefix outside the linker's search path: the installed zero.pc carries no run path (as for any library).
LD_LIBRARY_PATH="$libdir" "$app/app"
