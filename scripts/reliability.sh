#!/usr/bin/env bash
# The reliability builds of issue 9 (tests/fault/README.md), each in a folder of its own: unit,
# conformance and fault tests under AddressSanitizer+UBSan and under ThreadSanitizer (reduced
# selections), and the bounded libFuzzer run on the store's wire parser (MNCL_FUZZ_SECONDS,
# default 60). scripts/test.sh runs them in CI (or with MNCL_TEST_SANITIZERS=1):
#   bash scripts/reliability.sh build       configures and builds the three folders;
#   bash scripts/reliability.sh fuzz        runs the fuzzer (built first);
#   bash scripts/reliability.sh sanitized   runs the ASan+UBSan and TSan selections (built first;
#                                           not with --built, when "build" has just run);
#   bash scripts/reliability.sh all         all of it.
# test.sh runs "build" and "fuzz" beside the main ctest, at idle priority: most of its tests
# wait (on timeouts, on peers), which leaves about half of the CPU idle.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: reliability.sh build|fuzz|sanitized|all}
jobs=-j"$(nproc)"
step() { echo "== $* ($(date +%T))"; }

common_targets=(mncl mncl-run mncl-naive conformance_test store_test plugin_kit_test op_history_test
                peer_watch_test naive_threads_test plugin_p2p_concurrency_test fault_test bad_input_test leak_test
                mncl-mock-hang)
gloo_target=()
[ -d plugins/gloo ] && gloo_target=(mncl-gloo gloo_transport_test)
# The nccl plugin on the fake GPU (tests/cuda/fake_gpu), where CUDA and NCCL are installed.
nccl_targets=(mncl-nccl mncl-fake-gpu gpu_collectives_test)

# flat stays out of the sanitized runs: Open MPI's own never-freed allocations would fail LSan.
# naive up to 3 ranks: it branches only on a size of 1 (4 ranks run in the main ctest).
asan_regex='^(store_test|plugin_kit_test|plugin_misbehaviour_test|op_history_test|peer_watch_test|naive_threads_test|plugin_p2p_concurrency_test|gloo_transport_test|native_async_destroy_test|loader|conformance\.(naive\.np[1-3]|gloo\.np[1-4])|conformance\.nccl\.fake_gpu\.np[23]|cuda\.fake_gpu\.(nccl|naive|gloo|auto_cuda)\..*|fault\.(bad_input|leak_cycles|watchdog\..*|abort\.(naive|gloo|shm|nccl)\..*|abort_destroy\.(naive|gloo|shm)\..*|killed_rank\.(naive|nccl)\.np4|aborted_peer\.naive\.np3|aborted_peer\.gloo\.np3|destroyed_peer\.naive\.np3|destroyed_peer\.gloo\.np3|killed_rank\.nccl_silent\.np3|aborted_peer\.nccl_silent\.np3|killed_rank\.own_pidns\.naive\.np3|killed_rank\.store_host_exits\.naive\.np3|stalled_rank\.naive\.np4|mismatch\.count\.checks\.naive\.np4)|split\.(naive\.np4\.hosts_of_2|gloo\.np3\.hosts_of_2|destroy_order\.naive\.np3|store_keys\.naive\.np3)|frontends\.(unit|mp\.naive\.np3)|nonblocking\.lifetime\.naive\.np2)$'
asan_targets=("${common_targets[@]}" "${gloo_target[@]}" loader_test split_test destroy_order_test store_keys_test
              mncl-shm "${nccl_targets[@]}"
              frontends_unit_test frontends_mp_test native_async_destroy_test nonblocking_lifetime_test
              plugin_misbehaviour_test mncl-mock-misbehave)
# TSan's conformance run: np3 only (an odd size, every case); np2 and np4 beside it took about
# 4 of the 9 minutes of this stage on 2 cores, with the whole run past its 30-minute target.
# gloo's fault runs here are those where this rank's own abort closes the connections
# (abort.gloo: the poison, under the teardown lock, see gloo_transport.cpp), not those where a
# peer closes them while a wait of ours ends (aborted_peer.gloo, killed ranks): there Gloo's
# device thread signals a buffer that the woken rank destroys at once, and libgloo's
# ~UnboundBuffer orders the two only by polling weak_ptr::expired() (a relaxed load, which
# libstdc++ says gives no synchronization), so TSan reports a race inside libgloo, now and then
# (once in CI, stop 41). ASan and the main run keep aborted_peer.gloo.
tsan_regex='^(store_test|plugin_kit_test|op_history_test|naive_threads_test|plugin_p2p_concurrency_test|gloo_transport_test|native_async_destroy_test|shm\.lanes|conformance\.naive\.np3|conformance\.nccl\.fake_gpu\.np2|cuda\.fake_gpu\.(nccl\.np2|nccl\.dead_peer\..*|naive\.np2)|fault\.(watchdog\..*|abort\.(naive|gloo|nccl)\.np2|aborted_peer\.naive\.np3|destroyed_peer\.naive\.np3|killed_rank\.nccl_silent\.np3|aborted_peer\.nccl_silent\.np3|killed_rank\.own_pidns\.naive\.np3|abort_destroy\.naive\.np2|stalled_rank\.naive\.np4)|split\.(destroy_order|store_keys)\.naive\.np3)$'
tsan_targets=("${common_targets[@]}" "${gloo_target[@]}" mncl-shm shm_lanes_test "${nccl_targets[@]}"
              native_async_destroy_test destroy_order_test store_keys_test)

