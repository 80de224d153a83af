#!/usr/bin/env bash
# examples/python/train_softmax.py under mncl-run: it learns (test accuracy >= 0.9 after 8
# epochs, also with gradients sent as bfloat16, and with double buffering), and a run stopped
# after epoch 3 and rerun resumes from its checkpoint and ends with the same weights, bit for
# bit, as one run through (with double buffering too: the averages in flight are saved).
# Usage: example_train.sh <mncl-run> <python3> <script> <ranks>
set -euo pipefail
run=$1 python=$2 script=$3 ranks=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/mncl-example-train.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
check() {  # check <description> <command...>: counts a failure when the command fails
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what" >&2; failures=$((failures + 1)); fi
}

train() {  # train <log> [args...]: the example at $ranks ranks; its exit status is returned
  local log=$1
  shift
  "$run" -n "$ranks" --timeout 120 -- "$python" "$script" "$@" > "$log" 2>&1
}

accuracy_at_least() {  # accuracy_at_least <log> <what>
  local acc
  acc=$(awk '/^epoch 8 /{print $NF}' "$1")
  check "$2: epoch 8 reached" test -n "$acc"
  check "$2: test accuracy $acc >= 0.9" awk -v a="${acc:-0}" 'BEGIN{exit !(a >= 0.9)}'
}

train "$work/whole.log" || { cat "$work/whole.log"; exit 1; }
accuracy_at_least "$work/whole.log" "one run"
train "$work/bf16.log" --grad-dtype bfloat16 || { cat "$work/bf16.log"; exit 1; }
accuracy_at_least "$work/bf16.log" "gradients as bfloat16"

train "$work/double.log" --double-buffering || { cat "$work/double.log"; exit 1; }
accuracy_at_least "$work/double.log" "double buffering"

resumes_alike() {  # resumes_alike <one run's log> <name> [args...]: stopped and rerun
  local whole_log=$1 name=$2 stopped=0
  shift 2
  train "$work/$name.first.log" --checkpoint "$work/$name" --stop-after 3 "$@" || stopped=$?
  check "$name: the stopped run ends with status 3 (got $stopped)" test "$stopped" = 3
  train "$work/$name.second.log" --checkpoint "$work/$name" "$@" ||
    { cat "$work/$name.second.log"; exit 1; }
  check "$name: the rerun resumes after epoch 3" \
    grep -q "^resumed after epoch 3$" "$work/$name.second.log"
  check "$name: the rerun starts at epoch 4" \
    sh -c "! grep -q '^epoch [123] ' '$work/$name.second.log'"
  local whole resumed
  whole=$(grep '^weights ' "$whole_log" || true)
  resumed=$(grep '^weights ' "$work/$name.second.log" || true)
  check "$name: the resumed run ends with one run's weights" \
    test -n "$whole" -a "$whole" = "$resumed"
}
resumes_alike "$work/whole.log" plain
resumes_alike "$work/double.log" double --double-buffering
if ((failures)); then
  tail -n 5 "$work"/*.log >&2
  exit 1
fi
echo "the example learns and resumes"
