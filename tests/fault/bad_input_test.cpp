// fault.bad_input: every entry point fed hostile arguments must return the specific status with
// a message (mncl_last_error() non-empty, naming what was wrong), never MNCL_OK, never crash.
// One process, a single-rank naive communicator (and a pair of ranks with a second process). Prints
// one line per failed case and the summary "fault.bad_input naive PASS|FAIL accepted bad inputs 0
// of N; wrong status 0".
#include <mncl/mncl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

namespace {

struct Tally {
  int cases = 0, accepted = 0, wrong_status = 0, no_message = 0;
};
Tally g;

// Runs one case: `call` must return `expect` with a message containing `needle` (if given).
void check(const char *name, mncl_status_t expect, const std::function<mncl_status_t()> &call,
           const char *needle = nullptr) {
  ++g.cases;
  const mncl_status_t st = call();
  const std::string msg = mncl_last_error();
  if (st == MNCL_OK) {
    ++g.accepted;
    std::printf("  ACCEPTED %s (expected %s)\n", name, mncl_status_string(expect));
  } else if (st != expect) {
    ++g.wrong_status;
    std::printf("  WRONG %s: %s, expected %s: %s\n", name, mncl_status_string(st),
                mncl_status_string(expect), msg.c_str());
  } else if (msg.empty() || (needle && msg.find(needle) == std::string::npos)) {
    ++g.no_message;
    std::printf("  NO MESSAGE %s: '%s' lacks '%s'\n", name, msg.c_str(), needle ? needle : "");
  }
}

// A valid call next to the refused ones: it must succeed (a check refusing too much).
void expect_ok(const char *name, const std::function<mncl_status_t()> &call) {
  ++g.cases;
  const mncl_status_t st = call();
  if (st != MNCL_OK) {
    ++g.wrong_status;
    std::printf("  REFUSED %s: %s: %s\n", name, mncl_status_string(st), mncl_last_error());
  }
}

// mncl_comm_create with one environment variable set to a bad value.
void check_env(const char *var, const char *value,
               mncl_status_t expect = MNCL_ERR_INVALID_ARGUMENT) {
  const char *old = std::getenv(var);
  const std::string saved = old ? old : "";
  setenv(var, value, 1);
  const std::string name = std::string("mncl_comm_create with ") + var + "='" + value + "'";
  mncl_comm_t c = nullptr;
  check(
      name.c_str(), expect, [&] { return mncl_comm_create(nullptr, &c); }, var);
  if (c) mncl_comm_destroy(c);
  if (old) {
    setenv(var, saved.c_str(), 1);
  } else {
    unsetenv(var);
  }
}

// Rank `rank` of a pair on `store` (naive, a minute's timeout).
mncl_status_t pair_rank(const char *store, int rank, mncl_comm_t *comm) {
  mncl_config_t cfg = MNCL_CONFIG_INIT;
  cfg.backend = "naive";
  cfg.rank = rank;
  cfg.size = 2;
  cfg.bootstrap = store;
  cfg.timeout_ms = 60000;
  return mncl_comm_create(&cfg, comm);
}

}  // namespace

