#!/bin/sh
# Two processes of one host given one local rank (a LOCAL_RANK left in the shell of a launch by
# hand) once shared a core and a GPU. Every rank of the host now warns, naming the variable, and
# takes its order on the host instead: bound to cores 0 and 1, local ranks 0 and 1 of 2.
#   local_rank_collision_test.sh /path/to/mncl-run /path/to/create_probe
set -u
RUN=${1:?usage: local_rank_collision_test.sh MNCL_RUN CREATE_PROBE}
PROBE=${2:?usage: local_rank_collision_test.sh MNCL_RUN CREATE_PROBE}
out=$(MNCL_BIND=core MNCL_DEBUG=info "$RUN" -n 2 --timeout 60 --tag-output -- "$PROBE" \
  --setenv MNCL_LOCAL_RANK=0 --setenv MNCL_LOCAL_SIZE=2 --allreduce 2>&1)
rc=$?
failures=0
check() {
  if printf '%s\n' "$out" | grep -q -- "$2"; then echo "ok: $1"; else
    echo "FAIL: $1 (no line with: $2)"
    failures=$((failures + 1))
  fi
}
[ "$rc" -eq 0 ] || { echo "FAIL: exit status $rc"; failures=$((failures + 1)); }
for r in 0 1; do
  check "rank $r warns" "^\[r$r\] .*local ranks given on host .* collide (ranks 0 and 1 were both given local rank 0, from MNCL_LOCAL_RANK)"
  check "rank $r bound as local rank $r" "^\[r$r\] .*MNCL_BIND=core: local rank $r of 2"
  check "rank $r passes" "^\[r$r\] create_probe rank $r: PASS"
done
[ "$failures" -eq 0 ] || { printf '%s\n' "$out"; exit 1; }
