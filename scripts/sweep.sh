#!/usr/bin/env bash
# The README's main job: installs what is missing, builds (scripts/setup.sh), then sweeps every
# available backend on 4 local ranks from 8 B to 64 MiB with mncl-perf, printing the tables and
# the paths of the combined JSON, CSV and PNG. Extra arguments go to mncl-perf (e.g. -C all).
#
# Environment: MNCL_BUILD_DIR (default build), MNCL_SWEEP_OUT (default <build>/sweep),
# MNCL_SWEEP_BACKENDS (default naive,flat,gloo,shm; missing or unusable ones, e.g. nccl without
# a GPU, are skipped and listed with their reason). mncl-perf measures host buffers only.
set -euo pipefail
cd "$(dirname "$0")/.."

# The plot needs Debian's python3-matplotlib; without it the sweep still runs, minus the PNG.
if ! dpkg-query -W -f='${Status}' python3-matplotlib 2>/dev/null | grep -q "install ok installed"; then
  echo "sweep: installing python3-matplotlib for the plot" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  { $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive \
      $sudo apt-get install -y -q --no-install-recommends python3-matplotlib; } >&2 ||
    echo "sweep: could not install python3-matplotlib: the results will have no PNG" >&2
fi
# Only what the sweep runs: libmncl, the plugins and the tools (the tests come with test.sh).
MNCL_BUILD_TARGETS=${MNCL_BUILD_TARGETS:-"mncl mncl-plugins mncl-run mncl-info mncl-perf"} \
  bash scripts/setup.sh

build_dir=${MNCL_BUILD_DIR:-build}
out=${MNCL_SWEEP_OUT:-$build_dir/sweep}
# Open MPI refuses root unless told otherwise (containers, CI); harmless for other users.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The budget: under 10 minutes in all on 2 cores. Every size gets at most ~0.25 s per placement
# (fewer than -n iterations for the slow sizes: the tables' iters column), and the naive backend, whose
# data goes through the TCP store, stops at 4 MiB (said so in its table and the summary).
exec "$build_dir/bin/mncl-perf" --backends "${MNCL_SWEEP_BACKENDS:-naive,flat,gloo,shm}" --np 4 \
  -b 8 -e 64M -f 2 -n 20 -w 3 -c 1 -C allreduce --size-budget-ms 250 \
  --cap naive=4M --backend-timeout 200 --out-dir "$out" "$@"
