#!/bin/sh
# One rank of `mpirun -np 2 sh stale_store_folders.sh CREATE_PROBE`: private store folders of
# this user left by earlier jobs whose rank 0 was killed (/tmp/mncl-<uid>-ompi-<job>, owner
# recorded in .rank0) are removed by the next job's rank 0; a folder whose owner still runs,
# one with no owner yet, and one whose owner is judged from another pid namespace stay.
set -u
. "$(dirname "$0")/rank0_ready.sh"
probe=${1:?usage: stale_store_folders.sh CREATE_PROBE}
base=/tmp/mncl-$(id -u)-ompi-stale-test-$OMPI_MCA_ess_base_jobid
if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then
  boot=$(cat /proc/sys/kernel/random/boot_id)
  ns=$(stat -L -c '%d:%i' /proc/self/ns/pid)
  dead=$(sh -c 'echo $$')  # a process that has ended
  start=$(sed 's/.*) //' /proc/$$/stat | cut -d' ' -f20)  # field 22: this shell's start time
  mkdir -p "$base-dead" "$base-reused" "$base-alive" "$base-unowned" "$base-elsewhere" || exit 1
  echo "$boot $ns $dead 12345" >"$base-dead/.rank0"
  echo "$boot $ns $$ 1" >"$base-reused/.rank0"  # this pid, another process's start time
  echo "$boot $ns $$ $start" >"$base-alive/.rank0"
  echo "$boot 1:1 $dead 12345" >"$base-elsewhere/.rank0"
  rank0_ready "$base.ready"
else
  wait_for_rank0 "$base.ready"
fi
"$probe" --allreduce
rc=$?
if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then
  for gone in dead reused; do
    if [ -e "$base-$gone" ]; then
      echo "FAIL: $base-$gone (owner ended) is still there"
      rc=1
    fi
  done
  for kept in alive unowned elsewhere; do
    if [ ! -d "$base-$kept" ]; then
      echo "FAIL: $base-$kept was removed"
      rc=1
    fi
  done
  [ "$rc" = 0 ] && echo "PASS: the folders of ended owners removed, the others kept"
  rm -rf "$base-dead" "$base-reused" "$base-alive" "$base-unowned" "$base-elsewhere" "$base.ready"
fi
exit $rc
