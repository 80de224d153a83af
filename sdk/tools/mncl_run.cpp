// mncl-run: a small local launcher (like torchrun / mpirun on one host). It starts N copies of a
// program with MNCL_RANK, MNCL_SIZE, MNCL_LOCAL_RANK, MNCL_LOCAL_SIZE and MNCL_STORE set, waits
// for them, and makes sure no rank outlives a failed or timed-out job.
//
// Only POSIX and the C++ standard library: the launcher must work even when libmncl does not.
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "../common/free_port.h"

extern char **environ;

namespace {

constexpr const char *kUsage =
    "Usage: mncl-run -n N [options] [--] program [args...]\n"
    "\n"
    "Starts N local ranks of `program` for MNCL and waits for them.\n"
    "\n"
    "Options:\n"
    "  -n, --np N           number of ranks to start (required, >= 1)\n"
    "  --timeout SECONDS    kill the whole job after SECONDS and exit 124 (default: none)\n"
    "  --grace SECONDS      after a rank fails, how long the others may keep running before\n"
    "                       they are killed (default 5; MNCL_RUN_GRACE)\n"
    "  --backend NAME       set MNCL_BACKEND=NAME for every rank\n"
    "  --store tcp|file     bootstrap store: tcp://127.0.0.1:<free port> (default) or a fresh\n"
    "                       file:// directory, removed when the job ends\n"
    "  --tag-output         prefix every output line with \"[rN] \"\n"
    "  --ranks-per-host M   pose as several hosts: ranks r*M .. r*M+M-1 count as host r (each\n"
    "                       gets MNCL_HOSTID=<host name>~r and its local rank and size), to\n"
    "                       try host-aware code (mncl_comm_split_type) on one machine\n"
    "  -h, --help           show this text\n"
    "\n"
    "Every rank gets MNCL_RANK, MNCL_SIZE, MNCL_LOCAL_RANK, MNCL_LOCAL_SIZE and MNCL_STORE\n"
    "(and MNCL_BACKEND with --backend, MNCL_HOSTID with --ranks-per-host, and with a TCP store\n"
    "a fresh random MNCL_STORE_TOKEN unless one is set); the rest of the environment is\n"
    "inherited.\n"
    "\n"
    "Exit status: 0 if every rank exited 0; otherwise the status of the first rank that failed\n"
    "(128+N if it was killed by signal N); 124 on --timeout; 2 on a usage error. SIGINT, SIGTERM\n"
    "and SIGHUP are forwarded to every rank (a second one kills them).\n";

using Clock = std::chrono::steady_clock;

struct Options {
  int np = 0;
  double timeout_s = 0;  // 0: none
  double grace_s = 5;
  std::string backend;
  int ranks_per_host = 0;  // 0: one real host (no MNCL_HOSTID)
  bool file_store = false;
  bool tag_output = false;
  std::vector<std::string> argv;
};

// A rank's captured output stream (only with --tag-output).
struct Stream {
  int fd = -1;          // read end of the pipe; -1 once closed
  int out_fd = 1;       // where tagged lines go
  std::string pending;  // a partial line waiting for its newline
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int status = 0;  // waitpid status once exited
  Stream out, err;
};

// Signals only set flags and poke a self-pipe; the loop does the work.
volatile sig_atomic_t g_forward_signal = 0;
volatile sig_atomic_t g_signal_count = 0;
int g_wake_pipe[2] = {-1, -1};

void on_signal(int sig) {
  int saved = errno;
  // SIGCHLD only needs to wake the loop, which reaps.
  if (sig != SIGCHLD) {
    g_forward_signal = sig;
    g_signal_count = g_signal_count + 1;
  }
  char c = 0;
  ssize_t ignored = write(g_wake_pipe[1], &c, 1);
  (void)ignored;
  errno = saved;
}

[[noreturn]] void usage_error(const std::string &msg) {
  std::fprintf(stderr, "mncl-run: %s\n(see mncl-run --help)\n", msg.c_str());
  std::exit(2);
}

double parse_seconds(const std::string &flag, const std::string &value) {
  char *end = nullptr;
  errno = 0;
  double v = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || errno != 0 || !(v >= 0) || v > 7 * 24 * 3600.0)
    usage_error(flag + ": '" + value + "' is not a number of seconds in [0, 604800]");
  return v;
}

