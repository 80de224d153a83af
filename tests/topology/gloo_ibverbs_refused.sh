#!/usr/bin/env bash
# MNCL_GLOO_TRANSPORT=ibverbs is refused, with the reason (this Gloo's ibverbs transport has no
# unbound buffers, which every MNCL gloo operation uses), wherever a user meets it: mncl-info's
# plugin list and backend choice, the auto rules on an InfiniBand node (gloo passed over, never
# "gloo over ibverbs"), and mncl_comm_create in a 2-rank job with MNCL_BACKEND=gloo. TCP, the
# default, still brings the same job up.
# Usage: gloo_ibverbs_refused.sh <mncl-info> <mncl-run> <create_probe> <folder of the XML files>
set -u
info=$1
run=$2
probe=$3
dir=$4
# expect / refute / check, and status
source "$(dirname "$0")/expect_lines.sh"
why='MNCL_GLOO_TRANSPORT=ibverbs is not supported: .*no unbound buffers, which every MNCL gloo operation uses; use tcp'

check "mncl-info --plugins, ibverbs" env MNCL_GLOO_TRANSPORT=ibverbs "$info" --plugins
expect '^  gloo +loaded '
expect "^ +probe score 0: $why"

check "mncl-info, MNCL_BACKEND=gloo, ibverbs" env MNCL_GLOO_TRANSPORT=ibverbs MNCL_BACKEND=gloo \
  "$info"
expect "gloo: unusable here: $why"

# 8 ranks, 2 per host, on the 2-socket InfiniBand node: the rules pick gloo over TCP, and pass
# it over, with the reason, when ibverbs is asked for. (The store is never contacted.)
ib=(HWLOC_XMLFILE="$dir/cpu_2socket_ib.xml" MNCL_SIZE=8 MNCL_LOCAL_SIZE=2
  MNCL_STORE=file:///nonexistent/mncl-store MNCL_BACKEND=auto)
check "mncl-info --topology, InfiniBand node, 8 ranks" env "${ib[@]}" "$info" --topology
expect '^  Decision \(MNCL_BACKEND=auto, host memory\): gloo$'
expect "gloo over TCP \(IPoIB where the hosts' addresses are on InfiniBand\)"
refute 'ibverbs'
check "mncl-info --topology, InfiniBand node, 8 ranks, ibverbs" env "${ib[@]}" \
  MNCL_GLOO_TRANSPORT=ibverbs "$info" --topology
refute '^  Decision \(MNCL_BACKEND=auto, host memory\): gloo$'
expect "passed over: gloo unusable: $why"

# A real job: every rank's mncl_comm_create fails, naming the reason; tcp works.
check "mncl-run -n 2, MNCL_BACKEND=gloo, ibverbs" env MNCL_BACKEND=gloo MNCL_GLOO_TRANSPORT=ibverbs \
  "$run" -n 2 --timeout 60 --tag-output -- "$probe" --expect MNCL_ERR_PLUGIN \
  --contains "MNCL_GLOO_TRANSPORT=ibverbs is not supported" --contains "no unbound buffers" \
  --max-seconds 30
[ "$rc" -eq 0 ] || { echo "FAIL: '$what' exited $rc" >&2; status=1; }
check "mncl-run -n 2, MNCL_BACKEND=gloo, tcp" env MNCL_BACKEND=gloo MNCL_GLOO_TRANSPORT=tcp \
  "$run" -n 2 --timeout 60 --tag-output -- "$probe" --allreduce
[ "$rc" -eq 0 ] || { echo "FAIL: '$what' exited $rc" >&2; status=1; }

[ "$status" -eq 0 ] && echo PASS || echo FAIL
exit $status
