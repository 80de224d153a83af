#include "driver.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "report.h"
#include "util.h"

#ifndef MNCL_PERF_PLOT_SCRIPT
#define MNCL_PERF_PLOT_SCRIPT ""
#endif

namespace mncl::perf {

namespace {

bool exists(const std::string &path) {
  return access(path.c_str(), F_OK) == 0;
}

std::string dirname_of(const std::string &path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string self_exe(const char *argv0) {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) return std::string(buf, static_cast<size_t>(n));
  return argv0;
}

// An executable in PATH, or "".
std::string which(const std::string &name) {
  const char *path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    const std::string p = (dir.empty() ? "." : dir) + "/" + name;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// Where libmncl would find libmncl-<name>.so: MNCL_PLUGIN_PATH, then <bin>/../lib/mncl/plugins.
std::string find_plugin(const std::string &bin_dir, const std::string &name) {
  std::vector<std::string> dirs;
  if (const char *p = std::getenv("MNCL_PLUGIN_PATH")) {
    std::stringstream ss(p);
    std::string d;
    while (std::getline(ss, d, ':'))
      if (!d.empty()) dirs.push_back(d);
  }
  dirs.push_back(bin_dir + "/../lib/mncl/plugins");
  dirs.push_back(bin_dir + "/../lib64/mncl/plugins");
  for (const std::string &d : dirs) {
    const std::string f = d + "/libmncl-" + name + ".so";
    if (exists(f)) return f;
  }
  return "";
}

std::string read_file(const std::string &path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs argv with stdout going to `out_path` (unless empty); returns the exit status (128+N
// for a signal).
int spawn(const std::vector<std::string> &args, const std::string &out_path) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return 127;
  if (pid == 0) {
    const int fd =
        out_path.empty() ? -1 : open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      close(fd);
    }
    std::vector<char *> cargv;
    for (const std::string &a : args) cargv.push_back(const_cast<char *>(a.c_str()));
    cargv.push_back(nullptr);
    execvp(cargv[0], cargv.data());
    std::fprintf(stderr, "mncl-perf: cannot run %s\n", cargv[0]);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::vector<std::string> split_csv_line(const std::string &line) {
  std::vector<std::string> cells;
  std::stringstream ss(line);
  std::string c;
  while (std::getline(ss, c, ',')) cells.push_back(c);
  if (!line.empty() && line.back() == ',') cells.push_back("");
  return cells;
}

struct BackendRun {
  std::string backend;
  std::string launcher;
  std::string skipped;  // why it did not run ("" if it ran)
  std::string capped;   // e.g. "1 MiB" when --cap applied
  int status = 0;
  double seconds = 0;
  std::string json, csv, txt;
  std::string unusable;  // file where the ranks write why the backend is unusable here
};

// One line per backend at a few sizes: what the closing notes quote.
void print_summary(const std::vector<BackendRun> &runs) {
  const unsigned long long want[] = {8, 1048576, 67108864};
  std::printf(
      "\n# Summary: out-of-place, sizes 8 B / 1 MiB / 64 MiB or the nearest measured below (first "
      "collective of each run)\n");
  std::printf("# %-8s %-14s %12s %10s %10s %10s %8s\n", "backend", "collective", "size(B)", "busbw",
              "raw busbw", "MNCL/raw", "%lim");
  std::printf("# %-8s %-14s %12s %10s %10s %10s %8s\n", "", "", "", "(GB/s)", "(GB/s)", "(time)",
              "");
  for (const BackendRun &r : runs) {
    if (!r.skipped.empty() || !exists(r.csv)) continue;
    std::ifstream f(r.csv);
    std::string line, first_coll;
    std::getline(f, line);  // header
    std::vector<std::vector<std::string>> rows;
    while (std::getline(f, line)) rows.push_back(split_csv_line(line));
    for (const auto &c : rows)
      if (c.size() >= 23 && first_coll.empty()) first_coll = c[1];
    // Sizes are rounded down to a multiple of the ranks (times the element size), so the
    // requested sizes may not appear: take the largest measured size not above each one.
    std::vector<std::string> picked;
    for (unsigned long long w : want) {
      unsigned long long best = 0;
      bool found = false;
      for (const auto &c : rows) {
        if (c.size() < 23 || c[1] != first_coll || c[2] != "out-of-place") continue;
        const unsigned long long sz = std::strtoull(c[3].c_str(), nullptr, 10);
        if (sz <= w && (!found || sz > best)) best = sz, found = true;
      }
      const std::string size = std::to_string(best);
      if (!found || std::find(picked.begin(), picked.end(), size) != picked.end()) continue;
      picked.push_back(size);
      for (const auto &c : rows) {
        if (c.size() < 23) continue;
        if (c[1] != first_coll || c[2] != "out-of-place" || c[3] != size) continue;
        auto num = [](const std::string &cell, const char *f) {
          if (cell.empty()) return std::string("-");
          char buf[32];
          std::snprintf(buf, sizeof buf, f, std::strtod(cell.c_str(), nullptr));
          return std::string(buf);
        };
        std::printf("  %-8s %-14s %12s %10s %10s %10s %8s\n", c[0].c_str(), c[1].c_str(),
                    c[3].c_str(), num(c[14], "%.4g").c_str(), num(c[18], "%.4g").c_str(),
                    num(c[19], "%.2f").c_str(), num(c[22], "%.2f").c_str());
      }
    }
    if (!r.capped.empty())
      std::printf("  %-8s (sizes capped at %s for this backend)\n", r.backend.c_str(),
                  r.capped.c_str());
  }
}

std::string json_str(const std::string &s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o + "\"";
}

}  // namespace

int run_sweep(const Options &o, int argc, char **argv) {
  const std::string self = self_exe(argv[0]);
  const std::string bin_dir = dirname_of(self);
  std::string mncl_run = bin_dir + "/mncl-run";
  if (!exists(mncl_run)) mncl_run = which("mncl-run");
  const std::string mpirun = which("mpirun");
  const bool tty = isatty(2);

  {
    std::error_code ec;
    std::filesystem::create_directories(o.out_dir, ec);
    if (ec || !std::filesystem::is_directory(o.out_dir)) {
      std::fprintf(stderr, "mncl-perf: cannot create --out-dir %s: %s\n", o.out_dir.c_str(),
                   ec ? ec.message().c_str() : "not a directory");
      return 1;
    }
    const std::string probe = o.out_dir + "/.mncl-perf-write-test";
    std::ofstream t(probe);
    if (!(t << "x") || (t.close(), !t)) {
      std::fprintf(stderr, "mncl-perf: --out-dir %s is not writable\n", o.out_dir.c_str());
      return 1;
    }
    std::remove(probe.c_str());
  }
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);

  std::vector<BackendRun> runs;
  const double t_start = now_s();
  int failures = 0;
  for (size_t bi = 0; bi < o.backends.size(); ++bi) {
    BackendRun r;
    r.backend = o.backends[bi];
    // flat needs mpirun; shm goes through it too when it is installed, so that its table has
    // the raw MPI_Allreduce column (Open MPI's shared-memory path) from the same run.
    const bool via_mpi = r.backend == "flat" || (r.backend == "shm" && !mpirun.empty());
    r.launcher = via_mpi ? "mpirun" : "mncl-run";
    if (find_plugin(bin_dir, r.backend).empty())
      r.skipped = "libmncl-" + r.backend + ".so is not built or not in MNCL_PLUGIN_PATH";
    else if (via_mpi && mpirun.empty())
      r.skipped = "mpirun is not installed (openmpi-bin)";
    else if (!via_mpi && mncl_run.empty())
      r.skipped = "mncl-run not found next to mncl-perf";
    if (!r.skipped.empty()) {
      std::fprintf(stderr, "[sweep %zu/%zu] %s: skipped: %s\n", bi + 1, o.backends.size(),
                   r.backend.c_str(), r.skipped.c_str());
      runs.push_back(r);
      continue;
    }
    Options ro = o;
    if (auto cap = o.caps.find(r.backend); cap != o.caps.end() && cap->second < o.max_bytes) {
      ro.max_bytes = cap->second;
      ro.min_bytes = std::min(ro.min_bytes, ro.max_bytes);
      r.capped = format_size(cap->second);
      ro.note = (ro.note.empty() ? "" : ro.note + "; ") + "sizes capped at " + r.capped +
                " for this backend to fit the sweep's time budget";
    }
    const std::string base = o.out_dir + "/" + r.backend;
    r.json = base + ".json";
    r.csv = base + ".csv";
    r.txt = base + ".txt";
    r.unusable = base + ".unusable";
    std::remove(r.json.c_str());
    std::remove(r.csv.c_str());
    std::remove(r.unusable.c_str());
    std::vector<std::string> args;
    if (via_mpi) {
      args = {mpirun, "-np", std::to_string(o.nranks), "--oversubscribe"};
      if (geteuid() == 0) args.push_back("--allow-run-as-root");
      if (o.backend_timeout_s > 0)
        args.insert(args.end(),
                    {"--timeout", std::to_string(static_cast<int>(o.backend_timeout_s + 0.999))});
    } else {
      args = {mncl_run, "-n", std::to_string(o.nranks)};
      if (o.backend_timeout_s > 0)
        args.insert(args.end(), {"--timeout", std::to_string(o.backend_timeout_s)});
      args.push_back("--");
    }
    args.push_back(self);
    for (const std::string &f : run_flags(ro)) args.push_back(f);
    args.insert(args.end(),
                {"--backend", r.backend, "--json", r.json, "--csv", r.csv, "--progress"});
    std::fprintf(stderr, "[sweep %zu/%zu] %s: %d ranks via %s, %s .. %s%s\n", bi + 1,
                 o.backends.size(), r.backend.c_str(), o.nranks, r.launcher.c_str(),
                 format_size(ro.min_bytes).c_str(), format_size(ro.max_bytes).c_str(),
                 r.capped.empty() ? "" : " (capped)");
    setenv("MNCL_PERF_PROGRESS", tty ? "tty" : "lines", 1);
    setenv("MNCL_PERF_UNUSABLE_FILE", r.unusable.c_str(), 1);
    const double t0 = now_s();
    r.status = spawn(args, r.txt);
    r.seconds = now_s() - t0;
    unsetenv("MNCL_PERF_UNUSABLE_FILE");
    if (tty) std::fputs("\r\033[K", stderr);
    std::fputs(read_file(r.txt).c_str(), stdout);
    std::fflush(stdout);
    // Built but unusable here (nccl without a GPU, a plugin's probe refusing): the ranks wrote
    // why at mncl_comm_create. That is a skip, like a backend that is not built, not a failure.
    if (r.status != 0 && exists(r.unusable)) {
      std::string why = read_file(r.unusable);
      why = why.substr(0, why.find('\n'));
      r.skipped = "unusable here: " + (why.empty() ? std::string("mncl_comm_create failed") : why);
      std::remove(r.unusable.c_str());
      std::fprintf(stderr, "[sweep %zu/%zu] %s: skipped: %s\n", bi + 1, o.backends.size(),
                   r.backend.c_str(), r.skipped.c_str());
      runs.push_back(r);
      continue;
    }
    std::remove(r.unusable.c_str());
    std::fprintf(
        stderr, "[sweep %zu/%zu] %s: %s in %.0f s\n", bi + 1, o.backends.size(), r.backend.c_str(),
        r.status == 0 ? "done" : ("FAILED (exit status " + std::to_string(r.status) + ")").c_str(),
        r.seconds);
    if (r.status != 0) ++failures;
    runs.push_back(r);
  }

  // One combined JSON (each run's document under "runs") and one CSV.
  const std::string json_path = o.out_dir + "/sweep.json", csv_path = o.out_dir + "/sweep.csv",
                    png_path = o.out_dir + "/sweep.png";
  bool json_ok = false, csv_ok = false;
  {
    std::ofstream j(json_path);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    j << "{\"tool\":\"mncl-perf sweep\",\"host\":" << json_str(host) << ",\"ranks\":" << o.nranks
      << ",\"time\":" << static_cast<long long>(std::time(nullptr))
      << ",\"command\":" << json_str(command) << ",\"backends\":[";
    for (size_t i = 0; i < runs.size(); ++i) {
      const BackendRun &r = runs[i];
      j << (i ? "," : "") << "\n{\"backend\":" << json_str(r.backend)
        << ",\"launcher\":" << json_str(r.launcher);
      if (!r.skipped.empty()) {
        j << ",\"skipped\":" << json_str(r.skipped) << "}";
        continue;
      }
      j << ",\"exit_status\":" << r.status << ",\"seconds\":" << r.seconds
        << ",\"capped_at\":" << (r.capped.empty() ? "null" : json_str(r.capped));
      std::string doc = exists(r.json) ? read_file(r.json) : "";
      while (!doc.empty() && (doc.back() == '\n' || doc.back() == ' ')) doc.pop_back();
      j << ",\"run\":" << (doc.empty() ? "null" : doc) << "}";
    }
    j << "\n]}\n";
    j.close();
    json_ok = static_cast<bool>(j);
  }
  {
    std::ofstream c(csv_path);
    c << Reporter::csv_header() << "\n";
    for (const BackendRun &r : runs) {
      if (!r.skipped.empty() || !exists(r.csv)) continue;
      std::ifstream f(r.csv);
      std::string line;
      std::getline(f, line);
      while (std::getline(f, line)) c << line << "\n";
    }
    c.close();
    csv_ok = static_cast<bool>(c);
  }
  if (!json_ok) std::fprintf(stderr, "mncl-perf: cannot write %s\n", json_path.c_str());
  if (!csv_ok) std::fprintf(stderr, "mncl-perf: cannot write %s\n", csv_path.c_str());
  print_summary(runs);

  // The plot: the script picks matplotlib or gnuplot, and says so when it has neither.
  std::string script = o.plot_script;
  if (script.empty()) {
    const std::string installed = bin_dir + "/../share/mncl/mncl-plot";
    script = exists(installed) ? installed : MNCL_PERF_PLOT_SCRIPT;
  }
  bool have_png = false;
  if (!csv_ok) {
    std::fprintf(stderr, "mncl-perf: no combined CSV; no PNG\n");
  } else if (!script.empty() && exists(script)) {
    std::remove(png_path.c_str());
    const int st = spawn({"/bin/sh", script, csv_path, png_path}, "");
    have_png = st == 0 && exists(png_path);
  } else {
    std::fprintf(stderr, "mncl-perf: no plotting script found (--plot-script); no PNG\n");
  }

  const char *not_written = "(NOT written, see the message above)";
  std::printf("\n# Sweep finished in %.0f s. Results:\n#   JSON: %s\n#   CSV:  %s\n#   PNG:  %s\n",
              now_s() - t_start, json_ok ? json_path.c_str() : not_written,
              csv_ok ? csv_path.c_str() : not_written,
              have_png ? png_path.c_str() : "(not produced, see the message above)");
  for (const BackendRun &r : runs)
    if (!r.skipped.empty())
      std::printf("#   %s skipped: %s\n", r.backend.c_str(), r.skipped.c_str());
  for (const BackendRun &r : runs)
    if (r.skipped.empty() && r.status != 0)
      std::printf("#   %s FAILED (exit status %d), its output: %s\n", r.backend.c_str(), r.status,
                  r.txt.c_str());
  std::fflush(stdout);
  return failures == 0 && json_ok && csv_ok ? 0 : 1;
}

}  // namespace mncl::perf
