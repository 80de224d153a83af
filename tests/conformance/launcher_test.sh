#!/bin/sh
# Behaviour of mncl-run itself, with plain shell commands as ranks (no MNCL involved):
# environment, tagged output, exit-status propagation, killing the rest, timeout, file store.
#   launcher_test.sh /path/to/mncl-run
set -u
RUN=${1:?usage: launcher_test.sh MNCL_RUN}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/mncl-run-test-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
# expect_rc WANT GOT WHAT
expect_rc() {
  if [ "$2" -ne "$1" ]; then fail "$3: exit status $2, want $1"; else echo "ok: $3"; fi
}
now() { date +%s; }

# 1. Every rank sees its own rank, the size, and one store address; output is tagged.
"$RUN" -n 3 --tag-output -- sh -c \
  'echo "env $MNCL_RANK $MNCL_SIZE $MNCL_LOCAL_RANK $MNCL_LOCAL_SIZE $MNCL_STORE"' \
  >"$TMP/out" 2>&1
expect_rc 0 $? "three ranks exiting 0"
for r in 0 1 2; do
  grep -q "^\[r$r\] env $r 3 $r 3 tcp://127.0.0.1:[0-9][0-9]*$" "$TMP/out" ||
    fail "rank $r: missing or wrong tagged line in: $(cat "$TMP/out")"
done
[ "$(sed 's/.* //' "$TMP/out" | sort -u | wc -l)" -eq 1 ] || fail "ranks saw different stores"

# 1b. A TCP store gets a fresh secret, the same on every rank (anyone on the host can reach
# 127.0.0.1); a caller's MNCL_STORE_TOKEN is kept.
"$RUN" -n 2 -- sh -c 'echo "$MNCL_STORE_TOKEN"' >"$TMP/tokens" 2>&1
expect_rc 0 $? "store token"
[ "$(sort -u "$TMP/tokens" | wc -l)" -eq 1 ] && grep -qE '^[0-9a-f]{32}$' "$TMP/tokens" ||
  fail "ranks' store tokens: $(cat "$TMP/tokens")"
out=$(MNCL_STORE_TOKEN=mine "$RUN" -n 1 -- sh -c 'echo $MNCL_STORE_TOKEN')
[ "$out" = mine ] || fail "MNCL_STORE_TOKEN not inherited: '$out'"

# 2. --backend sets MNCL_BACKEND; without it the caller's value is inherited.
out=$(MNCL_BACKEND=inherited "$RUN" -n 1 -- sh -c 'echo $MNCL_BACKEND')
[ "$out" = inherited ] || fail "MNCL_BACKEND not inherited: '$out'"
out=$(MNCL_BACKEND=inherited "$RUN" -n 1 --backend naive -- sh -c 'echo $MNCL_BACKEND')
[ "$out" = naive ] || fail "--backend not applied: '$out'"

# 2b. --ranks-per-host: ranks 0-1 pose as one host, 2 as another (hosts of 2 and 1); without
# it the caller's MNCL_HOSTID is inherited.
MNCL_HOSTID=inherited "$RUN" -n 3 --ranks-per-host 2 --tag-output -- sh -c \
  'echo "host $MNCL_RANK $MNCL_LOCAL_RANK $MNCL_LOCAL_SIZE $MNCL_HOSTID"' >"$TMP/hosts" 2>&1
expect_rc 0 $? "--ranks-per-host 2 with three ranks"
for want in "0 0 2 .*~0" "1 1 2 .*~0" "2 0 1 .*~1"; do
  r=${want%% *}
  grep -q "^\[r$r\] host $want\$" "$TMP/hosts" || fail "rank $r: want 'host $want' in: $(cat "$TMP/hosts")"
done
# 2c. torchrun's names for the same numbers (scripts read LOCAL_RANK to pick a GPU), replacing
# any left in the caller's shell; GROUP_RANK is the host's index.
RANK=9 WORLD_SIZE=9 LOCAL_RANK=9 "$RUN" -n 3 --ranks-per-host 2 --tag-output -- sh -c \
  'echo "torchrun $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK"' >"$TMP/torchrun" 2>&1
expect_rc 0 $? "torchrun's variables"
for want in "0 3 0 2 0" "1 3 1 2 0" "2 3 0 1 1"; do
  r=${want%% *}
  grep -q "^\[r$r\] torchrun $want\$" "$TMP/torchrun" ||
    fail "rank $r: want 'torchrun $want' in: $(cat "$TMP/torchrun")"
