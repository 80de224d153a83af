#include "report.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace mncl::perf {

namespace {

std::string fmt(const char *f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string time_str(double us) {
  return fmt(us < 1e5 ? "%.2f" : "%.0f", us);
}

std::string json_escape(const std::string &s) {
  std::string o;
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      o += '\\';
      o += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += ch;
    }
  }
  return o;
}

std::string json_num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// "reported" is the time the table shows and algbw / busbw / MNCL/raw come from: -a's pick (the
// run's "time" field names it), which with -a 0 (rank 0's) is none of avg, min, max.
std::string json_timing(const Timing &t) {
  return "{\"avg\":" + json_num(t.avg) + ",\"min\":" + json_num(t.min) +
         ",\"max\":" + json_num(t.max) + ",\"reported\":" + json_num(t.reported) + "}";
}

// The text columns of one placement, or N/A.
std::string placement_cells(const Result &r, bool with_raw, bool with_limit) {
  char buf[256];
  if (!r.measured) {
    std::snprintf(buf, sizeof buf, "  %6s %9s %7s %7s %6s", "N/A", "N/A", "N/A", "N/A", "N/A");
    std::string s = buf;
    if (with_raw) {
      std::snprintf(buf, sizeof buf, "  %9s %8s", "N/A", "N/A");
      s += buf;
    }
    if (with_limit) s += "    N/A";
    return s;
  }
  const std::string algbw = r.no_bandwidth ? "N/A" : fmt("%.2f", r.algbw),
                    busbw = r.no_bandwidth ? "N/A" : fmt("%.2f", r.busbw);
  std::snprintf(buf, sizeof buf, "  %6d %9s %7s %7s %6s", r.iters,
                time_str(r.time.reported).c_str(), algbw.c_str(), busbw.c_str(),
                r.wrong < 0 ? "N/A" : std::to_string(r.wrong).c_str());
  std::string s = buf;
  if (with_raw) {
    if (r.has_raw)
      std::snprintf(buf, sizeof buf, "  %9s %8.2f", time_str(r.raw_time.reported).c_str(), r.ratio);
    else
      std::snprintf(buf, sizeof buf, "  %9s %8s", "N/A", "N/A");
    s += buf;
  }
  if (with_limit) {
    if (r.no_bandwidth || r.pct_limit <= 0)
      std::snprintf(buf, sizeof buf, " %6s", "N/A");
    else
      std::snprintf(buf, sizeof buf, " %6.1f", r.pct_limit);
    s += buf;
  }
  return s;
}

}  // namespace

void derive(Result &res, CollKind kind, size_t bytes, int nranks, double membw_bytes_per_s) {
  const double sec = res.time.reported * 1e-6;
  res.algbw = sec > 0 ? static_cast<double>(bytes) / 1e9 / sec : 0;
  res.busbw = res.algbw * busbw_factor(kind, nranks);
  if (res.has_raw) {
    res.raw_busbw =
        res.raw_time.reported > 0
            ? static_cast<double>(bytes) / 1e3 / res.raw_time.reported * busbw_factor(kind, nranks)
            : 0;
    res.ratio = res.raw_time.reported > 0 ? res.time.reported / res.raw_time.reported : 0;
  }
  if (res.no_bandwidth) res.algbw = res.busbw = res.raw_busbw = 0;
  if (membw_bytes_per_s > 0 && !res.no_bandwidth) {
    const double limit = membw_bytes_per_s / 1e9 / traffic_factor(kind, nranks);
    res.pct_limit = 100.0 * res.algbw / limit;
  }
}

double Reporter::limit_algbw(CollKind kind) const {
  return info_.membw.bytes_per_s / 1e9 / traffic_factor(kind, info_.nranks);
}

