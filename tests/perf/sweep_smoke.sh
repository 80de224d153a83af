#!/usr/bin/env bash
# sweep_smoke.sh MNCL_PERF OUT_DIR BACKENDS: the README's sweep driver on 2 ranks with tiny sizes.
# Passes when every backend that ran checked 0 wrong values, the combined CSV has a row for each,
# and, with mpirun installed, shm ran under it with the raw MPI column (its issue-12 yardstick).
set -u
perf=$1 out=$2 backends=$3
rm -rf "$out"
log=$("$perf" --backends "$backends" --np 2 -b 8 -e 64K -f 8 -n 2 -w 1 -c 1 --no-membw \
  --backend-timeout 120 --out-dir "$out" 2>&1)
rc=$?
echo "$log"
fail() { echo "FAIL: $*" >&2; exit 1; }
[ "$rc" -eq 0 ] || fail "mncl-perf --backends exited with $rc"
IFS=, read -r -a list <<<"$backends"
for b in "${list[@]}"; do
  grep -q "^$b," "$out/sweep.csv" || fail "no $b rows in $out/sweep.csv"
  grep -q "Out of bounds values : 0 OK" "$out/$b.txt" || fail "$b: wrong values (see $out/$b.txt)"
done
if command -v mpirun >/dev/null && [[ ",$backends," == *,shm,* ]]; then
  grep -q "baseline: raw mpi" "$out/shm.txt" || fail "shm ran without the raw MPI baseline"
fi
echo "sweep_smoke: PASS ($backends)"
