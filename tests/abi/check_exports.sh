#!/usr/bin/env bash
# The exported surface: libmncl has SONAME libmncl.so.<ABI major> and exports exactly the
# functions mncl.h declares, each versioned @@MNCL_1.0 (or a later node listed in the version
# script); every plugin exports only mncl_plugin_v<N> tables.
#
# Usage: check_exports.sh <mncl.h> <libmncl.so> <plugin folder>...
set -u
header=$1 lib=$2
shift 2
status=0
fail() {
  echo "FAIL: $*" >&2
  status=1
}
# Defined global/weak dynamic symbols, one "name[@@version]" a line (without the absolute
# size-0 symbols GNU ld adds for version nodes, "MNCL_1.0").
exports() {
  readelf -W --dyn-syms "$1" |
    awk '$1 ~ /^[0-9]+:$/ && $7 != "UND" && ($5 == "GLOBAL" || $5 == "WEAK") &&
         !($7 == "ABS" && $3 == 0 && $8 ~ /^[A-Za-z0-9_]+_[0-9.]+$/) { print $8 }'
}

# --- libmncl ---------------------------------------------------------------------------------
abi_major=$(sed -n 's/^#define MNCL_ABI_MAJOR \([0-9]*\).*/\1/p' "$header")
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
echo "libmncl: $lib"
echo "  SONAME $soname (MNCL_ABI_MAJOR $abi_major)"
[ "$soname" = "libmncl.so.$abi_major" ] || fail "SONAME is '$soname', expected libmncl.so.$abi_major"

nodes=$(readelf -W -V "$lib" | sed -n 's/.*Name: \(MNCL_[0-9.]*\).*/\1/p' | sort -u | tr '\n' ' ')
echo "  version nodes: $nodes"
[[ " $nodes " == *" MNCL_1.0 "* ]] || fail "no MNCL_1.0 version node"

declared=$(sed -n 's/^MNCL_API[^(]*[ *]\(mncl_[a-z0-9_]*\)(.*/\1/p' "$header" | sort -u)
exported=""
while read -r sym; do
  [ -z "$sym" ] && continue
  name=${sym%%@*}
  version=${sym#"$name"}
  version=${version#@@}
  version=${version#@}
  if [[ ! "$name" =~ ^mncl_[a-z0-9_]+$ ]]; then
    fail "libmncl exports '$sym', which is not mncl_*"
  elif [ -z "$version" ] || [[ ! " $nodes " == *" $version "* ]]; then
    fail "libmncl exports '$sym' without an MNCL_x.y version (version script not applied?)"
  fi
  exported+="$name"$'\n'
done < <(exports "$lib")
exported=$(sort -u <<<"$exported" | sed '/^$/d')
echo "  $(wc -l <<<"$exported") exported mncl_* functions, $(wc -l <<<"$declared") declared in mncl.h"
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
[ -z "$missing" ] || fail "declared in mncl.h but not exported: $(echo $missing)"
[ -z "$extra" ] || fail "exported but not declared in mncl.h: $(echo $extra)"

# --- plugins ---------------------------------------------------------------------------------
nplugins=0
for dir in "$@"; do
  for plugin in "$dir"/libmncl-*.so; do
    [ -f "$plugin" ] || continue
    nplugins=$((nplugins + 1))
    syms=$(exports "$plugin" | sed 's/@.*//' | sort -u)
    echo "plugin $(basename "$plugin"): $(echo $syms)"
    [ -n "$syms" ] || fail "$plugin exports nothing (no mncl_plugin_v<N> table)"
    while read -r s; do
      [ -z "$s" ] && continue
      [[ "$s" =~ ^mncl_plugin_v[0-9]+$ ]] || fail "$plugin exports '$s', which is not a mncl_plugin_v<N> table"
    done <<<"$syms"
  done
done
[ "$nplugins" -gt 0 ] || fail "no plugin found in $*"
[ $status -eq 0 ] && echo "OK: libmncl exports only mncl_* @MNCL_1.0 with SONAME $soname; $nplugins plugins export only mncl_plugin_v<N>"
exit $status
