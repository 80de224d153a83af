// Per-call overhead of libmncl: a size-1 communicator on the no-op plugin, whose execute()
// returns at once, so every nanosecond measured is the core's (argument validation, dispatch
// through the plugin table, request bookkeeping). BM_plugin_execute_direct calls the same
// plugin function without libmncl: the floor to subtract.
#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <mncl/mncl_plugin.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

mncl_comm_t g_comm = nullptr;

// One communicator for the whole binary: creation is not what is measured.
mncl_comm_t comm() {
  if (g_comm != nullptr) return g_comm;
  mncl_config_t config = MNCL_CONFIG_INIT;
  config.backend = MNCL_MICRO_NOOP_PLUGIN;  // a path: no search, no other plugin involved
  config.rank = 0;
  config.size = 1;
  const mncl_status_t st = mncl_comm_create(&config, &g_comm);
  if (st != MNCL_OK) {
    std::fprintf(stderr, "mncl-micro: cannot create a communicator on %s: %s\n",
                 MNCL_MICRO_NOOP_PLUGIN, mncl_last_error());
    std::exit(1);
  }
  return g_comm;
}

void check(benchmark::State &state, mncl_status_t st) {
  if (st != MNCL_OK) state.SkipWithError(mncl_last_error());
}

void BM_allreduce(benchmark::State &state) {
  const size_t count = static_cast<size_t>(state.range(0));
  std::vector<float> in(count), out(count);
  mncl_comm_t c = comm();
  for (auto _ : state)
    check(state, mncl_allreduce(c, in.data(), out.data(), count, MNCL_FLOAT32, MNCL_SUM, nullptr));
}
BENCHMARK(BM_allreduce)->Arg(1)->Arg(1 << 20)->UseRealTime();

void BM_allreduce_inplace(benchmark::State &state) {
  std::vector<float> buf(1024);
  mncl_comm_t c = comm();
  for (auto _ : state)
    check(state,
          mncl_allreduce(c, buf.data(), buf.data(), buf.size(), MNCL_FLOAT32, MNCL_SUM, nullptr));
}
BENCHMARK(BM_allreduce_inplace)->UseRealTime();

void BM_bcast(benchmark::State &state) {
  std::vector<float> buf(1024);
  mncl_comm_t c = comm();
  for (auto _ : state)
    check(state, mncl_bcast(c, buf.data(), buf.size(), MNCL_FLOAT32, 0, nullptr));
}
BENCHMARK(BM_bcast)->UseRealTime();

void BM_alltoall(benchmark::State &state) {
  std::vector<float> in(1024), out(1024);
  mncl_comm_t c = comm();
  for (auto _ : state)
    check(state, mncl_alltoall(c, in.data(), out.data(), in.size(), MNCL_FLOAT32, nullptr));
}
BENCHMARK(BM_alltoall)->UseRealTime();

void BM_barrier(benchmark::State &state) {
  mncl_comm_t c = comm();
  for (auto _ : state) check(state, mncl_barrier(c, nullptr));
}
BENCHMARK(BM_barrier)->UseRealTime();

// Non-blocking: request allocation, the core's async path, completion and release.
void BM_iallreduce_wait(benchmark::State &state) {
  std::vector<float> in(1024), out(1024);
  mncl_comm_t c = comm();
  for (auto _ : state) {
    mncl_request_t req = nullptr;
    check(state, mncl_iallreduce(c, in.data(), out.data(), in.size(), MNCL_FLOAT32, MNCL_SUM,
                                 nullptr, &req));
    check(state, mncl_wait(req, -1));
  }
}
BENCHMARK(BM_iallreduce_wait)->UseRealTime();

void BM_iallreduce_test(benchmark::State &state) {
  std::vector<float> in(1024), out(1024);
  mncl_comm_t c = comm();
  for (auto _ : state) {
    mncl_request_t req = nullptr;
    check(state, mncl_iallreduce(c, in.data(), out.data(), in.size(), MNCL_FLOAT32, MNCL_SUM,
                                 nullptr, &req));
    int done = 0;
    while (!done) check(state, mncl_test(req, &done));
  }
}
BENCHMARK(BM_iallreduce_test)->UseRealTime();

void BM_allreduce_coalesced_16(benchmark::State &state) {
  std::vector<std::vector<float>> in(16, std::vector<float>(64)), out = in;
  std::vector<const void *> sp;
  std::vector<void *> rp;
  std::vector<size_t> counts(16, 64);
  for (int i = 0; i < 16; ++i) {
    sp.push_back(in[i].data());
    rp.push_back(out[i].data());
  }
  mncl_comm_t c = comm();
  for (auto _ : state)
    check(state, mncl_allreduce_coalesced(c, sp.data(), rp.data(), counts.data(), 16, MNCL_FLOAT32,
                                          MNCL_SUM, nullptr));
}
BENCHMARK(BM_allreduce_coalesced_16)->UseRealTime();

// The error path: validation refuses, the thread's last-error message is formatted.
void BM_invalid_root(benchmark::State &state) {
  std::vector<float> buf(16);
  mncl_comm_t c = comm();
  for (auto _ : state) {
    if (mncl_bcast(c, buf.data(), buf.size(), MNCL_FLOAT32, 7, nullptr) !=
        MNCL_ERR_INVALID_ARGUMENT)
      state.SkipWithError("an out-of-range root was accepted");
  }
}
BENCHMARK(BM_invalid_root)->UseRealTime();

// The floor: the plugin's execute() called through its table, without libmncl.
void BM_plugin_execute_direct(benchmark::State &state) {
  void *so = dlopen(MNCL_MICRO_NOOP_PLUGIN, RTLD_NOW | RTLD_LOCAL);
  const auto *table =
      so ? static_cast<const mncl_plugin_v1_t *>(dlsym(so, MNCL_PLUGIN_V1_SYMBOL)) : nullptr;
  if (table == nullptr || table->execute == nullptr) {
    state.SkipWithError("cannot load the no-op plugin's table");
    return;
  }
  std::vector<float> in(1024), out(1024);
  mncl_coll_v1_t coll{};
  coll.struct_size = sizeof coll;
  coll.kind = MNCL_COLL_ALLREDUCE;
  coll.dtype = MNCL_FLOAT32;
  coll.op = MNCL_SUM;
  coll.root = -1;
  coll.sendbuf = in.data();
  coll.recvbuf = out.data();
  coll.count = in.size();
  auto execute = table->execute;
  benchmark::DoNotOptimize(execute);
  for (auto _ : state) {
    benchmark::DoNotOptimize(execute(nullptr, &coll));
    ++coll.seq;
  }
  dlclose(so);
}
BENCHMARK(BM_plugin_execute_direct)->UseRealTime();

}  // namespace

int main(int argc, char **argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  comm();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (g_comm != nullptr) mncl_comm_destroy(g_comm);
  return 0;
}
