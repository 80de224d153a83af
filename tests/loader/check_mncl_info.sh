#!/usr/bin/env bash
# mncl-info must list the real naive plugin as loaded, every mock or bad file with the reason it
# was refused, and the ABI version, capabilities and runnable collectives of the loaded v1..v5
# mocks.
# Usage: check_mncl_info.sh <mncl-info> (MNCL_PLUGIN_PATH set by ctest).
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
# Line $3 (default 1) under a loaded plugin: $1 names it, $2 is a pattern the line must match.
expect_details() {
  local details
  details=$(awk -v name="$1" -v nth="${3:-1}" \
    '$1 == name && $2 == "loaded" { for (i = 0; i < nth; ++i) getline; print; exit }' <<<"$out")
  if ! grep -Eq -- "$2" <<<"$details"; then
    echo "MISSING: under '$1 loaded', line ${3:-1} matching /$2/ (got: '$details')" >&2
    status=1
  fi
}
expect '^  naive +loaded '
expect '^  mock +loaded '
expect '^  nosym +REFUSED .*no mncl_plugin_v1'
expect '^  v6only +REFUSED .*offers plugin ABI v6 only; this core supports v1\.\.v5'
expect '^  badabi +REFUSED .*abi_version 7'
expect '^  v2badabi +REFUSED .*mncl_plugin_v2 declares abi_version 1 but the symbol name promises 2'
expect '^  badmagic +REFUSED .*magic'
expect '^  small +REFUSED .*smaller than'
expect '^  initfail +REFUSED .*init\(\) refused'
expect '^  nomem +REFUSED .*no memory type'
expect '^  noexec +REFUSED .*missing mandatory functions'
expect '^  text +REFUSED .*not an ELF file'
expect '^  elf32 +REFUSED .*32-bit ELF'
expect '^  misnamed +REFUSED .*differs from the file name'
# v2 plugins show ABI v2 and their p2p-lanes; a v1 table never does, even when it sets bit 4.
# v3 plugins also show v3's kinds (bits 12, 13: 0x31ff with the mocks' 0x1ff); a v1 or v2 table
# never does, even when it sets them. v4 plugins add the batch kind (bit 14: 0x71ff); a v3 table
# never shows it, even when it sets it. v5 plugins add gatherv and scatterv (bits 15, 16:
# 0x1f1ff); a v4 table never shows them, even when it sets them.
expect_details mock 'plugin ABI v1, memory host, collectives 0x1ff,'
expect_details v2only 'plugin ABI v2, memory host,p2p-lanes, collectives 0x1ff,'
expect_details v1v2 'plugin ABI v2, memory host,p2p-lanes, collectives 0x1ff,'
expect_details v3only 'plugin ABI v3, memory host,p2p-lanes, collectives 0x31ff,'
expect_details v2v3 'plugin ABI v3, memory host,p2p-lanes, collectives 0x31ff,'
expect_details v2allv 'plugin ABI v2, memory host,p2p-lanes, collectives 0x1ff,'
expect_details v4only 'plugin ABI v4, memory host,p2p-lanes, collectives 0x71ff,'
expect_details v3v4 'plugin ABI v4, memory host,p2p-lanes, collectives 0x71ff,'
expect_details v3batch 'plugin ABI v3, memory host,p2p-lanes, collectives 0x31ff,'
expect_details v5only 'plugin ABI v5, memory host,p2p-lanes, collectives 0x1f1ff,'
expect_details v4rootedv 'plugin ABI v4, memory host,p2p-lanes, collectives 0x71ff,'
expect_details v5v6 'plugin ABI v5, memory host,p2p-lanes, collectives 0x1f1ff,'
expect_details v1v6 'plugin ABI v1, memory host, collectives 0x1ff,'
expect_details v1p2p 'plugin ABI v1, memory host, collectives 0x1ff,'
# The next line says which of mncl.h's collectives the backend cannot run, counting the core's
# own forms (a batch from send/recv, gatherv/scatterv from alltoallv). The mocks implement the
# v1 kinds but send and recv (0x1ff), so a batch runs only where v4's batch kind is kept; the
# v-collectives are missing below ABI v3, and gatherv/scatterv run from ABI v3 on (as an
# alltoallv below v5, natively from v5: either way they are not listed).
expect_runs() { expect_details "$1" "$2" 2; }
below_v3='cannot run mncl_send, mncl_recv, mncl_allgatherv, mncl_alltoallv, mncl_sendrecv_batch, '
below_v3+='mncl_sendrecv, mncl_gatherv, mncl_scatterv \(nor their mncl_i\* forms\)$'
for plugin in mock v2only v1v2 v2allv v1v6; do expect_runs $plugin "$below_v3"; done
for plugin in v3only v2v3 v3batch; do
  expect_runs $plugin 'cannot run mncl_send, mncl_recv, mncl_sendrecv_batch, mncl_sendrecv \(nor'
done
for plugin in v4only v3v4 v4rootedv v5only v5v6; do
  expect_runs $plugin 'cannot run mncl_send, mncl_recv \(nor'
done
expect_runs naive 'runs every collective of mncl\.h$'
exit $status
