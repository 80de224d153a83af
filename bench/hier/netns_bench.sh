#!/bin/sh
# The hierarchical allreduce where it is meant to pay: two "hosts" joined by a network link of
# limited bandwidth. Two Linux network namespaces (each with its own host name through a UTS
# namespace) are joined by a veth pair whose rate tc caps (a token bucket, RATE each way);
# ranks 0-1 run on host A and 2-3 on host B. The world's allreduce (gloo over the
# link, by default) and HierarchicalCommunicator's two algorithms (shm inside each host, the
# world's backend across) then run side by side in one mncl-hier-bench run.
#
# usage: [RATE=1gbit] [BACKEND=gloo] bench/hier/netns_bench.sh [build dir]
#                                                  [-- mncl-hier-bench options]
# Needs root, iproute2 (ip, tc) and util-linux (unshare). Prints the benchmark's table.
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
rate=${RATE:-1gbit} backend=${BACKEND:-gloo}
bench=$build/bin/mncl-hier-bench
[ -x "$bench" ] || { echo "netns_bench: $bench not built" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "netns_bench: needs root (network namespaces)" >&2; exit 2; }
for tool in ip tc unshare; do
  command -v $tool >/dev/null || { echo "netns_bench: $tool is not installed" >&2; exit 2; }
done

tag=$(( $$ % 10000 ))
A=hA$tag B=hB$tag
cleanup() { ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true; }
trap cleanup EXIT INT TERM
ip netns add "$A"
ip netns add "$B"
ip link add "veth-$A" type veth peer name "veth-$B"
ip link set "veth-$A" netns "$A"
ip link set "veth-$B" netns "$B"
net=10.202.$(( tag % 250 ))
ip -n "$A" addr add "$net.1/24" dev "veth-$A"
ip -n "$B" addr add "$net.2/24" dev "veth-$B"
for ns in "$A" "$B"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "veth-$ns" up
  # The link's rate, each direction: a token bucket on each end's egress.
  tc -n "$ns" qdisc add dev "veth-$ns" root tbf rate "$rate" burst 256kb latency 100ms
done
echo "netns_bench: 2 hosts x 2 ranks, link $rate each way, world backend" \
     "$backend, hosts' own backend auto (shm)"

plugins=$(cd "$build/lib/mncl/plugins" && pwd)
port=$(( 21000 + tag ))
logs=$(mktemp -d)
pids=""
for r in 0 1 2 3; do
  if [ "$r" -lt 2 ]; then ns=$A; else ns=$B; fi
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$1"; shift; exec "$@"' sh "$ns" \
    env MNCL_RANK=$r MNCL_SIZE=4 MNCL_LOCAL_RANK=$((r % 2)) MNCL_LOCAL_SIZE=2 \
        MNCL_STORE="tcp://$net.1:$port" MNCL_BACKEND="$backend" MNCL_GLOO_IFACE="veth-$ns" \
        MNCL_PLUGIN_PATH="$plugins" MNCL_MEMORY=host MNCL_TIMEOUT=120 \
        "$bench" "$@" >"$logs/$r.log" 2>&1 &
  pids="$pids $!"
done
status=0
for p in $pids; do wait "$p" || status=1; done
cat "$logs/0.log"
if [ $status -ne 0 ]; then
  for r in 1 2 3; do echo "--- rank $r"; tail -20 "$logs/$r.log"; done
fi
rm -rf "$logs"
exit $status
