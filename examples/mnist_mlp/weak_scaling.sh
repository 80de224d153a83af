#!/usr/bin/env bash
# Weak scaling of the Fashion-MNIST example: the work per rank stays fixed (--per-rank-batch),
# and efficiency = samples/s at N ranks / (N x samples/s at 1 rank), for each backend, with and
# without double buffering. Throughput comes from the last epoch's training time (the first
# epoch also pays for warm-up), on the slowest rank.
#
#   examples/mnist_mlp/weak_scaling.sh [BUILD_DIR [RANKS [BACKENDS]]]     # defaults: build 2
#       env: EPOCHS (2), PER_RANK_BATCH (64), EXTRA (more mnist_mlp options), RUNTIME_DIR (where
#       mncl-run, libmncl and the plugins come from; BUILD_DIR)
#
# Prints one table row per (backend, double buffering) and writes the raw 'perf' lines to
# $OUT (weak_scaling.tsv). Flat runs under mpirun, the others under mncl-run. The machine's
# load average is printed with the figures: on a shared machine they are noisy.
set -euo pipefail
build=${1:-build}
ranks=${2:-2}
backends=${3:-naive gloo flat}
runtime=${RUNTIME_DIR:-$build}
epochs=${EPOCHS:-2}
per_rank_batch=${PER_RANK_BATCH:-64}
out=${OUT:-weak_scaling.tsv}
export MNCL_PLUGIN_PATH=${MNCL_PLUGIN_PATH:-$runtime/lib/mncl/plugins}
export LD_LIBRARY_PATH=$runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
log=$(mktemp -d "${TMPDIR:-/tmp}/weak-scaling-XXXXXX")
trap 'rm -rf "$log"' EXIT

# run BACKEND NP FLAGS...: the last epoch's perf line.
run() {
  local backend=$1 np=$2
  shift 2
  local args=("$build/bin/mnist_mlp" --epochs "$epochs" --per-rank-batch "$per_rank_batch"
              --test-limit 2000 ${EXTRA:-} "$@")
  if [ "$backend" = flat ]; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MNCL_BACKEND=flat \
      mpirun -np "$np" --oversubscribe --bind-to none -x MNCL_BACKEND -x MNCL_PLUGIN_PATH \
      -x LD_LIBRARY_PATH "${args[@]}" >"$log/run.txt" 2>&1
  else
    "$runtime/bin/mncl-run" -n "$np" --backend "$backend" --timeout 600 -- "${args[@]}" \
      >"$log/run.txt" 2>&1
  fi || { cat "$log/run.txt" >&2; return 1; }
  grep "^perf epoch=$epochs " "$log/run.txt" | tail -1
}
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }

echo "# weak scaling: mnist_mlp, $per_rank_batch samples per rank per step, epoch $epochs of" \
     "$epochs; load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
printf '%-6s %-3s %12s %12s %7s %9s %9s %10s\n' backend db "1-rank s/s" "$ranks-rank s/s" \
  eff step_ms1 step_msN comm_msN
: >"$out"
for backend in $backends; do
  if [ "$backend" = flat ] && ! command -v mpirun >/dev/null; then
    echo "$backend: no mpirun, skipped"
    continue
  fi
  for db in 0 1; do
    flags=()
    [ "$db" = 1 ] && flags=(--double-buffering)
    one=$(run "$backend" 1 "${flags[@]}") || { echo "$backend: 1-rank run failed"; continue; }
    many=$(run "$backend" "$ranks" "${flags[@]}") || { echo "$backend: $ranks-rank run failed"; continue; }
    printf '%s\n%s\n' "$one" "$many" >>"$out"
    s1=$(field samples_per_s "$one")
    sn=$(field samples_per_s "$many")
    eff=$(awk "BEGIN { printf \"%.3f\", $sn / ($ranks * $s1) }")
    printf '%-6s %-3s %12s %12s %7s %9s %9s %10s\n' "$backend" "$db" "$s1" "$sn" "$eff" \
      "$(field step_ms "$one")" "$(field step_ms "$many")" "$(field comm_wait_ms "$many")"
  done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg); raw lines in $out"
