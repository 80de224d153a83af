#!/bin/sh
# fault.multihost: two Linux network namespaces joined by a veth pair act as two hosts (each
# with its own host name through a UTS namespace). A 4-rank job across them (ranks 0, 2 on
# host A, 1, 3 on host B) runs the conformance suite on each backend given; then an allreduce
# loop across them has its link cut (ip link set down) and every rank must fail within
# MNCL_TIMEOUT + 1 s. Needs root and iproute2; prints SKIP with the reason otherwise.
#
# usage: netns_test.sh <bin dir> <backend>...
set -u
bin=$1
shift
tag=$(( $$ % 10000 ))
A=mA$tag B=mB$tag
say() { echo "fault.multihost $1 $2 $3"; }
skip() { for b in "$@"; do say "$b" SKIP "$reason"; done; exit 0; }

reason=""
if [ "$(id -u)" -ne 0 ]; then reason="not root: network namespaces need CAP_SYS_ADMIN"
elif ! command -v ip >/dev/null; then reason="iproute2 (ip) is not installed"
elif ! command -v unshare >/dev/null; then reason="unshare (util-linux) is not installed"
elif ! ip netns add "$A" 2>/dev/null; then reason="ip netns add failed (no namespace support here)"
fi
[ -n "$reason" ] && skip "$@"

cleanup() { ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; }
trap cleanup EXIT INT TERM
if ! ip netns add "$B" || ! ip link add "veth-$A" type veth peer name "veth-$B" ||
   ! ip link set "veth-$A" netns "$A" || ! ip link set "veth-$B" netns "$B"; then
  reason="cannot create the veth pair between the namespaces"
  skip "$@"
fi
net=10.201.$(( tag % 250 ))
ip -n "$A" addr add "$net.1/24" dev "veth-$A"
ip -n "$B" addr add "$net.2/24" dev "veth-$B"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "veth-$A" up
ip -n "$B" link set "veth-$B" up

port=$(( 20000 + tag ))
status=0
for backend in "$@"; do
  # The conformance suite, 4 ranks over 2 hosts.
  start=$(date +%s)
  pids=""
  for r in 0 1 2 3; do
    if [ $((r % 2)) -eq 0 ]; then ns=$A; else ns=$B; fi
    ip netns exec "$ns" unshare --uts sh -c 'hostname "mncl-$1"; shift; exec "$@"' sh "$ns" \
      env MNCL_RANK=$r MNCL_SIZE=4 MNCL_LOCAL_RANK=$((r / 2)) MNCL_LOCAL_SIZE=2 \
          MNCL_STORE="tcp://$net.1:$port" MNCL_BACKEND="$backend" MNCL_GLOO_IFACE="veth-$ns" \
          MNCL_TIMEOUT=30 "$bin/conformance_test" >"/tmp/mncl-netns-$tag.$r.log" 2>&1 &
    pids="$pids $!"
  done
  ok=1
  for p in $pids; do wait "$p" || ok=0; done
  took=$(( $(date +%s) - start ))
  if [ $ok -eq 1 ]; then
    passed=$(grep -c '^\[       OK \]' "/tmp/mncl-netns-$tag.0.log")
    say "$backend" PASS "conformance over 2 hosts (netns + veth), 4 ranks: $passed tests passed on rank 0 in ${took} s"
  else
    say "$backend" FAIL "conformance over 2 hosts failed (logs: /tmp/mncl-netns-$tag.*.log)"
    tail -30 "/tmp/mncl-netns-$tag.0.log"
    status=1
  fi
  port=$((port + 1))
  # Cutting the link mid-run: every rank fails within the timeout (+1 s).
  "$bin/fault_test" link_cut --backend "$backend" --ranks 4 --timeout 3 \
      --netns "$A,$B" --hosts "$net.1,$net.2" \
      --cut "ip -n $A link set veth-$A down" || status=1
  ip -n "$A" link set "veth-$A" up
  [ $status -eq 0 ] && rm -f /tmp/mncl-netns-$tag.*.log
done
exit $status
