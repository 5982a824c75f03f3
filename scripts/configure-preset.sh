#!/usr/bin/env bash
# Configures a CMake preset: scripts/configure-preset.sh PRESET [cmake arguments...]. A build directory configured
# with another generator than the presets' (Ninja) is removed first, since CMake cannot change a build directory's
# generator in place; a directory with the presets' generator is kept, so builds stay incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=$1
shift
dir=build/$preset
if [[ -f $dir/CMakeCache.txt ]] && ! grep -qx 'CMAKE_GENERATOR:INTERNAL=Ninja' "$dir/CMakeCache.txt"; then
  echo "== $dir was configured with another generator: removing it"
  rm -rf "$dir"
fi
exec cmake --preset "$preset" "$@"
