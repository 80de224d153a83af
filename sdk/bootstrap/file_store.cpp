#include "bootstrap/file_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "bootstrap/net.h"
#include "bootstrap/store_util.h"
#include "common/error.h"
#include "common/log.h"

namespace mncl::bootstrap {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kFirstPoll{1};
constexpr milliseconds kMaxPoll{20};
// Well under NAME_MAX (255) with room for the hash suffix.
constexpr size_t kMaxNameBytes = 200;
// Temp and lock files start with '.', key files with "k_": they can never collide.
constexpr const char *kLockName = ".lock";

std::string system_error(const char *what, const std::string &path) {
  return format("file store: %s '%s': %s", what, path.c_str(), net::error_text(errno).c_str());
}

// A name unique across hosts, processes and threads sharing the directory. Host and pid
// alone are not: processes in different PID namespaces (containers sharing the folder) may
// have one pid and one host name, hence a random number drawn once per process.
std::string temp_name() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t nonce = [] {
    std::random_device device;
    return static_cast<uint64_t>(device()) << 32 | device();
  }();
  char host[256] = "host";
  gethostname(host, sizeof host - 1);
  return format(".tmp.%s.%d.%016llx.%llu", host, static_cast<int>(getpid()),
                static_cast<unsigned long long>(nonce),
                static_cast<unsigned long long>(counter.fetch_add(1)));
}

void write_all(int fd, const void *data, size_t size, const std::string &path) {
  const auto *at = static_cast<const uint8_t *>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, at, size);
    if (n < 0 && errno == EINTR) continue;
    MNCL_CHECK(n > 0, MNCL_ERR_SYSTEM, "%s", system_error("cannot write", path).c_str());
    at += n;
    size -= static_cast<size_t>(n);
  }
}

std::string not_a_store_file(const std::string &path, const char *what) {
  return format(
      "file store: '%s' is %s, not a file this store made (it makes only regular files and "
      "follows no symbolic link): someone else may have put it there; remove it, and use a "
      "folder only you can write to",
      path.c_str(), what);
}

// Opens a file of the store's folder, never through a symbolic link (one planted there would
// turn this process's reads and writes to a file of the planter's choice) nor a FIFO
// (O_NONBLOCK: open would hang). An invalid descriptor with errno ENOENT if it does not exist.
net::UniqueFd open_entry(const std::string &path, int flags, mode_t mode, struct stat &info) {
  net::UniqueFd fd(open(path.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode));
  if (!fd) {
    if (errno == ENOENT) return fd;
    if (errno == ELOOP && lstat(path.c_str(), &info) == 0 && S_ISLNK(info.st_mode)) {
      throw Error(MNCL_ERR_BOOTSTRAP, not_a_store_file(path, "a symbolic link"));
    }
    throw Error(MNCL_ERR_SYSTEM, system_error("cannot open", path));
  }
  MNCL_CHECK(fstat(fd.get(), &info) == 0, MNCL_ERR_SYSTEM, "%s",
             system_error("cannot stat", path).c_str());
  MNCL_CHECK(S_ISREG(info.st_mode), MNCL_ERR_BOOTSTRAP, "%s",
             not_a_store_file(path, "not a regular file").c_str());
  return fd;
}

// Reads the whole file; false if it does not exist.
bool read_file(const std::string &path, Bytes &out) {
  struct stat info {};
  net::UniqueFd fd = open_entry(path, O_RDONLY, 0, info);
  if (!fd) return false;
  // A key file is never modified in place (only replaced), so its size is final.
  out.resize(static_cast<size_t>(info.st_size));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd.get(), out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    MNCL_CHECK(n >= 0, MNCL_ERR_SYSTEM, "%s", system_error("cannot read", path).c_str());
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return true;
}

