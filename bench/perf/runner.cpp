#include "runner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#include "baseline.h"
#include "data.h"
#include "membw.h"
#include "report.h"
#include "util.h"

namespace mncl::perf {

namespace {

const char *kTimeSources[] = {"rank 0", "avg", "min", "max"};

// How many warm-up and timed iterations one placement of one size gets.
struct Plan {
  int warmup;
  int iters;
  // With a budget, plan_for makes one untimed MNCL call to size the plan: time_raw then makes
  // one untimed raw call as well, so that neither side's timed loop contains a cold first call.
  int probe_calls = 0;
};

class Run {
 public:
  Run(const Options &o, mncl_comm_t comm) : o_(o), comm_(comm) {
    must(mncl_comm_rank(comm, &rank_), "mncl_comm_rank");
    must(mncl_comm_size(comm, &nranks_), "mncl_comm_size");
    const char *name = nullptr;
    must(mncl_comm_backend(comm, &name), "mncl_comm_backend");
    backend_ = name ? name : "?";
  }

  int go(const std::string &command_line) {
    baseline_ = make_baseline(o_.baseline, backend_, comm_, &baseline_why_);
    RunInfo info;
    info.version = std::to_string(MNCL_VERSION_MAJOR) + "." + std::to_string(MNCL_VERSION_MINOR) +
                   "." + std::to_string(MNCL_VERSION_PATCH);
    info.backend = backend_;
    info.nranks = nranks_;
    info.dtype = mncl_dtype_name(o_.dtype);
    info.op = mncl_op_name(o_.op);
    info.iters = o_.iters;
    info.warmup = o_.warmup;
    info.warmup_calls = o_.warmup_calls;
    info.check = o_.check;
    info.size_budget_ms = o_.size_budget_ms;
    info.time_source = kTimeSources[o_.average];
    info.baseline = baseline_ ? baseline_->name() : "";
    info.baseline_why = baseline_why_;
    info.baseline_detail = baseline_ ? baseline_->detail() : "";
    info.note = o_.note;
    info.command = command_line;
    if (o_.membw) info.membw = measure_membw(comm_, nranks_, o_.membw_bytes);
    membw_ = info.membw.bytes_per_s;

    const size_t elem = mncl_dtype_size(o_.dtype);
    const size_t max_elems = (o_.max_bytes + elem - 1) / elem + 1;
    send_ = alloc_buffer(max_elems * elem);
    recv_ = alloc_buffer(max_elems * elem);

    Reporter rep(info, stdout);
    if (rank_ == 0) rep.begin();
    const std::vector<size_t> sizes = sweep_sizes(o_);
    const size_t total = sizes.size() * o_.colls.size();
    size_t done = 0;
    const double t_start = now_s();
    // The sweep driver asks for one self-overwriting line when its stderr is a terminal.
    const char *mode = std::getenv("MNCL_PERF_PROGRESS");
    const bool tty_progress = mode != nullptr && std::string(mode) == "tty";
    for (CollKind kind : o_.colls) {
      const Warmup w = warm_up(kind, sizes);
      if (rank_ == 0) {
        rep.begin_collective(kind, w);
        rep.add_warmup(w);
      }
      for (size_t bytes : sizes) {
        Row row = measure(kind, bytes);
        if (rank_ == 0) {
          rep.row(row);
          ++done;
          if (o_.progress)
            std::fprintf(stderr, "%s[mncl-perf] %s %s %s done (%zu/%zu, %.0f s)%s",
                         tty_progress ? "\r\033[K" : "", backend_.c_str(), spec_of(kind).name,
                         format_size(bytes).c_str(), done, total, now_s() - t_start,
                         tty_progress ? "" : "\n");
        }
      }
    }
    int64_t wrong = 0;
    if (rank_ == 0) {
      wrong = rep.end();
      if (!o_.json_path.empty()) rep.write_json(o_.json_path);
      if (!o_.csv_path.empty()) rep.write_csv(o_.csv_path);
    }
    // Every rank exits with the same status.
    wrong = allreduce_sum(comm_, wrong);
    baseline_.reset();
    return wrong == 0 ? 0 : 1;
  }

