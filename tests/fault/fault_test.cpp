// fault_test: multi-process fault scenarios (tests/fault/README.md). One binary is both the
// driver, which starts the ranks (fork/exec of itself), injects the fault and judges, and the
// worker (--worker), which runs one rank. Every run prints one line
//
//   <name> <backend> PASS|FAIL|SKIP <figure>
//
// and exits 0 on PASS or SKIP. Ranks report to the driver through a pipe, one line each
// ("ready <rank> <pid>" / "result <rank> <status> <monotonic ns> <extra>"); long error messages
// go to files in the run's folder. CLOCK_MONOTONIC is system-wide, so the driver can subtract
// the instant it injected the fault from the instant a rank's call returned.
//
// With --launcher mpirun (the flat backend) the driver starts one `mpirun -np N` instead, which
// starts the ranks; they take their rank from mpirun's environment and report through a FIFO
// in the run's folder (mpirun passes no descriptors on), and mpirun's exit ends the wait.
//
//   fault_test killed|stalled|late|mismatch|abort|aborted_peer|destroyed_peer|
//              exit_without_destroy|abort_destroy|recovery|watchdog|store_bind|store_token|
//              duplicate_rank|plugin_builds|size_mismatch
//              [--backend B] [--ranks N] [--timeout S] [--runs N] [--debug-checks 0|1]
//              [--case
//              allreduce_vs_bcast|count|dtype|root|allgatherv|alltoallv|gatherv|scatterv|
//              gatherv_large|scatterv_large|batch_count|run_ahead|zero_count|coalesced_split|
//              p2p_zero|recv_after_mismatch]
//              [--netns NS0,NS1 --hosts A0,A1]
//              [--launcher fork|mpirun] [--mpirun PATH] [--mpirun-arg ARG]... [--expect-job-end]
//              [--expect-named] [--victim-own-pidns] [--survivors-exit]
#include <fcntl.h>
#include <mncl/mncl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../../sdk/common/free_port.h"

