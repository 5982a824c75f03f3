#!/usr/bin/env bash
# Fails if any C/C++ file of the repository is not formatted with the repository's .clang-format.
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format=${CLANG_FORMAT:-clang-format}
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cpp' '*.hpp' '*.cu' '*.cuh' 2>/dev/null ||
                     find capi core examples tests bench -name '*.[ch]' -o -name '*.[ch]pp')
"$clang_format" --dry-run -Werror "${files[@]}"
echo "clang-format: ${#files[@]} files formatted"