int main(int argc, char **argv) {
  // The pair's rank 1 (started by the checks below): joins, and leaves when rank 0 aborts.
  if (argc == 3 && std::strcmp(argv[1], "--pair-rank-1") == 0) {
    mncl_comm_t comm = nullptr;
    if (pair_rank(argv[2], 1, &comm) != MNCL_OK) return 1;
    mncl_comm_destroy(comm);
    return 0;
  }
  char self[] = "/proc/self/exe";
  // A single-rank job with the in-process store, whatever the launcher set.
  for (const char *v : {"MNCL_RANK", "MNCL_STORE", "MNCL_LOCAL_RANK", "MNCL_LOCAL_SIZE", "RANK",
                        "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"})
    unsetenv(v);
  setenv("MNCL_SIZE", "1", 1);
  setenv("MNCL_BACKEND", "naive", 1);
  mncl_comm_t comm = nullptr;
  if (mncl_comm_create(nullptr, &comm) != MNCL_OK) {
    std::printf("fault.bad_input naive FAIL cannot create a communicator: %s\n", mncl_last_error());
    return 1;
  }
  const auto I = MNCL_ERR_INVALID_ARGUMENT;
  float a[64] = {0}, b[64] = {0};
  const size_t huge = std::numeric_limits<size_t>::max();
  const size_t half = huge / 2 + 1;
  int dummy = 0;
  auto *garbage = reinterpret_cast<mncl_comm_t>(&dummy);  // never dereferenced: not a live handle
  auto *bad_request = reinterpret_cast<mncl_request_t>(&dummy);
  const auto bad_dtype = static_cast<mncl_dtype_t>(99);
  const auto neg_dtype = static_cast<mncl_dtype_t>(-1);
  const auto bad_op = static_cast<mncl_op_t>(42);
  mncl_request_t req = nullptr;

  // --- handles ---------------------------------------------------------------------------------
  check(
      "allreduce NULL comm", I,
      [&] { return mncl_allreduce(nullptr, a, b, 4, MNCL_FLOAT32, MNCL_SUM, nullptr); }, "comm");
  check(
      "allreduce garbage comm", I,
      [&] { return mncl_allreduce(garbage, a, b, 4, MNCL_FLOAT32, MNCL_SUM, nullptr); },
      "not a live");
  check("barrier NULL comm", I, [&] { return mncl_barrier(nullptr, nullptr); });
  check("bcast garbage comm", I,
        [&] { return mncl_bcast(garbage, a, 4, MNCL_FLOAT32, 0, nullptr); });
  check("comm_destroy NULL", I, [&] { return mncl_comm_destroy(nullptr); });
  check("comm_destroy garbage", I, [&] { return mncl_comm_destroy(garbage); });
  check("comm_abort NULL", I, [&] { return mncl_comm_abort(nullptr); });
  check("comm_abort garbage", I, [&] { return mncl_comm_abort(garbage); });
  check(
      "comm_rank NULL out", I, [&] { return mncl_comm_rank(comm, nullptr); }, "rank");
  check(
      "comm_size NULL out", I, [&] { return mncl_comm_size(comm, nullptr); }, "size");
  check("comm_backend NULL out", I, [&] { return mncl_comm_backend(comm, nullptr); });
  check("comm_rank garbage comm", I, [&] {
    int r;
    return mncl_comm_rank(garbage, &r);
  });
  check("comm_split NULL out", I, [&] { return mncl_comm_split(comm, 0, 0, nullptr); });
  check(
      "comm_split negative color", I,
      [&] {
        mncl_comm_t n;
        return mncl_comm_split(comm, -7, 0, &n);
      },
      "color");
  check("comm_create NULL out", I, [&] { return mncl_comm_create(nullptr, nullptr); });
  check(
      "wait NULL request", I, [&] { return mncl_wait(nullptr, -1); }, "request");
  check(
      "wait garbage request", I, [&] { return mncl_wait(bad_request, -1); }, "not pending");
  check("test NULL request", I, [&] {
    int d;
    return mncl_test(nullptr, &d);
  });
  check(
      "test NULL done", I, [&] { return mncl_test(bad_request, nullptr); }, "done");
  check(
      "iallreduce NULL request out", I,
      [&] { return mncl_iallreduce(comm, a, b, 4, MNCL_FLOAT32, MNCL_SUM, nullptr, nullptr); },
      "request");

  // --- buffers, enums, roots, peers, counts -----------------------------------------------------
  check(
      "allreduce NULL sendbuf", I,
      [&] { return mncl_allreduce(comm, nullptr, b, 4, MNCL_FLOAT32, MNCL_SUM, nullptr); },
      "sendbuf");
  check(
      "allreduce NULL recvbuf", I,
      [&] { return mncl_allreduce(comm, a, nullptr, 4, MNCL_FLOAT32, MNCL_SUM, nullptr); },
      "recvbuf");
  check("bcast NULL buf", I,
        [&] { return mncl_bcast(comm, nullptr, 4, MNCL_FLOAT32, 0, nullptr); });
  check("reduce NULL recvbuf at root", I,
        [&] { return mncl_reduce(comm, a, nullptr, 4, MNCL_FLOAT32, MNCL_SUM, 0, nullptr); });
  check("gather NULL sendbuf", I,
        [&] { return mncl_gather(comm, nullptr, b, 4, MNCL_FLOAT32, 0, nullptr); });
  check("scatter NULL recvbuf", I,
        [&] { return mncl_scatter(comm, a, nullptr, 4, MNCL_FLOAT32, 0, nullptr); });
  check("allgather NULL recvbuf", I,
        [&] { return mncl_allgather(comm, a, nullptr, 4, MNCL_FLOAT32, nullptr); });
  check("alltoall NULL sendbuf", I,
        [&] { return mncl_alltoall(comm, nullptr, b, 4, MNCL_FLOAT32, nullptr); });
  check("reduce_scatter NULL recvbuf", I,
        [&] { return mncl_reduce_scatter(comm, a, nullptr, 4, MNCL_FLOAT32, MNCL_SUM, nullptr); });
  check(
      "allreduce overlapping buffers", I,
      [&] { return mncl_allreduce(comm, a, a + 1, 4, MNCL_FLOAT32, MNCL_SUM, nullptr); },
      "overlap");
  check(
      "allreduce dtype 99", I,
      [&] { return mncl_allreduce(comm, a, b, 4, bad_dtype, MNCL_SUM, nullptr); }, "dtype");
  check(
      "allreduce dtype -1", I,
      [&] { return mncl_allreduce(comm, a, b, 4, neg_dtype, MNCL_SUM, nullptr); }, "dtype");
  check(
      "bcast dtype 99", I, [&] { return mncl_bcast(comm, a, 4, bad_dtype, 0, nullptr); }, "dtype");
  check(
      "allreduce op 42", I,
      [&] { return mncl_allreduce(comm, a, b, 4, MNCL_FLOAT32, bad_op, nullptr); }, "op");
  check(
      "reduce op -3", I,
      [&] {
        return mncl_reduce(comm, a, b, 4, MNCL_FLOAT32, static_cast<mncl_op_t>(-3), 0, nullptr);
      },
      "op");
  check(
      "reduce_scatter op 42", I,
      [&] { return mncl_reduce_scatter(comm, a, b, 4, MNCL_FLOAT32, bad_op, nullptr); }, "op");
  check(
      "bcast root 1 of 1", I, [&] { return mncl_bcast(comm, a, 4, MNCL_FLOAT32, 1, nullptr); },
      "root");
  check(
      "bcast root -1", I, [&] { return mncl_bcast(comm, a, 4, MNCL_FLOAT32, -1, nullptr); },
      "root");
  check(
      "reduce root 5", I,
      [&] { return mncl_reduce(comm, a, b, 4, MNCL_FLOAT32, MNCL_SUM, 5, nullptr); }, "root");
  check(
      "gather root INT32_MAX", I,
      [&] { return mncl_gather(comm, a, b, 4, MNCL_FLOAT32, INT32_MAX, nullptr); }, "root");
  check(
      "scatter root INT32_MIN", I,
      [&] { return mncl_scatter(comm, a, b, 4, MNCL_FLOAT32, INT32_MIN, nullptr); }, "root");
  check(
      "send peer 3 of 1", I, [&] { return mncl_send(comm, a, 4, MNCL_FLOAT32, 3, nullptr); },
      "peer");
  check(
      "send peer -1", I, [&] { return mncl_send(comm, a, 4, MNCL_FLOAT32, -1, nullptr); }, "peer");
  check(
      "recv from self", I, [&] { return mncl_recv(comm, b, 4, MNCL_FLOAT32, 0, nullptr); }, "peer");
  check(
      "allreduce count SIZE_MAX", I,
      [&] { return mncl_allreduce(comm, a, b, huge, MNCL_FLOAT32, MNCL_SUM, nullptr); },
      "overflow");
  check(
      "allreduce count SIZE_MAX/2+1 x 8 B", I,
      [&] { return mncl_allreduce(comm, a, b, half, MNCL_FLOAT64, MNCL_SUM, nullptr); },
      "overflow");
  check(
      "allgather count SIZE_MAX/2 x 4 B", I,
      [&] { return mncl_allgather(comm, a, b, huge / 2, MNCL_INT32, nullptr); }, "overflow");
  check(
      "bcast count SIZE_MAX", I, [&] { return mncl_bcast(comm, a, huge, MNCL_UINT8, 0, nullptr); },
      "overflow");
  check(
      "alltoall count SIZE_MAX/2", I,
      [&] { return mncl_alltoall(comm, a, b, huge / 2, MNCL_INT64, nullptr); }, "overflow");
  {
    const void *sends[2] = {a, nullptr};
    void *recvs[2] = {b, nullptr};
    const size_t counts[2] = {4, 4};
    const size_t huge_counts[2] = {4, huge};
    check("coalesced NULL arrays", I, [&] {
      return mncl_allreduce_coalesced(comm, nullptr, recvs, counts, 2, MNCL_FLOAT32, MNCL_SUM,
                                      nullptr);
    });
    check(
        "coalesced NULL buffer with count", I,
        [&] {
          return mncl_allreduce_coalesced(comm, sends, recvs, counts, 2, MNCL_FLOAT32, MNCL_SUM,
                                          nullptr);
        },
        "NULL");
    check(
        "coalesced overflowing count", I,
        [&] {
          return mncl_allreduce_coalesced(comm, sends, recvs, huge_counts, 2, MNCL_FLOAT32,
                                          MNCL_SUM, nullptr);
        },
        "overflow");
    // Each count fits; their sum wraps (it once reached the backends, which pack the total).
    const size_t quarter = size_t{1} << 62;
    const void *three_sends[3] = {a, a, a};
    void *three_recvs[3] = {b, b, b};
    const size_t wrapping_counts[3] = {quarter, quarter, quarter};
    check(
        "coalesced counts whose sum overflows", I,
        [&] {
          return mncl_allreduce_coalesced(comm, three_sends, three_recvs, wrapping_counts, 3,
                                          MNCL_UINT8, MNCL_SUM, nullptr);
        },
        "address space");
    check(
        "coalesced dtype 99", I,
        [&] {
          return mncl_allreduce_coalesced(comm, sends, recvs, counts, 1, bad_dtype, MNCL_SUM,
                                          nullptr);
        },
        "dtype");
  }
  {
    // Overlaps across the buffers of one coalesced call (the emulated form runs them one after
    // the other, so any of them would change another buffer's result): refused, naming both.
    float m[64] = {0};
    const size_t counts[3] = {8, 8, 8};
    auto coalesced = [&](std::initializer_list<const void *> s, std::initializer_list<void *> r) {
      const std::vector<const void *> sends(s);
      const std::vector<void *> recvs(r);
      return [=, &comm] {
        return mncl_allreduce_coalesced(comm, sends.data(), recvs.data(), counts, sends.size(),
                                        MNCL_FLOAT32, MNCL_SUM, nullptr);
      };
    };
    check("coalesced recvbufs[2] overlaps recvbufs[0]", I,
          coalesced({m, m + 8, m + 16}, {m + 32, m + 48, m + 36}), "recvbufs[0] and recvbufs[2]");
    check("coalesced recvbufs[0] == recvbufs[1]", I,
          coalesced({m, m + 8, m + 16}, {m + 32, m + 32, m + 48}), "recvbufs[0] and recvbufs[1]");
    check("coalesced recvbufs[0] overlaps sendbufs[1]", I,
          coalesced({m, m + 36, m + 16}, {m + 32, m + 48, m + 56}),
          "recvbufs[0] overlaps sendbufs[1]");
    check("coalesced recvbufs[1] == sendbufs[0]", I,
          coalesced({m, m + 8, m + 16}, {m + 32, m, m + 48}), "recvbufs[1] overlaps sendbufs[0]");
    check("coalesced in-place recvbufs[0] overlaps recvbufs[1]", I,
          coalesced({m, m + 4, m + 16}, {m, m + 4, m + 32}), "recvbufs[0] and recvbufs[1]");
    check(
        "icoalesced recvbufs[1] overlaps sendbufs[0]", I,
        [&] {
          const void *sends[2] = {m, m + 16};
          void *recvs[2] = {m + 32, m + 4};
          return mncl_iallreduce_coalesced(comm, sends, recvs, counts, 2, MNCL_FLOAT32, MNCL_SUM,
                                           nullptr, &req);
        },
        "recvbufs[1] overlaps sendbufs[0]");
    // Still fine: in place per buffer, send buffers sharing memory, empty buffers anywhere.
    expect_ok("coalesced in place, shared sends, empty buffers", [&] {
      const void *sends[4] = {m, m + 8, m + 8, m + 9};
      void *recvs[4] = {m, m + 32, m + 40, m + 33};
      const size_t n[4] = {8, 8, 8, 0};
      return mncl_allreduce_coalesced(comm, sends, recvs, n, 4, MNCL_FLOAT32, MNCL_SUM, nullptr);
    });
  }
  check(
      "iallreduce dtype 99", I,
      [&] { return mncl_iallreduce(comm, a, b, 4, bad_dtype, MNCL_SUM, nullptr, &req); },
      "mncl_iallreduce: dtype");
  // A non-blocking call's messages name it, not the blocking collective the core ran.
  check(
      "ibcast root 9", I, [&] { return mncl_ibcast(comm, a, 4, MNCL_FLOAT32, 9, nullptr, &req); },
      "mncl_ibcast: root");
  check(
      "isend peer 1 of 1", I,
      [&] { return mncl_isend(comm, a, 4, MNCL_FLOAT32, 1, nullptr, &req); }, "mncl_isend: peer");
  check(
      "iallgatherv NULL recvcounts", I,
      [&] {
        size_t displs[1] = {0};
        return mncl_iallgatherv(comm, a, 4, b, nullptr, displs, MNCL_FLOAT32, nullptr, &req);
      },
      "mncl_iallgatherv: recvcounts");
  check(
      "iallreduce NULL request", I,
      [&] { return mncl_iallreduce(comm, a, b, 4, MNCL_FLOAT32, MNCL_SUM, nullptr, nullptr); },
      "mncl_iallreduce: request");
  {
    // And so do the failures of operations on an aborted communicator, at the call or when
    // the request is waited for.
    mncl_comm_t child = nullptr;
    mncl_request_t pending = nullptr;
    if (mncl_comm_split(comm, 0, 0, &child) == MNCL_OK) {
      mncl_comm_abort(child);
      const mncl_status_t started =
          mncl_iallreduce(child, a, b, 4, MNCL_FLOAT32, MNCL_SUM, nullptr, &pending);
      check(
          "iallreduce on an aborted communicator", MNCL_ERR_ABORTED, [&] { return started; },
          "mncl_iallreduce: the communicator was aborted");
      if (started == MNCL_OK) mncl_wait(pending, -1);
      mncl_comm_destroy(child);
    }
    // Waited for: a receive of a pair of ranks (this process and a second one it starts, on a
    // file store), left pending when its communicator is aborted.
    char dir[] = "/tmp/mncl-bad-input-XXXXXX";
    if (mkdtemp(dir) != nullptr) {
      const std::string store = std::string("file://") + dir;
      pid_t other = -1;
      char *child_argv[] = {self, const_cast<char *>("--pair-rank-1"),
                            const_cast<char *>(store.c_str()), nullptr};
      mncl_comm_t pair = nullptr;
      if (posix_spawn(&other, self, nullptr, nullptr, child_argv, environ) == 0 &&
          pair_rank(store.c_str(), 0, &pair) == MNCL_OK &&
          mncl_irecv(pair, a, 4, MNCL_FLOAT32, 1, nullptr, &pending) == MNCL_OK) {
        mncl_comm_abort(pair);
        check(
            "irecv of an aborted communicator, waited", MNCL_ERR_ABORTED,
            [&] { return mncl_wait(pending, -1); }, "mncl_irecv #");
      } else {
        check("a pair of ranks and an irecv", MNCL_OK, [] { return MNCL_ERR_INTERNAL; });
      }
      if (pair) mncl_comm_destroy(pair);
      if (other > 0) waitpid(other, nullptr, 0);
      std::system(("rm -rf '" + std::string(dir) + "'").c_str());
    }
  }
  {
    // A valid request, waited with a bad timeout, then completed properly.
    mncl_request_t r = nullptr;
    if (mncl_iallreduce(comm, a, b, 4, MNCL_FLOAT32, MNCL_SUM, nullptr, &r) == MNCL_OK) {
      check(
          "wait timeout -5", I, [&] { return mncl_wait(r, -5); }, "timeout");
      mncl_wait(r, -1);
      check(
          "wait on a completed request", I, [&] { return mncl_wait(r, -1); }, "not pending");
    }
  }

  // --- config structs --------------------------------------------------------------------------
  auto with_config = [&](const char *name, mncl_status_t expect, auto mutate, const char *needle) {
    mncl_config_t cfg = MNCL_CONFIG_INIT;
    mutate(cfg);
    mncl_comm_t c = nullptr;
    check(
        name, expect, [&] { return mncl_comm_create(&cfg, &c); }, needle);
    if (c) mncl_comm_destroy(c);
  };
  with_config(
      "config struct_size 0", I, [](mncl_config_t &c) { c.struct_size = 0; }, "struct_size");
  with_config(
      "config struct_size 7", I, [](mncl_config_t &c) { c.struct_size = 7; }, "struct_size");
  with_config(
      "config struct_size 1 GiB", I, [](mncl_config_t &c) { c.struct_size = size_t{1} << 30; },
      "struct_size");
  with_config(
      "config wrong magic", I, [](mncl_config_t &c) { c.magic = 0xdeadbeef; }, "magic");
  with_config(
      "config reserved0 set", I, [](mncl_config_t &c) { c.reserved0 = 1; }, "reserved0");
  with_config(
      "config size 0", I, [](mncl_config_t &c) { c.size = 0; }, "size");
  with_config(
      "config size -5", I, [](mncl_config_t &c) { c.size = -5; }, "size");
  with_config(
      "config rank 3 of 1", I,
      [](mncl_config_t &c) {
        c.rank = 3;
        c.size = 1;
      },
      "rank");
  with_config(
      "config rank -2", I, [](mncl_config_t &c) { c.rank = -2; }, "rank");
  with_config(
      "config timeout 0", I, [](mncl_config_t &c) { c.timeout_ms = 0; }, "timeout");
  with_config(
      "config timeout -7", I, [](mncl_config_t &c) { c.timeout_ms = -7; }, "timeout");
  // Past the clocks' range (once: create failed at once with a bogus "did not join" timeout).
  with_config(
      "config timeout INT64_MAX", I,
      [](mncl_config_t &c) { c.timeout_ms = std::numeric_limits<int64_t>::max(); }, "one week");
  with_config(
      "config timeout 2^32 + 1", I, [](mncl_config_t &c) { c.timeout_ms = (int64_t{1} << 32) + 1; },
      "one week");
  with_config(
      "config device -3", I, [](mncl_config_t &c) { c.device = -3; }, "device");
  with_config(
      "config empty backend", I, [](mncl_config_t &c) { c.backend = ""; }, "backend");
  with_config(
      "config bogus bootstrap", I,
      [](mncl_config_t &c) {
        c.size = 2;
        c.rank = 1;
        c.bootstrap = "carrier-pigeon://x";
        c.timeout_ms = 1000;
      },
      "carrier-pigeon");
  with_config(
      "config unknown backend", MNCL_ERR_PLUGIN,
      [](mncl_config_t &c) { c.backend = "no-such-backend"; }, "no-such-backend");

  // --- malformed environment values ------------------------------------------------------------
  check_env("MNCL_TIMEOUT", "abc");
  check_env("MNCL_TIMEOUT", "-1");
  check_env("MNCL_TIMEOUT", "0");
  check_env("MNCL_TIMEOUT", "1e300");
  check_env("MNCL_TIMEOUT", "99999999999999999999");
  check_env("MNCL_TIMEOUT", "nan");
  check_env("MNCL_TIMEOUT", "3s");
  check_env("MNCL_SIZE", "abc");
  check_env("MNCL_SIZE", "-4");
  check_env("MNCL_SIZE", "99999999999");
  check_env("MNCL_RANK", "x1");
  check_env("MNCL_RANK", "7");
  setenv("MNCL_LOCAL_SIZE", "2", 1);  // a local rank past the local size picks no real GPU
  check_env("MNCL_LOCAL_RANK", "2");
  unsetenv("MNCL_LOCAL_SIZE");
  {
    // A launcher that sets both its rank and size wins over another's leftovers: a RANK left
    // from torchrun under mpirun gave every rank the same number (here: rank 1 of 1, refused).
    // MNCL_SIZE is the user's and would hide it.
    unsetenv("MNCL_SIZE");
    const auto create_ok = [](const char *name) {
      expect_ok(name, [] {
        mncl_comm_t c = nullptr;
        const mncl_status_t st = mncl_comm_create(nullptr, &c);
        if (st == MNCL_OK) mncl_comm_destroy(c);
        return st;
      });
    };
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    setenv("RANK", "1", 1);
    create_ok("mncl_comm_create with Open MPI's rank and size beside a stale RANK=1");
    // An sbatch script's exported WORLD_SIZE beside srun's pair.
    for (const char *v : {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "RANK"}) unsetenv(v);
    setenv("WORLD_SIZE", "1", 1);
    setenv("SLURM_STEP_ID", "0", 1);
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "1", 1);
    create_ok("mncl_comm_create with WORLD_SIZE beside SLURM_PROCID/SLURM_NTASKS");
    // No launcher sets both: each variable from the first that sets it.
    for (const char *v : {"WORLD_SIZE", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS"}) {
      unsetenv(v);
    }
    setenv("RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
    create_ok("mncl_comm_create with RANK and OMPI_COMM_WORLD_SIZE alone");
    for (const char *v : {"OMPI_COMM_WORLD_SIZE", "RANK"}) unsetenv(v);
    setenv("MNCL_SIZE", "1", 1);
  }
  check_env("MNCL_DEVICE", "-9");
  check_env("MNCL_DEVICE", "gpu0");
  check_env("MNCL_DEBUG_CHECKS", "yes");
  check_env("MNCL_DEBUG_CHECKS", "2");
  check_env("MNCL_MEMORY", "disk");

  // --- use after destroy ------------------------------------------------------------------------
  mncl_comm_t doomed = nullptr;
  if (mncl_comm_create(nullptr, &doomed) == MNCL_OK) {
    mncl_comm_destroy(doomed);
    check(
        "allreduce on a destroyed comm", I,
        [&] { return mncl_allreduce(doomed, a, b, 4, MNCL_FLOAT32, MNCL_SUM, nullptr); },
        "not a live");
    check(
        "destroy twice", I, [&] { return mncl_comm_destroy(doomed); }, "not a live");
  }

  // --- mncl_last_error: the last failed call's message, as errno --------------------------------
  // Calls that succeed leave it as it was, whether or not they reach the backend (whose calls
  // clear it inside); a request's failure reported by mncl_wait or mncl_test is its own.
  check(
      "a refused call before the successful ones", I,
      [&] { return mncl_bcast(comm, a, 4, MNCL_FLOAT32, 7, nullptr); }, "root 7");
  const std::string refusal = mncl_last_error();
  const auto keeps = [&](const char *name, const std::function<mncl_status_t()> &call) {
    expect_ok(name, call);
    ++g.cases;
    if (refusal != mncl_last_error()) {
      ++g.no_message;
      std::printf("  LAST ERROR after a successful %s: '%s', expected '%s'\n", name,
                  mncl_last_error(), refusal.c_str());
    }
  };
  keeps("mncl_allreduce",
        [&] { return mncl_allreduce(comm, a, b, 4, MNCL_FLOAT32, MNCL_SUM, nullptr); });
  keeps("mncl_comm_rank", [&] {
    int r = -1;
    return mncl_comm_rank(comm, &r);
  });
  keeps("mncl_iallreduce",
        [&] { return mncl_iallreduce(comm, a, b, 4, MNCL_FLOAT32, MNCL_SUM, nullptr, &req); });
  keeps("mncl_wait", [&] { return mncl_wait(req, -1); });
  keeps("mncl_ibarrier", [&] { return mncl_ibarrier(comm, nullptr, &req); });
  keeps("mncl_test", [&] {
    int done = 0;
    mncl_status_t st = MNCL_OK;
    while (st == MNCL_OK && !done) st = mncl_test(req, &done);
    return st;
  });
  keeps("mncl_comm_split and mncl_comm_destroy", [&] {
    mncl_comm_t child = nullptr;
    const mncl_status_t st = mncl_comm_split(comm, 0, 0, &child);
    return st != MNCL_OK ? st : mncl_comm_destroy(child);
  });
  // The communicator is still fine after all of that.
  const bool healthy = mncl_allreduce(comm, a, b, 4, MNCL_FLOAT32, MNCL_SUM, nullptr) == MNCL_OK;
  mncl_comm_destroy(comm);

  const bool ok = g.accepted == 0 && g.wrong_status == 0 && g.no_message == 0 && healthy;
  std::printf(
      "fault.bad_input naive %s accepted bad inputs %d of %d; wrong status %d; without a "
      "message naming the problem %d; communicator usable afterwards: %s\n",
      ok ? "PASS" : "FAIL", g.accepted, g.cases, g.wrong_status, g.no_message,
      healthy ? "yes" : "no");
  return ok ? 0 : 1;
}