Options parse_args(int argc, char **argv) {
  Options o;
  // Empty counts as unset, as for the library's variables.
  if (const char *g = std::getenv("MNCL_RUN_GRACE"); g && *g) {
    o.grace_s = parse_seconds("MNCL_RUN_GRACE", g);
  }
  int i = 1;
  // Accepts "--flag value" and "--flag=value".
  auto value_of = [&](const std::string &arg,
                      const std::string &flag) -> std::optional<std::string> {
    if (arg == flag) {
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      return std::string(argv[++i]);
    }
    if (arg.rfind(flag + "=", 0) == 0) return arg.substr(flag.size() + 1);
    return std::nullopt;
  };
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.empty() || a[0] != '-') break;  // the program starts here
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--tag-output") {
      o.tag_output = true;
    } else if (auto v = value_of(a, "-n"); v || (v = value_of(a, "--np"))) {
      char *end = nullptr;
      long n = std::strtol(v->c_str(), &end, 10);
      if (v->empty() || *end != '\0' || n < 1 || n > 4096)
        usage_error("-n: '" + *v + "' is not a rank count in [1, 4096]");
      o.np = static_cast<int>(n);
    } else if (auto v = value_of(a, "--ranks-per-host")) {
      char *end = nullptr;
      long m = std::strtol(v->c_str(), &end, 10);
      if (v->empty() || *end != '\0' || m < 1 || m > 4096)
        usage_error("--ranks-per-host: '" + *v + "' is not a rank count in [1, 4096]");
      o.ranks_per_host = static_cast<int>(m);
    } else if (auto v = value_of(a, "--timeout")) {
      o.timeout_s = parse_seconds("--timeout", *v);
    } else if (auto v = value_of(a, "--grace")) {
      o.grace_s = parse_seconds("--grace", *v);
    } else if (auto v = value_of(a, "--backend")) {
      if (v->empty()) usage_error("--backend needs a non-empty name");
      o.backend = *v;
    } else if (auto v = value_of(a, "--store")) {
      if (*v == "file") {
        o.file_store = true;
      } else if (*v != "tcp") {
        usage_error("--store: '" + *v + "' is neither 'tcp' nor 'file'");
      }
    } else {
      usage_error("unknown option '" + a + "'");
    }
  }
  for (; i < argc; ++i) o.argv.emplace_back(argv[i]);
  if (o.np == 0) usage_error("-n N is required");
  if (o.argv.empty()) usage_error("no program given");
  return o;
}

void remove_tree(const std::string &path) {
  if (DIR *d = opendir(path.c_str())) {
    while (dirent *e = readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      std::string child = path + "/" + name;
      struct stat st;
      if (lstat(child.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        remove_tree(child);
      else
        unlink(child.c_str());
    }
    closedir(d);
  }
  rmdir(path.c_str());
}

void write_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stdout gone: drop the output, keep supervising
    data += n;
    len -= static_cast<size_t>(n);
  }
}

// Writes every complete line of `s` (and, at EOF, the rest) with the rank's tag. Whole lines
// go out in one write so lines of different ranks never mix.
void emit_lines(Stream &s, int rank, bool eof) {
  const std::string tag = "[r" + std::to_string(rank) + "] ";
  size_t start = 0;
  std::string out;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1)
    out += tag + s.pending.substr(start, nl + 1 - start);
  s.pending.erase(0, start);
  if (eof && !s.pending.empty()) {
    out += tag + s.pending + "\n";
    s.pending.clear();
  }
  if (!out.empty()) write_all(s.out_fd, out.data(), out.size());
}

