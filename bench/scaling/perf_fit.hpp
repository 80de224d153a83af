// Reading mncl-perf results (its --json or --csv files, one backend or a sweep) and fitting the
// α–β parameters of each backend's allreduce.
//
// mncl-perf times t(n) per call for n bytes on p ranks. Fitting t = a + b·n (least squares on
// the relative error, so 8-byte and 64-MiB rows count alike) and reading the result as a ring
// allreduce, a = 2(p-1)·α and b = 2(p-1)/p·β, gives per-message α and per-byte β. At p = 2 all
// the algorithms of scaling_model.hpp coincide (2α + nβ), so 2-rank results fit without
// knowing which algorithm the backend ran.
#ifndef MNCL_BENCH_SCALING_PERF_FIT_HPP
#define MNCL_BENCH_SCALING_PERF_FIT_HPP

#include <string>
#include <vector>

#include "scaling_model.hpp"

namespace mncl_scaling {

struct PerfRow {
  std::string backend;
  std::string collective;
  std::string placement;
  int ranks = 0;
  double bytes = 0;
  double time_us = 0;
};

struct PerfFile {
  std::vector<PerfRow> rows;
  double membw_gbps = 0;  // the run's measured memory bandwidth (all ranks), when present
};

// Reads a .json (mncl-perf or sweep) or .csv file; throws std::runtime_error on bad input.
PerfFile read_perf_file(const std::string &path);

struct Fit {
  std::string backend;
  int ranks = 0;
  std::size_t points = 0;
  double a_s = 0, b_s_per_byte = 0;  // t(n) = a + b n, as measured on `ranks` ranks
  LinkCost link;                     // α, β read as a ring allreduce
  double rms_relative_error = 0;     // of the fitted line against the points
  double predict_s(double bytes) const { return a_s + b_s_per_byte * bytes; }
};

// Least-squares fit over the allreduce rows of one backend at one rank count, with sizes in
// [min_bytes, max_bytes]. Throws when fewer than two sizes remain.
Fit fit_allreduce(const std::vector<PerfRow> &rows, const std::string &backend, int ranks,
                  double min_bytes = 0, double max_bytes = 1e300);

// Every (backend, ranks) pair with allreduce rows, in file order.
std::vector<std::pair<std::string, int>> allreduce_groups(const std::vector<PerfRow> &rows);

}  // namespace mncl_scaling

#endif  // MNCL_BENCH_SCALING_PERF_FIT_HPP