 private:
  Row measure(CollKind kind, size_t bytes) {
    const size_t elem = mncl_dtype_size(o_.dtype);
    Row row;
    row.kind = kind;
    row.root = o_.root;
    row.layout = layout_for(kind, bytes, elem, nranks_);
    // Per placement: [time, raw time] in µs, and the wrong count, for the cross-rank reductions.
    std::vector<double> local(6, 0.0);
    Result *res[2] = {&row.oop, &row.ip};
    for (int p = 0; p < 2; ++p) {
      const bool inplace = p == 1;
      if (inplace && !spec_of(kind).has_inplace) continue;
      const Call c = make_call(kind, row.layout, inplace, send_.get(), recv_.get(), elem, o_.dtype,
                               o_.op, o_.root, rank_, nranks_);
      maybe_hang();
      const Plan plan = plan_for(c);
      res[p]->measured = true;
      res[p]->iters = plan.iters;
      local[p * 3] = time_mncl(c, plan) * 1e6;
      if (baseline_ && baseline_->supports(c)) {
        res[p]->has_raw = true;
        local[p * 3 + 1] = time_raw(c, plan) * 1e6;
      }
      if (o_.check > 0) {
        int64_t wrong = 0;
        for (int round = 0; round < o_.check; ++round) {
          fill_for_check(c, row.layout, send_.get(), recv_.get(), round);
          must(run_mncl(comm_, c), spec_of(kind).name);
          wrong += count_wrong(c, row.layout, round);
        }
        local[p * 3 + 2] = static_cast<double>(wrong);
      }
    }
    std::vector<double> sum = local, mn = local, mx = local;
    allreduce_doubles(comm_, sum, MNCL_SUM);
    allreduce_doubles(comm_, mn, MNCL_MIN);
    allreduce_doubles(comm_, mx, MNCL_MAX);
    for (int p = 0; p < 2; ++p) {
      Result &r = *res[p];
      if (!r.measured) continue;
      auto timing = [&](int i) {
        Timing t{sum[i] / nranks_, mn[i], mx[i], 0};
        const double pick[] = {local[i], t.avg, t.min, t.max};
        t.reported = pick[o_.average];
        return t;
      };
      r.time = timing(p * 3);
      if (r.has_raw) r.raw_time = timing(p * 3 + 1);
      r.wrong = o_.check > 0 ? static_cast<int64_t>(sum[p * 3 + 2]) : -1;
      // sendrecv on one rank sends to itself: nothing moves, a bandwidth would be meaningless.
      r.no_bandwidth = kind == CollKind::kSendrecv && nranks_ == 1;
      derive(r, kind, row.layout.bytes, nranks_, membw_);
    }
    return row;
  }

  // --warmup-calls: before a collective's first size, untimed calls of MNCL and then of the raw
  // library, so that neither side's first row carries a cold start: connections and lazy setup,
  // and thresholds that only switch to a fast path after some messages (Open MPI's vader BTL
  // gives a peer its fast box after btl_vader_fbox_threshold = 16 sends). The size -w alone
  // would not pass them (3 calls in scripts/sweep.sh, fewer under --size-budget-ms), so the
  // first size's time, raw MPI's especially, included that slow start. Cheap and the same for
  // both sides: out of place, at the smallest swept size where every block holds 2 elements (the
  // largest swept size if none does), at most kWarmupMaxBytes. nccl-tests warms up at its
  // largest size instead, which would cost seconds per collective at 64 MiB.
  static constexpr size_t kWarmupMaxBytes = 64 * 1024;
  Warmup warm_up(CollKind kind, const std::vector<size_t> &sizes) {
    Warmup w;
    w.kind = kind;
    if (o_.warmup_calls <= 0 || sizes.empty()) return w;
    const size_t elem = mncl_dtype_size(o_.dtype);
    size_t bytes = sizes.back();
    for (size_t s : sizes) {
      if (layout_for(kind, s, elem, nranks_).count >= 2) {
        bytes = s;
        break;
      }
    }
    bytes = std::min(bytes, kWarmupMaxBytes);
    const Layout l = layout_for(kind, bytes, elem, nranks_);
    w.bytes = l.bytes;
    const Call c = make_call(kind, l, false, send_.get(), recv_.get(), elem, o_.dtype, o_.op,
                             o_.root, rank_, nranks_);
    maybe_hang();
    for (int i = 0; i < o_.warmup_calls; ++i, ++w.mncl_calls)
      must(run_mncl(comm_, c), spec_of(kind).name);
    if (baseline_ && baseline_->supports(c))
      for (int i = 0; i < o_.warmup_calls; ++i, ++w.raw_calls) baseline_->run(c);
    w.has_raw = baseline_ != nullptr;
    return w;
  }

  // Without a budget: -w and -n as given. With one, the first warm-up iteration's time (the
  // slowest rank's, so that every rank computes the same plan) scales both down.
  Plan plan_for(const Call &c) {
    Plan plan{o_.warmup, o_.iters};
    if (o_.size_budget_ms <= 0) return plan;
    const double t0 = now_s();
    must(run_mncl(comm_, c), spec_of(c.kind).name);
    plan.probe_calls = 1;
    std::vector<double> t = {now_s() - t0};
    allreduce_doubles(comm_, t, MNCL_MAX);
    const double budget_s = o_.size_budget_ms * 1e-3, one = std::max(t[0], 1e-9);
    plan.iters = static_cast<int>(
        std::clamp(std::floor(0.8 * budget_s / one), 1.0, static_cast<double>(o_.iters)));
    plan.warmup = static_cast<int>(std::clamp(std::floor(0.2 * budget_s / one), 0.0,
                                              static_cast<double>(std::max(o_.warmup - 1, 0))));
    return plan;
  }