void drain(Stream &s, int rank) {
  char buf[65536];
  for (;;) {
    ssize_t n = read(s.fd, buf, sizeof(buf));
    if (n > 0) {
      s.pending.append(buf, static_cast<size_t>(n));
      // Flush very long lines without a newline, so memory stays bounded.
      if (s.pending.size() > (1u << 20)) {
        s.pending += '\n';
        emit_lines(s, rank, false);
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    emit_lines(s, rank, true);  // EOF or a read error: the stream is done
    close(s.fd);
    s.fd = -1;
    break;
  }
  emit_lines(s, rank, false);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char *name = strsignal(sig);
    return "killed by signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
  }
  return "ended with wait status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

class Launcher {
 public:
  explicit Launcher(Options o) : opt_(std::move(o)), ranks_(static_cast<size_t>(opt_.np)) {}

  int run() {
    if (!setup_store()) return 1;
    install_signal_handlers();
    int rc = spawn_all() ? supervise() : finish_spawn_failure();
    if (!store_dir_.empty()) remove_tree(store_dir_);
    return rc;
  }

 private:
  bool setup_store() {
    if (opt_.file_store) {
      const char *tmp = std::getenv("TMPDIR");
      std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/mncl-run-XXXXXX";
      std::vector<char> buf(templ.begin(), templ.end());
      buf.push_back('\0');
      if (!mkdtemp(buf.data())) {
        std::fprintf(stderr, "mncl-run: mkdtemp(%s): %s\n", templ.c_str(), std::strerror(errno));
        return false;
      }
      // A file store's URL needs an absolute path (a relative TMPDIR gave a relative one).
      char *absolute = realpath(buf.data(), nullptr);
      if (absolute == nullptr) {
        std::fprintf(stderr, "mncl-run: realpath(%s): %s\n", buf.data(), std::strerror(errno));
        rmdir(buf.data());
        return false;
      }
      store_dir_ = absolute;
      std::free(absolute);
      store_ = "file://" + store_dir_;
    } else {
      int port = mncl::free_loopback_port();
      if (port <= 0) {
        std::fprintf(stderr, "mncl-run: cannot find a free TCP port on 127.0.0.1: %s\n",
                     std::strerror(errno));
        return false;
      }
      store_ = "tcp://127.0.0.1:" + std::to_string(port);
      // Any local user can reach 127.0.0.1: without a secret, anyone could read or overwrite
      // the job's keys. An inherited MNCL_STORE_TOKEN is kept (and passed on as it is).
      const char *inherited = std::getenv("MNCL_STORE_TOKEN");
      if (inherited == nullptr || *inherited == '\0') {
        unsigned char bytes[16];
        if (getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes)) {
          std::fprintf(stderr, "mncl-run: getrandom: %s\n", std::strerror(errno));
          return false;
        }
        static const char kHex[] = "0123456789abcdef";
        for (unsigned char b : bytes) {
          token_ += kHex[b >> 4];
          token_ += kHex[b & 15];
        }
      }
    }
    return true;
  }

  void install_signal_handlers() {
    if (pipe(g_wake_pipe) != 0) {
      std::perror("mncl-run: pipe");
      std::exit(1);
    }
    for (int fd : g_wake_pipe) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
      fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaction(sig, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the supervisor
  }

  // Everything a child needs is prepared before fork, so the child only calls exec.
  std::vector<std::string> child_env(int rank) const {
    static const char *const kOverridden[] = {
        "MNCL_RANK=", "MNCL_SIZE=", "MNCL_LOCAL_RANK=", "MNCL_LOCAL_SIZE=", "MNCL_STORE=",
        "MNCL_BACKEND=", "MNCL_HOSTID=",
        // torchrun's names for the same numbers, for scripts that read them (LOCAL_RANK to
        // pick a GPU); MNCL reads its own first, and these agree with them.
        "RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "GROUP_RANK="};
    std::vector<std::string> env;
    for (char **e = environ; *e; ++e) {
      bool skip = false;
      for (const char *p : kOverridden) {
        // MNCL_BACKEND and MNCL_HOSTID are only replaced when their option is given.
        bool optional = (std::strcmp(p, "MNCL_BACKEND=") == 0 && opt_.backend.empty()) ||
                        (std::strcmp(p, "MNCL_HOSTID=") == 0 && opt_.ranks_per_host == 0);
        if (std::strncmp(*e, p, std::strlen(p)) == 0 && !optional) skip = true;
      }
      if (!skip) env.emplace_back(*e);
    }
    const int per_host = opt_.ranks_per_host > 0 ? opt_.ranks_per_host : opt_.np;
    const int host = rank / per_host;
    const std::string local_rank = std::to_string(rank % per_host);
    const std::string local_size = std::to_string(std::min(per_host, opt_.np - host * per_host));
    if (opt_.ranks_per_host > 0) {
      char name[256] = "";
      if (gethostname(name, sizeof name - 1) != 0) std::strcpy(name, "localhost");
      env.push_back("MNCL_HOSTID=" + std::string(name) + "~" + std::to_string(host));
    }
    for (const char *prefix : {"MNCL_", ""}) {
      const std::string p = prefix;
      env.push_back(p + "RANK=" + std::to_string(rank));
      env.push_back(p + (p.empty() ? "WORLD_SIZE=" : "SIZE=") + std::to_string(opt_.np));
      env.push_back(p + "LOCAL_RANK=" + local_rank);
      env.push_back(p + (p.empty() ? "LOCAL_WORLD_SIZE=" : "LOCAL_SIZE=") + local_size);
    }
    env.push_back("GROUP_RANK=" + std::to_string(host));
    env.push_back("MNCL_STORE=" + store_);
    if (!token_.empty()) env.push_back("MNCL_STORE_TOKEN=" + token_);
    if (!opt_.backend.empty()) env.push_back("MNCL_BACKEND=" + opt_.backend);
    return env;
  }

  bool spawn(int r) {
    Rank &rk = ranks_[static_cast<size_t>(r)];
    std::vector<std::string> env = child_env(r);
    std::vector<char *> envp, argv;
    for (auto &s : env) envp.push_back(&s[0]);
    envp.push_back(nullptr);
    std::vector<std::string> args = opt_.argv;
    for (auto &s : args) argv.push_back(&s[0]);
    argv.push_back(nullptr);

    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if (opt_.tag_output && (pipe(out_pipe) != 0 || pipe(err_pipe) != 0)) {
      std::perror("mncl-run: pipe");
      return false;
    }
    const pid_t launcher = getpid();
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("mncl-run: fork");
      return false;
    }
    if (pid == 0) {
      // Own process group: the launcher can kill the rank with everything it started, and a
      // terminal's Ctrl-C reaches only the launcher, which forwards it.
      setpgid(0, 0);
      // A launcher killed outright (SIGKILL: a CI job cancelled, timeout -k) forwards nothing:
      // the rank dies with it instead of running on as an orphan. getppid() closes the race of
      // a launcher that died before the prctl.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(137);
      struct sigaction dfl;
      std::memset(&dfl, 0, sizeof(dfl));
      dfl.sa_handler = SIG_DFL;
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) sigaction(sig, &dfl, nullptr);
      if (opt_.tag_output) {
        dup2(out_pipe[1], 1);
        dup2(err_pipe[1], 2);
        for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
      }
      environ = envp.data();
      execvp(argv[0], argv.data());
      int e = errno;
      std::string msg = "mncl-run: rank " + std::to_string(r) + ": cannot execute '" +
                        opt_.argv[0] + "': " + std::strerror(e) + "\n";
      write_all(2, msg.data(), msg.size());
      _exit(e == ENOENT ? 127 : 126);
    }
    setpgid(pid, pid);  // also here, so kill(-pid) works even before the child ran
    rk.pid = pid;
    rk.running = true;
    if (opt_.tag_output) {
      close(out_pipe[1]);
      close(err_pipe[1]);
      rk.out = Stream{out_pipe[0], 1, {}};
      rk.err = Stream{err_pipe[0], 2, {}};
      for (int fd : {out_pipe[0], err_pipe[0]}) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        fcntl(fd, F_SETFD, FD_CLOEXEC);
      }
    }
    return true;
  }

  bool spawn_all() {
    for (int r = 0; r < opt_.np; ++r)
      if (!spawn(r)) return false;
    return true;
  }

  int finish_spawn_failure() {
    signal_all(SIGKILL);
    while (reap(true)) {
    }
    return 1;
  }

  void signal_all(int sig) {
    for (auto &rk : ranks_)
      if (rk.running) kill(-rk.pid, sig);
  }

  std::string running_list() const {
    std::string s;
    for (size_t r = 0; r < ranks_.size(); ++r)
      if (ranks_[r].running) s += (s.empty() ? "" : ", ") + std::to_string(r);
    return s;
  }

  int running_count() const {
    int n = 0;
    for (auto &rk : ranks_) n += rk.running ? 1 : 0;
    return n;
  }

  // Reaps finished ranks; returns whether any rank is still running.
  bool reap(bool block) {
    for (;;) {
      if (running_count() == 0) return false;
      int status = 0;
      pid_t pid = waitpid(-1, &status, block ? 0 : WNOHANG);
      if (pid < 0 && errno == EINTR) continue;
      if (pid <= 0) return true;
      for (size_t r = 0; r < ranks_.size(); ++r) {
        Rank &rk = ranks_[r];
        if (rk.pid != pid || !rk.running) continue;
        rk.running = false;
        rk.status = status;
        bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && !killing_) {
          // Failures after we started killing are our own doing; only report real ones.
          std::fprintf(stderr, "mncl-run: rank %zu (pid %d) %s\n", r, static_cast<int>(pid),
                       describe(status).c_str());
        }
        if (failed && first_failed_ < 0 && !timed_out_) {
          first_failed_ = static_cast<int>(r);
          if (!killing_ && running_count() > 0) {
            kill_at_ = Clock::now() + to_duration(opt_.grace_s);
            kill_reason_ = "rank " + std::to_string(r) + " failed";
          }
        }
      }
      if (block) return running_count() > 0;
    }
  }

  static Clock::duration to_duration(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  // Escalation: SIGTERM to every rank's group, then SIGKILL after a short while.
  void start_killing(const std::string &why) {
    if (killing_) return;
    killing_ = true;
    std::fprintf(stderr, "mncl-run: %s; terminating ranks still running: %s\n", why.c_str(),
                 running_list().c_str());
    signal_all(SIGTERM);
    sigkill_at_ = Clock::now() + std::chrono::seconds(3);
  }

  int supervise() {
    const auto start = Clock::now();
    std::optional<Clock::time_point> deadline;
    if (opt_.timeout_s > 0) deadline = start + to_duration(opt_.timeout_s);
    std::optional<Clock::time_point> drain_until;  // bounds output draining after the last exit
    int handled_signals = 0;

    for (;;) {
      reap(false);
      auto now = Clock::now();

      if (g_signal_count != handled_signals) {
        handled_signals = g_signal_count;
        int sig = g_forward_signal;
        if (handled_signals == 1) {
          // Forward first, as a terminal would have done; the ranks decide how to end.
          signal_all(sig);
          if (!kill_at_) kill_at_ = now + to_duration(opt_.grace_s);
          kill_reason_ = "received signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
        } else {
          killing_ = true;
          signal_all(SIGKILL);
        }
      }
      if (deadline && !timed_out_ && now >= *deadline && running_count() > 0) {
        timed_out_ = true;
        char why[64];
        std::snprintf(why, sizeof(why), "timeout after %g s", opt_.timeout_s);
        start_killing(why);
      }
      if (kill_at_ && now >= *kill_at_ && running_count() > 0) start_killing(kill_reason_);
      if (sigkill_at_ && now >= *sigkill_at_ && running_count() > 0) {
        signal_all(SIGKILL);
        sigkill_at_ = now + std::chrono::seconds(1);  // and again, should a rank still linger
      }

      bool streams_open = false;
      for (auto &rk : ranks_) streams_open |= rk.out.fd >= 0 || rk.err.fd >= 0;
      if (running_count() == 0) {
        // A rank's background children may hold its pipes open; do not wait for them forever.
        if (!drain_until) drain_until = now + std::chrono::seconds(2);
        if (!streams_open || now >= *drain_until) break;
      }

      std::vector<pollfd> fds;
      std::vector<std::pair<int, Stream *>> owners;
      fds.push_back({g_wake_pipe[0], POLLIN, 0});
      for (size_t r = 0; r < ranks_.size(); ++r) {
        for (Stream *s : {&ranks_[r].out, &ranks_[r].err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          owners.emplace_back(static_cast<int>(r), s);
        }
      }
      // Wake up periodically anyway: deadlines, and a SIGCHLD that raced with poll.
      int wait_ms = 100;
      int n = poll(fds.data(), fds.size(), wait_ms);
      if (n < 0 && errno != EINTR) {
        std::perror("mncl-run: poll");
        break;
      }
      if (n <= 0) continue;
      if (fds[0].revents) {
        char buf[64];
        while (read(g_wake_pipe[0], buf, sizeof(buf)) > 0) {
        }
      }
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents) drain(*owners[i - 1].second, owners[i - 1].first);
    }
    // Flush whatever is left (a pipe still held open by a grandchild).
    for (size_t r = 0; r < ranks_.size(); ++r) {
      for (Stream *s : {&ranks_[r].out, &ranks_[r].err}) {
        if (s->fd < 0) continue;
        emit_lines(*s, static_cast<int>(r), true);
        close(s->fd);
        s->fd = -1;
      }
    }
    if (timed_out_) return 124;
    if (first_failed_ >= 0) {
      return exit_code_of(ranks_[static_cast<size_t>(first_failed_)].status);
    }
    return 0;
  }

  Options opt_;
  std::vector<Rank> ranks_;
  std::string store_;
  std::string store_dir_;
  std::string token_;  // MNCL_STORE_TOKEN for the ranks of a TCP store, unless inherited
  int first_failed_ = -1;
  bool timed_out_ = false;
  bool killing_ = false;
  std::optional<Clock::time_point> kill_at_;
  std::optional<Clock::time_point> sigkill_at_;
  std::string kill_reason_;
};

}  // namespace

int main(int argc, char **argv) {
  Options opt = parse_args(argc, argv);
  return Launcher(std::move(opt)).run();
}
