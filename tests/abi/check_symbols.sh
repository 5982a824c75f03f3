#!/usr/bin/env bash
# The three lists of the ABI must agree: the functions zero.h declares, capi/exports.txt (with each symbol's
# version node), and what libzero.so exports. Nothing else may be exported (no C++, nlohmann-json or MPI
# symbol), the SONAME must be libzero.so.1, and libzero.so must not depend on MPI (the MPI module does, and
# exports exactly its one entry point).
#   check_symbols.sh LIBZERO LIBZERO_MPI
set -euo pipefail
lib=$1
mpi_module=$2
root=$(cd "$(dirname "$0")/../.." && pwd)

soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
if [[ "$soname" != "libzero.so.1" ]]; then
  echo "SONAME is '$soname', expected libzero.so.1"
  exit 1
fi
if readelf -d "$lib" | grep NEEDED | grep -i -q mpi; then
  echo "libzero.so depends on MPI:"; readelf -d "$lib" | grep NEEDED; exit 1
fi
module_soname=$(objdump -p "$mpi_module" | awk '/SONAME/ {print $2}')
module_exports=$(nm -D --defined-only "$mpi_module" | awk '{print $3}' | tr '\n' ' ')
if [[ "$module_soname" != "libzero-mpi.so.1" || "$module_exports" != "ZERO_MPI_0.3 zero_mpi_backend_open@@ZERO_MPI_0.3 " ]]; then
  echo "the MPI module: SONAME '$module_soname', exports: $module_exports"
  exit 1
fi

declared=$(cat "$root/capi/include/zero/zero.h" "$root/capi/include/zero/zero_backend.h" |
           grep -o -E 'ZERO_API (const )?[a-z0-9_]+\*? \**[a-z0-9_]+\(' |
           sed -E 's/.*[ *]([a-z0-9_]+)\($/\1/' | sort)
listed=$(grep -E '^ZERO_[0-9A-Z.]+ ' "$root/capi/exports.txt" | awk '{print $2 "@@" $1}' | sort)
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v -E '^ZERO_[0-9A-Z.]+$' | sort)

status=0
if ! diff <(echo "$declared") <(echo "$listed" | sed 's/@@.*//') >/tmp/zero_abi_diff.$$; then
  echo "zero.h and zero_backend.h (<) and capi/exports.txt (>) disagree:"; cat /tmp/zero_abi_diff.$$; status=1
fi
if ! diff <(echo "$listed") <(echo "$exported") >/tmp/zero_abi_diff.$$; then
  echo "capi/exports.txt (<) and the symbols $lib exports (>) disagree:"; cat /tmp/zero_abi_diff.$$; status=1
fi
debian=$(grep -E '^ zero_' "$root/packaging/debian/libzero1.symbols" | awk '{split($1, a, "@"); print a[1] "@@" a[2]}' | sort)
if ! diff <(echo "$listed") <(echo "$debian") >/tmp/zero_abi_diff.$$; then
  echo "capi/exports.txt (<) and packaging/debian/libzero1.symbols (>) disagree:"; cat /tmp/zero_abi_diff.$$; status=1
fi
rm -f /tmp/zero_abi_diff.$$
if [[ $status -eq 0 ]]; then
  echo "symbols ok: $(echo "$listed" | wc -l) functions declared, listed and exported with their version nodes;" \
       "SONAME $soname; nothing else exported; no MPI dependency; the MPI module exports its one entry point"
fi
exit $status