  // Seconds per call on this rank, timed after a barrier, like nccl-tests.
  double time_mncl(const Call &c, const Plan &plan) {
    const char *what = spec_of(c.kind).name;
    for (int i = 0; i < plan.warmup; ++i) must(run_mncl(comm_, c), what);
    must(mncl_barrier(comm_, nullptr), "mncl_barrier");
    const double t0 = now_s();
    for (int i = 0; i < plan.iters; ++i) must(run_mncl(comm_, c), what);
    return (now_s() - t0) / plan.iters;
  }

  double time_raw(const Call &c, const Plan &plan) {
    // The same untimed calls MNCL got: the budget probe plus the warm-ups.
    for (int i = 0; i < plan.probe_calls + plan.warmup; ++i) baseline_->run(c);
    baseline_->barrier();
    const double t0 = now_s();
    for (int i = 0; i < plan.iters; ++i) baseline_->run(c);
    return (now_s() - t0) / plan.iters;
  }

  // --debug-hang-rank: that rank stops answering, so tests can check that -T bounds the run.
  void maybe_hang() {
    if (o_.debug_hang_rank != rank_) return;
    std::fprintf(stderr, "mncl-perf: rank %d: --debug-hang-rank: sleeping instead of calling\n",
                 rank_);
    std::this_thread::sleep_for(std::chrono::hours(1));
  }

  const Options &o_;
  mncl_comm_t comm_;
  int rank_ = 0, nranks_ = 1;
  std::string backend_;
  std::unique_ptr<Baseline> baseline_;
  std::string baseline_why_;
  double membw_ = 0;
  Buffer send_, recv_;
};

}  // namespace

int run_rank(const Options &o, const std::string &command_line) {
  mncl_config_t config = MNCL_CONFIG_INIT;
  if (!o.backend.empty()) config.backend = o.backend.c_str();
  if (o.timeout_s > 0) config.timeout_ms = static_cast<int64_t>(o.timeout_s * 1000);
  mncl_comm_t comm = nullptr;
  mncl_status_t st = mncl_comm_create(&config, &comm);
  if (st != MNCL_OK) {
    // The library's message names the call ("mncl_comm_create: ..."); its config.backend is
    // this program's --backend.
    std::fprintf(stderr, "mncl-perf: %s [%s%s]\n", mncl_last_error(), mncl_status_string(st),
                 o.backend.empty() ? "" : "; config.backend is --backend");
    // Under the sweep driver: no usable plugin (not built for this machine, its probe refused,
    // e.g. nccl without a GPU) makes the backend a skip, not a failure. Tell the driver why.
    if (const char *f = std::getenv("MNCL_PERF_UNUSABLE_FILE"); f && *f && st == MNCL_ERR_PLUGIN) {
      std::string why = mncl_last_error();
      for (size_t p; (p = why.find("\n")) != std::string::npos;) {
        size_t e = p + 1;
        while (e < why.size() && why[e] == ' ') ++e;
        why.replace(p, e - p, p > 0 && why[p - 1] == ':' ? " " : "; ");
      }
      if (FILE *out = std::fopen(f, "a")) {
        std::fprintf(out, "%s\n", why.c_str());
        std::fclose(out);
      }
    }
    return 1;
  }
  int rank = -1;
  mncl_comm_rank(comm, &rank);
  try {
    Run run(o, comm);
    const int rc = run.go(command_line);
    st = mncl_comm_destroy(comm);
    if (st != MNCL_OK) {
      std::fprintf(stderr, "mncl-perf: rank %d: mncl_comm_destroy: %s: %s\n", rank,
                   mncl_status_string(st), mncl_last_error());
      return 1;
    }
    return rc;
  } catch (const std::exception &e) {
    // A failed collective leaves the others waiting: abort, and skip the collective destroy,
    // which would only wait out the timeout once more.
    if (dynamic_cast<const std::bad_alloc *>(&e) != nullptr) {
      std::fprintf(stderr,
                   "mncl-perf: rank %d: out of memory for the buffers of sizes up to -e %zu "
                   "bytes (each rank holds several buffers of that size): lower -e\n",
                   rank, o.max_bytes);
    } else {
      std::fprintf(stderr, "mncl-perf: rank %d: %s\n", rank, e.what());
    }
    mncl_comm_abort(comm);
    std::fflush(nullptr);
    _exit(1);
  }
}

}  // namespace mncl::perf