# <dir> <MNCL_SANITIZE> <targets...>
build_sanitized() {
  local dir=$1 sanitize=$2
  shift 2
  step "$dir: building with MNCL_SANITIZE=$sanitize"
  # Debug (-O0) compiles fastest, which dominates this step on 2 cores.
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DMNCL_SANITIZE="$sanitize" >/dev/null
  # Only the targets this configuration has (the nccl ones need the CUDA toolkit and NCCL).
  local targets=() known
  known=$(cmake --build "$dir" --target help)
  for t in "$@"; do
    if grep -qE "^\.\.\. $t( |\$)" <<<"$known"; then targets+=(--target "$t"); fi
  done
  cmake --build "$dir" "$jobs" "${targets[@]}" >/dev/null
}
build_fuzz() {
  step "build-fuzz: building libFuzzer on wire::parse_frame"
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -DMNCL_FUZZ=ON \
    -DMNCL_FUZZ_SECONDS="${MNCL_FUZZ_SECONDS:-60}" >/dev/null
  cmake --build build-fuzz "$jobs" --target wire_fuzz >/dev/null
}
build_all() {
  build_sanitized build-asan address,undefined "${asan_targets[@]}"
  build_sanitized build-tsan thread "${tsan_targets[@]}"
  build_fuzz
}

# <dir> <ctest regex>
test_sanitized() {
  step "$1: ctest"
  # --no-tests=error: a selection that matches nothing fails (CTest's regex takes at most 10
  # groups; one more made it match nothing, and the stage passed with no test run).
  ctest --test-dir "$1" --output-on-failure --no-tests=error "$jobs" -R "$2"
}
sanitized_all() {
  # intercept_tls_get_addr=0: GCC 12's LeakSanitizer misreads the dynamic TLS of dlopen'd
  # modules (here the fake CUDA and NCCL libraries under the nccl plugin) now and then,
  # depending on the memory layout, and its tracer crashes at exit ("Tracer caught signal 11"
  # in "DTLS ... at" a bogus range) after every test passed. Without tracking it scans no
  # dynamic TLS as a root: at worst a false leak report, never a hidden one.
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:intercept_tls_get_addr=0
  export UBSAN_OPTIONS=print_stacktrace=1
  # hwloc's PCI plugin (libpciaccess) leaks ~1 KiB once per process at unload, outside MNCL;
  # LSan cannot name a module that is gone, so the sanitized runs do without that plugin.
  export HWLOC_PLUGINS_BLACKLIST=hwloc_pci
  export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
  test_sanitized build-asan "$asan_regex"
  # TSan without the volume cases: the conformance suite's multi-MiB ones (Large.*) and the
  # store's values of hundreds of megabytes run the same code as the small ones, which TSan
  # sees, moving more bytes: about half of its conformance run, and 36 of store_test's 49 s.
  # Both run in the main ctest and under ASan.
  GTEST_FILTER=-Large.*:TcpStore.ValuesOfHundredsOfMegabytes \
    test_sanitized build-tsan "$tsan_regex"
}
fuzz() {
  step "build-fuzz: libFuzzer on wire::parse_frame for ${MNCL_FUZZ_SECONDS:-60} s"
  ctest --test-dir build-fuzz --output-on-failure -V -L fuzz
}

# Each mode builds first: a no-op after "build". One command per line, never "a && b": bash
# runs a function on the left of && with set -e off, so a failing step there went unnoticed.
case $mode in
  build) build_all ;;
  fuzz)
    build_all
    fuzz
    ;;
  sanitized)
    # test.sh has just built them beside the main ctest ("fuzz"): three configure runs and
    # no-op builds again took about 15 s.
    [ "${2:-}" = --built ] || build_all
    sanitized_all
    ;;
  all)
    build_all
    sanitized_all
    fuzz
    ;;
  *) echo "reliability.sh: unknown mode '$mode' (build, fuzz, sanitized or all)" >&2; exit 2 ;;
esac
step "reliability checks ($mode) done"