void Reporter::begin() {
  std::fprintf(out_, "# mncl-perf %s: backend %s%s%s, %d ranks, %s %s\n", info_.version.c_str(),
               info_.backend.c_str(), info_.backend_version.empty() ? "" : " ",
               info_.backend_version.c_str(), info_.nranks, info_.dtype.c_str(), info_.op.c_str());
  std::fprintf(
      out_, "#   iters %d, warmup %d, check %d, time = %s over ranks%s\n", info_.iters,
      info_.warmup, info_.check, info_.time_source,
      info_.size_budget_ms > 0 ? ", fewer iterations where one exceeds the size budget" : "");
  if (info_.warmup_calls > 0)
    std::fprintf(
        out_,
        "#   before each collective's first size: %d untimed calls of MNCL%s (--warmup-calls)\n",
        info_.warmup_calls,
        info_.baseline.empty() ? "" : (", then as many of raw " + info_.baseline).c_str());
  else
    std::fprintf(out_, "#   no warm-up before the first size (--warmup-calls 0)\n");
  if (info_.size_budget_ms > 0)
    std::fprintf(out_, "#   size budget %.0f ms per size and placement\n", info_.size_budget_ms);
  if (!info_.note.empty()) std::fprintf(out_, "#   note: %s\n", info_.note.c_str());
  if (info_.membw.bytes_per_s > 0) {
    std::fprintf(out_,
                 "#   memory bandwidth (copy, read+write, %d ranks at once, %s per rank): "
                 "%.2f GB/s => allreduce algbw limit B_mem/(2*%d) = %.2f GB/s\n",
                 info_.nranks, (std::to_string(info_.membw.buffer_bytes >> 20) + " MiB").c_str(),
                 info_.membw.bytes_per_s / 1e9, info_.nranks, limit_algbw(CollKind::kAllreduce));
  } else if (info_.membw.multi_host) {
    std::fprintf(out_,
                 "#   memory bandwidth: N/A (the ranks span more than one host: their clocks "
                 "cannot time one copy span, and the limit is a one-host bound); %%lim N/A\n");
  } else {
    std::fprintf(out_, "#   memory bandwidth: not measured (--no-membw)\n");
  }
  if (!info_.baseline.empty())
    std::fprintf(out_,
                 "#   baseline: raw %s%s on the same buffers in the same run; MNCL/raw = MNCL "
                 "time / raw time (above 1: MNCL slower)\n",
                 info_.baseline.c_str(),
                 info_.baseline_detail.empty() ? "" : (" (" + info_.baseline_detail + ")").c_str());
  else
    std::fprintf(out_, "#   baseline: none (%s)\n", info_.baseline_why.c_str());
  std::fflush(out_);
}

void Reporter::begin_collective(CollKind kind, const Warmup &w) {
  const bool raw = !info_.baseline.empty(),
             lim = info_.membw.bytes_per_s > 0 || info_.membw.multi_host;
  std::string group = "  %6s %9s %7s %7s %6s";
  std::string cols;
  char buf[256];
  std::snprintf(buf, sizeof buf, group.c_str(), "iters", "time", "algbw", "busbw", "#wrong");
  cols += buf;
  std::string units;
  std::snprintf(buf, sizeof buf, group.c_str(), "", "(us)", "(GB/s)", "(GB/s)", "");
  units += buf;
  if (raw) {
    std::snprintf(buf, sizeof buf, "  %9s %8s", "raw", "MNCL/raw");
    cols += buf;
    std::snprintf(buf, sizeof buf, "  %9s %8s", "(us)", "(time)");
    units += buf;
  }
  if (lim) {
    cols += "   %lim";
    units += "       ";
  }
  const int width = static_cast<int>(cols.size());
  // The warm-up calls as made (raw: N/A where the library has no equivalent of the call).
  std::string warm;
  if (w.mncl_calls > 0)
    warm = "; warm-up: " + std::to_string(w.mncl_calls) + " MNCL" +
           (!w.has_raw        ? std::string()
            : w.raw_calls > 0 ? " + " + std::to_string(w.raw_calls) + " raw"
                              : std::string(" (raw N/A)")) +
           " calls at " + std::to_string(w.bytes) + " B";
  std::fprintf(out_, "#\n# %s, %s%s\n", spec_of(kind).name,
               info_.membw.multi_host ? "memory limit N/A (ranks on more than one host)"
               : lim
                   ? ("memory limit: algbw <= " + fmt("%.2f", limit_algbw(kind)) + " GB/s").c_str()
                   : "memory limit not measured",
               warm.c_str());
  std::fprintf(out_, "# %-8s %12s %12s %8s %6s %6s %*s %*s\n", "", "", "", "", "", "", -width,
               "   out-of-place", -width, "   in-place");
  std::fprintf(out_, "# %-8s %12s %12s %8s %6s %6s%s%s\n", "backend", "size", "count", "type",
               "redop", "root", cols.c_str(), cols.c_str());
  std::fprintf(out_, "# %-8s %12s %12s %8s %6s %6s%s%s\n", "", "(B)", "(elements)", "", "", "",
               units.c_str(), units.c_str());
  std::fflush(out_);
}

