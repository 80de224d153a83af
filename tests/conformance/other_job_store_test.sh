#!/bin/sh
# A rank of another job on this job's store address (two jobs given one port, or a stale rank of
# an earlier job) once joined the job silently: job B's rank 1 ran job A's collectives with job
# A's rank 0, and A's own rank 1 was then refused as "another process's". Without
# MNCL_STORE_TOKEN, the ranks present the launcher's job id (here Slurm's job and step), so B's
# rank is refused at once and A comes up whole.
#   other_job_store_test.sh /path/to/create_probe
set -u
PROBE=${1:?usage: other_job_store_test.sh CREATE_PROBE}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/mncl-other-job-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
unset MNCL_RANK MNCL_SIZE MNCL_STORE_TOKEN MNCL_LOCAL_RANK MNCL_LOCAL_SIZE RANK WORLD_SIZE
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

env SLURM_JOB_ID=100 SLURM_STEP_ID=0 SLURM_PROCID=0 SLURM_NTASKS=2 MNCL_TIMEOUT=30 \
  MNCL_STORE="tcp://127.0.0.1:$port" "$PROBE" --allreduce >"$TMP/a0" 2>&1 &
a0=$!
sleep 1
# Job B's rank 1 on job A's store: refused, naming the token and the likely cause.
env SLURM_JOB_ID=200 SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_NTASKS=2 MNCL_TIMEOUT=30 \
  MNCL_STORE="tcp://127.0.0.1:$port" "$PROBE" --expect MNCL_ERR_BOOTSTRAP \
  --contains "refused this rank's token" --contains "another job's store" --max-seconds 20 \
  >"$TMP/b1" 2>&1 || fail "job B's rank 1 was not refused: $(cat "$TMP/b1")"
# Job A's own rank 1 then joins, and A's allreduce is exact.
env SLURM_JOB_ID=100 SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_NTASKS=2 MNCL_TIMEOUT=30 \
  MNCL_STORE="tcp://127.0.0.1:$port" "$PROBE" --allreduce >"$TMP/a1" 2>&1 ||
  fail "job A's rank 1: $(cat "$TMP/a1")"
wait $a0 || fail "job A's rank 0: $(cat "$TMP/a0")"
[ "$failures" -eq 0 ] && echo "ok: another job's rank refused, the job whole"
[ "$failures" -eq 0 ]