bool file_exists(const std::string &path) {
  struct stat info {};
  // lstat: a planted symbolic link is there (get() then says what it is), wherever it points.
  if (lstat(path.c_str(), &info) == 0) return true;
  MNCL_CHECK(errno == ENOENT, MNCL_ERR_SYSTEM, "%s", system_error("cannot stat", path).c_str());
  return false;
}

// Warns once per folder and process: every store of a job would say it again.
void warn_writable_by_others(const std::string &dir, mode_t mode) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!warned.insert(dir).second) return;
  }
  MNCL_WARN(
      "file store: every user may write to '%s' (mode %03o): they could plant or delete the "
      "job's keys; use a folder only you can write to",
      dir.c_str(), static_cast<unsigned>(mode & 07777));
}

void make_directories(const std::string &dir) {
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    const std::string prefix = dir.substr(0, slash);
    // The store's own folder is private: the keys name the job's hosts and processes, and
    // only this user's ranks should read or write them. Parents are made as mkdir -p would.
    if (mkdir(prefix.c_str(), slash == std::string::npos ? 0700 : 0777) != 0 && errno != EEXIST) {
      throw Error(MNCL_ERR_BOOTSTRAP, system_error("cannot create the directory", prefix));
    }
    if (slash == std::string::npos) break;
  }
  // An existing folder may have been made by another user (a predictable name in /tmp): lstat,
  // so that a symbolic link is judged, not the folder it leads to.
  struct stat info {};
  MNCL_CHECK(lstat(dir.c_str(), &info) == 0, MNCL_ERR_BOOTSTRAP, "%s",
             system_error("cannot use the directory", dir).c_str());
  if (S_ISLNK(info.st_mode)) {
    // This user's (or root's) link to a folder (scratch space linked from $HOME) is followed;
    // another user's is not: whoever made it would choose where the job's keys go.
    std::string target(4096, '\0');
    const ssize_t n = readlink(dir.c_str(), target.data(), target.size());
    target.resize(n > 0 ? static_cast<size_t>(n) : 0);
    if (info.st_uid != geteuid() && info.st_uid != 0) {
      throw Error(MNCL_ERR_BOOTSTRAP,
                  format("file store: '%s' is another user's symbolic link (uid %u, to '%s'), "
                         "which the store does not follow: whoever made it chooses where the "
                         "job's keys go; remove it, or use a folder of your own",
                         dir.c_str(), static_cast<unsigned>(info.st_uid), target.c_str()));
    }
    MNCL_CHECK(stat(dir.c_str(), &info) == 0, MNCL_ERR_BOOTSTRAP,
               "file store: '%s' is a symbolic link to '%s', which %s", dir.c_str(), target.c_str(),
               std::strerror(errno));
  }
  MNCL_CHECK(S_ISDIR(info.st_mode), MNCL_ERR_BOOTSTRAP, "file store: '%s' is not a directory",
             dir.c_str());
  // Another user's folder that anyone may write to (a predictable name in /tmp, made first):
  // anyone could read or plant the job's keys. Root's (a shared mount forced to 0777) and a
  // group's (a setgid project folder) are kept, with a warning for the first.
  MNCL_CHECK(info.st_uid == geteuid() || info.st_uid == 0 || (info.st_mode & S_IWOTH) == 0,
             MNCL_ERR_BOOTSTRAP,
             "file store: '%s' belongs to uid %u, not to this user (%u), and every user may write "
             "to it (mode %03o): another user could read or plant the job's keys; use a folder "
             "of your own",
             dir.c_str(), static_cast<unsigned>(info.st_uid), static_cast<unsigned>(geteuid()),
             static_cast<unsigned>(info.st_mode & 07777));
  if ((info.st_mode & S_IWOTH) != 0) warn_writable_by_others(dir, info.st_mode);
  MNCL_CHECK(access(dir.c_str(), R_OK | W_OK | X_OK) == 0, MNCL_ERR_BOOTSTRAP, "%s",
             system_error("cannot use the directory", dir).c_str());
}