void Reporter::row(const Row &r) {
  rows_.push_back(r);
  const bool raw = !info_.baseline.empty(),
             lim = info_.membw.bytes_per_s > 0 || info_.membw.multi_host;
  const CollSpec &s = spec_of(r.kind);
  std::fprintf(out_, "  %-8s %12zu %12zu %8s %6s %6d%s%s\n", info_.backend.c_str(), r.layout.bytes,
               r.layout.count, info_.dtype.c_str(), s.reduces ? info_.op.c_str() : "none",
               s.rooted ? r.root : -1, placement_cells(r.oop, raw, lim).c_str(),
               placement_cells(r.ip, raw, lim).c_str());
  std::fflush(out_);
}

int64_t Reporter::end() {
  int64_t wrong = 0;
  double bw = 0;
  int n = 0;
  for (const Row &r : rows_) {
    for (const Result *res : {&r.oop, &r.ip}) {
      if (!res->measured) continue;
      if (res->wrong > 0) wrong += res->wrong;
      if (res->no_bandwidth) continue;  // N/A: not part of the average
      bw += res->busbw;
      ++n;
    }
  }
  std::fprintf(out_, "# Out of bounds values : %lld %s\n", static_cast<long long>(wrong),
               wrong == 0 ? "OK" : "FAILED");
  std::fprintf(out_, "# Avg bus bandwidth    : %g \n#\n", n > 0 ? bw / n : 0.0);
  std::fflush(out_);
  return wrong;
}

const char *Reporter::csv_header() {
  return "backend,collective,placement,size_B,count,type,redop,root,ranks,iters,time_us,"
         "time_min_us,time_max_us,algbw_GBps,busbw_GBps,wrong,baseline,raw_time_us,"
         "raw_busbw_GBps,mncl_over_raw_time,membw_GBps,limit_busbw_GBps,pct_of_limit";
}

void Reporter::write_csv(const std::string &path) const {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path);
  f << csv_header() << "\n";
  for (const Row &r : rows_) {
    const CollSpec &s = spec_of(r.kind);
    for (int p = 0; p < 2; ++p) {
      const Result &res = p == 0 ? r.oop : r.ip;
      if (!res.measured) continue;
      const double limit_bus = info_.membw.bytes_per_s > 0
                                   ? limit_algbw(r.kind) * busbw_factor(r.kind, info_.nranks)
                                   : 0;
      f << info_.backend << ',' << s.name << ',' << (p == 0 ? "out-of-place" : "in-place") << ','
        << r.layout.bytes << ',' << r.layout.count << ',' << info_.dtype << ','
        << (s.reduces ? info_.op : "none") << ',' << (s.rooted ? r.root : -1) << ',' << info_.nranks
        << ',' << res.iters << ',' << json_num(res.time.reported) << ',' << json_num(res.time.min)
        << ',' << json_num(res.time.max) << ',' << (res.no_bandwidth ? "" : json_num(res.algbw))
        << ',' << (res.no_bandwidth ? "" : json_num(res.busbw)) << ','
        << (res.wrong < 0 ? "" : std::to_string(res.wrong)) << ','
        << (res.has_raw ? info_.baseline : "") << ','
        << (res.has_raw ? json_num(res.raw_time.reported) : "") << ','
        << (res.has_raw && !res.no_bandwidth ? json_num(res.raw_busbw) : "") << ','
        << (res.has_raw ? json_num(res.ratio) : "") << ','
        << (info_.membw.bytes_per_s > 0 ? json_num(info_.membw.bytes_per_s / 1e9) : "") << ','
        << (limit_bus > 0 ? json_num(limit_bus) : "") << ','
        << (limit_bus > 0 && !res.no_bandwidth ? json_num(res.pct_limit) : "") << "\n";
    }
  }
  if (!f) throw std::runtime_error("cannot write " + path);
}

