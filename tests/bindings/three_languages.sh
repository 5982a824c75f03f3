#!/usr/bin/env bash
# The same training run in C, Java and Go (examples/demo/train_demo.c, examples/java/TrainDemo.java,
# examples/go/train_demo): at every ZeRO stage on 2 ranks, the three programs' final weights must be the same bits
# (their FNV-1a checksums over every param's bytes are compared).
#   three_languages.sh MPIRUN C_DEMO "JAVA [JVM OPTIONS...]" JAVA_CLASSPATH GO_DEMO
set -euo pipefail
mpirun=$1 c_demo=$2 classpath=$4 go_demo=$5
IFS=';' read -r -a java <<<"$3" # a CMake list: the java command and its options
args=(--steps 30 --hidden 48)
status=0
for stage in 0 1 2 3; do
  sums=()
  for lang in C Java Go; do
    case $lang in
      C) cmd=("$c_demo") ;;
      Java) cmd=("${java[@]}" -cp "$classpath" TrainDemo) ;;
      Go) cmd=("$go_demo") ;;
    esac
    out=$("$mpirun" -np 2 "${cmd[@]}" --stage "$stage" "${args[@]}" 2>&1) || {
      echo "$lang at stage $stage failed:"
      echo "$out"
      exit 1
    }
    sum=$(grep -o 'final weights checksum [0-9a-f]*' <<<"$out" | awk '{print $4}')
    if [[ -z $sum ]]; then
      echo "$lang at stage $stage printed no checksum:"
      echo "$out"
      exit 1
    fi
    sums+=("$sum")
  done
  echo "stage $stage: C ${sums[0]}  Java ${sums[1]}  Go ${sums[2]}"
  if [[ ${sums[0]} != "${sums[1]}" || ${sums[0]} != "${sums[2]}" ]]; then
    echo "  the final weights differ between languages"
    status=1
  fi
done
exit $status
