#include "mncl/frontends/checkpointer.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <set>

#include "mncl/frontends/agreement.hpp"

namespace mncl {

namespace {

constexpr char kMagic[8] = {'M', 'N', 'C', 'L', 'C', 'K', 'P', 'T'};
// magic 8 | version 4 | rank 4 | size 4 | group length 4 | iteration 8 | payload length 8 |
// payload crc 4 | header crc 4 (over the 44 bytes before it, then the group) | group | payload.
// Version 1 (the whole job) has no group (its length field, once "reserved", is 0), so its
// files are byte for byte those of the checkpointers before groups; version 2 has one.
constexpr uint32_t kWholeJobVersion = 1;
constexpr uint32_t kGroupVersion = 2;
constexpr std::size_t kHeaderBytes = 48;
constexpr std::size_t kHeaderCrcOffset = 44;

template <class T>
void put(uint8_t *out, std::size_t offset, T value) {
  std::memcpy(out + offset, &value, sizeof value);
}
template <class T>
T get(const uint8_t *in, std::size_t offset) {
  T value;
  std::memcpy(&value, in + offset, sizeof value);
  return value;
}

std::string errno_text() {
  return std::strerror(errno);
}

[[noreturn]] void fail(const std::string &what) {
  throw CheckpointError("checkpointer: " + what);
}

std::string group_name(const std::string &group) {
  return group.empty() ? "the whole job" : "group '" + group + "'";
}

void write_all(int fd, const uint8_t *data, std::size_t size, const std::string &path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("writing " + path + ": " + errno_text());
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

void make_directories(const std::string &directory) {
  std::string prefix;
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = directory.find('/', pos + 1);
    prefix = directory.substr(0, pos);
    if (prefix.empty()) continue;
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      fail("creating " + prefix + ": " + errno_text());
    }
  }
}

void sync_directory(const std::string &directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("opening " + directory + ": " + errno_text());
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail("syncing " + directory + ": " + errno_text());
}

// "123" -> 123; anything else (empty, signs, letters, overflow) -> nullopt.
std::optional<uint64_t> parse_iteration(const std::string &text) {
  // Every uint64 (save() takes any): up to 20 digits, with the overflow checked.
  if (text.empty() || text.size() > 20) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto digit = static_cast<uint64_t>(c - '0');
    if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

}  // namespace

uint32_t crc32(const void *data, std::size_t size, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto *bytes = static_cast<const uint8_t *>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < size; ++i) crc = table[(crc ^ bytes[i]) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

Checkpointer::Checkpointer(Communicator &comm, std::string directory, std::string name,
                           CheckpointerOptions options)
    : comm_(&comm), directory_(std::move(directory)), name_(std::move(name)), options_(options) {
  // Collective: a rank whose arguments or directory fail tells the others at once, which would
  // otherwise learn of it only when resume() timed out waiting for it.
  std::exception_ptr refused;
  try {
    set_up();
  } catch (...) {
    refused = std::current_exception();
  }
  agree_or_throw(comm, "Checkpointer", refused, 0);
}

void Checkpointer::set_up() {
  if (name_.empty() || name_.find('/') != std::string::npos) {
    throw InvalidArgument("Checkpointer: the name '" + name_ + "' must be non-empty without '/'");
  }
  if (options_.keep == 0) throw InvalidArgument("Checkpointer: keep must be at least 1");
  const std::string &user_group = options_.group;
  if (!std::all_of(user_group.begin(), user_group.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
      })) {
    throw InvalidArgument("Checkpointer: the group '" + user_group +
                          "' may only hold letters, digits, '_' and '-'");
  }
  // Ranks of different groups share rank numbers: without the group in the file names they
  // would write the same files and load each other's states.
  const auto &path = comm_->group_path();
  if (!path && user_group.empty()) {
    throw InvalidArgument(
        "Checkpointer: this communicator's group of the job is unknown (it was made by "
        "split_host, split_cross_host or adopt), so its snapshots could not be told from other "
        "groups' (same file names, same ranks): name the group in CheckpointerOptions::group");
  }
  group_ = path.value_or("") + (user_group.empty() ? "" : "u" + user_group);
  if (directory_.empty()) directory_ = ".";
  make_directories(directory_);
  // mkdir's EEXIST also stands for a file of that name, and a folder this rank cannot write to
  // would only fail at the first save.
  struct stat st {};
  if (::stat(directory_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    fail(directory_ + " is not a directory");
  }
  if (::access(directory_.c_str(), W_OK | X_OK) != 0) {
    fail("writing into " + directory_ + ": " + errno_text());
  }
}

std::string Checkpointer::file_prefix() const {
  return name_ + "." + (group_.empty() ? "" : group_ + ".") + std::to_string(comm_->rank()) + ".";
}

std::string Checkpointer::path(uint64_t iteration) const {
  return directory_ + "/" + file_prefix() + std::to_string(iteration);
}

void Checkpointer::save_bytes(uint64_t iteration, Span<const uint8_t> payload) {
  std::array<uint8_t, kHeaderBytes> header{};
  std::memcpy(header.data(), kMagic, sizeof kMagic);
  put<uint32_t>(header.data(), 8, group_.empty() ? kWholeJobVersion : kGroupVersion);
  put<uint32_t>(header.data(), 12, static_cast<uint32_t>(comm_->rank()));
  put<uint32_t>(header.data(), 16, static_cast<uint32_t>(comm_->size()));
  put<uint32_t>(header.data(), 20, static_cast<uint32_t>(group_.size()));
  put<uint64_t>(header.data(), 24, iteration);
  put<uint64_t>(header.data(), 32, payload.size());
  put<uint32_t>(header.data(), 40, crc32(payload.data(), payload.size()));
  put<uint32_t>(header.data(), kHeaderCrcOffset,
                crc32(group_.data(), group_.size(), crc32(header.data(), kHeaderCrcOffset)));

  // Written under a temporary name and renamed: a reader sees the old file or the whole new one.
  const std::string final_path = path(iteration);
  if (const auto size = written_job_size(iteration);
      size && *size != static_cast<uint32_t>(comm_->size())) {
    fail(final_path + " holds a snapshot of a job of " + std::to_string(*size) +
         " ranks; this job has " + std::to_string(comm_->size()) +
         ": checkpoint to another directory or name (it was not overwritten)");
  }
  const std::string temp_path = final_path + ".tmp";
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("creating " + temp_path + ": " + errno_text());
  try {
    write_all(fd, header.data(), header.size(), temp_path);
    write_all(fd, reinterpret_cast<const uint8_t *>(group_.data()), group_.size(), temp_path);
    write_all(fd, payload.data(), payload.size(), temp_path);
    if (options_.sync && ::fsync(fd) != 0) fail("syncing " + temp_path + ": " + errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(temp_path.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(temp_path.c_str());
    fail("closing " + temp_path + ": " + errno_text());
  }
  if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
    ::unlink(temp_path.c_str());
    fail("renaming " + temp_path + " to " + final_path + ": " + errno_text());
  }
  if (options_.sync) sync_directory(directory_);
  prune(iteration);
}

std::vector<uint64_t> Checkpointer::listed_iterations(std::vector<std::string> *temporaries) const {
  std::vector<uint64_t> iterations;
  DIR *dir = ::opendir(directory_.c_str());
  if (!dir) return iterations;
  const std::string prefix = file_prefix();
  const std::string temp_suffix = ".tmp";
  while (const dirent *entry = ::readdir(dir)) {
    const std::string file = entry->d_name;
    if (file.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = file.substr(prefix.size());
    if (auto iteration = parse_iteration(rest)) {
      iterations.push_back(*iteration);
    } else if (temporaries && rest.size() > temp_suffix.size() &&
               rest.compare(rest.size() - temp_suffix.size(), temp_suffix.size(), temp_suffix) ==
                   0 &&
               parse_iteration(rest.substr(0, rest.size() - temp_suffix.size()))) {
      temporaries->push_back(directory_ + "/" + file);
    }
  }
  ::closedir(dir);
  std::sort(iterations.begin(), iterations.end());
  return iterations;
}

std::optional<std::size_t> Checkpointer::check_header(const std::vector<uint8_t> &bytes,
                                                      uint64_t iteration, std::string *why) const {
  auto reject = [why](const std::string &reason) -> std::optional<std::size_t> {
    if (why) *why = reason;
    return std::nullopt;
  };
  if (bytes.size() < kHeaderBytes) {
    return reject("truncated: " + std::to_string(bytes.size()) + " bytes, no complete header");
  }
  const uint8_t *h = bytes.data();
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0) return reject("not an MNCL checkpoint");
  const std::size_t group_length = get<uint32_t>(h, 20);
  if (group_length > bytes.size() - kHeaderBytes) {
    return reject("truncated: the header's group of " + std::to_string(group_length) +
                  " bytes is not all there");
  }
  const std::string group(reinterpret_cast<const char *>(h + kHeaderBytes), group_length);
  if (get<uint32_t>(h, kHeaderCrcOffset) !=
      crc32(group.data(), group.size(), crc32(h, kHeaderCrcOffset))) {
    return reject("header checksum mismatch");
  }
  const uint32_t version = get<uint32_t>(h, 8);
  if (version != (group.empty() ? kWholeJobVersion : kGroupVersion)) {
    return reject("format version " + std::to_string(version));
  }
  if (get<uint32_t>(h, 12) != static_cast<uint32_t>(comm_->rank()) ||
      get<uint64_t>(h, 24) != iteration) {
    return reject("header names rank " + std::to_string(get<uint32_t>(h, 12)) + " iteration " +
                  std::to_string(get<uint64_t>(h, 24)));
  }
  // Another group's state, however it got this name: never loaded.
  if (group != group_) {
    return reject("written by " + group_name(group) + ", this rank checkpoints " +
                  group_name(group_));
  }
  return kHeaderBytes + group_length;
}

std::optional<uint32_t> Checkpointer::written_job_size(uint64_t iteration) const {
  const int fd = ::open(path(iteration).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::vector<uint8_t> head(kHeaderBytes);
  auto read_into = [fd](uint8_t *out, std::size_t size) {
    while (size > 0) {
      const ssize_t n = ::read(fd, out, size);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      out += n;
      size -= static_cast<std::size_t>(n);
    }
    return true;
  };
  bool complete = read_into(head.data(), head.size());
  if (complete) {
    // The group follows the fixed part (at most a few dozen bytes; a corrupt length fails the
    // checksum after a bounded read).
    const std::size_t group_length = std::min<std::size_t>(get<uint32_t>(head.data(), 20), 4096);
    head.resize(kHeaderBytes + group_length);
    complete = read_into(head.data() + kHeaderBytes, group_length);
  }
  ::close(fd);
  if (!complete || !check_header(head, iteration, nullptr)) return std::nullopt;
  return get<uint32_t>(head.data(), 16);
}

bool Checkpointer::of_another_job_size(uint64_t iteration) const {
  const auto size = written_job_size(iteration);
  return size && *size != static_cast<uint32_t>(comm_->size());
}

std::optional<std::vector<uint8_t>> Checkpointer::read_snapshot(uint64_t iteration,
                                                                std::string *why) const {
  auto reject = [why](const std::string &reason) -> std::optional<std::vector<uint8_t>> {
    if (why) *why = reason;
    return std::nullopt;
  };
  const std::string file = path(iteration);
  std::FILE *f = std::fopen(file.c_str(), "rb");
  if (!f) return reject("cannot open: " + errno_text());
  std::vector<uint8_t> bytes;
  std::array<uint8_t, 1 << 16> block;
  std::size_t n;
  while ((n = std::fread(block.data(), 1, block.size(), f)) > 0) {
    bytes.insert(bytes.end(), block.data(), block.data() + n);
  }
  const bool read_error = std::ferror(f) != 0;
  std::fclose(f);
  if (read_error) return reject("read error");
  const auto payload_offset = check_header(bytes, iteration, why);
  if (!payload_offset) return std::nullopt;
  const uint8_t *h = bytes.data();
  const uint64_t length = get<uint64_t>(h, 32);
  if (length != bytes.size() - *payload_offset) {
    return reject("payload is " + std::to_string(bytes.size() - *payload_offset) +
                  " bytes, header says " + std::to_string(length));
  }
  if (get<uint32_t>(h, 40) != crc32(h + *payload_offset, length)) {
    return reject("payload checksum mismatch");
  }
  // Never loaded into a job of another size (resume() says so rather than starting afresh, and
  // nothing deletes or overwrites it).
  if (get<uint32_t>(h, 16) != static_cast<uint32_t>(comm_->size())) {
    return reject("written by a job of " + std::to_string(get<uint32_t>(h, 16)) + " ranks");
  }
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(*payload_offset));
  return bytes;
}

Checkpointer::Scan Checkpointer::scan() const {
  Scan found;
  for (uint64_t iteration : listed_iterations()) {
    std::string why;
    if (read_snapshot(iteration, &why)) {
      found.valid.push_back(iteration);
      continue;
    }
    // Whose header names another job size, the payload intact or not: as save() and prune()
    // judge it (they read the header alone).
    if (const auto size = written_job_size(iteration);
        size && *size != static_cast<uint32_t>(comm_->size())) {
      found.another_job.emplace_back(iteration, *size);
    }
    if (options_.verbose) {
      std::fprintf(stderr, "mncl checkpointer: rank %d: skipping %s: %s\n", comm_->rank(),
                   path(iteration).c_str(), why.c_str());
    }
  }
  return found;
}

std::vector<uint64_t> Checkpointer::local_iterations() const {
  return scan().valid;
}

std::optional<uint64_t> Checkpointer::resume_with(
    const std::function<void(Span<const uint8_t>)> &load) {
  const Scan mine = scan();
  // Iterations every rank holds intact, newest first.
  const auto everyone = comm_->allgather_obj(mine.valid);
  std::set<uint64_t> common(everyone.front().begin(), everyone.front().end());
  for (const auto &theirs : everyone) {
    std::set<uint64_t> kept;
    for (uint64_t iteration : theirs) {
      if (common.count(iteration)) kept.insert(iteration);
    }
    common.swap(kept);
  }
  // Whether `load` ran on some rank (and may have changed its state, fully or in part) for an
  // iteration that not every rank could load, and the ranks' reasons.
  std::optional<uint64_t> touched;
  std::string touched_why;
  for (auto it = common.rbegin(); it != common.rend(); ++it) {
    // [ranks that loaded it, ranks whose load ran at all (and threw or not), ranks whose load
    //  refused this run's configuration]
    std::array<int32_t, 3> counts{0, 0, 0};
    std::string why;
    try {
      if (auto payload = read_snapshot(*it, &why)) {
        counts[1] = 1;
        load(Span<const uint8_t>(*payload));
        counts[0] = 1;
      }
    } catch (const SerializationError &e) {
      why = e.what();
    } catch (const InvalidArgument &e) {
      // Decoded, but not for this configuration (MultiNodeOptimizer's allreduce_every, say):
      // an older snapshot would roll training back, and resuming deletes newer ones.
      why = e.what();
      counts[2] = 1;
    } catch (const std::exception &e) {
      why = e.what();
    }
    if (!counts[0] && options_.verbose) {
      std::fprintf(stderr, "mncl checkpointer: rank %d: cannot load %s: %s\n", comm_->rank(),
                   path(*it).c_str(), why.c_str());
    }
    // Every rank must have loaded the same iteration, or none may use it.
    const bool refused_settings = counts[2] != 0;
    comm_->allreduce(counts, ReduceOp::kSum);
    if (counts[0] == comm_->size()) {
      remove_leftovers(*it);
      return *it;
    }
    // Every rank takes the same branches from here: the counts are the same everywhere.
    // The reason of a rank that refused the settings, where one did (not a corrupt one's).
    const std::string first_why =
        first_reason(counts[2] == 0 || refused_settings ? why : std::string());
    if (counts[2] > 0) {
      throw InvalidArgument(
          "Checkpointer::resume: the snapshot of iteration " + std::to_string(*it) +
          " does not fit this run (" + first_why +
          "); no older one was loaded and nothing was deleted: resume with the settings it was "
          "saved with (the ranks whose load ran may hold its state in part)");
    }
    if (counts[1] > 0 && !touched) {
      touched = *it;
      touched_why = first_why + "; " + std::to_string(counts[1]) + " of " +
                    std::to_string(comm_->size()) + " ranks ran its load, " +
                    std::to_string(counts[0]) + " loaded it whole";
    }
  }
  if (touched) {
    // No older snapshot replaced what a failed attempt loaded: the ranks' states now differ,
    // and "nothing to resume" would let training go on from them. Every rank throws alike.
    throw CheckpointError("Checkpointer::resume: the snapshot of iteration " +
                          std::to_string(*touched) + " could not be loaded on every rank (" +
                          touched_why +
                          "), and no older one that every rank holds loads; the ranks whose "
                          "load ran may hold its state in part or whole, so the state is not "
                          "the same everywhere: rebuild it before training");
  }
  if (common.empty()) refuse_to_start_afresh_over(everyone);
  // Nothing to resume here, but intact snapshots of a job of another size: starting afresh
  // would let the first saves overwrite them (same names). Every rank throws alike.
  const auto another_job = comm_->allgather_obj(mine.another_job);
  for (int rank = 0; rank < comm_->size(); ++rank) {
    if (another_job[rank].empty()) continue;
    const auto [newest, size] = another_job[rank].back();
    throw CheckpointError(
        "Checkpointer::resume: " + directory_ + " holds snapshots of '" + name_ +
        "' that a job of " + std::to_string(size) + " ranks wrote (rank " + std::to_string(rank) +
        "'s newest: iteration " + std::to_string(newest) + ") and none that this job of " +
        std::to_string(comm_->size()) +
        " ranks can resume: run with the job size that wrote them, or checkpoint to another "
        "directory or name; nothing was loaded or deleted");
  }
  remove_leftovers(std::nullopt);
  return std::nullopt;
}

// No iteration every rank holds, yet some rank holds several intact snapshots: no save cut
// short explains that (keeping two or more, every rank keeps the one before the save it was
// in), so a rank lost its snapshots (its directory lost, replaced or not shared, another name
// on one rank). Starting afresh would let the first saves prune the others': the run's whole
// progress, silently. Every rank throws alike (the lists are the same everywhere). Where each
// rank holds at most one (keep = 1 cut short mid-save, or the first save cut short) it still
// starts afresh, as keep = 1 is documented to.
void Checkpointer::refuse_to_start_afresh_over(
    const std::vector<std::vector<uint64_t>> &everyone) const {
  std::set<uint64_t> held;
  std::string holders, without;
  bool several = false;
  int newest_rank = -1;
  for (int rank = 0; rank < static_cast<int>(everyone.size()); ++rank) {
    const auto &theirs = everyone[static_cast<std::size_t>(rank)];
    std::string &list = theirs.empty() ? without : holders;
    list += (list.empty() ? "" : ", ") + std::to_string(rank);
    several = several || theirs.size() > 1;
    held.insert(theirs.begin(), theirs.end());
    if (!theirs.empty() &&
        (newest_rank < 0 ||
         theirs.back() > everyone[static_cast<std::size_t>(newest_rank)].back())) {
      newest_rank = rank;
    }
  }
  if (!several) return;
  throw CheckpointError(
      "Checkpointer::resume: no iteration of '" + name_ + "' in " + directory_ +
      " is intact on every rank, yet ranks " + holders + " hold snapshots (the newest: iteration " +
      std::to_string(*held.rbegin()) + " on rank " + std::to_string(newest_rank) + ")" +
      (without.empty() ? std::string(" of different iterations")
                       : "; ranks " + without +
                             " hold none (a directory lost, replaced or not "
                             "shared with them?)") +
      ", and no save cut short leaves one rank several with none in common" +
      ". Starting afresh would let the first saves delete them: restore the missing snapshots, "
      "or move these away to start afresh; nothing was loaded or deleted");
}

std::string Checkpointer::first_reason(const std::string &mine) const {
  const auto reasons = comm_->allgather_obj(mine);
  for (int rank = 0; rank < comm_->size(); ++rank) {
    if (!reasons[rank].empty()) return "rank " + std::to_string(rank) + ": " + reasons[rank];
  }
  return "no rank said why";
}

void Checkpointer::remove_leftovers(std::optional<uint64_t> resumed) const {
  std::vector<std::string> temporaries;
  for (uint64_t iteration : listed_iterations(&temporaries)) {
    // Newer than what everyone resumed from: a run that did not finish them on every rank
    // (a job of another size's are kept).
    if (resumed && iteration > *resumed && !of_another_job_size(iteration)) {
      remove_snapshot(iteration);
    }
  }
  // Half-written files of a writer that died (only this rank ever writes its files).
  for (const auto &file : temporaries) ::unlink(file.c_str());
}

void Checkpointer::remove_snapshot(uint64_t iteration) const {
  const std::string file = path(iteration);
  if (::unlink(file.c_str()) != 0 && errno != ENOENT) {
    fail("removing " + file + ": " + errno_text());
  }
}

void Checkpointer::prune(uint64_t newest_kept) const {
  std::vector<uint64_t> kept;
  for (uint64_t iteration : listed_iterations()) {
    // A job of another size wrote it: neither this job's to count nor to delete.
    if (of_another_job_size(iteration)) continue;
    if (iteration > newest_kept) {
      remove_snapshot(iteration);  // an abandoned future: it must never win a resume
    } else {
      kept.push_back(iteration);
    }
  }
  // listed_iterations() is sorted: the oldest are in front.
  for (std::size_t i = 0; i + options_.keep < kept.size(); ++i) remove_snapshot(kept[i]);
}

}  // namespace mncl
