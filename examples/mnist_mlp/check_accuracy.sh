#!/usr/bin/env bash
# The accuracy check of the Fashion-MNIST example (issue 7's acceptance figures): trains with the
# default options at 1, 2 and 4 ranks, requires >= 85 % test accuracy from each, and requires
# the 2-rank run (same global batch and seed) to end within 0.5 points of the 1-rank run. Then
# the model-parallel variant on 2 ranks. Takes a few minutes on 2 cores; not part of ctest.
#
#   examples/mnist_mlp/check_accuracy.sh [BUILD_DIR [BACKEND [mnist_mlp options...]]]
set -euo pipefail
build=${1:-build}
backend=${2:-naive}
shift $(($# < 2 ? $# : 2))
run="$build/bin/mncl-run"
export MNCL_PLUGIN_PATH=${MNCL_PLUGIN_PATH:-$build/lib/mncl/plugins}
log=$(mktemp -d "${TMPDIR:-/tmp}/mnist-check-XXXXXX")
trap 'rm -rf "$log"' EXIT

accuracy() { sed -n 's/^final test accuracy \([0-9.]*\).*/\1/p' "$1"; }
# awk does the arithmetic: is "$1" true?
holds() { awk "BEGIN { exit !($1) }"; }
status=0
declare -A acc
for np in 1 2 4; do
  start=$(date +%s)
  "$run" -n "$np" --backend "$backend" --timeout 1200 -- "$build/bin/mnist_mlp" "$@" \
    >"$log/np$np.txt" 2>&1 || { cat "$log/np$np.txt"; exit 1; }
  seconds=$(($(date +%s) - start))
  acc[$np]=$(accuracy "$log/np$np.txt")
  grep '^epoch' "$log/np$np.txt" | sed "s/^/  np$np /"
  printf 'np=%s  final test accuracy %s  wall %s s\n' "$np" "${acc[$np]}" "$seconds"
  if holds "${acc[$np]} < 0.85"; then
    echo "FAIL: $np rank(s) ended below 85 %"
    status=1
  fi
done
gap=$(awk "BEGIN { d = ${acc[2]} - ${acc[1]}; print (d < 0 ? -d : d) }")
printf '2-rank vs 1-rank accuracy gap: %.4f\n' "$gap"
if holds "$gap > 0.005"; then
  echo "FAIL: the 2-rank run is more than 0.5 points from the 1-rank run"
  status=1
fi

"$run" -n 2 --backend "$backend" --timeout 1200 -- "$build/bin/mnist_mlp_model_parallel" \
  >"$log/mp.txt" 2>&1 || { cat "$log/mp.txt"; exit 1; }
grep '^epoch' "$log/mp.txt" | sed 's/^/  model-parallel /'
mp=$(accuracy "$log/mp.txt")
echo "model-parallel (2 ranks): final test accuracy $mp"
if holds "$mp < 0.85"; then
  echo "FAIL: the model-parallel run ended below 85 %"
  status=1
fi
[ $status -eq 0 ] && echo "mnist accuracy check: passed"
exit $status
