#!/bin/sh
# Every MNCL_* variable the library, the plugins, the tools, the frontends or the Python
# package read is declared in the one table of sdk/common/env.cpp, so that mncl-info --env
# documents it and setting it draws no "is not a documented MNCL variable" warning. The names
# read are the quoted literals MNCL_... in the sources, less the C API's constants (status
# codes, split types). bench/ is left out: mncl-perf's variable is its own plumbing.
# Usage: check_env_table.sh <mncl-info> <source root>
set -eu
info=$1
root=$2
listed=$("$info" --env | sed -n 's/^  \([A-Z][A-Z0-9_]*\) .*=.*/\1/p' | sort -u)
read_by_code=$(grep -rhoE "[\"']MNCL_[A-Z0-9_]+[\"']" "$root/sdk" "$root/plugins" \
  "$root/frontends" "$root/python/mncl" | tr -d "\"'" | grep -vE '^MNCL_(OK|IN_PROGRESS|ERR_[A-Z_]+|SPLIT_TYPE_[A-Z_]+)$' | sort -u)
[ -n "$read_by_code" ] || { echo "FAIL: found no MNCL_ variable under $root"; exit 1; }
missing=$(printf '%s\n' "$read_by_code" | while read -r name; do
  printf '%s\n' "$listed" | grep -qx "$name" || echo "$name"
done)
if [ -n "$missing" ]; then
  echo "FAIL: read by the code but missing from sdk/common/env.cpp's table (mncl-info --env):"
  printf '  %s\n' $missing
  exit 1
fi
echo "PASS: $(printf '%s\n' "$read_by_code" | wc -l) MNCL_ variables read by the code, all in mncl-info --env"