// Sleeps for the next poll interval (doubling up to kMaxPoll) but never past the deadline.
void back_off(milliseconds &interval, Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  std::this_thread::sleep_for(std::min<Clock::duration>(interval, std::max(left, {})));
  interval = std::min(interval * 2, kMaxPoll);
}

}  // namespace

std::string key_file_name(const std::string &key) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string name = "k_";
  for (const char ch : key) {
    const auto byte = static_cast<unsigned char>(ch);
    if (std::isalnum(byte) || ch == '.' || ch == '_' || ch == '-') {
      name += ch;
    } else {
      name += '%';
      name += kHex[byte >> 4];
      name += kHex[byte & 15];
    }
  }
  if (name.size() <= kMaxNameBytes) return name;
  // FNV-1a over the whole key tells apart long keys that share the kept prefix.
  uint64_t hash = 14695981039346656037ull;
  for (const char ch : key) hash = (hash ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  name.resize(kMaxNameBytes - 17);
  return name + format("~%016llx", static_cast<unsigned long long>(hash));
}

FileStore::FileStore(std::string dir, std::chrono::milliseconds lock_timeout)
    : dir_(std::move(dir)), lock_timeout_(lock_timeout) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  MNCL_CHECK(!dir_.empty() && dir_.front() == '/', MNCL_ERR_INVALID_ARGUMENT,
             "file store: '%s' is not an absolute directory", dir_.c_str());
  make_directories(dir_);
  MNCL_INFO("using the file store at %s", describe().c_str());
}

std::string FileStore::path_of(const std::string &key) const {
  return dir_ + "/" + key_file_name(key);
}