done
out=$("$RUN" -n 2 --tag-output -- sh -c 'echo "$LOCAL_RANK/$LOCAL_WORLD_SIZE/$GROUP_RANK"' | sort)
[ "$out" = "$(printf '[r0] 0/2/0\n[r1] 1/2/0')" ] || fail "torchrun's variables, one host: '$out'"
out=$(MNCL_HOSTID=inherited "$RUN" -n 1 -- sh -c 'echo $MNCL_HOSTID')
[ "$out" = inherited ] || fail "MNCL_HOSTID not inherited: '$out'"
"$RUN" -n 2 --ranks-per-host 0 -- true 2>/dev/null
expect_rc 2 $? "--ranks-per-host 0 is a usage error"

# 3. A failing rank: its status is the launcher's, the others are killed after the grace.
start=$(now)
"$RUN" -n 3 --grace 1 -- sh -c '[ "$MNCL_RANK" = 1 ] && exit 3; sleep 60' 2>"$TMP/err"
rc=$?
expect_rc 3 $rc "rank 1 exits 3"
grep -q "rank 1 .*exited with status 3" "$TMP/err" || fail "no report of rank 1: $(cat "$TMP/err")"
[ $(($(now) - start)) -lt 20 ] || fail "the other ranks were not killed in time"

# 4. A rank killed by a signal: 128 + signal.
"$RUN" -n 2 -- sh -c '[ "$MNCL_RANK" = 0 ] && kill -9 $$; exit 0' 2>"$TMP/err"
expect_rc 137 $? "rank 0 killed by SIGKILL"
grep -q "rank 0 .*killed by signal 9" "$TMP/err" || fail "no signal report: $(cat "$TMP/err")"

# 5. The global timeout: exit 124, naming the ranks still running.
start=$(now)
"$RUN" -n 2 --timeout 1 -- sh -c '[ "$MNCL_RANK" = 1 ] && exit 0; sleep 60' 2>"$TMP/err"
expect_rc 124 $? "timeout"
grep -q "timeout.*still running: 0$" "$TMP/err" || fail "timeout report: $(cat "$TMP/err")"
[ $(($(now) - start)) -lt 20 ] || fail "timeout did not kill the ranks in time"

# 6. A file store: a fresh directory, removed afterwards.
dir=$("$RUN" -n 2 --store file -- sh -c \
  'd=${MNCL_STORE#file://}; [ -d "$d" ] && touch "$d/rank$MNCL_RANK" && echo "$d"' | sort -u)
expect_rc 0 $? "file store"
[ -n "$dir" ] && [ "$(echo "$dir" | wc -l)" -eq 1 ] || fail "file store directories: '$dir'"
[ -e "$dir" ] && fail "file store directory $dir was not removed"

# 7. SIGTERM to the launcher reaches the ranks.
# The ranks say when their trap is set, so the signal never arrives before it.
"$RUN" -n 2 -- sh -c "trap 'exit 7' TERM; touch '$TMP/ready'\$MNCL_RANK; sleep 60 & wait" &
pid=$!
for _ in $(seq 100); do
  [ -e "$TMP/ready0" ] && [ -e "$TMP/ready1" ] && break
  sleep 0.1
done
kill -TERM $pid
wait $pid
expect_rc 7 $? "SIGTERM forwarded"

# 7b. SIGKILL to the launcher (nothing to forward): the ranks die with it, not left as orphans.
# Each rank writes its pid when it starts, then execs a long sleep.
"$RUN" -n 2 -- sh -c "echo \$\$ > '$TMP/pid'\$MNCL_RANK; exec sleep 60" &
pid=$!
for _ in $(seq 100); do
  [ -s "$TMP/pid0" ] && [ -s "$TMP/pid1" ] && break
  sleep 0.1
done
kill -KILL $pid
wait $pid 2>/dev/null
orphans=""
for r in 0 1; do
  rank_pid=$(cat "$TMP/pid$r" 2>/dev/null)
  [ -n "$rank_pid" ] || { fail "rank $r never started"; continue; }
  for _ in $(seq 100); do  # gone (or a zombie) within 10 s
    state=$(cut -d" " -f3 "/proc/$rank_pid/stat" 2>/dev/null)  # no ps on a bare machine
    case "$state" in ""|Z*) break ;; esac
    sleep 0.1
  done
  case "$state" in ""|Z*) ;; *) orphans="$orphans $rank_pid"; kill -KILL "$rank_pid" ;; esac
done
[ -z "$orphans" ] && echo "ok: ranks die with a SIGKILLed launcher" ||
  fail "ranks outlived a SIGKILLed launcher:$orphans"

# 8. Usage errors and a program that does not exist.
"$RUN" -- true 2>/dev/null
expect_rc 2 $? "missing -n"
"$RUN" -n 2 -- /nonexistent/program 2>/dev/null
expect_rc 127 $? "missing program"
"$RUN" --help | grep -q "Usage: mncl-run" || fail "--help"

if [ $failures -ne 0 ]; then
  echo "$failures launcher check(s) failed"
  exit 1
fi
echo "all launcher checks passed"
