#!/usr/bin/env bash
# The GPU check for issue 5, for a machine with NVIDIA GPUs, the CUDA toolkit and NCCL:
# builds MNCL with the nccl plugin and runs, within about 5 minutes,
#   0. that MNCL's GPUs are nvidia-smi's (hwloc checked against the NVIDIA driver's list), also
#      with CUDA_VISIBLE_DEVICES given as a UUID prefix;
#   1. the conformance suite on the nccl backend, one rank per GPU (every GPU);
#   2. collectives and batched point to point on CUDA buffers on the nccl backend, one rank
#      per GPU (plain and under CUDA graph capture);
#   3. the staging path (CUDA buffers through naive and gloo) at 2-4 ranks sharing the GPUs;
#   4. a dead peer: an error within MNCL_TIMEOUT, not a hang (needs 2 GPUs);
#   5. the overhead of MNCL-nccl over raw NCCL, 1 rank, 8 B to 1 GiB;
#   6. the CPU-side CUDA tests (fake driver, fake GPU, plugin refusal) from ctest;
#   7. CUDA arrays from Python (tests/python/test_cuda.py): nccl, one rank per GPU, and staging.
# Prints one "CHECK <name>: PASS|FAIL|SKIP (<s> s) <detail>" line per check, logs in
# $BUILD/gpu-logs, and exits non-zero if any check failed.
#
#   tests/gpu/run.sh [build-dir]        (default build-gpu; CUDA_HOME / NCCL_HOME respected)
#
# MNCL_GPU_CHECK_MAX_BYTES (default 1Gi) caps the overhead sweep. tests/gpu/dry_run.sh runs this
# script without a GPU, on the fake GPU of tests/cuda/fake_gpu: a check of its plumbing only.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=$(realpath -m "${1:-build-gpu}")  # absolute: MNCL_PLUGIN_PATH below must be
LOGS=$BUILD/gpu-logs
JOBS=$(nproc)
failed=0

summary() {  # name status seconds detail
  printf 'CHECK %-22s %s (%s s) %s\n' "$1:" "$2" "$3" "$4"
  [ "$2" = FAIL ] && failed=1
  return 0
}

# run_check <name> <timeout s> <success grep pattern or ''> <command...>
run_check() {
  local name=$1 limit=$2 pattern=$3
  shift 3
  local log=$LOGS/$name.log start end rc detail
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  end=$(date +%s)
  detail=$(grep -E "${pattern:-^$}" "$log" | tail -1)
  if [ $rc -eq 0 ]; then
    summary "$name" PASS $((end - start)) "$detail"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    summary "$name" FAIL $((end - start)) "timed out after ${limit} s (log: $log)"
  else
    summary "$name" FAIL $((end - start)) "exit $rc: $(grep -E 'FAIL|error|Error' "$log" | head -1) (log: $log)"
  fi
}

NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "${NGPU:-0}" -eq 0 ]; then
  echo "tests/gpu/run.sh: no NVIDIA GPU visible (nvidia-smi -L); nothing to check here" >&2
  summary gpu SKIP 0 "no NVIDIA GPU"
  exit 0
fi
echo "GPUs: $NGPU ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"

# --- Build ----------------------------------------------------------------------------------
mkdir -p "$BUILD"
start=$(date +%s)
if cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMNCL_WITH_NCCL=ON >"$BUILD/configure.log" 2>&1 &&
   cmake --build "$BUILD" -j"$JOBS" --target mncl mncl-info mncl-run mncl-naive mncl-nccl \
     conformance_test gpu_collectives_test mncl-bench-nccl staging_unit_test staging_spmd_test \
     nccl_plugin_test cuda_device_count create_probe mncl-fake-cuda mncl-fake-gpu \
     $(cmake --build "$BUILD" --target help | grep -qw mncl-gloo && echo mncl-gloo) \
     >"$BUILD/build.log" 2>&1; then
  summary build PASS $(($(date +%s) - start)) "$(grep 'nccl plugin:' "$BUILD/configure.log")"
else
  summary build FAIL $(($(date +%s) - start)) "see $BUILD/configure.log and $BUILD/build.log"
  exit 1
fi
mkdir -p "$LOGS"
BIN=$BUILD/bin
export MNCL_PLUGIN_PATH=$BUILD/lib/mncl/plugins MNCL_TIMEOUT=60
RUN="$BIN/mncl-run --timeout 240 --tag-output"
has_gloo=$([ -f "$MNCL_PLUGIN_PATH/libmncl-gloo.so" ] && echo 1 || echo 0)

