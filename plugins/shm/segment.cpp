#include "shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>

#include "common/host.h"

namespace mncl::shm {

namespace kit = mncl::kit;

namespace {

constexpr size_t kPage = 4096;

size_t round_up(size_t x, size_t to) {
  return (x + to - 1) / to * to;
}

std::string errno_text(int err) {
  return std::string(std::strerror(err));
}

// A name lives only between shm_open and the moment every rank has mapped it (bounded by the
// create timeout), so one still there much later belongs to a creator killed in that window:
// remove it if that pid is gone and the file is older than 15 minutes (the age keeps us away
// from a creator in another pid namespace that shares this /dev/shm).
void sweep_stale_segments() {
  DIR *dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  const size_t prefix_len = std::strlen(kNamePrefix);
  const time_t now = time(nullptr);
  while (dirent *e = readdir(dir)) {
    if (std::strncmp(e->d_name, kNamePrefix, prefix_len) != 0) continue;
    const long pid = std::strtol(e->d_name + prefix_len, nullptr, 10);
    if (pid <= 0 || kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    struct stat st;
    const std::string path = std::string("/dev/shm/") + e->d_name;
    if (stat(path.c_str(), &st) != 0 || st.st_uid != getuid() || now - st.st_mtime < 15 * 60) {
      continue;
    }
    shm_unlink((std::string("/") + e->d_name).c_str());
  }
  closedir(dir);
}

}  // namespace

Layout::Layout(int nranks, size_t chunk_bytes, size_t p2p_slot_bytes)
    : n(nranks), chunk(chunk_bytes), p2p_slot(p2p_slot_bytes) {
  const size_t nn = static_cast<size_t>(n) * static_cast<size_t>(n);
  ctl = round_up(sizeof(Header), kPage);
  channels = round_up(ctl + static_cast<size_t>(n) * sizeof(RankCtl), kPage);
  p2p = round_up(channels + nn * sizeof(Channel), kPage);
  staging = round_up(p2p + nn * 2 * p2p_slot, kPage);
  // 2 halves plus a 320-byte skew (5 cache lines): strides that are not a power of two.
  staging_stride = 2 * chunk + 320;
  total = round_up(staging + static_cast<size_t>(n) * staging_stride, kPage);
}

Segment::~Segment() {
  unlink();
  if (base_ != nullptr) munmap(base_, layout_.total);
}

void Segment::create(const Layout &layout) {
  layout_ = layout;
  sweep_stale_segments();
  // Unique per host: pid (also lets a human tell whose it was), time and randomness.
  std::random_device rd;
  const unsigned long long nonce = (static_cast<unsigned long long>(rd()) << 32) ^ rd();
  for (int attempt = 0; attempt < 8; ++attempt) {
    name_ = kit::format("/%s%d-%llx-%d", kNamePrefix, static_cast<int>(getpid()), nonce, attempt);
    const int fd = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno == EEXIST) continue;
    if (fd < 0) {
      throw kit::Error(MNCL_ERR_SYSTEM, kit::format("shm: shm_open(%s) failed: %s", name_.c_str(),
                                                    errno_text(errno).c_str()));
    }
    linked_ = true;
    // posix_fallocate reserves the pages now: on a full tmpfs it fails here, where ftruncate
    // alone would let a later store into the mapping die with SIGBUS.
    const int err = posix_fallocate(fd, 0, static_cast<off_t>(layout_.total));
    if (err != 0) {
      close(fd);
      unlink();
      throw kit::Error(
          MNCL_ERR_SYSTEM,
          kit::format("shm: cannot reserve %zu bytes in /dev/shm for %s (%d "
                      "ranks): %s (free /dev/shm or enlarge it, docker run "
                      "--shm-size; lower MNCL_SHM_CHUNK; or use another backend, "
                      "MNCL_BACKEND=gloo)",
                      layout_.total, name_.c_str(), layout_.n, errno_text(err).c_str()));
    }
    map(fd);
    return;
  }
  throw kit::Error(MNCL_ERR_SYSTEM, "shm: could not find an unused segment name");
}

void Segment::attach(const std::string &name, const Layout &layout) {
  layout_ = layout;
  name_ = name;
  const int fd = shm_open(name_.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    throw kit::Error(MNCL_ERR_SYSTEM,
                     kit::format("shm: cannot open segment %s: %s (do all ranks share this "
                                 "host's /dev/shm?)",
                                 name_.c_str(), errno_text(errno).c_str()));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != layout_.total) {
    close(fd);
    throw kit::Error(MNCL_ERR_SYSTEM,
                     kit::format("shm: segment %s has %lld bytes, expected %zu", name_.c_str(),
                                 static_cast<long long>(st.st_size), layout_.total));
  }
  map(fd);
}

void Segment::map(int fd) {
  void *p = mmap(nullptr, layout_.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);  // the mapping keeps the object alive
  if (p == MAP_FAILED) {
    throw kit::Error(MNCL_ERR_SYSTEM,
                     kit::format("shm: mmap of %zu bytes (%s) failed: %s", layout_.total,
                                 name_.c_str(), errno_text(err).c_str()));
  }
  base_ = static_cast<unsigned char *>(p);
}

void Segment::unlink() {
  if (linked_) shm_unlink(name_.c_str());
  linked_ = false;
}

std::string host_identity() {
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::string id = (boot.empty() ? "?" : boot) + "|" + host;
  // Test hook: lets one machine pose as several hosts (tests/shm checks the refusal).
  if (const char *fake = std::getenv("MNCL_SHM_FAKE_HOST")) id += std::string("/") + fake;
  return id;
}

PidNamespace pid_namespace() {
  struct stat st;
  if (stat("/proc/self/ns/pid", &st) != 0) return {};
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

void publish_pid(RankCtl &ctl) {
  const PidNamespace ns = pid_namespace();
  ctl.pidns_dev.store(ns.dev, std::memory_order_relaxed);
  ctl.pidns_ino.store(ns.ino, std::memory_order_relaxed);
  ctl.pid.store(static_cast<int32_t>(getpid()), std::memory_order_release);
}

}  // namespace mncl::shm
