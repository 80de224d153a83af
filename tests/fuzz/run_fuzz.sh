#!/bin/sh
# Runs a libFuzzer binary for a bounded time and prints the figure line
#   fuzz.<name> - PASS|FAIL <execs> execs in <s> s, <crashes> crashes
# usage: run_fuzz.sh <fuzzer> <name> <seconds> [corpus dir]
set -u
fuzzer=$1 name=$2 seconds=$3 corpus=${4:-}
log=$(mktemp)
work=$(mktemp -d)
[ -n "$corpus" ] && [ -d "$corpus" ] && cp -r "$corpus"/. "$work"/ 2>/dev/null
# Artifacts (crashing inputs) land in the current directory, where ctest keeps them.
"$fuzzer" -max_total_time="$seconds" -print_final_stats=1 -max_len=4096 "$work" >"$log" 2>&1
rc=$?
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
crashes=$(grep -c '^==[0-9]*==ERROR\|deadly signal\|^SUMMARY: ' "$log")
if [ "$rc" -eq 0 ] && [ "$crashes" -eq 0 ]; then result=PASS; else result=FAIL; tail -40 "$log"; fi
echo "fuzz.$name - $result ${execs:-0} execs in $seconds s, $crashes crashes (corpus $(ls "$work" | wc -l) inputs)"
rm -rf "$log" "$work"
[ "$result" = PASS ]