# --- 0: MNCL's GPUs are nvidia-smi's, and CUDA_VISIBLE_DEVICES by UUID maps ------------------
# hwloc's view is checked against the NVIDIA driver's list (sdk/topology/gpu_inventory.h).
if [ -d /proc/driver/nvidia/gpus ]; then
  run_check topology-gpus 30 '^GPUs:' env -u CUDA_VISIBLE_DEVICES bash -c '
    set -e
    count() { sed -n "s/^  GPUs *\([0-9]*\) NVIDIA.*/\1/p"; }
    seen=$('"$BIN"'/mncl-info --topology | count)
    uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | tail -1)
    bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | tail -1 | tr A-F a-f)
    one=$(CUDA_VISIBLE_DEVICES=${uuid:0:12} '"$BIN"'/mncl-info --topology)
    first=$(echo "$one" | sed -n "s/^    GPU 0 *\([0-9a-f:.]*\) .*/\1/p")
    echo "GPUs: nvidia-smi '"$NGPU"', mncl-info ${seen:-0}; CUDA_VISIBLE_DEVICES=${uuid:0:12}:" \
      "$(echo "$one" | count) GPU, GPU 0 at ${first:-none} (nvidia-smi: $bus)"
    [ "${seen:-0}" = '"$NGPU"' ] && [ "$(echo "$one" | count)" = 1 ] && [ "${bus: -12}" = "$first" ]'
else
  summary topology-gpus SKIP 0 "no /proc/driver/nvidia/gpus (no NVIDIA kernel driver view here)"
fi

# --- 1-2: the nccl backend, one rank per GPU ------------------------------------------------
run_check nccl-conformance 150 'PASSED|tests ran' \
  env MNCL_BACKEND=nccl $RUN -n "$NGPU" -- "$BIN/conformance_test"
run_check nccl-cuda-buffers 90 'PASSED' \
  env MNCL_BACKEND=nccl $RUN -n "$NGPU" -- "$BIN/gpu_collectives_test"

# --- 3: staging through host backends, ranks sharing the GPUs -------------------------------
backends="naive"
[ "$has_gloo" = 1 ] && backends="naive gloo"
run_check staging 120 'PASSED' bash -c '
  set -e
  for backend in '"$backends"'; do
    for np in 2 3 4; do
      MNCL_BACKEND=$backend '"$RUN"' -n $np -- '"$BIN"'/gpu_collectives_test
      echo "staging $backend np$np: PASSED"
    done
  done'

# --- 4: a dead peer ---------------------------------------------------------------------------
if [ "$NGPU" -ge 2 ]; then
  run_check nccl-dead-peer 60 'dead peer:' \
    env MNCL_BACKEND=nccl MNCL_TIMEOUT=10 MNCL_GPU_TEST_DEAD_PEER=1 MNCL_RUN_GRACE=30 \
    $RUN -n 2 -- "$BIN/gpu_collectives_test"
else
  summary nccl-dead-peer SKIP 0 "needs 2 GPUs (NCCL takes one GPU per rank)"
fi

# --- 5: overhead over raw NCCL --------------------------------------------------------------
run_check nccl-overhead 120 '^(\[r0\] )?overhead:' \
  $RUN -n 1 -- "$BIN/mncl-bench-nccl" --min-bytes 8 --max-bytes "${MNCL_GPU_CHECK_MAX_BYTES:-1Gi}"
sed -n 's/^\[r0\] //p' "$LOGS/nccl-overhead.log" | grep -E '^ *[0-9]+(Ki|Mi|Gi)? ' || true

# --- 6: the CPU-side CUDA tests ----------------------------------------------------------------
run_check cuda-cpu-tests 120 'tests passed' ctest --test-dir "$BUILD" -L cuda -LE 'gpu|python' -j4

# --- 7: CUDA arrays from Python (__cuda_array_interface__), on this GPU -------------------------
# The package straight from the source tree; needs a python3 with NumPy (else SKIP).
py=""
for candidate in /usr/bin/python3 python3; do
  if "$candidate" -c 'import numpy' 2>/dev/null; then py=$candidate; break; fi
done
cudart=$(find "${CUDA_HOME:-/usr/local/cuda}/" -name 'libcudart.so.13*' 2>/dev/null | head -1)
if [ -z "$cudart" ]; then
  summary python-cuda SKIP 0 "no libcudart.so.13 under ${CUDA_HOME:-/usr/local/cuda}"
elif [ -n "$py" ]; then
  cudart_dir=$(dirname "$cudart")
  run_check python-cuda 90 'CUDA arrays on' bash -c '
    set -e
    export PYTHONPATH='"$PWD"'/python:'"$PWD"'/tests/python MNCL_LIBRARY='"$BUILD"'/lib/libmncl.so
    export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}'"$cudart_dir"'
    MNCL_BACKEND=nccl '"$RUN"' -n '"$NGPU"' -- '"$py"' tests/python/test_cuda.py
    MNCL_BACKEND=naive '"$RUN"' -n 2 -- '"$py"' tests/python/test_cuda.py'
else
  summary python-cuda SKIP 0 "no python3 with NumPy here"
fi

exit $failed
