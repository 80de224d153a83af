#!/usr/bin/env bash
# mncl-info must list the real naive plugin as loaded and every mock or bad file with the
# reason it was refused. Usage: check_mncl_info.sh <mncl-info> (MNCL_PLUGIN_PATH set by ctest).
set -u
out=$("$1" --plugins 2>/dev/null)
echo "$out"
status=0
expect() {
  if ! grep -Eq -- "$1" <<<"$out"; then
    echo "MISSING: a line matching /$1/" >&2
    status=1
  fi
}
expect '^  naive +loaded '
expect '^  mock +loaded '
expect '^  nosym +REFUSED .*no mncl_plugin_v1'
expect '^  v2only +REFUSED .*offers plugin ABI v2 only; this core supports v1\.\.v1'
expect '^  badabi +REFUSED .*abi_version 7'
expect '^  badmagic +REFUSED .*magic'
expect '^  small +REFUSED .*smaller than'
expect '^  initfail +REFUSED .*init\(\) refused'
expect '^  nomem +REFUSED .*no memory type'
expect '^  noexec +REFUSED .*missing mandatory functions'
expect '^  text +REFUSED .*not an ELF file'
expect '^  elf32 +REFUSED .*32-bit ELF'
expect '^  misnamed +REFUSED .*differs from the file name'
exit $status
