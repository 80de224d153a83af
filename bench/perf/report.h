// mncl-perf's outputs: the nccl-tests-style text table on stdout, and the same rows as JSON and
// CSV files. Only rank 0 reports.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "collectives.h"
#include "membw.h"

namespace mncl::perf {

// Seconds per iteration across ranks, in microseconds.
struct Timing {
  double avg = 0, min = 0, max = 0;
  double reported = 0;  // the one -a picks (rank 0, avg, min or max): the table's time, from
                        // which algbw, busbw and MNCL/raw are computed
};

// One placement (out-of-place or in-place) of one size.
struct Result {
  bool measured = false;
  int iters = 0;
  Timing time;
  double algbw = 0, busbw = 0;  // GB/s (1e9 bytes/s), as nccl-tests
  int64_t wrong = -1;           // -1: not checked
  bool has_raw = false;
  Timing raw_time;
  double raw_busbw = 0;
  double ratio = 0;      // MNCL time / raw time (1.00 = parity, above 1 = MNCL slower)
  double pct_limit = 0;  // algbw / (B_mem / traffic factor) * 100; 0 when not measured
  // No bandwidth to report (sendrecv on one rank copies nothing): algbw, busbw and %lim are
  // N/A, and the row stays out of the average.
  bool no_bandwidth = false;
};

// --warmup-calls: the untimed calls made before a collective's first size (counted as made).
struct Warmup {
  CollKind kind = CollKind::kAllreduce;
  size_t bytes = 0;    // the size they ran at
  int mncl_calls = 0;  // MNCL calls made
  bool has_raw = false;
  int raw_calls = 0;  // raw-library calls made (0 where it has no equivalent)
};

struct Row {
  CollKind kind;
  Layout layout;
  int root = -1;
  Result oop, ip;
};

struct RunInfo {
  std::string version;
  std::string backend;
  std::string backend_version;
  int nranks = 0;
  std::string dtype, op;
  int iters = 0, warmup = 0, check = 0;
  int warmup_calls = 0;  // --warmup-calls
  double size_budget_ms = 0;
  const char *time_source = "avg";
  std::string baseline;         // "mpi", "gloo" or "" when none
  std::string baseline_why;     // why none
  std::string baseline_detail;  // how it runs (raw MPI: its thread level), or ""
  MemBandwidth membw;           // bytes_per_s == 0: not measured
  std::string note;
  std::string command;
};

class Reporter {
 public:
  Reporter(RunInfo info, std::FILE *out) : info_(std::move(info)), out_(out) {}
  void begin();
  void begin_collective(CollKind kind, const Warmup &w);
  void add_warmup(const Warmup &w) { warmups_.push_back(w); }
  void row(const Row &r);
  // Prints the footer; returns the total of wrong values.
  int64_t end();
  void write_json(const std::string &path) const;
  void write_csv(const std::string &path) const;
  // The CSV header line, shared with the sweep driver, which concatenates runs.
  static const char *csv_header();
  const RunInfo &info() const { return info_; }

 private:
  double limit_algbw(CollKind kind) const;
  RunInfo info_;
  std::FILE *out_;
  std::vector<Row> rows_;
  std::vector<Warmup> warmups_;
};

// Fills algbw, busbw, ratio and % of limit from the timings.
void derive(Result &res, CollKind kind, size_t bytes, int nranks, double membw_bytes_per_s);

}  // namespace mncl::perf