void FileStore::set(const std::string &key, const void *data, size_t len) {
  const std::string temp = dir_ + "/" + temp_name();
  const std::string path = path_of(key);
  // 0600 whatever the umask: only this user's ranks read the keys. O_EXCL never follows a link.
  net::UniqueFd fd(open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  MNCL_CHECK(fd, MNCL_ERR_SYSTEM, "%s", system_error("cannot create", temp).c_str());
  try {
    write_all(fd.get(), data, len, temp);
    // close() is where NFS reports write errors.
    MNCL_CHECK(::close(fd.release()) == 0, MNCL_ERR_SYSTEM, "%s",
               system_error("cannot write", temp).c_str());
    // rename() is atomic: readers see the old file, no file, or the whole new one.
    MNCL_CHECK(rename(temp.c_str(), path.c_str()) == 0, MNCL_ERR_SYSTEM, "%s",
               system_error("cannot rename a temp file to", path).c_str());
  } catch (...) {
    unlink(temp.c_str());
    throw;
  }
}

Bytes FileStore::get(const std::string &key, const WaitOptions &opts) {
  const auto deadline = Clock::now() + opts.timeout;
  const std::string path = path_of(key);
  auto interval = kFirstPoll;
  Bytes value;
  for (;;) {
    throw_if_aborted(opts, "waiting for store key '" + key + "'");
    const bool last_try = Clock::now() >= deadline;
    if (read_file(path, value)) return value;
    MNCL_CHECK(!last_try, MNCL_ERR_TIMEOUT, "store key '%s' not set within %.1f s", key.c_str(),
               seconds(opts.timeout));
    back_off(interval, deadline);
  }
}

int64_t FileStore::add(const std::string &key, int64_t delta) {
  const std::string lock_path = dir_ + "/" + kLockName;
  // Each call opens its own descriptor, so flock() excludes other threads as well as processes.
  struct stat info {};
  net::UniqueFd lock = open_entry(lock_path, O_RDWR | O_CREAT, 0600, info);
  MNCL_CHECK(lock, MNCL_ERR_SYSTEM, "%s", system_error("cannot open", lock_path).c_str());
  // Polled, not blocking: a holder that never lets go (a stopped process, a lock an NFS server
  // lost track of) must fail this call at the store's timeout, not hang it.
  const auto deadline = Clock::now() + lock_timeout_;
  auto interval = kFirstPoll;
  while (flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    MNCL_CHECK(errno == EINTR || errno == EWOULDBLOCK, MNCL_ERR_SYSTEM, "%s",
               system_error("cannot lock", lock_path).c_str());
    if (errno == EINTR) continue;
    MNCL_CHECK(Clock::now() < deadline, MNCL_ERR_TIMEOUT,
               "file store: cannot add to key '%s': the lock file %s stayed locked for %.1f s "
               "(its holder, another process or thread, is stopped or hung, or the file "
               "system's locks are stale)",
               key.c_str(), lock_path.c_str(), seconds(lock_timeout_));
    back_off(interval, deadline);
  }
  int64_t value = 0;
  Bytes current;
  if (read_file(path_of(key), current)) {
    const char *begin = reinterpret_cast<const char *>(current.data());
    const char *end = begin + current.size();
    const auto [stop, error] = std::from_chars(begin, end, value);
    MNCL_CHECK(!current.empty() && error == std::errc() && stop == end, MNCL_ERR_INVALID_ARGUMENT,
               "store key '%s' holds a %zu-byte value that is not a decimal integer, so it "
               "cannot be added to",
               key.c_str(), current.size());
  }
  MNCL_CHECK(!__builtin_add_overflow(value, delta, &value), MNCL_ERR_INVALID_ARGUMENT,
             "adding %lld to store key '%s' overflows int64", static_cast<long long>(delta),
             key.c_str());
  const std::string text = std::to_string(value);
  set(key, text.data(), text.size());
  return value;  // the lock is released when its descriptor closes
}

std::vector<std::string> FileStore::wait(const std::vector<std::string> &keys,
                                         const WaitOptions &opts) {
  const auto deadline = Clock::now() + opts.timeout;
  auto interval = kFirstPoll;
  std::vector<std::string> missing = keys;
  while (!missing.empty()) {
    throw_if_aborted(opts, "waiting for store key '" + missing.front() + "'");
    const bool last_try = Clock::now() >= deadline;
    missing.erase(std::remove_if(missing.begin(), missing.end(),
                                 [&](const std::string &key) { return file_exists(path_of(key)); }),
                  missing.end());
    if (missing.empty() || last_try) break;
    back_off(interval, deadline);
  }
  return missing;
}

size_t FileStore::erase_prefix(const std::string &prefix) {
  check_erase_prefix(prefix);
  // Names encode keys byte by byte, so a key's name begins with its prefix's, unless the name
  // was shortened before the prefix's end (key_file_name): such keys are passed over.
  std::string start = key_file_name(prefix);
  if (start.size() > kMaxNameBytes - 17) return 0;
  std::unique_ptr<DIR, int (*)(DIR *)> dir(opendir(dir_.c_str()), closedir);
  MNCL_CHECK(dir != nullptr, MNCL_ERR_SYSTEM, "%s",
             system_error("cannot list the directory", dir_).c_str());
  std::vector<std::string> names;
  while (const dirent *entry = readdir(dir.get())) {
    if (std::strncmp(entry->d_name, start.c_str(), start.size()) == 0) {
      names.emplace_back(entry->d_name);
    }
  }
  size_t erased = 0;
  for (const auto &name : names) {
    const std::string path = dir_ + "/" + name;
    if (unlink(path.c_str()) == 0) {
      ++erased;
    } else {
      MNCL_CHECK(errno == ENOENT, MNCL_ERR_SYSTEM, "%s",
                 system_error("cannot delete", path).c_str());
    }
  }
  return erased;
}

bool FileStore::erase(const std::string &key) {
  const std::string path = path_of(key);
  if (unlink(path.c_str()) == 0) return true;
  MNCL_CHECK(errno == ENOENT, MNCL_ERR_SYSTEM, "%s", system_error("cannot delete", path).c_str());
  return false;
}

}  // namespace mncl::bootstrap
