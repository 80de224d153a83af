#!/usr/bin/env bash
# The scaling figures in one command: measures weak scaling of the Fashion-MNIST example at 1
# and 2 ranks for each backend with and without double buffering
# (examples/mnist_mlp/weak_scaling.sh), fits each backend's alpha-beta from a 2-rank mncl-perf
# allreduce sweep, compares the model's 2-rank efficiency with the measurement, and projects a
# ResNet-50-sized gradient (~100 MB) to 4 and 8 nodes of 100 Gb/s InfiniBand.
#
#   bench/scaling/check_model.sh [BUILD_DIR [BACKENDS]]    # defaults: build "naive gloo flat"
#       env: RUNTIME_DIR (mncl-run, libmncl and plugins; BUILD_DIR), OUT_DIR (a temp dir)
set -euo pipefail
build=${1:-build}
backends=${2:-naive gloo flat}
runtime=${RUNTIME_DIR:-$build}
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/scaling-check-XXXXXX")}
mkdir -p "$out"
export MNCL_PLUGIN_PATH=${MNCL_PLUGIN_PATH:-$runtime/lib/mncl/plugins}
export LD_LIBRARY_PATH=$runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
scaling="$build/bin/mncl-scaling"

echo "## 1. weak scaling, measured"
OUT="$out/weak_scaling.tsv" RUNTIME_DIR=$runtime \
  "$here/../../examples/mnist_mlp/weak_scaling.sh" "$build" 2 "$backends"

echo
echo "## 2. alpha-beta fits from 2-rank mncl-perf allreduce sweeps (8 B .. 4 MiB)"
perf_args=(-b 8 -e 4M -f 2 -n 20 -w 3 -c 0 -C allreduce --no-membw)
for backend in $backends; do
  if [ "$backend" = flat ]; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MNCL_BACKEND=flat \
      mpirun -np 2 --oversubscribe --bind-to none -x MNCL_BACKEND -x MNCL_PLUGIN_PATH \
      -x LD_LIBRARY_PATH "$build/bin/mncl-perf" --backend flat --baseline none "${perf_args[@]}" \
      --json "$out/$backend.json" >"$out/$backend.perf.txt" 2>&1 || true
  else
    "$runtime/bin/mncl-run" -n 2 --backend "$backend" --timeout 300 -- "$build/bin/mncl-perf" \
      --backend "$backend" --baseline none "${perf_args[@]}" --json "$out/$backend.json" \
      >"$out/$backend.perf.txt" 2>&1 || true
  fi
  [ -s "$out/$backend.json" ] && "$scaling" --perf "$out/$backend.json" | grep '^fit' ||
    echo "$backend: no mncl-perf results (see $out/$backend.perf.txt)"
done

echo
echo "## 3. model vs measurement at 2 ranks. comp1: the 1-rank step time (the model's compute);"
echo "##    comp2: the 2-rank step time less its comm wait (ranks sharing 2 cores run slower);"
echo "##    pred: the alpha-beta model alone; corr: the same model on comp2. err = model - measured"
printf '%-6s %-3s %7s %7s %9s %9s %8s %8s %8s %8s %8s\n' backend db comp1 comp2 pred_comm \
  meas_comm meas_eff pred_eff err_pts corr_eff corr_err
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }
while read -r one && read -r two; do
  backend=$(field backend "$one")
  db=$(field double_buffering "$one")
  [ -s "$out/$backend.json" ] || continue
  eff=$(awk "BEGIN { print $(field samples_per_s "$two") / (2 * $(field samples_per_s "$one")) }")
  check=$("$scaling" --perf "$out/$backend.json" --check-backend "$backend" --check-ranks 2 \
    --compute-ms "$(field step_ms "$one")" --grad-bytes "$(field grad_bytes "$one")" \
    --overlap "$db" --measured-efficiency "$eff" \
    --measured-comm-ms "$(field comm_wait_ms "$two")" \
    --compute-ms-at-p "$(awk "BEGIN { print $(field step_ms "$two") - $(field comm_wait_ms "$two") }")" |
    grep '^check')
  printf '%-6s %-3s %7.3f %7.3f %9.3f %9.3f %8.3f %8.3f %+8.1f %8.3f %+8.1f\n' "$backend" "$db" \
    "$(field compute_ms "$check")" "$(field compute_ms_at_p "$check")" \
    "$(field predicted_comm_ms "$check")" "$(field measured_comm_ms "$check")" \
    "$(field measured_efficiency "$check")" "$(field predicted_efficiency "$check")" \
    "$(field error_points "$check")" "$(field corrected_efficiency "$check")" \
    "$(field corrected_error_points "$check")"
done <"$out/weak_scaling.tsv"

echo
echo "## 4. projection: ResNet-50-sized gradient (25.6 M float32 = 102 MB), 145 ms/step, 100 Gb/s"
echo "##    InfiniBand (ChainerMN reports 3.8x on 4 nodes and 7.2x on 8)"
"$scaling" --workload resnet50 --network ib100 --max-nodes 1024
echo
echo "(load average now: $(cut -d' ' -f1-3 /proc/loadavg); files in $out)"