namespace {

// ---------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}
double seconds(int64_t ns) {
  return static_cast<double>(ns) / 1e9;
}

const char *status_name(int s) {
  static const char *const names[] = {"OK",     "INVALID_ARGUMENT", "NOT_SUPPORTED", "TIMEOUT",
                                      "REMOTE", "ABORTED",          "PLUGIN",        "BOOTSTRAP",
                                      "SYSTEM", "INTERNAL",         "IN_PROGRESS"};
  return s >= 0 && s <= 10 ? names[s] : "UNKNOWN";
}
int status_of(const std::string &name) {
  for (int s = 0; s <= 10; ++s) {
    if (name == status_name(s)) return s;
  }
  return -1;
}

std::string env_or(const char *name, const std::string &fallback) {
  const char *v = std::getenv(name);
  return v && *v ? v : fallback;
}
int env_int(const char *name, int fallback) {
  const char *v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

std::string read_file(const std::string &path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int free_port() {
  return mncl::free_loopback_port();  // outside the ephemeral range (see there)
}

// The local addresses (as /proc/net/tcp writes them) listening on a TCP port.
std::vector<std::string> listeners(int port) {
  std::vector<std::string> out;
  for (const char *file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string sl, local, remote, state;
      ls >> sl >> local >> remote >> state;
      const auto colon = local.rfind(':');
      if (state != "0A" || colon == std::string::npos) continue;  // 0A: LISTEN
      if (std::stoi(local.substr(colon + 1), nullptr, 16) != port) continue;
      out.push_back(local.substr(0, colon));
    }
  }
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char *f, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// ---------------------------------------------------------------------------------------------
// Worker side
// ---------------------------------------------------------------------------------------------

struct Worker {
  int rank = -1, size = 0, fd = -1;
  std::string dir, scenario;

  void line(const std::string &text) {
    const std::string l = text + "\n";
    if (fd >= 0 && write(fd, l.data(), l.size()) != static_cast<ssize_t>(l.size())) _exit(9);
  }
  // The pid: under mpirun the driver learns its victim's process only from this line.
  void ready() { line(fmt("ready %d %d", rank, static_cast<int>(getpid()))); }
  // Returns once the driver has every rank's result (Job::release), or after limit_s.
  void linger(double limit_s) const {
    const std::string done = dir + "/reported";
    for (const int64_t end = now_ns() + static_cast<int64_t>(limit_s * 1e9);
         access(done.c_str(), F_OK) != 0 && now_ns() < end;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Reports a call's outcome: status, the instant it returned, extra words; the message goes
  // to <dir>/msg.<rank>.
  void result(mncl_status_t st, int64_t t, const std::string &extra = "-",
              const char *message = nullptr) {
    if (message) std::ofstream(dir + "/msg." + std::to_string(rank)) << message;
    line(fmt("result %d %s %lld %s", rank, status_name(st), static_cast<long long>(t),
             extra.c_str()));
  }
};

int fail_create(Worker &w, mncl_status_t st) {
  std::fprintf(stderr, "rank %d: mncl_comm_create: %s: %s\n", w.rank, status_name(st),
               mncl_last_error());
  w.result(st, now_ns(), "create-failed", mncl_last_error());
  return 3;
}

// Allreduce in a loop until it fails; "ready" after 10 calls. For killed/stalled/recovery.
// pause_ms: once ready, before each allreduce (a rank busy computing between them).
mncl_status_t loop_until_failure(Worker &w, mncl_comm_t comm, int64_t *t_fail, int pause_ms = 0) {
  std::vector<float> send(1024, 1.0f), recv(send.size());
  for (long it = 0;; ++it) {
    if (it > 10 && pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    const mncl_status_t st = mncl_allreduce(comm, send.data(), recv.data(), send.size(),
                                            MNCL_FLOAT32, MNCL_SUM, nullptr);
    if (st != MNCL_OK) {
      *t_fail = now_ns();
      return st;
    }
    if (it == 10) w.ready();
  }
}

int worker_killed(Worker &w) {
  mncl_comm_t comm = nullptr;
  if (auto st = mncl_comm_create(nullptr, &comm); st != MNCL_OK) return fail_create(w, st);
  // --survivors-exit: each survivor exits as soon as it has failed, without destroying the
  // communicator, as an application does; rank 1 is busy for a second between allreduces, so
  // that it comes to the failure after rank 0 did.
  const bool exit_at_once = env_int("FAULT_EXIT_AT_ONCE", 0) != 0;
  int64_t t = 0;
  const mncl_status_t st = loop_until_failure(w, comm, &t, exit_at_once && w.rank == 1 ? 1000 : 0);
  w.result(st, t, "-", mncl_last_error());
  // Rank 0's process hosts the TCP store, which holds the note of the killed rank's end: it
  // stays until every rank has reported. One that exited at once after failing left a rank
  // still checking to find only that rank 0 had exited (a CI run under load: the victim in a
  // pid namespace of its own, which /proc does not show). With --survivors-exit, the library's
  // own linger at exit (Comm::linger_at_exit) is what keeps it.
  if (!exit_at_once) w.linger(2.0 * env_int("MNCL_TIMEOUT", 3) + 30);
  return 0;  // no destroy: the driver measures the failing call itself
}

int worker_recovery(Worker &w) {
  mncl_comm_t comm = nullptr;
  if (auto st = mncl_comm_create(nullptr, &comm); st != MNCL_OK) return fail_create(w, st);
  int64_t t_fail = 0;
  const mncl_status_t st = loop_until_failure(w, comm, &t_fail);
  const std::string first_error = mncl_last_error();
  // The documented way out: abort (no leave protocol with a dead peer), destroy, re-create.
  mncl_comm_abort(comm);
  mncl_comm_destroy(comm);
  mncl_config_t cfg = MNCL_CONFIG_INIT;
  const std::string store = env_or("FAULT_STORE2", "");
  cfg.bootstrap = store.c_str();
  cfg.rank = w.rank;
  cfg.size = w.size - 1;  // the victim is the last rank
  // Survivors notice the death up to one timeout apart (a closed connection at once, a silent
  // peer only at the timeout), so the new rendezvous must allow for that skew.
  cfg.timeout_ms = 4 * 1000 * static_cast<int64_t>(env_int("MNCL_TIMEOUT", 3));
  mncl_comm_t again = nullptr;
  mncl_status_t st2 = mncl_comm_create(&cfg, &again);
  std::string extra = "-";
  if (st2 == MNCL_OK) {
    std::vector<int32_t> send(257, w.rank + 1), recv(send.size(), -1);
    st2 =
        mncl_allreduce(again, send.data(), recv.data(), send.size(), MNCL_INT32, MNCL_SUM, nullptr);
    const int32_t expect = (w.size - 1) * w.size / 2;
    const bool correct = st2 == MNCL_OK && std::all_of(recv.begin(), recv.end(),
                                                       [&](int32_t v) { return v == expect; });
    extra = fmt("%s %s %lld", status_name(st), correct ? "correct" : "wrong",
                static_cast<long long>(t_fail));
    mncl_comm_destroy(again);
  }
  w.result(st2, now_ns(), extra, (first_error + "\n" + mncl_last_error()).c_str());
  return 0;
}

int worker_late(Worker &w) {
  mncl_comm_t comm = nullptr;
  if (auto st = mncl_comm_create(nullptr, &comm); st != MNCL_OK) return fail_create(w, st);
  const int runs = env_int("FAULT_RUNS", 5);
  int failures = 0, wrong = 0;
  std::string first_error;
  std::vector<int64_t> send(100), recv(100);
  for (int i = 0; i < runs; ++i) {
    // Rank i % size arrives one second after the others.
    if (i % w.size == w.rank) std::this_thread::sleep_for(std::chrono::seconds(1));
    for (size_t k = 0; k < send.size(); ++k) send[k] = (w.rank + 1) * static_cast<int64_t>(k + i);
    const mncl_status_t st =
        mncl_allreduce(comm, send.data(), recv.data(), send.size(), MNCL_INT64, MNCL_SUM, nullptr);
    if (st != MNCL_OK) {
      ++failures;
      if (first_error.empty()) first_error = mncl_last_error();
      break;  // the communicator is unusable after a failure
    }
    const int64_t factor = static_cast<int64_t>(w.size) * (w.size + 1) / 2;
    for (size_t k = 0; k < send.size(); ++k) {
      if (recv[k] != factor * static_cast<int64_t>(k + i)) {
        ++wrong;
        break;
      }
    }
  }
  if (failures == 0) mncl_comm_destroy(comm);
  w.result(failures ? MNCL_ERR_TIMEOUT : MNCL_OK, now_ns(), fmt("%d %d", failures, wrong),
           first_error.c_str());
  return 0;
}

// The mismatch cases of gatherv / scatterv: a block of `full` elements in root 0's arrays, half
// of that on the odd ranks. _large takes blocks of 1000000 int32 (4 MB): shm stages them in many
// rounds, so ranks whose own block agrees are still in the call when the others fail.
bool is_rooted_v_case(const std::string &which) {
  return which == "gatherv" || which == "scatterv" || which == "gatherv_large" ||
         which == "scatterv_large";
}
size_t rooted_v_full(const std::string &which) {
  return which == "gatherv_large" || which == "scatterv_large" ? 1000000 : 20;
}
// Element k of rank r's block holds r * kRankStride + k (k < 1000000 in every case).
constexpr int32_t kRankStride = 1000000;

// One mismatched call: odd ranks make variant B of the case, even ranks variant A.
int worker_mismatch(Worker &w) {
  mncl_comm_t comm = nullptr;
  if (auto st = mncl_comm_create(nullptr, &comm); st != MNCL_OK) return fail_create(w, st);
  const std::string which = env_or("FAULT_CASE", "count");
  const bool b = w.rank % 2 == 1;
  size_t count = 20;
  mncl_dtype_t dtype = MNCL_FLOAT32;
  int root = 0;
  bool bcast = false;
  if (which == "allreduce_vs_bcast") bcast = b;
  if (which == "count") count = b ? 10 : 20;
  if (which == "dtype") dtype = b ? MNCL_INT32 : MNCL_FLOAT32;
  if (which == "root") {
    bcast = true;
    root = w.rank < w.size / 2 ? 0 : 1;  // ranks 0, 1 say 0; the upper half says 1
  }
  // Rank r contributes (r + 1) * (i + 1); results are judged against this rank's own call.
  std::vector<float> fs(count), fr(count, -1);
  std::vector<int32_t> is(count), ir(count, -1);
  for (size_t i = 0; i < count; ++i) {
    fs[i] = static_cast<float>((w.rank + 1) * (i + 1));
    is[i] = static_cast<int32_t>((w.rank + 1) * (i + 1));
  }
  const bool f = dtype == MNCL_FLOAT32;
  if (mncl_barrier(comm, nullptr) != MNCL_OK) return fail_create(w, MNCL_ERR_INTERNAL);
  const int64_t t0 = now_ns();
  mncl_status_t st;
  bool correct = true;
  std::string message;  // when set: the error to report rather than mncl_last_error()
  if (which == "batch_count") {
    // A ring shift as one mncl_sendrecv_batch: variant B sends and receives 10 elements, variant
    // A 20, so (at even sizes) every receive disagrees with its sender. Judged against this
    // rank's own call: the receive holds the previous rank's first elements.
    const int next = (w.rank + 1) % w.size, prev = (w.rank + w.size - 1) % w.size;
    const size_t n = b ? 10 : 20;
    std::vector<int32_t> send(n), recv(n, -1);
    for (size_t i = 0; i < n; ++i) send[i] = static_cast<int32_t>(w.rank * 1000 + i);
    const mncl_p2p_op_t ops[] = {
        {sizeof(mncl_p2p_op_t), MNCL_P2P_RECV, prev, recv.data(), n, MNCL_INT32, 0},
        {sizeof(mncl_p2p_op_t), MNCL_P2P_SEND, next, send.data(), n, MNCL_INT32, 0}};
    st = mncl_sendrecv_batch(comm, ops, 2, nullptr);
    for (size_t i = 0; st == MNCL_OK && i < n; ++i) {
      if (recv[i] != static_cast<int32_t>(prev * 1000 + i)) correct = false;
    }
  } else if (which == "allgatherv" || which == "alltoallv") {
    // Variant B expects 10 elements from rank 0, which (even: variant A) sends 20; every rank's
    // own arguments are consistent, so only the peers can tell.
    const size_t n = static_cast<size_t>(w.size), me = static_cast<size_t>(w.rank);
    std::vector<size_t> counts(n, 20), displs(n), sendcounts(n, 20);
    if (b) counts[0] = 10;
    for (size_t i = 1; i < n; ++i) displs[i] = displs[i - 1] + counts[i - 1];
    const size_t total = displs[n - 1] + counts[n - 1];
    std::vector<int32_t> send(which == "alltoallv" ? 20 * n : counts[me]), recv(total, -1);
    for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<int32_t>(w.rank * 1000 + i);
    std::vector<size_t> sdispls(n);
    for (size_t i = 0; i < n; ++i) sdispls[i] = 20 * i;
    if (which == "allgatherv") {
      st = mncl_allgatherv(comm, send.data(), counts[me], recv.data(), counts.data(), displs.data(),
                           MNCL_INT32, nullptr);
    } else {
      st = mncl_alltoallv(comm, send.data(), sendcounts.data(), sdispls.data(), recv.data(),
                          counts.data(), displs.data(), MNCL_INT32, nullptr);
    }
    // Judged against this rank's own call: block i holds rank i's first counts[i] elements
    // (allgatherv) or the counts[i] elements rank i sent here (alltoallv).
    for (size_t i = 0; st == MNCL_OK && i < n; ++i) {
      const size_t first = which == "alltoallv" ? 20 * me : 0;
      for (size_t k = 0; k < counts[i]; ++k) {
        if (recv[displs[i] + k] != static_cast<int32_t>(i * 1000 + first + k)) correct = false;
      }
    }
  } else if (which == "gatherv" || which == "gatherv_large") {
    // Variant B sends 10 elements to root 0, which (even: variant A) expects 20 from every rank
    // (_large: 500000 and 1000000, so that shm runs many rounds). Judged against this rank's own
    // call: on the root, block i holds rank i's first `full` elements.
    const size_t n = static_cast<size_t>(w.size), full = rooted_v_full(which),
                 mine = b ? full / 2 : full;
    std::vector<size_t> counts(n, full), displs(n);
    for (size_t i = 0; i < n; ++i) displs[i] = full * i;
    std::vector<int32_t> send(mine), recv(full * n, -1);
    for (size_t i = 0; i < mine; ++i) send[i] = static_cast<int32_t>(w.rank * kRankStride + i);
    st = mncl_gatherv(comm, send.data(), mine, recv.data(), counts.data(), displs.data(),
                      MNCL_INT32, 0, nullptr);
    for (size_t i = 0; st == MNCL_OK && w.rank == 0 && i < n && correct; ++i) {
      for (size_t k = 0; k < full; ++k) {
        if (recv[full * i + k] != static_cast<int32_t>(i * kRankStride + k)) {
          correct = false;
          break;
        }
      }
    }
  } else if (which == "scatterv" || which == "scatterv_large") {
    // Root 0 (even: variant A) sends 20 elements to every rank; variant B expects 10 (_large:
    // 1000000 and 500000). A rank that accepts a block of another size without an error has a
    // wrong result, even when the elements it kept are right.
    const size_t n = static_cast<size_t>(w.size), full = rooted_v_full(which),
                 mine = b ? full / 2 : full;
    std::vector<size_t> counts(n, full), displs(n);
    for (size_t i = 0; i < n; ++i) displs[i] = full * i;
    std::vector<int32_t> send(full * n), recv(mine, -1);
    for (size_t i = 0; i < send.size(); ++i) {
      send[i] = static_cast<int32_t>(kRankStride * (i / full) + i % full);
    }
    st = mncl_scatterv(comm, send.data(), counts.data(), displs.data(), recv.data(), mine,
                       MNCL_INT32, 0, nullptr);
    if (st == MNCL_OK && mine != full) correct = false;
    for (size_t k = 0; st == MNCL_OK && k < mine; ++k) {
      if (recv[k] != static_cast<int32_t>(kRankStride * w.rank + k)) {
        correct = false;
        break;
      }
    }
  } else if (which == "run_ahead") {
    // Root 0 bcasts 4 elements twice and returns at once (a root waits for nobody); every other
    // rank bcasts 8 elements once. shm's root could run two calls ahead of its receivers and
    // publish the second call over the first's stamp, so a receiver once returned MNCL_OK with
    // the first call's 4 elements and 4 stale ones. Judged against this rank's own call: a
    // receiver that returns MNCL_OK holds 8 elements the root never sent, so it is wrong.
    if (w.rank == 0) {
      st = mncl_bcast(comm, is.data(), 4, MNCL_INT32, 0, nullptr);
      if (st == MNCL_OK) st = mncl_bcast(comm, is.data(), 4, MNCL_INT32, 0, nullptr);
    } else {
      st = mncl_bcast(comm, ir.data(), 8, MNCL_INT32, 0, nullptr);
      if (st == MNCL_OK) correct = false;
    }
  } else if (which == "zero_count") {
    // A bcast of 20 elements where variant B passes count 0 (and returns at once), then a
    // matched allreduce: variant B's allreduce meets the others' bcast, and must not take its
    // data. Judged against this rank's own calls.
    const size_t n = b ? 0 : 20;
    std::vector<int32_t> data(20, -1);
    if (w.rank == 0) data = is;
    st = mncl_bcast(comm, data.data(), n, MNCL_INT32, 0, nullptr);
    for (size_t i = 0; st == MNCL_OK && i < n; ++i) {
      if (data[i] != static_cast<int32_t>(i + 1)) correct = false;
    }
    if (st == MNCL_OK) {
      st = mncl_allreduce(comm, is.data(), ir.data(), 20, MNCL_INT32, MNCL_SUM, nullptr);
      for (size_t i = 0; st == MNCL_OK && i < 20; ++i) {
        if (ir[i] != static_cast<int32_t>(w.size * (w.size + 1) / 2 * (i + 1))) correct = false;
      }
    }
  } else if (which == "coalesced_split") {
    // One allreduce_coalesced of 20 elements in two buffers: variant A splits them 8 + 12,
    // variant B 12 + 8. The totals agree, the buffers do not: backends that compared only the
    // total returned MNCL_OK with elements summed across buffers (an element of buffer 0 with
    // one of buffer 1). Judged against this rank's own call: buffer j, element i is the sum over
    // ranks of (r + 1) * (100 * j + i + 1).
    const size_t counts[2] = {b ? 12u : 8u, b ? 8u : 12u};
    std::vector<int32_t> s0(counts[0]), s1(counts[1]), r0(counts[0], -1), r1(counts[1], -1);
    for (size_t i = 0; i < s0.size(); ++i) s0[i] = static_cast<int32_t>((w.rank + 1) * (i + 1));
    for (size_t i = 0; i < s1.size(); ++i) s1[i] = static_cast<int32_t>((w.rank + 1) * (i + 101));
    const void *sbufs[2] = {s0.data(), s1.data()};
    void *rbufs[2] = {r0.data(), r1.data()};
    st = mncl_allreduce_coalesced(comm, sbufs, rbufs, counts, 2, MNCL_INT32, MNCL_SUM, nullptr);
    const int32_t factor = w.size * (w.size + 1) / 2;
    for (size_t i = 0; st == MNCL_OK && i < r0.size(); ++i) {
      if (r0[i] != static_cast<int32_t>(factor * (i + 1))) correct = false;
    }
    for (size_t i = 0; st == MNCL_OK && i < r1.size(); ++i) {
      if (r1[i] != static_cast<int32_t>(factor * (i + 101))) correct = false;
    }
  } else if (which == "p2p_zero" || which == "recv_after_mismatch") {
    // Point to point between rank 2k (sender) and 2k + 1 (receiver), two messages each:
    //   p2p_zero: sends of 0 then 4 elements, receives of 4 then 0. Both pairs of calls
    //     disagree; gloo skipped empty messages, so its first receive took the second send's 4
    //     elements and returned MNCL_OK.
    //   recv_after_mismatch: sends of 4 then 4 elements, receives of 8 (disagrees) then 4.
    //     naive's failed first receive left the message in place, so the second one took the
    //     first send's elements and returned MNCL_OK.
    // Messages between a pair match in issue order (mncl.h): receive #k matches send #k
    // whatever became of the calls before it. The receiver makes both calls even after a
    // failure; a receive that returns MNCL_OK against a send of another count, or with data
    // other than its own send's, is wrong. A rank without a partner (odd sizes) does nothing.
    const bool zero = which == "p2p_zero";
    const size_t send_n[2] = {zero ? 0u : 4u, 4};
    const size_t recv_n[2] = {zero ? 4u : 8u, zero ? 0u : 4u};
    const bool sender = w.rank % 2 == 0, receiver = !sender;
    const int peer = sender ? w.rank + 1 : w.rank - 1;
    mncl_status_t first_error = MNCL_OK;
    std::string first_message;
    for (int m = 0; m < 2 && peer < w.size; ++m) {
      std::vector<int32_t> data(8, -1);
      // Message m of sender r carries r * 1000 + 100 * m + i.
      for (size_t i = 0; sender && i < send_n[m]; ++i) {
        data[i] = static_cast<int32_t>(w.rank * 1000 + 100 * m + i);
      }
      const mncl_status_t s =
          sender ? mncl_send(comm, data.data(), send_n[m], MNCL_INT32, peer, nullptr)
                 : mncl_recv(comm, data.data(), recv_n[m], MNCL_INT32, peer, nullptr);
      if (s != MNCL_OK && first_error == MNCL_OK) {
        first_error = s;
        first_message = mncl_last_error();
      }
      if (receiver && s == MNCL_OK) {
        if (recv_n[m] != send_n[m]) correct = false;
        for (size_t i = 0; i < recv_n[m]; ++i) {
          if (data[i] != static_cast<int32_t>(peer * 1000 + 100 * m + i)) correct = false;
        }
      }
    }
    // A wrong result is reported with MNCL_OK (the driver counts it so); otherwise the first
    // failure, if any, with its message (a later call may have succeeded since).
    st = correct ? first_error : MNCL_OK;
    message = first_message;
  } else if (bcast) {
    st = f ? mncl_bcast(comm, fs.data(), count, dtype, root, nullptr)
           : mncl_bcast(comm, is.data(), count, dtype, root, nullptr);
  } else {
    st = f ? mncl_allreduce(comm, fs.data(), fr.data(), count, dtype, MNCL_SUM, nullptr)
           : mncl_allreduce(comm, is.data(), ir.data(), count, dtype, MNCL_SUM, nullptr);
  }
  const int64_t t1 = now_ns();
  const bool judged = which == "allgatherv" || which == "alltoallv" || is_rooted_v_case(which) ||
                      which == "batch_count" || which == "run_ahead" || which == "zero_count" ||
                      which == "coalesced_split" || which == "p2p_zero" ||
                      which == "recv_after_mismatch";  // above, against the call's own layout
  if (st == MNCL_OK && !judged) {
    for (size_t i = 0; i < count; ++i) {
      const double expect = bcast ? static_cast<double>((root + 1) * (i + 1))
                                  : static_cast<double>(w.size * (w.size + 1) / 2 * (i + 1));
      const double got = bcast ? (f ? fs[i] : is[i]) : (f ? fr[i] : ir[i]);
      if (got != expect) correct = false;
    }
  }
  w.result(st, t1, fmt("%lld %s", static_cast<long long>(t1 - t0), correct ? "correct" : "wrong"),
           message.empty() ? mncl_last_error() : message.c_str());
  // A failed communicator is abandoned (abort + destroy skips the leave protocol).
  if (st != MNCL_OK) mncl_comm_abort(comm);
  // Rank 0's process hosts the TCP store: it stays until every rank has reported, or a rank
  // still in the call would fail on the lost store (naive keeps every message there) rather
  // than with the call's own verdict.
  w.linger(2.0 * env_int("MNCL_TIMEOUT", 3) + 30);
  mncl_comm_destroy(comm);
  return 0;
}

// The abort scenarios' other ranks: stay alive (and connected) while rank 0 is blocked, then
// abandon the communicator (abort + destroy: no collective, no leave).
int abandon_later(Worker &w, mncl_comm_t comm, mncl_status_t status) {
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  w.result(status, now_ns());
  mncl_comm_abort(comm);
  mncl_comm_destroy(comm);
  return 0;
}

// Creates the communicator and passes a barrier with every rank (met: the barrier's status).
// false when the create failed (reported; the worker then exits 3, as fail_create says).
bool create_and_meet(Worker &w, mncl_comm_t *comm, mncl_status_t *met) {
  if (auto st = mncl_comm_create(nullptr, comm); st != MNCL_OK) {
    fail_create(w, st);
    return false;
  }
  *met = mncl_barrier(*comm, nullptr);
  return true;
}

// The abort scenarios' rank 0: a thread that aborts comm 0.5 s from now, recording when and
// what mncl_comm_abort returned (twice when `second` is given: the second must be harmless).
std::thread abort_later(mncl_comm_t comm, int64_t *t_abort, mncl_status_t *first,
                        mncl_status_t *second = nullptr) {
  return std::thread([=] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    *t_abort = now_ns();
    *first = mncl_comm_abort(comm);
    if (second != nullptr) *second = mncl_comm_abort(comm);
  });
}

// Rank 0 blocks in an allreduce nobody else joins; another thread aborts it.
int worker_abort(Worker &w) {
  mncl_comm_t comm = nullptr;
  if (auto st = mncl_comm_create(nullptr, &comm); st != MNCL_OK) return fail_create(w, st);
  if (w.rank != 0) return abandon_later(w, comm, MNCL_OK);
  int64_t t_abort = 0;
  mncl_status_t first = MNCL_ERR_INTERNAL, second = MNCL_ERR_INTERNAL;
  std::thread aborter = abort_later(comm, &t_abort, &first, &second);
  std::vector<float> buf(1000, 1.0f);
  const mncl_status_t st =
      mncl_allreduce(comm, buf.data(), buf.data(), buf.size(), MNCL_FLOAT32, MNCL_SUM, nullptr);
  const int64_t t = now_ns();
  const std::string message = mncl_last_error();
  aborter.join();
  // A later call fails fast too, and destroy still works.
  const mncl_status_t later = mncl_barrier(comm, nullptr);
  const mncl_status_t destroyed = mncl_comm_destroy(comm);
  w.result(st, t,
           fmt("%lld %s %s %s %s", static_cast<long long>(t_abort), status_name(first),
               status_name(second), status_name(later), status_name(destroyed)),
           message.c_str());
  return 0;
}

// The last rank leaves the communicator once all have passed a barrier; the others go on:
//   aborted_peer: it aborts while they wait in an allreduce for its contribution, and lives on
//     past their timeout (what they must learn of is the abort, not a process that exited);
//   exit_without_destroy: it exits without mncl_comm_destroy; they destroy the communicator,
//     whose rank 0 waits for every rank to leave;
//   destroyed_peer: it destroys the communicator while they wait for it in an allreduce, and
//     its process then ends at once (a destroy of a rank other than the store's host waits for
//     no one): they must name the destroy, which a backend that sees the process end (shm)
//     reports as a death.
int worker_last_rank_leaves(Worker &w) {
  const bool aborts = w.scenario == "aborted_peer";
  const bool destroys = w.scenario == "destroyed_peer";
  mncl_comm_t comm = nullptr;
  mncl_status_t st = MNCL_OK;
  if (!create_and_meet(w, &comm, &st)) return 3;
  const int last = w.size - 1;
  if (destroys && w.rank == last) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // they wait
    w.result(st, now_ns());
    if (st == MNCL_OK) mncl_comm_destroy(comm);
    return 0;
  }
  if (w.rank == last) {
    if (aborts) std::this_thread::sleep_for(std::chrono::milliseconds(500));  // they wait
    const int64_t t = now_ns();
    if (aborts && st == MNCL_OK) st = mncl_comm_abort(comm);
    w.result(st, t);
    if (!aborts) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // they leave the barrier
      _exit(0);
    }
    std::this_thread::sleep_for(std::chrono::seconds(env_int("MNCL_TIMEOUT", 3) + 1));
    mncl_comm_destroy(comm);
    return 0;
  }
  if (aborts || destroys) {  // the others wait for the last rank's part
    std::vector<float> buf(1000, 1.0f);
    if (st == MNCL_OK) {
      st =
          mncl_allreduce(comm, buf.data(), buf.data(), buf.size(), MNCL_FLOAT32, MNCL_SUM, nullptr);
    }
    w.result(st, now_ns(), "-", mncl_last_error());
    mncl_comm_abort(comm);  // the documented way out after a failure
    mncl_comm_destroy(comm);
    return 0;
  }
  const int64_t t0 = now_ns();
  if (st == MNCL_OK) st = mncl_comm_destroy(comm);
  const int64_t t1 = now_ns();
  w.result(st, t1, fmt("%lld", static_cast<long long>(t1 - t0)), mncl_last_error());
  return 0;
}

// Rank 0 waits in mncl_comm_destroy for a rank that does not leave (rank 1 sleeps, then
// abandons the communicator: abort + destroy, no leave); another thread of rank 0 aborts it.
int worker_abort_destroy(Worker &w) {
  mncl_comm_t comm = nullptr;
  mncl_status_t joined = MNCL_OK;
  if (!create_and_meet(w, &comm, &joined)) return 3;
  if (w.rank != 0) return abandon_later(w, comm, joined);
  int64_t t_abort = 0;
  mncl_status_t aborted = MNCL_ERR_INTERNAL;
  std::thread aborter = abort_later(comm, &t_abort, &aborted);
  const mncl_status_t st = joined != MNCL_OK ? joined : mncl_comm_destroy(comm);
  const int64_t t = now_ns();
  const std::string message = mncl_last_error();
  aborter.join();
  // The handle is gone now, whatever destroy said.
  const mncl_status_t after = mncl_comm_abort(comm);
  w.result(
      st, t,
      fmt("%lld %s %s", static_cast<long long>(t_abort), status_name(aborted), status_name(after)),
      message.c_str());
  return 0;
}

// Every rank calls into a plugin that never returns (the "hang" mock).
int worker_watchdog(Worker &w) {
  mncl_comm_t comm = nullptr;
  mncl_status_t met = MNCL_OK;
  if (!create_and_meet(w, &comm, &met)) return 3;
  std::vector<float> buf(1024, 1.0f);
  const int64_t t0 = now_ns();
  const mncl_status_t st =
      mncl_allreduce(comm, buf.data(), buf.data(), buf.size(), MNCL_FLOAT32, MNCL_SUM, nullptr);
  const int64_t t1 = now_ns();
  w.result(st, t1, fmt("%lld", static_cast<long long>(t1 - t0)), mncl_last_error());
  mncl_comm_destroy(comm);
  return 0;
}

// Creates a communicator and reports; the driver inspects the listening sockets meanwhile.
int worker_store(Worker &w) {
  if (env_int("FAULT_AFTER_LISTEN", 0)) {
    // duplicate_rank: start only once another process serves the store, so that the test
    // chooses which of two "rank 0"s binds the address first.
    const std::string url = env_or("MNCL_STORE", "");
    const int port = std::atoi(url.substr(url.rfind(':') + 1).c_str());
    for (int i = 0; i < 3000 && listeners(port).empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  mncl_comm_t comm = nullptr;
  const int64_t t0 = now_ns();
  mncl_status_t st = mncl_comm_create(nullptr, &comm);
  const int64_t t1 = now_ns();
  std::string message = mncl_last_error();
  if (st == MNCL_OK && w.scenario == "size_mismatch") {
    // The job that was created must be whole: an allreduce over every rank it counts.
    int size = 0, value = 0;
    mncl_comm_size(comm, &size);
    value = w.rank + 1;
    st = mncl_allreduce(comm, &value, &value, 1, MNCL_INT32, MNCL_SUM, nullptr);
    message = st != MNCL_OK ? mncl_last_error() : "";
    if (st == MNCL_OK && value != size * (size + 1) / 2) {
      st = MNCL_ERR_INTERNAL;
      message =
          fmt("the allreduce over %d ranks gave %d, not %d", size, value, size * (size + 1) / 2);
    }
  }
  if (st == MNCL_OK) w.ready();
  w.result(st, t1, fmt("%lld", static_cast<long long>(t1 - t0)), message.c_str());
  if (st == MNCL_OK) {
    // Hold the store up until the driver has looked at it.
    std::this_thread::sleep_for(std::chrono::milliseconds(env_int("FAULT_HOLD_MS", 0)));
    // size_mismatch: until the driver has every result (a stray reads the store meanwhile).
    if (env_int("FAULT_LINGER", 0)) w.linger(60);
    mncl_comm_destroy(comm);
  }
  return 0;
}

int worker_main() {
  Worker w;
  // Under mpirun every rank gets the same environment: the rank is mpirun's.
  w.rank = env_int("MNCL_RANK", env_int("OMPI_COMM_WORLD_RANK", -1));
  w.size = env_int("MNCL_SIZE", env_int("OMPI_COMM_WORLD_SIZE", 0));
  w.rank = env_int("FAULT_REPORT_AS", w.rank);  // duplicate_rank: two processes of one rank
  w.fd = env_int("FAULT_RESULT_FD", -1);
  if (const std::string fifo = env_or("FAULT_RESULT_FIFO", ""); w.fd < 0 && !fifo.empty()) {
    w.fd = open(fifo.c_str(), O_WRONLY | O_CLOEXEC);  // the driver holds the read end open
  }
  w.dir = env_or("FAULT_DIR", "/tmp");
  w.scenario = env_or("FAULT_SCENARIO", "");
  if (w.scenario == "killed" || w.scenario == "stalled" || w.scenario == "link_cut") {
    return worker_killed(w);
  }
  if (w.scenario == "recovery") return worker_recovery(w);
  if (w.scenario == "late") return worker_late(w);
  if (w.scenario == "mismatch") return worker_mismatch(w);
  if (w.scenario == "abort") return worker_abort(w);
  if (w.scenario == "aborted_peer" || w.scenario == "exit_without_destroy" ||
      w.scenario == "destroyed_peer") {
    return worker_last_rank_leaves(w);
  }
  if (w.scenario == "abort_destroy") return worker_abort_destroy(w);
  if (w.scenario == "watchdog") return worker_watchdog(w);
  if (w.scenario == "store_bind" || w.scenario == "store_token" || w.scenario == "duplicate_rank" ||
      w.scenario == "plugin_builds" || w.scenario == "size_mismatch") {
    return worker_store(w);
  }
  std::fprintf(stderr, "worker: unknown scenario '%s'\n", w.scenario.c_str());
  return 2;
}

// ---------------------------------------------------------------------------------------------
// Driver side
// ---------------------------------------------------------------------------------------------

struct Options {
  std::string scenario, backend = "naive", which = "count";
  int ranks = 4, timeout_s = 3, runs = 1, debug_checks = 0;
  bool known_issue = false;               // a documented limitation: report XFAIL instead of FAIL
  std::vector<std::string> netns, hosts;  // multi-host runs: rank r in netns[r % n]
  std::string cut;                        // shell command that cuts the link (link_cut)
  std::string launcher = "fork";          // mpirun: one mpirun starts the ranks (flat)
  std::string mpirun = "mpirun";
  std::vector<std::string> mpirun_args;  // e.g. --enable-recovery
  bool expect_job_end = false;           // killed: mpirun ends the job (its default); judge that
  // killed, aborted_peer: every survivor must fail with REMOTE naming the dead (or aborting)
  // rank, not at its timeout (backends that notice a gone peer)
  bool expect_named = false;
  // killed, exit_without_destroy: the last rank runs in a pid namespace of its own, as in a
  // container or on another host: the others cannot judge its process through /proc, only through
  // the store (the connection it leaves open there ends with it). Needs root; SKIP otherwise.
  bool victim_own_pidns = false;
  // killed: the survivors exit as soon as they have failed (no destroy), rank 1 a second after
  // rank 0, the store's host, which must keep the note of the victim's end until it has read it.
  bool survivors_exit = false;
};

struct Event {
  std::string kind;  // ready | result
  int rank = -1;
  int status = -1;
  int64_t t = 0;
  std::vector<std::string> extra;
};

class Job {
 public:
  Job(const Options &o, int ranks, std::map<std::string, std::string> env,
      std::function<void(int, std::map<std::string, std::string> &)> per_rank = nullptr)
      : ranks_(ranks) {
    char tmpl[] = "/tmp/mncl-fault-XXXXXX";
    if (!mkdtemp(tmpl)) {
      std::perror("mkdtemp");
      std::exit(1);
    }
    dir_ = tmpl;
    int fds[2] = {-1, -1};
    if (o.launcher == "mpirun") {
      const std::string fifo = dir_ + "/events";
      if (mkfifo(fifo.c_str(), 0600) != 0) {
        std::perror("mkfifo");
        std::exit(1);
      }
      read_fd_ = open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
      // A writer of our own: the FIFO never reads as EOF while ranks come and go (mpirun's
      // exit ends the wait instead).
      keep_fd_ = open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
      env["FAULT_RESULT_FIFO"] = fifo;
    } else {
      if (pipe2(fds, O_CLOEXEC) != 0) {
        std::perror("pipe");
        std::exit(1);
      }
      read_fd_ = fds[0];
    }
    std::string host0 = o.hosts.empty() ? "127.0.0.1" : o.hosts[0];
    if (env.find("MNCL_STORE") == env.end()) {
      env["MNCL_STORE"] = fmt("tcp://%s:%d", host0.c_str(), free_port());
    }
    env["MNCL_TIMEOUT"] = std::to_string(o.timeout_s);
    env["MNCL_SIZE"] = std::to_string(ranks);
    env["FAULT_SCENARIO"] = o.scenario;
    env["FAULT_DIR"] = dir_;
    if (env.count("MNCL_BACKEND") == 0) env["MNCL_BACKEND"] = o.backend;
    if (o.debug_checks) env["MNCL_DEBUG_CHECKS"] = "1";
    // flat's blocking calls are bounded only when polled (unless the caller says otherwise).
    if (o.backend == "flat") env["MNCL_FLAT_BOUNDED"] = env_or("MNCL_FLAT_BOUNDED", "1");
    store_ = env["MNCL_STORE"];
    if (o.launcher == "mpirun") {
      // The ranks inherit mpirun's environment (all on this host); MNCL_RANK stays unset, so
      // each takes OMPI_COMM_WORLD_RANK. --oversubscribe: CI has fewer cores than ranks.
      std::vector<std::string> args = {o.mpirun,          "-np",       std::to_string(ranks),
                                       "--oversubscribe", "--bind-to", "none"};
      args.insert(args.end(), o.mpirun_args.begin(), o.mpirun_args.end());
      args.insert(args.end(), {self(), "--worker"});
      launcher_ = spawn(args, env, -1);
      return;
    }
    for (int r = 0; r < ranks; ++r) {
      auto e = env;
      e["MNCL_RANK"] = std::to_string(r);
      const int nhosts = o.netns.empty() ? 1 : static_cast<int>(o.netns.size());
      e["MNCL_LOCAL_RANK"] = std::to_string(r / nhosts);
      e["MNCL_LOCAL_SIZE"] = std::to_string((ranks - r % nhosts + nhosts - 1) / nhosts);
      if (!o.netns.empty()) e["MNCL_GLOO_IFACE"] = "veth-" + o.netns[r % nhosts];
      if (per_rank) per_rank(r, e);
      std::vector<std::string> args = {self(), "--worker"};
      if (o.victim_own_pidns && r == ranks - 1) {
        // Killing unshare kills the rank (--kill-child), pid 1 of its namespace. /proc stays
        // the host's, which the rank sees is not its namespace's: it has no identity to judge.
        args = {"unshare", "--pid", "--fork", "--kill-child", self(), "--worker"};
      } else if (!o.netns.empty()) {
        // A namespace is a host: its own network, and its own host name (UTS namespace).
        const std::string &ns = o.netns[r % nhosts];
        args = {"ip",   "netns",   "exec",
                ns,     "unshare", "--uts",
                "sh",   "-c",      "hostname \"mncl-$1\" && exec \"$0\" --worker",
                self(), ns};
      }
      pids_.push_back(spawn(args, e, fds[1]));
    }
    close(fds[1]);
  }
  ~Job() {
    for (pid_t p : pids_) {
      kill(p, SIGCONT);
      kill(p, SIGKILL);
    }
    for (pid_t p : pids_) waitpid(p, nullptr, 0);
    if (launcher_ > 0) stop_mpirun();
    close(read_fd_);
    if (keep_fd_ >= 0) close(keep_fd_);
    std::filesystem::remove_all(dir_);
  }

  static std::string self() {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "/proc/self/exe";
  }

  // Reads events until `done` says so or the deadline passes; returns false on timeout/EOF (or
  // once mpirun has exited).
  bool read_until(double timeout_s, const std::function<bool()> &done) {
    const int64_t deadline = now_ns() + static_cast<int64_t>(timeout_s * 1e9);
    while (!done()) {
      const int64_t left_ms = (deadline - now_ns()) / 1000000;
      if (left_ms <= 0) return false;
      pollfd p{read_fd_, POLLIN, 0};
      const bool ended = launcher_ended();  // before the read: its ranks' last lines count
      if (poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 100))) > 0) {
        char buf[4096];
        const ssize_t n = read(read_fd_, buf, sizeof buf);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return done();
        if (n > 0) parse(buf, static_cast<size_t>(n));
        continue;  // drain before judging by mpirun's exit
      }
      if (ended) return done();
    }
    return true;
  }
  bool all_ready(double timeout_s) {
    return read_until(timeout_s, [&] { return static_cast<int>(ready_.size()) == ranks_; });
  }
  bool results_from(const std::vector<int> &ranks, double timeout_s) {
    return read_until(timeout_s, [&] {
      for (int r : ranks) {
        if (!results_.count(r)) return false;
      }
      return true;
    });
  }
  std::string message(int rank) const { return read_file(dir_ + "/msg." + std::to_string(rank)); }
  // Lets ranks that wait in Worker::linger go on.
  void release() const { std::ofstream(dir_ + "/reported") << "1\n"; }
  // Waits (up to timeout_s) for the ranks started by fork to exit on their own: a job's keys
  // in a file store are gone once its ranks have destroyed their communicators.
  bool exited(double timeout_s) {
    const int64_t deadline = now_ns() + static_cast<int64_t>(timeout_s * 1e9);
    while (!pids_.empty() && now_ns() < deadline) {
      pids_.erase(std::remove_if(pids_.begin(), pids_.end(),
                                 [](pid_t p) { return waitpid(p, nullptr, WNOHANG) == p; }),
                  pids_.end());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pids_.empty();
  }
  // Under mpirun: the pid the rank reported with "ready" (-1 before that).
  pid_t pid(int rank) const {
    if (launcher_ <= 0) return pids_[static_cast<size_t>(rank)];
    auto it = ready_.find(rank);
    return it == ready_.end() || it->second.extra.empty() ? -1
                                                          : std::atoi(it->second.extra[0].c_str());
  }
  // Signals a rank's process (false if its pid is unknown: never kill(-1, ...)).
  bool signal(int rank, int sig) const {
    const pid_t p = pid(rank);
    return p > 0 && kill(p, sig) == 0;
  }
  const std::map<int, Event> &results() const { return results_; }
  const std::string &store() const { return store_; }
  // mpirun only: the instant mpirun was seen to have exited (0 while it runs), its wait status.
  int64_t launcher_exit_ns() {
    launcher_ended();
    return launcher_exit_ns_;
  }
  int launcher_status() const { return launcher_status_; }
  // mpirun only: waits up to timeout_s for mpirun to exit; launcher_exit_ns() then.
  int64_t launcher_exit_within(double timeout_s) {
    const int64_t deadline = now_ns() + static_cast<int64_t>(timeout_s * 1e9);
    while (!launcher_ended() && now_ns() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return launcher_exit_ns_;
  }

 private:
  // fork + exec of args with env; pipe_fd (>= 0) becomes the child's FAULT_RESULT_FD.
  static pid_t spawn(std::vector<std::string> args, const std::map<std::string, std::string> &env,
                     int pipe_fd) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      std::exit(1);
    }
    if (pid > 0) return pid;
    if (pipe_fd >= 0) {
      const int wfd = dup(pipe_fd);  // without O_CLOEXEC
      setenv("FAULT_RESULT_FD", std::to_string(wfd).c_str(), 1);
    } else {
      const int null = open("/dev/null", O_RDONLY);  // mpirun would forward our stdin to rank 0
      if (null >= 0) dup2(null, 0);
    }
    for (const auto &[k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::perror("execvp");
    _exit(127);
  }

  void parse(const char *buf, size_t n) {
    pending_.append(buf, n);
    for (size_t nl; (nl = pending_.find('\n')) != std::string::npos;) {
      std::istringstream in(pending_.substr(0, nl));
      pending_.erase(0, nl + 1);
      Event e;
      in >> e.kind >> e.rank;
      if (e.kind == "result") {
        std::string st;
        long long t = 0;
        in >> st >> t;
        e.status = status_of(st);
        e.t = t;
      }
      for (std::string word; in >> word;) e.extra.push_back(word);
      (e.kind == "result" ? results_ : ready_).insert_or_assign(e.rank, e);
    }
  }

  bool launcher_ended() {
    if (launcher_ <= 0 || launcher_exit_ns_ != 0) return launcher_exit_ns_ != 0;
    if (waitpid(launcher_, &launcher_status_, WNOHANG) == launcher_) launcher_exit_ns_ = now_ns();
    return launcher_exit_ns_ != 0;
  }
  // A reported pid that is still one of our ranks (not reused since).
  bool is_our_rank(pid_t p) const {
    char buf[4096];
    const ssize_t n =
        readlink(fmt("/proc/%d/exe", static_cast<int>(p)).c_str(), buf, sizeof buf - 1);
    return p > 0 && n > 0 && std::string(buf, static_cast<size_t>(n)) == self();
  }
  // mpirun ends its job on SIGTERM (and SIGKILLs what does not go); a stopped rank must run
  // again to die of SIGTERM. Ranks it leaves behind are killed by their reported pids.
  void stop_mpirun() {
    for (int r = 0; r < ranks_; ++r) {
      if (is_our_rank(pid(r))) kill(pid(r), SIGCONT);
    }
    const auto wait_for = [&](double s) {
      for (int64_t end = now_ns() + static_cast<int64_t>(s * 1e9); now_ns() < end;) {
        if (launcher_ended()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      return launcher_ended();
    };
    if (!launcher_ended()) kill(launcher_, SIGTERM);
    if (!wait_for(10)) {
      kill(launcher_, SIGKILL);
      waitpid(launcher_, &launcher_status_, 0);
    }
    for (int r = 0; r < ranks_; ++r) {
      if (is_our_rank(pid(r))) kill(pid(r), SIGKILL);
    }
  }

  int ranks_;
  std::string dir_, store_, pending_;
  int read_fd_ = -1, keep_fd_ = -1;
  std::vector<pid_t> pids_;
  pid_t launcher_ = -1;  // mpirun
  int64_t launcher_exit_ns_ = 0;
  int launcher_status_ = 0;
  std::map<int, Event> ready_, results_;
};

int report(const std::string &name, const Options &o, bool ok, const std::string &figure) {
  const char *result = ok ? "PASS" : o.known_issue ? "XFAIL" : "FAIL";
  // A plugin given by path is named by its file: ".../libmncl-hang.so" -> "hang".
  std::string backend = o.backend.substr(o.backend.rfind('/') + 1);
  if (backend.rfind("libmncl-", 0) == 0) backend = backend.substr(8, backend.rfind(".so") - 8);
  std::printf("%s %s %s %s\n", name.c_str(), backend.c_str(), result, figure.c_str());
  std::fflush(stdout);
  return ok || o.known_issue ? 0 : 1;
}
std::string test_name(const Options &o, const std::string &what) {
  return fmt("fault.%s.np%d", what.c_str(), o.ranks);
}

// --victim-own-pidns needs unshare --pid (root, util-linux): false after printing SKIP and
// the reason where it cannot be had.
bool own_pidns_available(const std::string &name, const Options &o) {
  if (!o.victim_own_pidns || std::system("unshare --pid --fork true >/dev/null 2>&1") == 0) {
    return true;
  }
  std::printf(
      "%s %s SKIP cannot start a process in a pid namespace of its own (unshare --pid "
      "needs root, and util-linux)\n",
      name.c_str(), o.backend.c_str());
  return false;
}

std::vector<int> survivors(int ranks, int victim) {
  std::vector<int> out;
  for (int r = 0; r < ranks; ++r) {
    if (r != victim) out.push_back(r);
  }
  return out;
}

// (1) kill -9 and (2) SIGSTOP one rank in an allreduce loop; (10) or cut the link between the
// network namespaces the ranks run in (every rank must fail then).
int drive_killed(const Options &o, bool stop) {
  const bool cut = !o.cut.empty();
  const std::string name = test_name(o, cut                  ? "link_cut"
                                        : stop               ? "stalled_rank"
                                        : o.expect_job_end   ? "killed_rank.default_mpirun"
                                        : o.survivors_exit   ? "killed_rank.store_host_exits"
                                        : o.victim_own_pidns ? "killed_rank.own_pidns"
                                                             : "killed_rank");
  if (!own_pidns_available(name, o)) return 0;
  std::map<std::string, std::string> env;
  if (o.survivors_exit) env["FAULT_EXIT_AT_ONCE"] = "1";
  Job job(o, o.ranks, env);
  if (!job.all_ready(60)) {
    return report(name, o, false, "the ranks did not reach their allreduce loop");
  }
  const int victim = cut ? -1 : o.ranks - 1;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const int64_t t_fault = now_ns();
  if (cut) {
    if (std::system(o.cut.c_str()) != 0) return report(name, o, false, "cannot cut: " + o.cut);
  } else if (!job.signal(victim, stop ? SIGSTOP : SIGKILL)) {
    return report(name, o, false, fmt("cannot signal rank %d", victim));
  }
  const auto others = survivors(o.ranks, victim);
  const double bound = o.timeout_s + 1.0;
  job.results_from(others, bound + 10);
  // mpirun only: it ended the job. The survivors report their failure first (the core's watch
  // finds the dead rank within a moment), so the job's end is waited for here.
  const int64_t t_end =
      o.expect_job_end ? job.launcher_exit_within(bound + 10) : job.launcher_exit_ns();
  if (o.expect_job_end) {
    // mpirun's default: a rank's death ends the whole job. Judged: it ends, and in time.
    const double after = t_end ? seconds(t_end - t_fault) : -1;
    const int st = job.launcher_status();
    return report(name, o, t_end && after <= bound,
                  t_end ? fmt("mpirun ended the whole job %.2f s after the kill (bound %.1f s, "
                              "mpirun exit %d); %zu/%zu survivors returned before it",
                              after, bound, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st),
                              job.results().size(), others.size())
                        : fmt("the job still runs %.1f s after the kill", bound + 10));
  }
  if (t_end && job.results().size() < others.size()) {
    std::fprintf(stderr,
                 "%s: mpirun ended the job %.2f s after the fault (its default on a rank's "
                 "death; --mpirun-arg --enable-recovery keeps the survivors running)\n",
                 name.c_str(), seconds(t_end - t_fault));
  }
  std::vector<double> latencies;
  int erroring = 0;
  bool ok = true;
  std::string problems;
  for (int r : others) {
    auto it = job.results().find(r);
    if (it == job.results().end()) {
      ok = false;
      problems += fmt(" rank %d never returned;", r);
      continue;
    }
    const Event &e = it->second;
    const double lat = seconds(e.t - t_fault);
    latencies.push_back(lat);
    const bool expected = e.status == MNCL_ERR_REMOTE || e.status == MNCL_ERR_TIMEOUT;
    if (expected) ++erroring;
    if (!expected || lat > bound) {
      ok = false;
      problems += fmt(" rank %d: %s after %.2f s;", r, status_name(e.status), lat);
    }
    if (o.expect_named && !stop && !cut) {
      // The backend noticed the rank's death: REMOTE, naming it, not the timeout. "rank N (pid",
      // as the watch (and shm) name a rank they found gone: the diagnosis of a failed
      // collective names it too ("missing: rank N"), but whatever the cause.
      const std::string m = job.message(r);
      if (e.status != MNCL_ERR_REMOTE || m.find(fmt("rank %d (pid", victim)) == std::string::npos) {
        ok = false;
        problems += fmt(" rank %d: %s, not REMOTE naming rank %d: %s;", r, status_name(e.status),
                        victim, m.c_str());
      }
    }
    if (stop) {
      // The message must name the operation with its number and the missing rank.
      const std::string m = job.message(r);
      const bool names_op = m.find("mncl_allreduce #") != std::string::npos;
      const bool names_rank = m.find(fmt("missing: rank %d", victim)) != std::string::npos ||
                              m.find(fmt(", %d (no report", victim)) != std::string::npos;
      if (!names_op || !names_rank) {
        ok = false;
        problems += fmt(" rank %d's message lacks the %s: %s;", r,
                        names_op ? "missing rank" : "operation", m.c_str());
      }
    }
  }
  if (!problems.empty()) std::fprintf(stderr, "%s:%s\n", name.c_str(), problems.c_str());
  if ((stop || o.expect_named) && !others.empty() && job.results().count(others[0])) {
    std::fprintf(stderr, "%s: rank %d's message: %s\n", name.c_str(), others[0],
                 job.message(others[0]).c_str());
  }
  const double mx = latencies.empty() ? 0 : *std::max_element(latencies.begin(), latencies.end());
  return report(name, o, ok,
                fmt("detection max %.2f s median %.2f s (bound %.1f s); survivors erroring "
                    "%d/%zu",
                    mx, median(latencies), bound, erroring, others.size()));
}

// (3) one rank 1 s late in every call, 3 s timeout: no false timeouts.
int drive_late(const Options &o) {
  const std::string name = test_name(o, "late_rank");
  Job job(o, o.ranks, {{"FAULT_RUNS", std::to_string(o.runs)}});
  std::vector<int> all = survivors(o.ranks, -1);
  job.results_from(all, o.runs * (1.5 + o.timeout_s) + 60);
  int false_timeouts = 0, wrong = 0, missing = 0;
  for (int r : all) {
    auto it = job.results().find(r);
    if (it == job.results().end()) {
      ++missing;
      continue;
    }
    if (it->second.status != MNCL_OK) {
      ++false_timeouts;
      std::fprintf(stderr, "%s: rank %d: %s\n", name.c_str(), r, job.message(r).c_str());
    }
    if (it->second.extra.size() >= 2) wrong += std::atoi(it->second.extra[1].c_str());
  }
  return report(name, o, false_timeouts == 0 && wrong == 0 && missing == 0,
                fmt("%d runs (a rank 1 s late, timeout %d s): %d false timeouts, %d wrong "
                    "results%s",
                    o.runs, o.timeout_s, false_timeouts, wrong,
                    missing ? fmt(", %d ranks never reported", missing).c_str() : ""));
}

// (4) mismatched collectives, with or without MNCL_DEBUG_CHECKS.
int drive_mismatch(const Options &o) {
  const std::string name =
      test_name(o, fmt("mismatch.%s%s", o.which.c_str(), o.debug_checks ? ".checks" : ""));
  // What each side's fingerprint shows, so that the message can be checked for both. The
  // per-rank counts (gatherv, scatterv, alltoallv) are compared after the fingerprints; every
  // rank names the first disagreement, rank 1's (the first odd rank) with root / rank 0. A
  // backend without v5's kinds runs gatherv and scatterv as an alltoallv, whose check names
  // them in its own terms (the second pair).
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> names = {
      {"allreduce_vs_bcast", {{"allreduce(", "bcast("}}},
      {"count", {{"count 20", "count 10"}}},
      {"dtype", {{"float32", "int32"}}},
      {"root", {{"root 0", "root 1"}}},
      {"allgatherv", {{"recvcounts 20", "recvcounts 10"}}},
      {"gatherv",
       {{"rank 1 passes sendcount 10", "root 0's recvcounts[1] is 20"},
        {"rank 1's sendcounts[0] is 10", "rank 0's recvcounts[1] is 20"}}},
      {"scatterv",
       {{"rank 1 passes recvcount 10", "root 0's sendcounts[1] is 20"},
        {"rank 0's sendcounts[1] is 20", "rank 1's recvcounts[0] is 10"}}},
      {"alltoallv", {{"rank 0's sendcounts[1] is 20", "rank 1's recvcounts[0] is 10"}}}};
  const auto names_both = [&](const std::string &m) {
    for (const auto &[a, b] : names[o.which]) {
      if (m.find(a) != std::string::npos && m.find(b) != std::string::npos) return true;
    }
    return false;
  };
  // gatherv / scatterv without the checks: every rank that fails (any may complete: its own
  // block agreed, or it sent its block before the receiver checked it) fails with
  // MNCL_ERR_REMOTE naming both counts of a disagreeing block, the root's and the rank's,
  // whoever found it: not a lost connection, an abort or a bare "rank N found mismatched calls"
  // (gloo's sender once got the receiver's poison, shm's others a peer's abort).
  const bool rooted_v = !o.debug_checks && is_rooted_v_case(o.which);
  const size_t full = rooted_v_full(o.which);
  const auto names_counts = [&](const std::string &m) {
    const auto has_number = [&](size_t v) {
      const std::string d = std::to_string(v);
      for (size_t at = m.find(d); at != std::string::npos; at = m.find(d, at + 1)) {
        const size_t end = at + d.size();
        if ((at == 0 || !std::isdigit(static_cast<unsigned char>(m[at - 1]))) &&
            (end == m.size() || !std::isdigit(static_cast<unsigned char>(m[end])))) {
          return true;
        }
      }
      return false;
    };
    return m.find("elements") != std::string::npos && has_number(full) && has_number(full / 2);
  };
  // Without the checks, a backend that cannot tell a different call from a stalled peer (gloo)
  // times out; the diagnosis then names the calls: in every run where every rank timed out, at
  // least one of them (the ranks' reports come in over a grace, so the last to look sees them
  // all; a rank that completed its own call reports nothing, and its call cannot be named).
  const bool calls_named_at_timeout = !o.debug_checks && names.count(o.which) > 0 &&
                                      (o.which == "allreduce_vs_bcast" || o.which == "count" ||
                                       o.which == "dtype" || o.which == "root");
  int timeout_runs = 0, timeout_runs_named = 0;
  int wrong = 0, errors = 0, oks = 0, slow = 0, unnamed = 0, lost = 0, not_remote = 0, vague = 0;
  double max_fail_s = 0;
  std::map<std::string, int> statuses;
  for (int run = 0; run < o.runs; ++run) {
    Job job(o, o.ranks, {{"FAULT_CASE", o.which}});
    std::vector<int> all = survivors(o.ranks, -1);
    job.results_from(all, 2 * o.timeout_s + 30);
    job.release();
    bool timed_out = calls_named_at_timeout, named_at_timeout = false;
    for (int r : all) {
      const auto it = job.results().find(r);
      if (it == job.results().end() || it->second.status != MNCL_ERR_TIMEOUT) {
        timed_out = false;
        continue;
      }
      const std::string m = job.message(r);
      if (m.find("called it differently") != std::string::npos && names_both(m)) {
        named_at_timeout = true;
      }
    }
    timeout_runs += timed_out ? 1 : 0;
    timeout_runs_named += timed_out && named_at_timeout ? 1 : 0;
    if (timed_out && !named_at_timeout) {
      std::fprintf(stderr, "%s: no rank that timed out names both calls; rank 0's message: %s\n",
                   name.c_str(), job.message(0).c_str());
    }
    for (int r : all) {
      auto it = job.results().find(r);
      if (it == job.results().end()) {
        ++lost;
        continue;
      }
      const Event &e = it->second;
      ++statuses[status_name(e.status)];
      const double took = e.extra.empty() ? 0 : std::atof(e.extra[0].c_str()) / 1e9;
      if (e.status == MNCL_OK) {
        if (e.extra.size() >= 2 && e.extra[1] == "wrong") {
          ++wrong;
        } else {
          ++oks;
        }
        continue;
      }
      ++errors;
      max_fail_s = std::max(max_fail_s, took);
      // A failure before the call (the barrier ahead of it: a slow rank may still be in it when
      // the others fail and abort) says nothing about the call.
      const bool before = !e.extra.empty() && e.extra[0] == "create-failed";
      if (rooted_v && !before) {
        const std::string m = job.message(r);
        if (e.status != MNCL_ERR_REMOTE || !names_counts(m)) {
          ++vague;
          std::fprintf(stderr,
                       "%s: rank %d failed with %s without naming both counts (%zu, %zu): %s\n",
                       name.c_str(), r, status_name(e.status), full, full / 2, m.c_str());
        }
      }
      if (o.debug_checks) {
        const std::string m = job.message(r);
        if (took > 1.0) ++slow;
        // The checks fail every rank with REMOTE before the backend runs anything.
        if (e.status != MNCL_ERR_REMOTE) {
          ++not_remote;
          std::fprintf(stderr, "%s: rank %d failed with %s, not REMOTE: %s\n", name.c_str(), r,
                       status_name(e.status), m.c_str());
        }
        if (!names_both(m) || m.find("mismatch") == std::string::npos) {
          ++unnamed;
          std::fprintf(stderr, "%s: rank %d's message does not name both calls: %s\n", name.c_str(),
                       r, m.c_str());
        }
      }
    }
  }
  std::string st;
  for (const auto &[k, v] : statuses) st += fmt("%s%s %d", st.empty() ? "" : ", ", k.c_str(), v);
  if (o.debug_checks) {
    const bool ok =
        oks == 0 && wrong == 0 && slow == 0 && unnamed == 0 && lost == 0 && not_remote == 0;
    return report(
        name, o, ok,
        fmt("%d runs: %d/%d rank-calls failed (%d not REMOTE), slowest %.3f s (bound 1 "
            "s), %d messages without both fingerprints or counts [%s]",
            o.runs, errors, o.runs * o.ranks, not_remote, max_fail_s, unnamed, st.c_str()));
  }
  return report(
      name, o, wrong == 0 && lost == 0 && vague == 0 && timeout_runs_named == timeout_runs,
      fmt("%d runs: %d wrong results, %d errors/timeouts, %d correct-under-own-call, "
          "%d rank processes died without a result%s%s [%s]",
          o.runs, wrong, errors, oks, lost,
          rooted_v ? fmt(", %d failures not REMOTE naming both counts", vague).c_str() : "",
          calls_named_at_timeout ? fmt(", %d/%d runs where every rank timed out named both calls",
                                       timeout_runs_named, timeout_runs)
                                       .c_str()
                                 : "",
          st.c_str()));
}

// The abort scenarios: rank 0 reports the status of the call that another of its threads
// aborted, with the abort's time (ns) and more words after it. judge(status, seconds from the
// abort to the call's return, word(i), rank 0's message) returns {ok, detail}.
template <typename Judge>
int drive_rank0_abort(const Options &o, const char *scenario, Judge &&judge) {
  const std::string name = test_name(o, scenario);
  Job job(o, o.ranks, {});
  job.results_from({0}, 30);
  auto it = job.results().find(0);
  if (it == job.results().end()) return report(name, o, false, "rank 0 never returned");
  const Event &e = it->second;
  const double lat = e.extra.size() >= 1 ? seconds(e.t - std::atoll(e.extra[0].c_str())) : -1;
  const auto word = [&](size_t i) { return e.extra.size() > i ? e.extra[i] : std::string("?"); };
  const auto [ok, detail] = judge(e.status, lat, word, job.message(0));
  if (!ok) std::fprintf(stderr, "%s: rank 0: %s\n", name.c_str(), job.message(0).c_str());
  return report(name, o, ok, detail);
}

// (5) abort from another thread.
int drive_abort(const Options &o) {
  return drive_rank0_abort(o, "abort", [](int status, double lat, auto word, const std::string &) {
    const bool ok = status == MNCL_ERR_ABORTED && lat >= 0 && lat <= 1.0 && word(1) == "OK" &&
                    word(2) == "OK" && word(3) == "ABORTED" && word(4) == "OK";
    return std::make_pair(
        ok, fmt("blocked call returned %s %.3f s after mncl_comm_abort (bound 1 s); second "
                "abort %s; next call %s; destroy %s",
                status_name(status), lat, word(2).c_str(), word(3).c_str(), word(4).c_str()));
  });
}

// A rank destroys the communicator while the others wait for its part: each must fail with
// REMOTE naming it as one that destroyed the communicator (it issues nothing more), not wait
// out the timeout (run with a long one), on every backend.
// The results of a job whose last rank leaves the others waiting; that rank's own (MNCL_OK),
// or null with why not in *why.
const Event *last_rank_leaves(Job &job, const Options &o, std::string *why) {
  job.results_from(survivors(o.ranks, -1), o.timeout_s + 30);
  const auto mine = job.results().find(o.ranks - 1);
  if (mine == job.results().end() || mine->second.status != MNCL_OK) {
    *why = mine == job.results().end() ? "never returned" : status_name(mine->second.status);
    return nullptr;
  }
  return &mine->second;
}

int drive_destroyed_peer(const Options &o) {
  const std::string name = test_name(o, "destroyed_peer");
  Job job(o, o.ranks, {});
  const int leaver = o.ranks - 1;
  std::string why;
  const Event *mine = last_rank_leaves(job, o, &why);
  if (mine == nullptr) return report(name, o, false, fmt("rank %d %s", leaver, why.c_str()));
  int named = 0;
  double latest = 0;
  std::string problems;
  const auto others = survivors(o.ranks, leaver);
  for (int r : others) {
    const auto it = job.results().find(r);
    if (it == job.results().end()) {
      problems += fmt(" rank %d never returned;", r);
      continue;
    }
    const std::string m = job.message(r);
    const bool names = it->second.status == MNCL_ERR_REMOTE &&
                       m.find(fmt("rank %d (pid", leaver)) != std::string::npos &&
                       m.find("destroyed the communicator") != std::string::npos;
    named += names ? 1 : 0;
    latest = std::max(latest, seconds(it->second.t - mine->t));
    if (!names) problems += fmt(" rank %d: %s: %s;", r, status_name(it->second.status), m.c_str());
  }
  if (!problems.empty()) std::fprintf(stderr, "%s:%s\n", name.c_str(), problems.c_str());
  if (!others.empty() && job.results().count(others[0])) {
    std::fprintf(stderr, "%s: rank %d's message: %s\n", name.c_str(), others[0],
                 job.message(others[0]).c_str());
  }
  return report(name, o, problems.empty(),
                fmt("%d/%zu waiting ranks failed naming rank %d, which destroyed the "
                    "communicator, the last %.2f s after it began (timeout %d s)",
                    named, others.size(), leaver, latest, o.timeout_s));
}

// (5c) the last rank aborts while the others wait for it: with --expect-named every other rank
// must fail with ABORTED or REMOTE naming that rank and its abort (not at the timeout: the
// aborting rank outlives it); otherwise each must fail, at the timeout at the latest.
int drive_aborted_peer(const Options &o) {
  const std::string name = test_name(o, "aborted_peer");
  Job job(o, o.ranks, {});
  const int aborter = o.ranks - 1;
  std::string why;
  const Event *mine = last_rank_leaves(job, o, &why);
  if (mine == nullptr) {
    return report(name, o, false, fmt("rank %d's mncl_comm_abort %s", aborter, why.c_str()));
  }
  const int64_t t_abort = mine->t;
  int named = 0;
  double latest = 0;
  bool ok = true;
  std::string problems;
  const auto others = survivors(o.ranks, aborter);
  for (int r : others) {
    const auto it = job.results().find(r);
    if (it == job.results().end()) {
      ok = false;
      problems += fmt(" rank %d never returned;", r);
      continue;
    }
    const Event &e = it->second;
    const std::string m = job.message(r);
    // ABORTED (naive, shm: the communicator was aborted, by that rank) or REMOTE (gloo: its
    // connections closed), naming the rank.
    const bool failed = e.status == MNCL_ERR_ABORTED || e.status == MNCL_ERR_REMOTE;
    const bool names = failed && m.find(fmt("rank %d", aborter)) != std::string::npos &&
                       (!o.expect_named || m.find("aborted") != std::string::npos);
    named += names ? 1 : 0;
    latest = std::max(latest, seconds(e.t - t_abort));
    if (o.expect_named ? !names : !failed && e.status != MNCL_ERR_TIMEOUT) {
      ok = false;
      problems += fmt(" rank %d: %s: %s;", r, status_name(e.status), m.c_str());
    }
  }
  if (!problems.empty()) std::fprintf(stderr, "%s:%s\n", name.c_str(), problems.c_str());
  if (!others.empty() && job.results().count(others[0])) {
    std::fprintf(stderr, "%s: rank %d's message: %s\n", name.c_str(), others[0],
                 job.message(others[0]).c_str());
  }
  return report(name, o, ok,
                fmt("%d/%zu waiting ranks failed naming rank %d, which aborted, the last %.2f s "
                    "after its abort (timeout %d s)",
                    named, others.size(), aborter, latest, o.timeout_s));
}

// (5d) a rank exits without destroying the communicator: the others' destroy must not wait
// out the timeout (run with a long one) for a rank of their host that can no longer leave.
int drive_exit_without_destroy(const Options &o) {
  const std::string name =
      test_name(o, o.victim_own_pidns ? "exit_without_destroy.own_pidns" : "exit_without_destroy");
  if (!own_pidns_available(name, o)) return 0;
  Job job(o, o.ranks, {});
  const int leaver = o.ranks - 1;
  const double bound = std::min(30.0, o.timeout_s / 2.0);
  job.results_from(survivors(o.ranks, -1), bound);
  bool ok = true;
  double longest = 0;
  std::string problems;
  for (int r = 0; r < o.ranks; ++r) {
    const auto it = job.results().find(r);
    if (it == job.results().end()) {
      ok = false;
      problems += fmt(" rank %d did not return within %.0f s;", r, bound);
      continue;
    }
    const Event &e = it->second;
    if (e.status != MNCL_OK) {
      ok = false;
      problems += fmt(" rank %d: %s: %s;", r, status_name(e.status), job.message(r).c_str());
    }
    if (r != leaver && !e.extra.empty()) {
      longest = std::max(longest, std::atoll(e.extra[0].c_str()) / 1e9);
    }
  }
  if (!problems.empty()) std::fprintf(stderr, "%s:%s\n", name.c_str(), problems.c_str());
  return report(name, o, ok,
                fmt("rank %d exited without mncl_comm_destroy; the others' destroy took %.2f s "
                    "at most (timeout %d s)",
                    leaver, longest, o.timeout_s));
}

// (5b) abort from another thread while mncl_comm_destroy waits for a rank that never leaves.
int drive_abort_destroy(const Options &o) {
  return drive_rank0_abort(
      o, "abort_destroy", [&](int status, double lat, auto word, const std::string &message) {
        const bool ok = status == MNCL_ERR_ABORTED && lat >= 0 && lat <= 1.0 && word(1) == "OK" &&
                        word(2) == "INVALID_ARGUMENT" &&
                        message.find("aborted while it waited for") != std::string::npos;
        return std::make_pair(
            ok,
            fmt("destroy returned %s %.3f s after mncl_comm_abort (bound 1 s; the timeout is %d "
                "s); the freed handle then gives %s",
                status_name(status), lat, o.timeout_s, word(2).c_str()));
      });
}

// (6) recovery: a rank dies, the others re-create a smaller communicator on a new store.
int drive_recovery(const Options &o) {
  const std::string name = test_name(o, "recovery");
  const std::string store2 = fmt("tcp://127.0.0.1:%d", free_port());
  Job job(o, o.ranks, {{"FAULT_STORE2", store2}});
  if (!job.all_ready(60)) return report(name, o, false, "the ranks did not reach their loop");
  const int victim = o.ranks - 1;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const int64_t t_kill = now_ns();
  if (!job.signal(victim, SIGKILL)) return report(name, o, false, "cannot kill the victim");
  const auto others = survivors(o.ranks, victim);
  job.results_from(others, 3.0 * o.timeout_s + 30);
  bool ok = true;
  std::vector<double> recover, total;
  for (int r : others) {
    auto it = job.results().find(r);
    if (it == job.results().end()) {
      ok = false;
      continue;
    }
    const Event &e = it->second;
    const bool correct = e.status == MNCL_OK && e.extra.size() >= 3 && e.extra[1] == "correct";
    if (!correct) {
      ok = false;
      std::fprintf(stderr, "%s: rank %d: %s %s\n", name.c_str(), r, status_name(e.status),
                   job.message(r).c_str());
      continue;
    }
    recover.push_back(seconds(e.t - std::atoll(e.extra[2].c_str())));
    total.push_back(seconds(e.t - t_kill));
  }
  const auto mx = [](const std::vector<double> &v) {
    return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
  };
  return report(name, o, ok && static_cast<int>(recover.size()) == o.ranks - 1,
                fmt("recovery (error -> abort, destroy, re-create size %d on a new store, "
                    "correct allreduce) max %.3f s; kill -> recovered max %.2f s; %zu/%zu "
                    "survivors recovered",
                    o.ranks - 1, mx(recover), mx(total), recover.size(), others.size()));
}

// (7) watchdog: a plugin that never returns.
int drive_watchdog(const Options &o) {
  const std::string name = test_name(o, "watchdog");
  Job job(o, o.ranks, {});
  std::vector<int> all = survivors(o.ranks, -1);
  job.results_from(all, o.timeout_s + 30);
  bool ok = true;
  double mx = 0;
  int with_dump = 0;
  for (int r : all) {
    auto it = job.results().find(r);
    if (it == job.results().end()) {
      ok = false;
      continue;
    }
    const Event &e = it->second;
    const double took = e.extra.empty() ? 99 : std::atof(e.extra[0].c_str()) / 1e9;
    mx = std::max(mx, took);
    const std::string m = job.message(r);
    // The dump: every rank's last operations with number, bytes and state.
    bool dump = m.find("watchdog") != std::string::npos;
    for (int q = 0; q < o.ranks; ++q) {
      dump = dump && m.find(fmt("rank %d: allreduce #1 4096 B", q)) != std::string::npos;
    }
    dump = dump && m.find("barrier #0 0 B done") != std::string::npos;
    if (dump) ++with_dump;
    if (e.status != MNCL_ERR_TIMEOUT || took > o.timeout_s + 1.0 || !dump) {
      ok = false;
      std::fprintf(stderr, "%s: rank %d: %s after %.2f s: %s\n", name.c_str(), r,
                   status_name(e.status), took, m.c_str());
    }
  }
  if (job.results().count(0)) {
    std::fprintf(stderr, "%s: rank 0's message: %s\n", name.c_str(), job.message(0).c_str());
  }
  return report(name, o, ok,
                fmt("blocked allreduce returned TIMEOUT after max %.2f s (timeout %d s); %d/%d "
                    "ranks got the per-rank dump of last operations",
                    mx, o.timeout_s, with_dump, o.ranks));
}

// (9) the TCP store listens on the requested address only; a wrong or missing token is refused.
int drive_store_bind(const Options &o) {
  Options one = o;
  one.backend = "naive";
  const std::string name = "fault.store_bind";
  const int port = free_port();
  Job job(one, 1, {{"MNCL_STORE", fmt("tcp://127.0.0.1:%d", port)}, {"FAULT_HOLD_MS", "1500"}});
  if (!job.all_ready(30)) return report(name, one, false, "the communicator was not created");
  const auto addrs = listeners(port);
  std::string list;
  bool ok = !addrs.empty();
  for (const auto &a : addrs) {
    list += (list.empty() ? "" : ",") + a;
    if (a != "0100007F") ok = false;  // 127.0.0.1 in /proc/net/tcp's byte order
  }
  return report(name, one, ok,
                fmt("listeners on port %d: %s (wildcard listeners: %d)", port,
                    list.empty() ? "none" : list.c_str(),
                    static_cast<int>(std::count_if(addrs.begin(), addrs.end(), [](auto &a) {
                      return a.find_first_not_of('0') == std::string::npos;
                    }))));
}

int drive_store_token(const Options &o) {
  Options two = o;
  two.backend = "naive";
  two.timeout_s = 3;
  const std::string name = "fault.store_token";
  int refused = 0;
  std::string detail;
  for (const char *bad : {"wrong", ""}) {
    Job job(two, 2, {}, [&](int r, std::map<std::string, std::string> &e) {
      e["MNCL_STORE_TOKEN"] = r == 0 ? "s3cret" : bad;
    });
    job.results_from({0, 1}, 30);
    auto it = job.results().find(1);
    const std::string m = job.message(1);
    const bool ok = it != job.results().end() && it->second.status == MNCL_ERR_BOOTSTRAP &&
                    m.find("token") != std::string::npos;
    if (ok) ++refused;
    detail += fmt("%s%s token: %s", detail.empty() ? "" : "; ", *bad ? "wrong" : "missing",
                  it == job.results().end() ? "no result" : status_name(it->second.status));
    if (!ok) std::fprintf(stderr, "%s: rank 1: %s\n", name.c_str(), m.c_str());
  }
  // And the right token gets in.
  Job good(two, 2, {{"MNCL_STORE_TOKEN", "s3cret"}});
  good.results_from({0, 1}, 30);
  const bool admitted = good.results().count(1) && good.results().at(1).status == MNCL_OK;
  detail += fmt("; right token: %s", admitted ? "admitted" : "FAILED");
  return report(name, two, refused == 2 && admitted,
                fmt("%d/2 bad tokens refused (%s)", refused, detail.c_str()));
}

// Two processes given one rank of 3 (and none rank 2), on each kind of store. Rank 1 twice:
// the second to claim it fails at once with MNCL_ERR_BOOTSTRAP naming the rank; the others
// stop waiting for rank 2 a grace after they see its note, also with MNCL_ERR_BOOTSTRAP,
// naming the claim and the rank that never joined (they would time out at the join with
// MNCL_ERR_TIMEOUT otherwise); run again in the same file store folder, the same happens (the
// failed join took its claims back). Rank 0 twice: on a file store likewise; on a TCP store
// the second cannot start the store, says that another process may be rank 0 too, and leaves
// its note in the first one's store.
int drive_duplicate_rank(const Options &o) {
  Options three = o;
  three.backend = "naive";
  const std::string name = "fault.duplicate_rank";
  struct Case {
    int dup;
    bool file;
    bool again;  // in the previous case's folder
  };
  const Case cases[] = {
      {1, false, false}, {1, true, false}, {1, true, true}, {0, false, false}, {0, true, false}};
  int passed = 0;
  std::string detail, folder;
  for (const Case &c : cases) {
    if (c.file && !c.again) {
      if (!folder.empty()) std::filesystem::remove_all(folder);
      char tmpl[] = "/tmp/mncl-dup-store-XXXXXX";
      if (!mkdtemp(tmpl)) return report(name, three, false, "mkdtemp failed");
      folder = tmpl;
    }
    std::map<std::string, std::string> env;
    if (c.file) env["MNCL_STORE"] = "file://" + folder;
    const int dup = c.dup;
    Job job(three, 3, env, [dup](int r, std::map<std::string, std::string> &e) {
      if (r == 2) {
        e["MNCL_RANK"] = std::to_string(dup);
        e["FAULT_REPORT_AS"] = "2";
      }
    });
    job.results_from({0, 1, 2}, 60 + 2 * three.timeout_s);
    const std::string rank_words = fmt("rank %d (from MNCL_RANK)", dup);
    const bool bind_case = dup == 0 && !c.file;
    int refused = 0, told = 0;
    for (int r : {0, 1, 2}) {
      auto it = job.results().find(r);
      if (it == job.results().end()) continue;
      const std::string m = job.message(r);
      const bool claimant = r == dup || r == 2;
      if (claimant && it->second.status == MNCL_ERR_BOOTSTRAP &&
          m.find(bind_case ? "is another process rank 0 too? This one is rank 0 from MNCL_RANK"
                           : rank_words + " is another process's already") != std::string::npos) {
        ++refused;
      } else if (it->second.status == MNCL_ERR_BOOTSTRAP &&
                 m.find("a process claimed " + rank_words + " a second time") !=
                     std::string::npos &&
                 m.find("rank 2 did not join") != std::string::npos) {
        ++told;
      } else {
        std::fprintf(stderr, "%s: rank %d twice, process %d: %s: %s\n", name.c_str(), dup, r,
                     status_name(it->second.status), m.c_str());
      }
    }
    const bool ok = refused == 1 && told == 2;
    passed += ok;
    detail +=
        fmt("%srank %d twice, %s store%s: %d refused at once, %d stopped waiting, naming "
            "the claim",
            detail.empty() ? "" : "; ", dup, c.file ? "file" : "tcp",
            c.again ? " (again, same folder)" : "", refused, told);
  }
  std::filesystem::remove_all(folder);
  // Another job's "rank 0" (a job of 4) on this job's TCP address, run twice so that each of
  // the two rank 0s binds it first once (the other starts once the address listens). The one
  // that binds second is refused at once and leaves its note in the other's store:
  // - this job's rank 0 first: the foreign one's note names a job of 4, so it stops no one:
  //   ranks 0 and 1 wait for their missing peers until the timeout, blaming no second claim;
  // - the foreign one first: rank 1 joins the foreign store, where it and the foreign rank 0
  //   find each other's sizes (3 and 4) within half a second and both fail naming that
  //   disagreement (before the grace of rank 0's note; they used to stop at the grace, and
  //   the foreign rank 0 at its timeout).
  // The two jobs run side by side (each on a port of its own).
  std::unique_ptr<Job> jobs[2];
  for (const bool ours_first : {true, false}) {
    jobs[ours_first] =
        std::make_unique<Job>(three, 3, std::map<std::string, std::string>{},
                              [ours_first](int r, std::map<std::string, std::string> &e) {
                                if (r == 2) {
                                  e["MNCL_RANK"] = "0";
                                  e["MNCL_SIZE"] = "4";
                                  e["FAULT_REPORT_AS"] = "2";
                                }
                                if ((r == 2) == ours_first) e["FAULT_AFTER_LISTEN"] = "1";
                              });
  }
  for (const bool ours_first : {true, false}) {
    Job &job = *jobs[ours_first];
    job.results_from({0, 1, 2}, 60 + 2 * three.timeout_s);
    const int second = ours_first ? 2 : 0;  // the process refused at the bind
    int refused = 0, timed_out = 0, told = 0;
    for (int r : {0, 1, 2}) {
      auto it = job.results().find(r);
      if (it == job.results().end()) continue;
      const std::string m = job.message(r);
      if (r == second && it->second.status == MNCL_ERR_BOOTSTRAP &&
          m.find("is another process rank 0 too?") != std::string::npos) {
        ++refused;
      } else if (!ours_first && r != second && it->second.status == MNCL_ERR_BOOTSTRAP &&
                 m.find(r == 1 ? "the ranks disagree on the job's size: this process is rank 1 "
                                 "of 3 (size from MNCL_SIZE), and rank 0 (pid "
                               : "the ranks disagree on the job's size: this process is rank 0 "
                                 "of 4 (size from MNCL_SIZE), and rank 1 (pid ") !=
                     std::string::npos) {
        ++told;
      } else if (r != second && it->second.status == MNCL_ERR_TIMEOUT &&
                 m.find("a process claimed") == std::string::npos) {
        ++timed_out;
      } else {
        std::fprintf(stderr, "%s: another job's rank 0, process %d: %s: %s\n", name.c_str(), r,
                     status_name(it->second.status), m.c_str());
      }
    }
    const bool ok =
        refused == 1 && timed_out == (ours_first ? 2 : 0) && told == (ours_first ? 0 : 2);
    passed += ok;
    detail +=
        fmt("; another job's rank 0 on the address, %s bound first: process %d refused at "
            "once (%d), %d timed out without blaming a second claim, %d named the sizes",
            ours_first ? "this job's" : "the other job's", second, refused, timed_out, told);
  }
  return report(name, three, passed == static_cast<int>(std::size(cases)) + 2, detail);
}

// Processes started with different job sizes (WORLD_SIZE=2 on one, 3 on the others) on one
// store. Every process whose size the ranks below it contradict fails mncl_comm_create with
// MNCL_ERR_BOOTSTRAP naming the disagreement (not a timeout, and not a job that runs with
// sizes that disagree: naive summed over 2 ranks on one and over 3 on the others):
// - sizes 2, 3, 3: all three, at once;
// - sizes 4, 3, 3: rank 0 too, while it still waits for its rank 3 (naming rank 1 or 2,
//   whichever it read first);
// - sizes 2, 2, 3: ranks 0 and 1 are a job of 2 and run (an allreduce checks it); the third
//   process, a stray that says 3, fails naming rank 0's size.
// On a TCP store, and on a file store folder where, after each case, a job of 4 must run: no
// join record of a failed one is left to read as another size there.
// The timeout (--timeout, 20 s in CI) is far longer than any of these takes: a rank that
// waited it out reports MNCL_ERR_TIMEOUT, which fails the test.
int drive_size_mismatch(const Options &o) {
  const std::string name = "fault.size_mismatch";
  struct Case {
    std::vector<int> sizes;
    int healthy;  // ranks 0..healthy-1 form a job that must run
  };
  const Case cases[] = {{{2, 3, 3}, 0}, {{4, 3, 3}, 0}, {{2, 2, 3}, 2}};
  char tmpl[] = "/tmp/mncl-size-store-XXXXXX";
  if (!mkdtemp(tmpl)) return report(name, o, false, "mkdtemp failed");
  const std::string folder = tmpl;
  int passed = 0, runs = 0;
  std::string detail;
  // A job of `sizes.size()` processes, process r given size sizes[r]; true if every process
  // of ranks 0..healthy-1 ran (and checked its allreduce) and every other one was refused,
  // naming the disagreement.
  const auto judge = [&](const std::vector<int> &sizes, int healthy, bool file) {
    const int n = static_cast<int>(sizes.size());
    std::map<std::string, std::string> env{{"FAULT_LINGER", "1"}};
    if (file) env["MNCL_STORE"] = "file://" + folder;
    Job job(o, n, env, [sizes](int r, std::map<std::string, std::string> &e) {
      e["MNCL_SIZE"] = std::to_string(sizes[static_cast<size_t>(r)]);
      e.erase("MNCL_LOCAL_SIZE");
      e.erase("MNCL_LOCAL_RANK");
    });
    const std::vector<int> all = survivors(n, -1);
    job.results_from(all, 60 + 2 * o.timeout_s);
    job.release();
    const bool exited = job.exited(30 + o.timeout_s);
    int refused = 0, ran = 0;
    for (int r : all) {
      auto it = job.results().find(r);
      const std::string m = job.message(r);
      const int size = sizes[static_cast<size_t>(r)];
      const auto names = [&](int other_rank) {
        return m.find(fmt("and rank %d (pid ", other_rank)) != std::string::npos &&
               m.find(fmt("was started as one of %d (size from MNCL_SIZE)",
                          sizes[static_cast<size_t>(other_rank)])) != std::string::npos;
      };
      if (r < healthy) {
        if (it != job.results().end() && it->second.status == MNCL_OK) {
          ++ran;
          continue;
        }
      } else if (it != job.results().end() && it->second.status == MNCL_ERR_BOOTSTRAP &&
                 m.find(fmt("the ranks disagree on the job's size: this process is rank %d of "
                            "%d (size from MNCL_SIZE)",
                            r, size)) != std::string::npos &&
                 (r == 0 ? names(1) || names(2) : names(0))) {
        ++refused;
        continue;
      }
      std::fprintf(stderr, "%s: %s store, %d processes, process %d (size %d): %s: %s\n",
                   name.c_str(), file ? "file" : "tcp", n, r, size,
                   it == job.results().end() ? "no result" : status_name(it->second.status),
                   m.c_str());
    }
    detail += fmt("%s%s store, sizes", detail.empty() ? "" : "; ", file ? "file" : "tcp");
    for (int size : sizes) detail += fmt(" %d", size);
    detail += fmt(": %d refused naming the disagreement, %d ran%s", refused, ran,
                  exited ? "" : ", not all exited");
    ++runs;
    return refused == n - healthy && ran == healthy && exited;
  };
  for (const bool file : {false, true}) {
    for (const Case &c : cases) {
      passed += judge(c.sizes, c.healthy, file);
      if (file) passed += judge({4, 4, 4, 4}, 4, true);
    }
  }
  std::filesystem::remove_all(folder);
  return report(name, o, passed == runs, detail);
}

// One rank runs the backend as a plugin of ABI v4 (MNCL_PLUGIN_ABI_MAX=4), the others as v5:
// the first would run gatherv as the core's alltoallv, the others natively, and each would
// wait for the other's messages. Every rank fails mncl_comm_create, naming both builds.
int drive_plugin_builds(const Options &o) {
  const std::string name = test_name(o, "plugin_builds");
  Job job(o, o.ranks, {}, [](int r, std::map<std::string, std::string> &e) {
    if (r == 1) e["MNCL_PLUGIN_ABI_MAX"] = "4";
  });
  std::vector<int> all = survivors(o.ranks, -1);
  job.results_from(all, 60 + o.timeout_s);
  int refused = 0;
  for (int r : all) {
    auto it = job.results().find(r);
    const std::string m = job.message(r);
    if (it != job.results().end() && it->second.status == MNCL_ERR_PLUGIN &&
        m.find("different builds of the " + o.backend + " plugin") != std::string::npos &&
        m.find("plugin ABI v4") != std::string::npos && m.find("rank 1") != std::string::npos) {
      ++refused;
    } else {
      std::fprintf(stderr, "%s: rank %d: %s\n", name.c_str(), r, m.c_str());
    }
  }
  // The same job with the same build everywhere is created.
  Job same(o, o.ranks, {{"MNCL_PLUGIN_ABI_MAX", "4"}});
  same.results_from(all, 60 + o.timeout_s);
  int created = 0;
  for (int r : all) {
    created += same.results().count(r) && same.results().at(r).status == MNCL_OK;
  }
  return report(name, o, refused == o.ranks && created == o.ranks,
                fmt("%d/%d ranks refused at create naming both builds; %d/%d created with one "
                    "build everywhere",
                    refused, o.ranks, created, o.ranks));
}

std::vector<std::string> split_list(const std::string &s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--worker") == 0) return worker_main();
  signal(SIGPIPE, SIG_IGN);
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--backend")
      o.backend = next();
    else if (a == "--ranks")
      o.ranks = std::atoi(next().c_str());
    else if (a == "--timeout")
      o.timeout_s = std::atoi(next().c_str());
    else if (a == "--runs")
      o.runs = std::atoi(next().c_str());
    else if (a == "--case")
      o.which = next();
    else if (a == "--debug-checks")
      o.debug_checks = std::atoi(next().c_str());
    else if (a == "--known-issue")
      o.known_issue = true;
    else if (a == "--netns")
      o.netns = split_list(next());
    else if (a == "--hosts")
      o.hosts = split_list(next());
    else if (a == "--cut")
      o.cut = next();
    else if (a == "--launcher")
      o.launcher = next();
    else if (a == "--mpirun")
      o.mpirun = next();
    else if (a == "--mpirun-arg")
      o.mpirun_args.push_back(next());
    else if (a == "--expect-job-end")
      o.expect_job_end = true;
    else if (a == "--expect-named")
      o.expect_named = true;
    else if (a == "--victim-own-pidns")
      o.victim_own_pidns = true;
    else if (a == "--survivors-exit")
      o.survivors_exit = true;
    else if (a[0] != '-' && o.scenario.empty())
      o.scenario = a;
    else {
      std::fprintf(stderr, "usage: see the top of fault_test.cpp\n");
      return 2;
    }
  }
  if (o.scenario == "killed" || o.scenario == "link_cut") return drive_killed(o, false);
  if (o.scenario == "stalled") return drive_killed(o, true);
  if (o.scenario == "late") return drive_late(o);
  if (o.scenario == "mismatch") return drive_mismatch(o);
  if (o.scenario == "abort") return drive_abort(o);
  if (o.scenario == "aborted_peer") return drive_aborted_peer(o);
  if (o.scenario == "destroyed_peer") return drive_destroyed_peer(o);
  if (o.scenario == "exit_without_destroy") return drive_exit_without_destroy(o);
  if (o.scenario == "abort_destroy") return drive_abort_destroy(o);
  if (o.scenario == "recovery") return drive_recovery(o);
  if (o.scenario == "watchdog") return drive_watchdog(o);
  if (o.scenario == "store_bind") return drive_store_bind(o);
  if (o.scenario == "store_token") return drive_store_token(o);
  if (o.scenario == "duplicate_rank") return drive_duplicate_rank(o);
  if (o.scenario == "plugin_builds") return drive_plugin_builds(o);
  if (o.scenario == "size_mismatch") return drive_size_mismatch(o);
  std::fprintf(stderr, "unknown scenario '%s'\n", o.scenario.c_str());
  return 2;
}
