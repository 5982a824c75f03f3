#!/usr/bin/env bash
# The bindings' per-call overhead: gather + grad_ready + release from C, Java and Go on the same 1,000-param engine
# (stage 1, one process: every call local). Runs the three programs in turn `pairs` times and prints the medians and
# each language's cost above C's (goal: below 1 µs per call).
#   bench/bindings/run.sh [BUILD_DIR] [pairs]
set -euo pipefail
build=${1:-build/release}
pairs=${2:-7}
c_prog=$build/bench_bindings_overhead
java_cp=$build/bindings/java/libzero.jar:$build/bindings/java/bench-classes
go_prog=$build/bindings/go/bench_overhead
declare -A all=()
for ((i = 0; i < pairs; ++i)); do
  all[c]+="$("$c_prog" 200 | awk '{print $2}') "
  all[java]+="$(java -cp "$java_cp" Overhead 200 | awk '{print $2}') "
  all[go]+="$("$go_prog" 200 | awk '{print $2}') "
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
c=$(median <<<"${all[c]}")
printf '%-6s %12s %16s\n' language "ns per call" "above C (ns)"
for lang in c java go; do
  m=$(median <<<"${all[$lang]}")
  printf '%-6s %12.1f %16.1f\n' "$lang" "$m" "$(echo "$m - $c" | bc -l)"
done
echo "(medians of $pairs runs, each the median of 200 rounds of 1,000 params x 3 calls)"
