#!/usr/bin/env bash
# mncl-info --topology on the checked-in topologies (through HWLOC_XMLFILE) and on this
# machine: the summary, each decision with its reason, and the binding.
# Usage: check_mncl_info_topology.sh <mncl-info> <folder of the XML files>
set -u
info=$1
dir=$2
# expect / refute, and status
source "$(dirname "$0")/expect_lines.sh"
run() {  # run <description> <env...>: mncl-info --topology under the given environment
  what=$1
  shift
  out=$(env "$@" "$info" --topology 2>&1)
  rc=$?
  echo "=== $what"
  echo "$out"
}

run "this machine"
expect '^  source +this machine$'
expect '^  CPU +.*[0-9]+ cores?, [0-9]+ PUs?'
expect '^  Decision \(MNCL_BACKEND=auto, (host|CUDA) memory\): [a-z]+$'
expect '^    why: auto: '
expect '^  Process binding: MNCL_BIND=auto: '

run "DGX A100" HWLOC_XMLFILE="$dir/dgx_a100.xml"
expect '^  source +XML file .*dgx_a100.xml \(HWLOC_XMLFILE\)$'
expect '^  GPUs +8 NVIDIA$'
expect '^    GPU 0 +0000:07:00.0 .*NUMA node 3'
expect '^  InfiniBand +yes'
expect '^  Decision \(MNCL_BACKEND=auto, CUDA memory\): [a-z]+$'
expect '^    why: auto: CUDA memory, 1 rank on one host -> '
expect '^  Process binding: MNCL_BIND=auto: local rank 0 of 1: near GPU 0 \(0000:07:00.0, NUMA node 3\): CPUs 48-63,176-191$'

run "DGX A100, rank 5 of 8, host memory" HWLOC_XMLFILE="$dir/dgx_a100.xml" MNCL_MEMORY=host \
  MNCL_LOCAL_RANK=5 MNCL_LOCAL_SIZE=8
expect '^  Decision \(MNCL_BACKEND=auto, host memory\): [a-z]+$'
expect '^  Process binding: .*local rank 5 of 8: NUMA node 5 \(CPUs 80-95,208-223\)$'

run "2-socket CPU node" HWLOC_XMLFILE="$dir/cpu_2socket_ib.xml" MNCL_LOCAL_RANK=1 MNCL_LOCAL_SIZE=2
expect '^  GPUs +none'
expect '^    mlx5_0 +InfiniBand \(active\) +0000:18:00.0 +NUMA node 0'
expect '^  Decision \(MNCL_BACKEND=auto, host memory\): [a-z]+$'
expect '^  Process binding: .*NUMA node 1 \(CPUs 16-31,48-63\)$'

run "laptop" HWLOC_XMLFILE="$dir/laptop.xml"
expect '^  CPU +.*1 package, 4 cores, 8 PUs'
expect '^  GPUs +none \(no NVIDIA GPU\)$'
expect '^  InfiniBand +no$'
expect '^  Process binding: .*not bound'

run "laptop, host override" HWLOC_XMLFILE="$dir/laptop.xml" MNCL_BACKEND_HOST=naive
expect '^  Decision \(MNCL_BACKEND=auto, host memory\): naive$'
expect '^    why: auto: MNCL_BACKEND_HOST=naive: naive'

run "HWLOC_XMLFILE that cannot be read" HWLOC_XMLFILE=/nonexistent/mncl-topology.xml
expect 'HWLOC_XMLFILE=/nonexistent/mncl-topology.xml could not be loaded \(hwloc read this machine instead\)'
expect '^  source +this machine$'

run "bad MNCL_BIND" MNCL_BIND=socket
expect "MNCL_BIND='socket' is not none, numa, core or auto"
[ "$rc" -ne 0 ] || { echo "mncl-info accepted MNCL_BIND=socket" >&2; status=1; }
exit $status
