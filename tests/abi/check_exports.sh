#!/usr/bin/env bash
# The exported surface: libmncl has SONAME libmncl.so.<ABI major> and exports exactly the
# functions mncl.h declares, each with the default version (@@) of the node the version script
# gives it: the node that names it explicitly (a function added in a minor release, e.g.
# MNCL_1.1 { global: mncl_allgatherv; ... } MNCL_1.0;), else the node whose wildcard matches it
# (mncl_* in MNCL_1.0). Every node of the script is in the library, and every name the script
# lists is declared in mncl.h (a typo there would silently leave the function in MNCL_1.0).
# Every plugin exports only mncl_plugin_v<N> tables.
#
# Usage: check_exports.sh <mncl.h> <libmncl.so> <libmncl.map> <plugin folder>...
set -u
header=$1 lib=$2 map=$3
shift 3
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

# The version script's global patterns, one "<node> <name or wildcard>" a line (comments
# dropped; local: patterns ignored).
script_globals() {
  awk '
    { line = $0; out = ""
      while (line != "") {
        if (in_comment) {
          i = index(line, "*/"); if (i == 0) { line = ""; break }
          line = substr(line, i + 2); in_comment = 0
        } else {
          i = index(line, "/*"); if (i == 0) { out = out line; line = ""; break }
          out = out substr(line, 1, i - 1) " "; line = substr(line, i + 2); in_comment = 1
        }
      }
      text = text " " out }
    END {
      gsub(/[{};]/, " & ", text); gsub(/:/, ": ", text)
      n = split(text, tok, /[ \t\n]+/); node = ""; depth = 0; section = ""
      for (i = 1; i <= n; ++i) {
        t = tok[i]; if (t == "") continue
        if (t == "{") { depth = 1; section = "global:"; continue }
        if (t == "}") { depth = 0; node = ""; after = 1; continue }
        # Outside braces: a node name before "{", or after "}" the nodes it inherits up to ";"
        # ("} MNCL_1.1;" must not name the next node MNCL_1.1).
        if (depth == 0) {
          if (t == ";") after = 0; else if (!after && node == "") node = t
          continue
        }
        if (t == "global:" || t == "local:") { section = t; continue }
        if (t != ";" && section == "global:") print node, t
      }
    }' "$1"
}
globals=$(script_globals "$map")
script_nodes=$(awk '{ print $1 }' <<<"$globals" | sort -u | tr '\n' ' ')
echo "  version script $map: nodes $script_nodes"
[ -n "$globals" ] || fail "no global: pattern found in $map"
for node in $script_nodes; do
  [[ " $nodes " == *" $node "* ]] || fail "node $node of $map is not in $lib"
done
# The node a function belongs to: the one naming it explicitly wins over wildcards (as in ld).
node_of() {
  local node pattern wildcard_node=""
  while read -r node pattern; do
    [ -z "$pattern" ] && continue
    if [ "$pattern" = "$1" ]; then
      echo "$node"
      return
    fi
    # shellcheck disable=SC2053 # a glob match, as the linker does
    if [[ "$pattern" == *[*?[]* && "$1" == $pattern && -z "$wildcard_node" ]]; then
      wildcard_node=$node
    fi
  done <<<"$globals"
  echo "$wildcard_node"
}

declared=$(sed -n 's/^MNCL_API[^(]*[ *]\(mncl_[a-z0-9_]*\)(.*/\1/p' "$header" | sort -u)
# Names the script lists explicitly must be functions of mncl.h.
while read -r node pattern; do
  [ -z "$pattern" ] || [[ "$pattern" == *[*?[]* ]] && continue
  grep -qxF -- "$pattern" <<<"$declared" ||
    fail "$map names '$pattern' in $node, but mncl.h declares no such function"
done <<<"$globals"

exported=""
declare -A per_node=()
while read -r sym; do
  [ -z "$sym" ] && continue
  name=${sym%%@*}
  version=${sym#"$name"}
  default=0
  [[ "$version" == @@* ]] && default=1
  version=${version#@@}
  version=${version#@}
  if [[ ! "$name" =~ ^mncl_[a-z0-9_]+$ ]]; then
    fail "libmncl exports '$sym', which is not mncl_*"
  elif [ -z "$version" ] || [[ ! " $nodes " == *" $version "* ]]; then
    fail "libmncl exports '$sym' without an MNCL_x.y version (version script not applied?)"
  elif [ $default -eq 1 ]; then
    expected=$(node_of "$name")
    if [ -z "$expected" ]; then
      fail "libmncl exports '$sym', which no global: pattern of $map matches"
    elif [ "$version" != "$expected" ]; then
      fail "libmncl exports '$sym', but $map puts $name in $expected"
    fi
    per_node[$version]=$((${per_node[$version]:-0} + 1))
  fi
  exported+="$name"$'\n'
done < <(exports "$lib")
for node in $nodes; do
  echo "  @@$node: ${per_node[$node]:-0} functions"
done
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
[ $status -eq 0 ] && echo "OK: libmncl exports only mncl.h's functions, each @@ its node in $(basename "$map") ($(echo $nodes)), with SONAME $soname; $nplugins plugins export only mncl_plugin_v<N>"
exit $status