void Reporter::write_json(const std::string &path) const {
  std::ostringstream j;
  j << "{\"tool\":\"mncl-perf\",\"version\":\"" << json_escape(info_.version) << "\",";
  j << "\"backend\":\"" << json_escape(info_.backend) << "\",\"backend_version\":\""
    << json_escape(info_.backend_version) << "\",\"ranks\":" << info_.nranks << ",";
  j << "\"dtype\":\"" << info_.dtype << "\",\"op\":\"" << info_.op << "\",\"iters\":" << info_.iters
    << ",\"warmup\":" << info_.warmup << ",\"warmup_calls\":" << info_.warmup_calls
    << ",\"check\":" << info_.check << ",\"size_budget_ms\":" << json_num(info_.size_budget_ms)
    << ",\"time\":\"" << info_.time_source << "\",";
  j << "\"command\":\"" << json_escape(info_.command) << "\",\"note\":\"" << json_escape(info_.note)
    << "\",";
  if (info_.membw.bytes_per_s > 0)
    j << "\"membw\":{\"GBps\":" << json_num(info_.membw.bytes_per_s / 1e9)
      << ",\"per_rank_GBps\":" << json_num(info_.membw.per_rank_bytes_per_s / 1e9)
      << ",\"buffer_bytes\":" << info_.membw.buffer_bytes
      << ",\"convention\":\"read+write bytes of all ranks copying at once\"},";
  else if (info_.membw.multi_host)
    j << "\"membw\":null,\"membw_why\":\"ranks on more than one host\",";
  else
    j << "\"membw\":null,";
  if (!info_.baseline.empty())
    j << "\"baseline\":\"" << json_escape(info_.baseline) << "\",\"baseline_detail\":\""
      << json_escape(info_.baseline_detail) << "\",";
  else
    j << "\"baseline\":null,\"baseline_why\":\"" << json_escape(info_.baseline_why) << "\",";
  // The warm-up calls made before each collective's first size (--warmup-calls).
  j << "\"warmups\":[";
  for (size_t i = 0; i < warmups_.size(); ++i) {
    const Warmup &w = warmups_[i];
    j << (i ? "," : "") << "{\"collective\":\"" << spec_of(w.kind).name << "\",\"size\":" << w.bytes
      << ",\"mncl_calls\":" << w.mncl_calls
      << ",\"raw_calls\":" << (w.has_raw ? std::to_string(w.raw_calls) : "null") << "}";
  }
  j << "],";
  j << "\"results\":[";
  bool first = true;
  for (const Row &r : rows_) {
    const CollSpec &s = spec_of(r.kind);
    for (int p = 0; p < 2; ++p) {
      const Result &res = p == 0 ? r.oop : r.ip;
      if (!res.measured) continue;
      j << (first ? "\n" : ",\n");
      first = false;
      j << "{\"collective\":\"" << s.name << "\",\"placement\":\""
        << (p == 0 ? "out-of-place" : "in-place") << "\",\"size\":" << r.layout.bytes
        << ",\"count\":" << r.layout.count << ",\"root\":" << (s.rooted ? r.root : -1)
        << ",\"iters\":" << res.iters << ",\"time_us\":" << json_timing(res.time)
        << ",\"algbw_GBps\":" << (res.no_bandwidth ? "null" : json_num(res.algbw))
        << ",\"busbw_GBps\":" << (res.no_bandwidth ? "null" : json_num(res.busbw))
        << ",\"busbw_factor\":" << json_num(busbw_factor(r.kind, info_.nranks))
        << ",\"wrong\":" << (res.wrong < 0 ? "null" : std::to_string(res.wrong));
      if (res.has_raw)
        j << ",\"raw\":{\"library\":\"" << info_.baseline
          << "\",\"time_us\":" << json_timing(res.raw_time)
          << ",\"busbw_GBps\":" << (res.no_bandwidth ? "null" : json_num(res.raw_busbw))
          << ",\"mncl_over_raw_time\":" << json_num(res.ratio) << "}";
      else
        j << ",\"raw\":null";
      if (info_.membw.bytes_per_s > 0)
        j << ",\"limit_algbw_GBps\":" << json_num(limit_algbw(r.kind))
          << ",\"pct_of_limit\":" << (res.no_bandwidth ? "null" : json_num(res.pct_limit));
      j << "}";
    }
  }
  j << "\n]}\n";
  std::ofstream f(path);
  f << j.str();
  if (!f) throw std::runtime_error("cannot write " + path);
}

}  // namespace mncl::perf
