#!/bin/sh
# Kill one rank mid-run, restart the job, and check that every rank resumes at the newest
# iteration all of them hold intact, skipping the dead rank's partial and corrupt files.
#   checkpoint_resume_test.sh MNCL_RUN CHECKPOINT_JOB NP
set -u
RUN=${1:?usage: checkpoint_resume_test.sh MNCL_RUN CHECKPOINT_JOB NP}
JOB=${2:?}
NP=${3:?}
DIE_RANK=$((NP - 1))
TMP=$(mktemp -d "${TMPDIR:-/tmp}/mncl-ckpt-resume-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# 1. Rank NP-1 dies while saving iteration 6: it holds 4 and 5 (and junk for 6); the others
#    saved 6 before noticing, or block in iteration 7 until the launcher stops them.
"$RUN" -n "$NP" --grace 1 --timeout 60 --tag-output -- \
  "$JOB" "$TMP" 20 --die-rank "$DIE_RANK" --die-at 6 >"$TMP/run1.log" 2>&1
rc=$?
[ $rc -ne 0 ] || fail "the first run should fail when rank $DIE_RANK is killed"
[ -f "$TMP/job.$DIE_RANK.6.tmp" ] || fail "no half-written temporary left behind"
ls "$TMP" >"$TMP/files1.txt"

# 2. Restart: everyone resumes at 5, finishes, and the junk is gone.
"$RUN" -n "$NP" --timeout 60 --tag-output -- "$JOB" "$TMP" 10 --expect-resume 5 \
  >"$TMP/run2.log" 2>&1 || fail "the resumed run failed (status $?)"
for r in $(seq 0 $((NP - 1))); do
  grep -q "^\[r$r\] rank $r: resumed at 5$" "$TMP/run2.log" || fail "rank $r did not resume at 5"
  grep -q "^\[r$r\] rank $r: done at 10$" "$TMP/run2.log" || fail "rank $r did not finish"
done
grep -q "skipping .*job.$DIE_RANK.6" "$TMP/run2.log" || fail "the corrupt snapshot was not reported"

# 3. Only the two newest snapshots per rank remain, and no temporaries.
expected=$(for r in $(seq 0 $((NP - 1))); do echo "job.$r.10"; echo "job.$r.9"; done | sort)
actual=$(ls "$TMP" | grep '^job\.' | sort)
[ "$actual" = "$expected" ] || fail "left over: $(echo $actual)"

# 4. A third run resumes at the end and has nothing left to do.
"$RUN" -n "$NP" --timeout 60 -- "$JOB" "$TMP" 10 --expect-resume 10 >"$TMP/run3.log" 2>&1 ||
  fail "the third run did not resume at 10"

if [ $failures -ne 0 ]; then
  echo "--- run 1 (files: $(cat "$TMP/files1.txt" | tr '\n' ' '))"
  cat "$TMP/run1.log"
  echo "--- run 2"
  cat "$TMP/run2.log"
  echo "$failures check(s) failed"
  exit 1
fi
echo "checkpoint resume: all checks passed"
