#include "core/comm.h"

#include <cxxabi.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "bootstrap/memory_store.h"
#include "common/coll.h"   // the plugin kit: kit::make_coll, kit::make_batch_coll
#include "common/dtype.h"  // the plugin kit: kit::is_v_kind
#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "core/debug_checks.h"
#include "core/peer_watch.h"
#include "core/selection.h"
#include "core/validate.h"
#include "cuda/driver.h"
#include "loader/plugin_call.h"
#include "topology/agreement.h"
#include "topology/hwloc_topology.h"

namespace mncl::core {

namespace {

using Clock = std::chrono::steady_clock;

// Lane workers linger after operations up to this size (see Comm::work).
constexpr size_t kLingerMaxBytes = 64 * 1024;
// How long a wait on a natively posted operation polls before it starts to sleep. MPI (flat)
// progresses an operation only inside its calls: a 4 MiB allreduce on 4 ranks takes about 2 ms
// of polling, and waits that slept from 500 us on made it 2.5x slower than MPI_Wait.
constexpr auto kNativeSpin = std::chrono::milliseconds(20);

// The value of a rank's "leave/<rank>" key: it left in the leave protocol (its rank 0 waits for
// every rank's and then erases the communicator's keys), or abandoned an aborted communicator
// (nobody waits: the last rank to leave erases them, where rank 0 abandoned it too).
constexpr char kLeftInTurn[] = "1";
constexpr char kLeftAbandoned[] = "a";

// now + ms, saturating: a timeout too long for the clock means no deadline.
Clock::time_point deadline_after(int64_t ms) {
  const auto now = Clock::now();
  const int64_t room =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now).count();
  return ms >= room ? Clock::time_point::max() : now + std::chrono::milliseconds(ms);
}

// "mncl_recv #3 (peer 1)": an operation in messages, with its peer for point to point.
std::string describe_op(const mncl_coll_v1_t &c) {
  std::string label = op_label(coll_function_name(c.kind), c.kind, c.seq);
  if (c.kind == MNCL_COLL_SEND || c.kind == MNCL_COLL_RECV) label += format(" (peer %d)", c.root);
  return label;
}

// The host this rank counts as on: MNCL_HOSTID, else the host name.
std::string hostname() {
  if (auto id = env::get("MNCL_HOSTID")) {
    if (!id->empty()) return *id;
  }
  char name[256] = "";
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

std::string bytes_to_string(const bootstrap::Bytes &b) {
  return std::string(b.begin(), b.end());
}

// The lines of a rank's join record (see Comm::create).
std::vector<std::string> join_fields(const std::string &join) {
  std::vector<std::string> fields;
  size_t start = 0;
  for (size_t newline; (newline = join.find('\n', start)) != std::string::npos;
       start = newline + 1) {
    fields.push_back(join.substr(start, newline - start));
  }
  fields.push_back(join.substr(start));
  return fields;
}

// "1, 3 and 4" for messages.
std::string list_ranks(const std::vector<int> &ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += (i + 1 == ranks.size()) ? " and " : ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

bootstrap::WaitOptions wait_options(int64_t timeout_ms, const std::atomic<bool> *aborted) {
  bootstrap::WaitOptions opts;
  opts.timeout = std::chrono::milliseconds(timeout_ms);
  opts.aborted = aborted;
  return opts;
}

// After this rank set its leave key: where rank 0 abandoned the communicator (aborted before
// its destroy: it waits for nobody) and every rank has left, erases the communicator's keys
// (store: its view), which otherwise stayed for the job's life, an aborted operation's data
// included (naive). Rank 0's key is read first, so that only then are all of them looked at.
// Several ranks may find every key at once: erasing is idempotent, and every leave key is set
// by then (whichever rank sets the last one finds them all).
void erase_if_all_abandoned(bootstrap::Store &store, int size) {
  const std::string first = "leave/0";
  if (!store.wait({first}, wait_options(0, nullptr)).empty()) return;
  const bootstrap::Bytes how = store.get(first, wait_options(0, nullptr));
  if (std::string(how.begin(), how.end()) != kLeftAbandoned) return;  // rank 0 erases them
  std::vector<std::string> leave;
  for (int r = 1; r < size; ++r) leave.push_back("leave/" + std::to_string(r));
  if (store.wait(leave, wait_options(0, nullptr)).empty()) store.erase_prefix("");
}

// Called while an exchange still waits for the ranks named; may throw to stop waiting.
using WhileWaiting = std::function<void(const std::vector<int> &missing_ranks)>;

// Sets "<prefix><rank>" on this rank and waits for every rank's key; returns every rank's
// value. On timeout, names the ranks that never wrote theirs. With while_waiting, waits in
// slices of half a second and calls it after each slice that left keys missing.
std::vector<std::string> exchange(bootstrap::Store &store, const std::string &prefix, int rank,
                                  int size, const std::string &value, int64_t timeout_ms,
                                  const std::atomic<bool> *aborted, const char *what,
                                  std::vector<int> *missing_ranks = nullptr,
                                  const WhileWaiting &while_waiting = nullptr) {
  store.set(prefix + std::to_string(rank), value.data(), value.size());
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(prefix + std::to_string(r));
  const auto ranks_of = [&](const std::vector<std::string> &missing) {
    std::vector<int> ranks;
    for (const auto &k : missing) ranks.push_back(std::stoi(k.substr(prefix.size())));
    if (missing_ranks) *missing_ranks = ranks;
    return ranks;
  };
  constexpr int64_t kSliceMs = 500;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto missing = keys;
  std::vector<std::string> values;  // read while waiting (with while_waiting)
  for (;;) {
    const int64_t left_ms =
        std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                 deadline - std::chrono::steady_clock::now())
                                 .count());
    const bool last_slice = !while_waiting || left_ms <= kSliceMs;
    missing = store.wait(missing, wait_options(last_slice ? left_ms : kSliceMs, aborted));
    if (missing.empty() && while_waiting) {
      // A rank that fails may take its key back (Comm::leave_after_failed_join): read every
      // value now, and wait again for any that went (its rank's failure tells the others).
      for (const auto &k : keys) {
        try {
          values.push_back(bytes_to_string(store.get(k, wait_options(0, aborted))));
        } catch (const Error &e) {
          if (e.status() != MNCL_ERR_TIMEOUT) throw;
          missing.push_back(k);
        }
      }
      if (!missing.empty()) values.clear();
    }
    if (missing.empty() || last_slice) break;
    while_waiting(ranks_of(missing));
  }
  if (!missing.empty()) {
    const std::vector<int> ranks = ranks_of(missing);
    throw Error(MNCL_ERR_TIMEOUT,
                format("%s: rank%s %s did not %s within %.1f s (store %s)", what,
                       ranks.size() > 1 ? "s" : "", list_ranks(ranks).c_str(),
                       std::strcmp(what, "mncl_comm_create") == 0 ? "join" : "respond",
                       timeout_ms / 1000.0, store.describe().c_str()));
  }
  if (!values.empty()) return values;
  for (const auto &k : keys) {
    values.push_back(bytes_to_string(store.get(k, wait_options(timeout_ms, aborted))));
  }
  return values;
}

// Every rank of a new communicator chooses its backend from the same job facts and publishes
// its choice (or its failure) under "choice/" of `store`; every rank runs the same agreement
// over all of them (agreement.h), so that all end the same way instead of some waiting for
// others that gave up. settings.rank/size are the new communicator's.
Selection agree_on_backend(bootstrap::Store &store, const LaunchSettings &settings, int local_size,
                           int num_hosts, const std::atomic<bool> *aborted, const char *fn) {
  Selection selection;
  std::string local_error;
  mncl_status_t local_status = MNCL_ERR_PLUGIN;
  // The plugin folders as this creation found them: searched once, for the choice and for the
  // agreed backend (see loader::Discovery).
  loader::Discovery plugins;
  // Any failure is published, so that the other ranks end at once too instead of waiting out
  // the timeout for this rank's record.
  try {
    selection = select_backend(settings, probe_info(settings, local_size, num_hosts), &plugins);
    MNCL_INFO("backend %s chosen: %s", selection.plugin->name().c_str(), selection.why.c_str());
  } catch (const Error &e) {
    // MNCL_ERR_PLUGIN, whatever the cause (a backend could not be had), but for a bad setting
    // of a plugin's own (MNCL_SHM_CHUNK=1K), which the user must correct.
    local_error = e.what();
    if (e.status() == MNCL_ERR_INVALID_ARGUMENT) local_status = MNCL_ERR_INVALID_ARGUMENT;
  } catch (const std::exception &e) {
    local_error = format("internal error while choosing the backend: %s", e.what());
    local_status = MNCL_ERR_INTERNAL;
  } catch (...) {
    local_error = "internal error while choosing the backend (an unknown exception)";
    local_status = MNCL_ERR_INTERNAL;
  }
  const std::string record = local_error.empty() ? "ok\n" + topology::serialize(selection.choice)
                                                 : "error\n" + local_error;
  const auto records =
      exchange(store, "choice/", settings.rank, settings.size, record, settings.timeout_ms, aborted,
               format("%s (backend choice)", fn).c_str());
  std::vector<topology::RankChoice> choices;
  std::vector<std::string> failures;
  for (int r = 0; r < settings.size; ++r) {
    const std::string &rec = records[r];
    if (rec.compare(0, 6, "error\n") == 0) {
      if (r != settings.rank) failures.push_back(format("rank %d: %s", r, rec.c_str() + 6));
    } else {
      choices.push_back(topology::parse_choice(rec.substr(3)));
    }
  }
  if (!local_error.empty()) throw Error(local_status, format("%s: %s", fn, local_error.c_str()));
  if (!failures.empty()) {
    std::string all;
    for (const auto &f : failures) all += "\n  " + f;
    throw Error(MNCL_ERR_PLUGIN,
                format("%s: other ranks could not choose a backend:%s", fn, all.c_str()));
  }
  const topology::Agreement agreement = topology::agree(choices);
  if (!agreement.error.empty())
    throw Error(MNCL_ERR_PLUGIN, format("%s: %s", fn, agreement.error.c_str()));
  if (agreement.backend != selection.plugin->name()) {
    MNCL_INFO("backend %s instead of %s: %s", agreement.backend.c_str(),
              selection.plugin->name().c_str(), agreement.why.c_str());
    selection.plugin = loader::load(agreement.backend, &plugins);  // in this rank's usable list
  }
  return selection;
}

// The private store folders (file:///tmp/mncl-<uid>-ompi-<job>, made up under mpirun) that
// this process holds rank 0 of. Removed when the process ends (or libmncl is unloaded), not
// with a communicator: another world communicator of the job may still be using the folder,
// and a peer that has left the last one may already be creating the next one in it. They
// only hold this job's keys, which each communicator's rank 0 deletes at destroy.
//
// A process killed before it exits (mpirun ends the job when a rank fails) leaves its folder:
// rank 0 writes who it is into the folder (kOwnerFile), and the next job's rank 0 removes the
// folders of this user whose rank 0 has died since.
class PrivateStoreFolders {
 public:
  static void own(const std::string &dir) {
    static PrivateStoreFolders folders;
    {
      std::lock_guard<std::mutex> lock(folders.mutex_);
      if (!folders.dirs_.insert(dir).second) return;
    }
    write_owner(dir);
    remove_stale(dir);
  }
  ~PrivateStoreFolders() {
    for (const std::string &dir : dirs_) {
      std::error_code ignored;  // best effort
      std::filesystem::remove_all(dir, ignored);
    }
  }

 private:
  // Not a key's file name (FileStore names none with a leading dot).
  static constexpr const char *kOwnerFile = ".rank0";

  // Who owns a folder: its process_identity ("<boot id> <pid namespace> <pid> <start time>").
  // A pid alone could be reused, and means nothing on another boot or in another pid namespace
  // that shares /tmp (a container): only an owner seen from the same boot and namespace is
  // judged (liveness).
  static void write_owner(const std::string &dir) {
    const std::string owner = process_identity(::getpid());
    if (owner.empty()) return;
    std::ofstream(dir + "/" + kOwnerFile) << owner << "\n";
  }

  // This user's other private folders whose owner is gone: same boot and pid namespace, and
  // its pid no longer runs the process that wrote it. Best effort; never fails the create.
  static void remove_stale(const std::string &own_dir) {
    const std::string prefix = format("mncl-%d-ompi-", static_cast<int>(getuid()));
    std::error_code error;
    for (const auto &entry : std::filesystem::directory_iterator("/tmp", error)) {
      const std::string dir = entry.path().string();
      struct stat info {};
      if (entry.path().filename().string().rfind(prefix, 0) != 0 || dir == own_dir ||
          lstat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode) || info.st_uid != getuid()) {
        continue;
      }
      std::string owner;
      std::getline(std::ifstream(dir + "/" + kOwnerFile), owner);
      // Unowned yet, still running, or not judged from here.
      if (liveness(owner) != Liveness::kGone) continue;
      std::istringstream fields(owner);
      std::string boot, ns;
      int pid = 0;
      fields >> boot >> ns >> pid;
      std::error_code ignored;
      if (std::filesystem::remove_all(dir, ignored) > 0) {
        MNCL_INFO(
            "removed %s, the store folder of a job whose rank 0 (pid %d) ended without "
            "removing it",
            dir.c_str(), pid);
      }
    }
  }

  std::mutex mutex_;
  std::set<std::string> dirs_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Creation: rendezvous, backend agreement, plugin communicator.
// ---------------------------------------------------------------------------------------------

std::unique_ptr<Comm> Comm::create(const mncl_config_t *user_config) {
  const mncl_config_t config = read_user_config(user_config);
  const LaunchSettings settings = resolve_launch_settings(config);

  std::unique_ptr<Comm> comm(new Comm());
  comm->rank_ = settings.rank;
  comm->size_ = settings.size;
  comm->timeout_ms_ = settings.timeout_ms;
  comm->device_ = settings.device;
  comm->debug_checks_ = settings.debug_checks;
  comm->history_.set_max_running(Comm::max_lanes(settings.size));
  comm->linger_ = std::chrono::microseconds(settings.lane_linger_us);
  // A process may create several world communicators on one store in turn (re-creation after
  // a failure, test suites): each generation gets its own key namespace, the same on every
  // rank since every rank creates them in the same order.
  {
    static std::mutex mutex;
    static std::map<std::string, int> generations;
    std::lock_guard<std::mutex> lock(mutex);
    const int generation = generations[settings.store_url]++;
    comm->id_ = generation == 0 ? "w" : format("w%d", generation);
  }
  comm->launch_ = std::make_shared<const LaunchSettings>(settings);
  comm->job_ = std::make_shared<Job>();
  comm->job_->tcp_store = settings.store_url.rfind("tcp://", 0) == 0;
  comm->job_->hosts_tcp_store = comm->job_->tcp_store && settings.rank == 0;
  comm->job_->world_rank = settings.rank;
  comm->job_->world_size = settings.size;
  comm->job_->world_id = comm->id_;
  log::set_rank(settings.rank);
  MNCL_INFO("creating rank %d of %d, store %s, backend '%s', timeout %.1f s", settings.rank,
            settings.size, settings.store_url.empty() ? "(in-process)" : settings.store_url.c_str(),
            settings.backend_spec.c_str(), settings.timeout_ms / 1000.0);

  const std::string host = hostname();
  // Two processes given one rank (a launcher's variable left in the shell, one MNCL_RANK for
  // all) would both wait for the rank no one took: the second to claim it fails at once, and
  // leaves a note that makes the others stop waiting.
  const std::string rank_words =
      format("rank %d (from %s)", settings.rank, settings.rank_origin.c_str());
  // The job's size travels in the note: a process of another job that happens to use the
  // same store address (another job's "rank 0" on the same MASTER_ADDR:MASTER_PORT) must not
  // stop this one.
  const std::string claim = format("%s a second time: %s pid %d (a job of %d ranks)",
                                   rank_words.c_str(), host.c_str(), ::getpid(), settings.size);
  const auto note_of_this_job = [&](const std::string &note) {
    const size_t at = note.find("(a job of ");
    int size = -1;
    return at != std::string::npos && std::sscanf(note.c_str() + at, "(a job of %d", &size) == 1 &&
           size == settings.size;
  };
  // What a second rank 0 that found the TCP store's address taken appends to its note. It
  // claims nothing in the store (it may be another job's, whose rank 0 has not claimed yet):
  // a TCP store lives as long as its job, so its note is no earlier job's.
  static constexpr const char *kStoreTaken = "; it found the store's address taken";
  const auto opts = wait_options(settings.timeout_ms, &comm->aborted_);
  // torchrun's MASTER_ADDR:MASTER_PORT (a store no one named): MASTER_ADDR=$(hostname) may
  // resolve to 127.0.1.1 on rank 0 (Debian's /etc/hosts) and to the host's network address
  // elsewhere; only then is the store served on every address of rank 0's host. An address the
  // user named is kept to (mncl-run's tcp://127.0.0.1:port stays off the network).
  // A job whose ranks are all on this host (LOCAL_WORLD_SIZE = WORLD_SIZE) needs no other.
  const bool one_host = settings.local_size >= 1 && settings.local_size >= settings.size;
  const auto listen = settings.store_from_master && !one_host
                          ? bootstrap::TcpListen::kEveryAddressForAHostNameOnLoopback
                          : bootstrap::TcpListen::kNamedHost;
  try {
    comm->job_store_ = settings.store_url.empty()
                           ? bootstrap::make_memory_store()
                           : bootstrap::open_store(settings.store_url, settings.rank, settings.size,
                                                   opts, listen, settings.job_token);
  } catch (const Error &e) {
    // Two processes that both think they are rank 0 both start the store: the second finds
    // the address taken. Say which variable made it rank 0.
    const bool taken = std::strstr(e.what(), "in use") != nullptr;
    if (!(taken && settings.rank == 0 && comm->job_->tcp_store)) throw;
    if (settings.size > 1) {
      // Leave the note in the other rank 0's store, as a client, if that is what holds the
      // address (briefly: it may be some other program).
      try {
        const auto store = bootstrap::make_prefix_store(
            bootstrap::open_store(settings.store_url, 1, settings.size,
                                  wait_options(2000, &comm->aborted_),
                                  bootstrap::TcpListen::kNamedHost, settings.job_token),
            comm->id_ + "/");
        const std::string note = claim + kStoreTaken;
        store->set("claim/twice", note.data(), note.size());
      } catch (const Error &note_error) {
        MNCL_INFO("mncl_comm_create: could not tell the other rank 0: %s", note_error.what());
      }
    }
    throw Error(e.status(), format("%s; is another process rank 0 too? This one is rank 0 "
                                   "from %s",
                                   e.what(), settings.rank_origin.c_str()));
  }
  if (comm->job_->hosts_tcp_store) {
    comm->job_store_->set(kServedWorldKey, comm->id_.data(), comm->id_.size());
  } else if (comm->job_->tcp_store) {
    comm->job_store_ = comm->reach_own_server(std::move(comm->job_store_), settings, listen);
  }
  if (settings.store_is_private_dir) {
    // A made-up name in /tmp that another user could have created first, to read or plant
    // keys: the folder must be this user's, and no one else's to look into.
    const std::string dir = settings.store_url.substr(std::strlen("file://"));
    struct stat info {};
    // lstat: a symbolic link planted under the name would have this job chmod its target.
    MNCL_CHECK(lstat(dir.c_str(), &info) == 0 && S_ISDIR(info.st_mode), MNCL_ERR_BOOTSTRAP,
               "the job's private store folder %s is not a folder (a symbolic link?): someone "
               "else made it; remove it, or set MNCL_STORE",
               dir.c_str());
    MNCL_CHECK(info.st_uid == getuid(), MNCL_ERR_BOOTSTRAP,
               "the job's private store folder %s belongs to uid %u, not to this user (%u): "
               "someone else made it; remove it, or set MNCL_STORE",
               dir.c_str(), static_cast<unsigned>(info.st_uid), static_cast<unsigned>(getuid()));
    MNCL_CHECK((info.st_mode & 0077) == 0 || chmod(dir.c_str(), 0700) == 0, MNCL_ERR_BOOTSTRAP,
               "cannot make the job's private store folder %s private: %s", dir.c_str(),
               std::strerror(errno));
  }
  comm->comm_store_ = bootstrap::make_prefix_store(comm->job_store_, comm->id_ + "/");

  // Round 1, joining: every rank's host and pid. Grouping by host gives the local rank and
  // size (when the launcher did not) and the number of hosts, which the backend rules need.
  if (comm->comm_store_->add("claim/" + std::to_string(settings.rank), 1) > 1) {
    comm->comm_store_->set("claim/twice", claim.data(), claim.size());
    throw Error(MNCL_ERR_BOOTSTRAP,
                format("mncl_comm_create: %s is another process's already (this is %s pid %d): "
                       "two processes were given one rank (or the store %s holds the keys of an "
                       "earlier job that did not end, or is another job's, on the same address: "
                       "give each job its own port, or MNCL_STORE_TOKEN)",
                       rank_words.c_str(), host.c_str(), ::getpid(),
                       comm->comm_store_->describe().c_str()));
  }
  if (comm->job_->tcp_store && !comm->job_->hosts_tcp_store) {
    // Should this process end without destroying its communicators, the store's host learns
    // that it left the job (see wait_for_job_to_leave). Only once the rank is this process's
    // for sure: a second claimant's will would say the real one left. Best effort: without
    // it a lost process is waited for until the timeout.
    try {
      comm->job_store_->set_on_close(comm->job_->left_key(settings.rank), "1", 1);
    } catch (const Error &e) {
      MNCL_INFO("could not leave the store a will for this process's end: %s", e.what());
    }
  }
  // Only once this process holds rank 0 for sure: a second "rank 0" refused above must not
  // take the real one's folder with it.
  if (settings.store_is_private_dir && settings.rank == 0) {
    PrivateStoreFolders::own(settings.store_url.substr(std::strlen("file://")));
  }
  std::vector<std::string> joins;
  std::vector<int> absent;
  // The rank no one took never joins: every rank that did gives up once the second claimant's
  // note has stood for a grace (a missing rank may still come: a stray extra process beside a
  // healthy job), rather than at the join timeout. Only a note of a job of this size, and one
  // whose rank this job's claims count twice unless a second rank 0 left it in the TCP store:
  // one an earlier job left in a file store folder used again stops nobody.
  const auto grace = std::chrono::milliseconds(std::min<int64_t>(10000, settings.timeout_ms / 4));
  std::optional<std::chrono::steady_clock::time_point> note_since;
  bool claimed_twice = false;
  const auto stop_if_claimed_twice = [&](const std::vector<int> &missing) {
    if (!comm->comm_store_->wait({"claim/twice"}, wait_options(0, nullptr)).empty()) return;
    const std::string twice =
        bytes_to_string(comm->comm_store_->get("claim/twice", wait_options(0, nullptr)));
    // Judged once: a rank that gives up first takes its own claim back.
    int claimed = -1;
    if (!note_since &&
        (!note_of_this_job(twice) || std::sscanf(twice.c_str(), "rank %d", &claimed) != 1 ||
         (twice.find(kStoreTaken) == std::string::npos &&
          comm->comm_store_->add("claim/" + std::to_string(claimed), 0) < 2))) {
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!note_since) note_since = now;
    if (now - *note_since < grace) return;
    claimed_twice = true;
    throw Error(MNCL_ERR_BOOTSTRAP,
                format("mncl_comm_create: a process claimed %s, and rank%s %s did not join: two "
                       "processes were given one rank; check the launcher's rank variables",
                       twice.c_str(), missing.size() > 1 ? "s" : "", list_ranks(missing).c_str()));
  };
  // Ranks started with different sizes (WORLD_SIZE=2 on one, 3 on the others; config->size
  // computed differently) would each see "their" ranks join and go on as jobs that disagree
  // (naive returned sums over 2 ranks on one and 3 on the others). Every join carries its
  // size: each rank compares those it finds, while it waits and once all are in, and fails
  // naming the first that differs. Ranks 0..n-1 that all say n still form a job of n: only the
  // processes that said more fail (strays beside it).
  std::vector<char> size_checked(static_cast<size_t>(settings.size), 0);
  int largest_size = settings.size;  // the largest size a rank joined with, as far as seen
  bool sizes_disagree = false;
  const auto check_size = [&](int r, const std::string &join) {
    size_checked[static_cast<size_t>(r)] = 1;
    const std::vector<std::string> field = join_fields(join);
    const int size = field.size() > 3 ? std::atoi(field[3].c_str()) : settings.size;
    if (size == settings.size) return;
    sizes_disagree = true;
    largest_size = std::max(largest_size, size);
    throw Error(MNCL_ERR_BOOTSTRAP,
                format("mncl_comm_create: the ranks disagree on the job's size: this process is "
                       "rank %d of %d (size from %s), and rank %d (pid %s on %s) was started as "
                       "one of %d (size from %s); give every rank the same size (check the "
                       "launcher's size variables, or config->size)",
                       settings.rank, settings.size, settings.size_origin.c_str(), r,
                       field.size() > 1 ? field[1].c_str() : "?", field[0].c_str(), size,
                       field.size() > 4 ? field[4].c_str() : "?"));
  };
  const auto while_joining = [&](const std::vector<int> &missing) {
    std::vector<char> is_missing(static_cast<size_t>(settings.size), 0);
    for (int r : missing) is_missing[static_cast<size_t>(r)] = 1;
    for (int r = 0; r < settings.size; ++r) {
      if (is_missing[static_cast<size_t>(r)] || size_checked[static_cast<size_t>(r)]) continue;
      std::string join;
      try {
        join = bytes_to_string(
            comm->comm_store_->get("join/" + std::to_string(r), wait_options(0, nullptr)));
      } catch (const Error &e) {
        // Gone since the wait saw it: a rank that failed took it back; judged if it is back.
        if (e.status() != MNCL_ERR_TIMEOUT) throw;
        continue;
      }
      check_size(r, join);
    }
    stop_if_claimed_twice(missing);
  };
  try {
    joins =
        exchange(*comm->comm_store_, "join/", settings.rank, settings.size,
                 host + "\n" + std::to_string(::getpid()) + "\n" +
                     std::to_string(settings.local_rank) + "\n" + std::to_string(settings.size) +
                     "\n" + settings.size_origin + "\n" + process_identity(::getpid()),
                 settings.timeout_ms, &comm->aborted_, "mncl_comm_create", &absent, while_joining);
    absent.clear();  // every rank joined
    for (int r = 0; r < settings.size; ++r) {
      if (!size_checked[static_cast<size_t>(r)]) check_size(r, joins[static_cast<size_t>(r)]);
    }
  } catch (const Error &e) {
    if (sizes_disagree) {
      comm->leave_after_failed_join(absent, largest_size);
      throw;
    }
    if (claimed_twice) {
      comm->leave_after_failed_join(absent);
      throw;
    }
    if (e.status() != MNCL_ERR_TIMEOUT) throw;
    std::string twice;
    try {
      if (comm->comm_store_->wait({"claim/twice"}, wait_options(0, nullptr)).empty()) {
        twice = bytes_to_string(comm->comm_store_->get("claim/twice", wait_options(0, nullptr)));
        if (!note_of_this_job(twice)) twice.clear();
      }
    } catch (const Error &) {
      // The store is gone too: the timeout says enough.
    }
    comm->leave_after_failed_join(absent);
    if (twice.empty()) throw;
    throw Error(MNCL_ERR_TIMEOUT, format("%s; a process claimed %s; check the launcher's rank "
                                         "variables",
                                         e.what(), twice.c_str()));
  }
  comm->joined_ = true;
  // "host\npid\nlocal rank given (-1: none)\nsize\nwhere the size came from\nprocess identity".
  std::vector<int> given_local_ranks;
  for (const auto &join : joins) {
    const std::vector<std::string> field = join_fields(join);
    comm->members_.push_back(Member{field[0], field.size() > 1 ? std::atoi(field[1].c_str()) : 0,
                                    field.size() > 5 ? field[5] : std::string()});
    given_local_ranks.push_back(field.size() > 2 ? std::atoi(field[2].c_str()) : -1);
  }
  std::set<std::string> hosts;
  int same_host_before = 0, same_host = 0, same_process = 0;
  std::map<int, int> given_on_host;  // local rank given -> the first rank of this host given it
  std::string collision;
  for (int r = 0; r < settings.size; ++r) {
    hosts.insert(comm->members_[r].host);
    if (comm->members_[r].host == host) {
      ++same_host;
      if (r < settings.rank) ++same_host_before;
      if (comm->members_[r].pid == ::getpid()) ++same_process;
      const int given = given_local_ranks[r];
      if (given >= 0 && collision.empty() && !given_on_host.emplace(given, r).second) {
        collision =
            format("ranks %d and %d were both given local rank %d", given_on_host[given], r, given);
      }
    }
  }
  comm->num_hosts_ = static_cast<int>(hosts.size());
  // Two processes of one host given one local rank (a LOCAL_RANK left in the shell of a launch
  // by hand) would share a core and a GPU: every rank of the host sees the same joins, and all
  // take their order on the host instead.
  const bool trust_given = settings.local_rank >= 0 && collision.empty();
  if (settings.local_rank >= 0 && !trust_given) {
    MNCL_WARN(
        "the local ranks given on host %s collide (%s, from %s): ignored; local rank %d of "
        "%d by the ranks' order on the host",
        host.c_str(), collision.c_str(), settings.local_rank_origin.c_str(), same_host_before,
        same_host);
  }
  comm->local_rank_ = trust_given ? settings.local_rank : same_host_before;
  comm->local_size_ = trust_given && settings.local_size >= 1 ? settings.local_size : same_host;
  if (comm->device_ < 0) comm->device_ = comm->local_rank_;

  // Round 2, the backend (see agree_on_backend).
  Selection selection = agree_on_backend(*comm->comm_store_, settings, comm->local_size_,
                                         comm->num_hosts_, &comm->aborted_, "mncl_comm_create");

  // One placement per process: the first communicator's (MNCL_BIND, logged at info level).
  topology::BindRequest placement;
  placement.mode = topology::parse_bind_mode(settings.bind);
  placement.local_rank = comm->local_rank_;
  placement.local_size = comm->local_size_;
  placement.gpu = selection.memory == topology::MemoryType::kCuda ? comm->device_ : -1;
  placement.ranks_in_process = same_process;
  topology::bind_this_process(topology::this_machine(), placement);

  comm->plugin_ = selection.plugin;
  comm->staging_ = std::make_unique<cuda::StagingPool>(comm->rank_, comm->size_, comm->backend());
  comm->table_ = &comm->plugin_->table();
  comm->watch_peers();
  comm->plugin_store_ = std::make_unique<StoreBridge>(
      bootstrap::make_prefix_store(comm->job_store_, comm->id_ + "/p/"), &comm->plugin_stop_,
      comm->peer_watch_);
  comm->create_plugin_comm(comm->bootstrap_for_plugin(), nullptr, 0, 0);
  MNCL_INFO("communicator %s ready: rank %d of %d on backend %s (%d host%s)", comm->id_.c_str(),
            comm->rank_, comm->size_, comm->backend().c_str(), comm->num_hosts_,
            comm->num_hosts_ > 1 ? "s" : "");
  return comm;
}

void Comm::leave_after_failed_join(const std::vector<int> &absent, int sizes_seen) {
  // The ranks that did join time out too, each at its own deadline: the store host waits for
  // them to see their own timeout before taking the store down under them.
  try {
    // A claim left behind would refuse this rank's next try on the same (file) store.
    comm_store_->erase("claim/" + std::to_string(rank_));
    const std::string my_join = "join/" + std::to_string(rank_);
    if (rank_ != 0 && !job_->tcp_store) {
      // Rank 0 removes the records of the ranks it waited for. Where it has gone (or never
      // came), or this rank is past its size (a stray beside its job), no one will: this
      // rank's record would outlive it in the folder and read as another job's size, or as a
      // rank that joined, to the next job there.
      int size_of_rank0 = -1;
      if (comm_store_->wait({"join/0"}, wait_options(0, nullptr)).empty()) {
        const std::vector<std::string> field =
            join_fields(bytes_to_string(comm_store_->get("join/0", wait_options(0, nullptr))));
        size_of_rank0 = field.size() > 3 ? std::atoi(field[3].c_str()) : size_;
      }
      if (rank_ >= size_of_rank0) {
        comm_store_->erase(my_join);
        // A rank 0 that failed on the sizes may still wait for this rank (below), and removes
        // this key then; one that is gone, or never came, removes nothing.
        if (size_of_rank0 < 1) return;
      }
    }
    comm_store_->set("leave/" + std::to_string(rank_), "1", 1);
    if (rank_ != 0) return;
    std::vector<int> present;
    std::vector<std::string> late;  // join keys of ranks this one stopped waiting for
    for (int r = 0; r < size_; ++r) {
      if (std::find(absent.begin(), absent.end(), r) == absent.end()) {
        present.push_back(r);
      } else if (sizes_seen > 0) {
        late.push_back("join/" + std::to_string(r));
      }
    }
    if (sizes_seen > 0) {
      // Sizes disagree. Ranks that come a little later (missing ones, and those of the larger
      // size seen) still find this rank's record for a short grace, and read why they fail,
      // rather than find no store (this process may serve it) or no record (removed below).
      for (int r = size_; r < sizes_seen; ++r) late.push_back("join/" + std::to_string(r));
      const int64_t grace = std::min<int64_t>(2000, timeout_ms_ / 4);
      const std::vector<std::string> never = comm_store_->wait(late, wait_options(grace, nullptr));
      for (const std::string &key : late) {
        if (std::find(never.begin(), never.end(), key) == never.end()) {
          present.push_back(std::stoi(key.substr(std::strlen("join/"))));
        }
      }
    }
    std::vector<std::string> leave;
    for (int r : present) leave.push_back("leave/" + std::to_string(r));
    const std::vector<std::string> stayed =
        comm_store_->wait(leave, wait_options(timeout_ms_, nullptr));
    comm_store_->erase("claim/twice");  // every rank that joined has read it by now
    // A leave key left behind would let the next try's rank 0 (same file store folder) erase
    // claim/twice before the ranks that time out after it have read it; a join key, make a
    // rank of the next try read another job's size.
    for (int r : present) {
      const std::string key = "leave/" + std::to_string(r);
      if (std::find(stayed.begin(), stayed.end(), key) != stayed.end()) continue;
      comm_store_->erase(key);
      comm_store_->erase("join/" + std::to_string(r));
    }
  } catch (const Error &e) {
    MNCL_INFO("mncl_comm_create: cleaning up after the failed join: %s", e.what());
  }
}

void Comm::leave_abandoned(bool last_of_job) {
  // Briefly: the store may be what failed (a cut link), and then a store call only fails after
  // the timeout, which an aborted destroy must not wait.
  run_briefly(std::chrono::milliseconds(500),
              [store = comm_store_, job_store = job_store_, rank = rank_, size = size_,
               closing = last_of_job && job_->hosts_tcp_store, watch = peer_watch_] {
                try {
                  // The store's host: a world re-created on this address waits for the next server.
                  if (closing) job_store->stop_accepting();
                  if (watch != nullptr) watch->take_back_wills();  // before the leave: see there
                  const std::string key = "leave/" + std::to_string(rank);
                  store->set(key, kLeftAbandoned, 1);
                  erase_if_all_abandoned(*store, size);
                } catch (const Error &e) {
                  MNCL_INFO("mncl_comm_destroy of an aborted communicator: could not leave: %s",
                            e.what());
                }
              });
  if (last_of_job && job_->hosts_tcp_store && peer_watch_ != nullptr) {
    linger_for_note(Clock::now() + kAbortedStoreLinger);
  }
}

void Comm::linger_for_note(Clock::time_point give_up) {
  // The store goes with this process. The others may not have read the note that tells them
  // why the communicator failed (an abort's, PeerWatch) yet: they read it within a peer check
  // or two, then fail, and leave. Without it they failed on the lost store instead, naming rank
  // 0 (fault.aborted_peer.naive in CI). Bounded: a rank that never leaves holds this process
  // until give_up, once.
  std::vector<std::string> others;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) others.push_back("leave/" + std::to_string(r));
  }
  const std::string own = "leave/" + std::to_string(rank_);
  bool left = false;  // this rank's leave key was seen: it left (leave_abandoned)
  try {
    while (Clock::now() < give_up) {
      const std::vector<std::string> missing = comm_store_->wait(others, wait_options(0, nullptr));
      // This rank's leave key seen, then gone: the last rank to leave erased every key
      // (erase_if_all_abandoned), so every rank has left. Not where it never left (a process
      // ending with the communicator, linger_at_exit).
      if (!missing.empty()) {
        const bool present = comm_store_->wait({own}, wait_options(0, nullptr)).empty();
        if (left && !present) return;
        left = left || present;
      }
      std::vector<int> ranks;
      for (const auto &key : missing) ranks.push_back(std::stoi(key.substr(std::strlen("leave/"))));
      if (peer_watch_->all_gone(ranks)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    MNCL_INFO("mncl_comm_destroy(%s): closing the store with ranks that have not left",
              id_.c_str());
  } catch (const Error &e) {
    MNCL_INFO("mncl_comm_destroy(%s): %s", id_.c_str(), e.what());
  }
}

void Comm::leave_job() {
  // Nothing to wait for: a world re-created on this address tells a server of this one, which
  // its host keeps until every process has left, from the next (reach_own_server).
  try {
    job_store_->set(job_->left_key(job_->world_rank), "1", 1);
  } catch (const Error &e) {
    // The host shut the store down (REMOTE) or is stuck: it does not wait for this key then.
    MNCL_INFO("mncl_comm_destroy: could not tell the store's host this process left: %s", e.what());
  }
}

std::shared_ptr<bootstrap::Store> Comm::reach_own_server(std::shared_ptr<bootstrap::Store> store,
                                                         const LaunchSettings &settings,
                                                         bootstrap::TcpListen listen) {
  const auto deadline = deadline_after(settings.timeout_ms);
  bootstrap::WaitOptions now;
  now.timeout = std::chrono::milliseconds(0);
  for (auto pause = std::chrono::milliseconds(10);;
       pause = std::min(pause * 2, std::chrono::milliseconds(200))) {
    std::string served;
    try {
      if (store->wait({kServedWorldKey}, now).empty()) {
        const bootstrap::Bytes value = store->get(kServedWorldKey, now);
        served.assign(value.begin(), value.end());
      }
      // No name: a server whose host has not named it yet, which is a new one.
      if (served.empty() || served == id_) return store;
    } catch (const Error &e) {
      // The connection was lost: the earlier world's server went just then.
      if (e.status() != MNCL_ERR_REMOTE) throw;
      served = "(a server that closed the connection)";
    }
    MNCL_CHECK(Clock::now() < deadline, MNCL_ERR_BOOTSTRAP,
               "mncl_comm_create: the store at %s still serves world communicator '%s' of an "
               "earlier job of rank 0's process after %.1f s, while this process creates its "
               "'%s' (its host waits for a rank that has not destroyed all of its "
               "communicators; or the ranks created different numbers of world communicators "
               "on this address)",
               store->describe().c_str(), served.c_str(), settings.timeout_ms / 1000.0,
               id_.c_str());
    store.reset();  // the earlier world's server goes once its host has seen every rank leave
    std::this_thread::sleep_for(pause);
    const int64_t left = std::max<int64_t>(
        1, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    store = bootstrap::open_store(settings.store_url, settings.rank, settings.size,
                                  wait_options(left, &aborted_), listen, settings.job_token);
  }
}

bool Comm::wait_for_job_to_leave(Clock::time_point give_up) {
  std::vector<std::string> others;
  for (int r = 0; r < job_->world_size; ++r) {
    if (r != job_->world_rank) others.push_back(job_->left_key(r));
  }
  if (others.empty()) return true;
  std::vector<std::string> missing;
  try {
    const int64_t left = std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now()).count());
    missing = job_store_->wait(others, wait_options(left, &aborted_));
  } catch (const Error &e) {
    if (e.status() != MNCL_ERR_ABORTED) throw;
    return false;
  }
  if (missing.empty()) return true;
  std::vector<int> ranks;
  for (const auto &key : missing) ranks.push_back(std::stoi(key.substr(key.rfind('/') + 1)));
  MNCL_WARN(
      "mncl_comm_destroy of %s: world rank%s %s still had communicators of this job after "
      "%.1f s; the store this process serves shuts down without them (destroy every "
      "communicator on every rank)",
      label().c_str(), ranks.size() > 1 ? "s" : "", list_ranks(ranks).c_str(),
      timeout_ms_ / 1000.0);
  return true;
}

mncl_bootstrap_v1_t Comm::bootstrap_for_plugin() const {
  mncl_bootstrap_v1_t bs{};
  bs.struct_size = sizeof bs;
  bs.rank = rank_;
  bs.size = size_;
  bs.local_rank = local_rank_;
  bs.local_size = local_size_;
  bs.num_hosts = num_hosts_;
  bs.device = device_;
  bs.timeout_ms = timeout_ms_;
  bs.comm_id = id_.c_str();
  bs.store = plugin_store_->table();
  return bs;
}

void Comm::create_plugin_comm(const mncl_bootstrap_v1_t &bs, void *parent_plugin_comm, int color,
                              int key) {
  set_last_error("");
  const bool split = parent_plugin_comm && table_->comm_split;
  const mncl_status_t status =
      loader::call_plugin(backend(), split ? "comm_split" : "comm_create", [&] {
        return split ? table_->comm_split(parent_plugin_comm, color, key, &bs, &plugin_comm_)
                     : table_->comm_create(&bs, &plugin_comm_);
      });
  if (status != MNCL_OK) {
    plugin_comm_ = nullptr;
    const std::string message =
        format("backend '%s' failed to create %s (rank %d of %d): %s", backend().c_str(),
               label().c_str(), rank_, size_, last_error());
    // The others wait for this rank in their backend's creation (gloo's connections), which
    // reads the note between its store waits: they fail now, naming this rank and why, instead
    // of at the timeout (and this rank's destroy, waiting for the store's host, with them).
    if (peer_watch_ != nullptr && status != MNCL_ERR_ABORTED) {
      peer_watch_->publish_failure(format("could not create its part of %s on backend '%s': %s",
                                          label().c_str(), backend().c_str(), last_error()));
    }
    throw Error(status, message);
  }
}

std::string Comm::label() const {
  if (id_ == "w") return "the world communicator";
  // "w2": the third world created on the same store by this process (see create).
  if (id_.find('.') == std::string::npos) return "the world communicator " + id_;
  return "the communicator " + id_ + " (split from the world communicator)";
}

Comm::~Comm() {
  // Normally destroy() ran; this is the path for a creation that failed half-way.
  if (!destroyed_.load()) {
    try {
      destroy();
    } catch (const std::exception &e) {
      MNCL_WARN("%s: %s", label().c_str(), e.what());
    }
  }
  // A destroy that failed before it stopped the watchdog: its threads use members declared
  // after it, which go first.
  watchdog_.reset();
}

// ---------------------------------------------------------------------------------------------
// Collectives
// ---------------------------------------------------------------------------------------------

void Comm::check_usable(const char *fn) const {
  MNCL_CHECK(!destroyed_.load(), MNCL_ERR_INVALID_ARGUMENT, "%s: the communicator was destroyed",
             fn);
  MNCL_CHECK(!aborted_.load(), MNCL_ERR_ABORTED, "%s: the communicator was aborted", fn);
  if (!plugin_aborted_.load()) return;
  {
    std::lock_guard<std::mutex> lock(watchdog_mutex_);
    MNCL_CHECK(broken_reason_.empty(), MNCL_ERR_INTERNAL, "%s: the communicator is unusable: %s",
               fn, broken_reason_.c_str());
  }
  const PeerWatch::Finding cause =
      peer_watch_ != nullptr ? peer_watch_->found() : PeerWatch::Finding{};
  MNCL_CHECK(cause.status == MNCL_OK, cause.status, "%s: the communicator is unusable: %s", fn,
             cause.reason.c_str());
  throw Error(MNCL_ERR_ABORTED,
              format("%s: the communicator is unusable: the watchdog aborted it after an "
                     "operation outlived its timeout",
                     fn));
}

void Comm::validate_and_number(mncl_coll_v1_t &coll) {
  check_usable(coll_function_name(coll.kind));
  validate_collective(coll, rank_, size_, *table_);
  // A backend that runs on the host cannot put anything into a CUDA graph: the graph's
  // launches would skip the collective, a silently wrong result (and staging's stream
  // synchronization would invalidate the capture).
  MNCL_CHECK(coll.stream == nullptr || (table_->caps & MNCL_CAP_STREAM_ORDERED) ||
                 !cuda::Driver::get().capturing(coll.stream),
             MNCL_ERR_NOT_SUPPORTED,
             "%s: stream %p is capturing a CUDA graph, but backend %s runs collectives on the "
             "host, outside any graph; call it outside the capture, or use a stream-ordered "
             "backend (nccl)",
             coll_function_name(coll.kind), coll.stream, backend().c_str());
  coll.struct_size = sizeof coll;
  coll.timeout_ms = timeout_ms_;
  if (coll.kind == MNCL_COLL_SEND || coll.kind == MNCL_COLL_RECV) {
    coll.seq = next_p2p_seq(coll.kind, coll.root);
    return;
  }
  if (coll.kind == MNCL_COLL_SENDRECV_BATCH) return;  // start_batch numbers each op
  coll.seq = next_seq_;
  // An emulated coalesced allreduce becomes nbufs allreduces, each with its own number.
  const bool emulated = coll.kind == MNCL_COLL_ALLREDUCE_COALESCED &&
                        !(table_->coll_mask & MNCL_COLL_BIT(MNCL_COLL_ALLREDUCE_COALESCED));
  next_seq_ += emulated ? std::max<size_t>(coll.nbufs, 1) : 1;
}

uint64_t Comm::next_p2p_seq(int32_t kind, int peer) {
  // Point to point is not collective: numbered per peer and direction, so the matching send
  // and receive agree and idle ranks' collective numbers stay in step.
  auto &counters = kind == MNCL_COLL_SEND ? next_send_seq_ : next_recv_seq_;
  if (counters.empty()) counters.assign(static_cast<size_t>(size_), 0);
  return counters[static_cast<size_t>(peer)]++;
}

bool Comm::needs_staging(const mncl_coll_v1_t &coll) {
  return !(table_->caps & MNCL_CAP_CUDA_MEMORY) && staging_->needed(coll);
}

bool Comm::uses_p2p_lanes() const {
  // The capability means nothing to plugins that order their own work (mncl_plugin_v2.h).
  return (table_->caps & MNCL_CAP_CONCURRENT_P2P) &&
         !(table_->caps & (MNCL_CAP_NATIVE_ASYNC | MNCL_CAP_STREAM_ORDERED));
}

Comm::Lane &Comm::p2p_lane(int32_t kind, int peer) {
  const size_t index = 2 * static_cast<size_t>(peer) + (kind == MNCL_COLL_RECV ? 1 : 0);
  std::lock_guard<std::mutex> lock(lanes_mutex_);
  if (p2p_.empty()) p2p_.resize(2 * static_cast<size_t>(size_));
  if (!p2p_[index]) p2p_[index] = std::make_unique<Lane>();
  return *p2p_[index];
}

Comm::Lane &Comm::lane_for(const mncl_coll_v1_t &coll) {
  if (!uses_p2p_lanes() || (coll.kind != MNCL_COLL_SEND && coll.kind != MNCL_COLL_RECV)) {
    return collectives_;
  }
  return p2p_lane(coll.kind, coll.root);
}

void Comm::gate_peer_lanes(Operation &batch) {
  std::vector<Lane *> lanes;
  for (const mncl_p2p_v4_t &o : batch.p2p) {
    Lane *lane = &p2p_lane(o.kind, o.peer);
    if (std::find(lanes.begin(), lanes.end(), lane) == lanes.end()) lanes.push_back(lane);
  }
  batch.gate = std::make_shared<LaneGate>();
  batch.gate->tokens = lanes.size();
  for (Lane *lane : lanes) {
    auto token = std::make_shared<Operation>();
    // Not the batch's descriptor: a token may outlive the batch's copy of its ops.
    token->coll = kit::make_batch_coll(nullptr, 0);
    token->deadline = batch.deadline;
    token->gate = batch.gate;
    token->gate_token = true;
    enqueue(*lane, token);
  }
}

void Comm::release_gate(LaneGate &gate) {
  {
    std::lock_guard<std::mutex> lock(gate.mutex);
    gate.released = true;
  }
  gate.cv.notify_all();
}

void Comm::pass_gate(Operation &token, Lane &lane) {
  LaneGate &gate = *token.gate;
  {
    std::unique_lock<std::mutex> lock(gate.mutex);
    ++gate.arrived;
    gate.cv.notify_all();
    // The batch releases its tokens however it ends (it runs on the collectives' lane, whose
    // operations all end within their deadlines); an abort ends the wait here too, and so
    // does the batch's deadline and a grace, should the batch never run.
    const auto give_up =
        token.deadline + std::chrono::milliseconds(Watchdog::grace_ms(timeout_ms_));
    while (!gate.cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return gate.released; })) {
      if (aborted_.load() || Clock::now() > give_up) break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(token.mutex);
    token.finished = true;
  }
  --lane.outstanding;
  token.finished_cv.notify_all();
}

void Comm::await_gate(const Operation &batch) {
  LaneGate &gate = *batch.gate;
  std::unique_lock<std::mutex> lock(gate.mutex);
  while (!gate.cv.wait_for(lock, std::chrono::milliseconds(100),
                           [&] { return gate.arrived == gate.tokens; })) {
    MNCL_CHECK(!aborted_.load(), MNCL_ERR_ABORTED, "%s on %s: the communicator was aborted",
               describe_op(batch.coll).c_str(), backend().c_str());
    MNCL_CHECK(Clock::now() < batch.deadline, MNCL_ERR_TIMEOUT,
               "%s on %s (rank %d of %d): its sends and receives were still queued behind "
               "earlier point-to-point operations with the same peers when its timeout of "
               "%.1f s ran out; it never started",
               describe_op(batch.coll).c_str(), backend().c_str(), rank_, size_,
               timeout_ms_ / 1000.0);
  }
}

Operation::~Operation() {
  if (inputs_ready != nullptr) cuda::Driver::get().drop_mark(inputs_ready);
}

void Comm::execute_now(const mncl_coll_v1_t &coll, void *inputs_ready) {
  const char *fn = coll_function_name(coll.kind);
  MNCL_CHECK(!aborted_.load(), MNCL_ERR_ABORTED, "%s: the communicator was aborted",
             op_label(fn, coll.kind, coll.seq).c_str());
  if (debug_checks_) {  // within what is left of the operation's timeout (Comm::complete)
    check_fingerprints(*comm_store_, coll, rank_, size_,
                       coll.timeout_ms > 0 ? coll.timeout_ms : timeout_ms_, &aborted_);
  }
  ensure_watchdog();
  auto call = [&](const mncl_coll_v1_t &c) {
    set_last_error("");
    const size_t token = history_.begin(c);
    bool threw = false;
    const mncl_status_t status = loader::call_plugin(
        backend(), "execute", [&] { return table_->execute(plugin_comm_, &c); }, &threw);
    history_.end(token, status == MNCL_OK);
    if (status == MNCL_OK) return;
    if (threw) backend_broke(last_error());
    std::string report;
    bool this_op = false;
    {
      std::lock_guard<std::mutex> lock(watchdog_mutex_);
      report = watchdog_report_;
      const bool p2p = c.kind == MNCL_COLL_SEND || c.kind == MNCL_COLL_RECV;
      this_op = watchdog_op_.kind == c.kind && watchdog_op_.seq == c.seq &&
                watchdog_op_.peer == (p2p ? c.root : -1);
    }
    if (!report.empty() && !aborted_.load()) {
      if (this_op) throw Error(MNCL_ERR_TIMEOUT, report + diagnosis(c, MNCL_ERR_TIMEOUT));
      // Another operation timed out, and this one ended in the abort of its communicator.
      throw Error(MNCL_ERR_ABORTED,
                  format("%s on %s (rank %d of %d): ended by the watchdog's abort of the "
                         "backend's communicator after another operation timed out: %s",
                         op_label(fn, c.kind, c.seq).c_str(), backend().c_str(), rank_, size_,
                         report.c_str()));
    }
    // A rank exited or aborted the communicator (PeerWatch): that is the cause, whatever the
    // backend saw of it (a closed connection, its own abort by the watchdog's peer check). A
    // rank's abort is MNCL_ERR_ABORTED naming that rank, as shm reports it, and needs no
    // diagnosis; to a plugin's store waits it was REMOTE (StoreBridge).
    mncl_status_t reported = status;
    const std::string head =
        format("%s on %s (rank %d of %d): ", op_label(fn, c.kind, c.seq).c_str(), backend().c_str(),
               rank_, size_);
    std::string message = head + last_error();
    explain_by_peers(&reported, head, &message, true, &c);
    throw Error(reported, message + (reported == MNCL_ERR_ABORTED ? "" : diagnosis(c, status)));
  };
  // Staging's waits on the caller's stream get the operation's timeout, and end on an abort.
  auto bounds = [&](const mncl_coll_v1_t &c) {
    return cuda::Staging::WaitBounds{c.timeout_ms > 0 ? c.timeout_ms : timeout_ms_, &aborted_,
                                     op_label(fn, c.kind, c.seq), inputs_ready};
  };
  if (coll.kind == MNCL_COLL_ALLREDUCE_COALESCED &&
      !(table_->coll_mask & MNCL_COLL_BIT(MNCL_COLL_ALLREDUCE_COALESCED))) {
    for (size_t i = 0; i < coll.nbufs; ++i) {
      mncl_coll_v1_t single = coll;
      single.kind = MNCL_COLL_ALLREDUCE;
      single.sendbuf = coll.sendbufs[i];
      single.recvbuf = coll.recvbufs[i];
      single.count = coll.counts[i];
      single.nbufs = 0;
      single.sendbufs = nullptr;
      single.recvbufs = nullptr;
      single.counts = nullptr;
      single.seq = coll.seq + i;
      needs_staging(single) ? staging_->run(single, call, bounds(single)) : call(single);
    }
    return;
  }
  needs_staging(coll) ? staging_->run(coll, call, bounds(coll)) : call(coll);
}

Comm::Inside::Inside(Comm &comm, const char *fn) : comm_(comm) {
  // Sequentially consistent, as destroy's store of destroyed_ and load of the count: either
  // destroy sees this call inside, or this call sees destroy begun.
  comm_.callers_inside_.fetch_add(1);
  if (comm_.destroyed_.load()) {
    comm_.callers_inside_.fetch_sub(1);
    throw Error(MNCL_ERR_INVALID_ARGUMENT,
                format("%s: the communicator is being destroyed (by another thread)", fn));
  }
}

void Comm::wait_for_callers(const std::atomic<int> *api_calls) {
  const auto inside = [&] {
    return std::max(callers_inside_.load(), api_calls != nullptr ? api_calls->load() : 0);
  };
  if (inside() == 0) return;
  // Each such call ends by its own timeout (the watchdog ends a backend call that does not,
  // after a grace), or at once after an abort.
  const auto give_up =
      Clock::now() + std::chrono::milliseconds(timeout_ms_) + std::chrono::seconds(30);
  MNCL_INFO("mncl_comm_destroy(%s): waiting for the calls of other threads to return", id_.c_str());
  while (inside() != 0) {
    if (Clock::now() > give_up) {
      throw Error(MNCL_ERR_INTERNAL,
                  format("mncl_comm_destroy: calls of other threads on this communicator "
                         "did not return within its timeout of %.1f s (+30 s); the backend's "
                         "communicator is left to the process's exit",
                         timeout_ms_ / 1000.0));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Comm::run(mncl_coll_v1_t coll) {
  const Inside inside(*this, coll_function_name(coll.kind));
  validate_and_number(coll);
  if (table_->caps & MNCL_CAP_NATIVE_ASYNC) {
    execute_now(coll);
    return;
  }
  Lane &lane = lane_for(coll);
  // Nothing queued on its lane: run it here (the caller's calls on a communicator are
  // serialized, so nothing is added to this lane meanwhile and its worker is idle).
  if (lane.outstanding.load() == 0) {
    execute_now(coll);
    return;
  }
  // Non-blocking operations are still queued: this one goes behind them, in issue order.
  auto op = std::make_shared<Operation>();
  op->coll = coll;
  op->deadline = deadline_after(timeout_ms_);
  enqueue(lane, op);
  wait(*op, -1);
  if (op->status != MNCL_OK) throw Error(op->status, op->error);
}

std::shared_ptr<Operation> Comm::start(const mncl_coll_v1_t &coll_in) {
  const Inside inside(*this, coll_function_name(coll_in.kind));
  auto op = std::make_shared<Operation>();
  op->coll = coll_in;
  // Checked before the caller's arrays (which need not outlive the call) are copied: an
  // impossible nbufs is the caller's error, not a failed copy; numbered after, so that a copy
  // that fails uses up no sequence number (the ranks' numbers would part).
  validate_collective(op->coll, rank_, size_, *table_);
  kit::keep_arrays(op->coll, op->sendbufs, op->recvbufs, op->counts);
  validate_and_number(op->coll);
  launch(op);
  return op;
}

void Comm::launch(const std::shared_ptr<Operation> &op) {
  op->issued = Clock::now();
  op->deadline = deadline_after(timeout_ms_);  // from the issuing call, whatever runs before it
  if (table_->caps & MNCL_CAP_NATIVE_ASYNC) {
    if (needs_staging(op->coll)) {  // staging blocks: run it now (issue order)
      execute_now(op->coll);
      op->finished = true;
      return;
    }
    if (debug_checks_) {
      check_fingerprints(*comm_store_, op->coll, rank_, size_, timeout_ms_, &aborted_);
    }
    const std::string label =
        op_label(coll_function_name(op->coll.kind), op->coll.kind, op->coll.seq);
    ensure_watchdog();  // its peer check also looks while posted operations wait
    std::lock_guard<std::mutex> lock(native_mutex_);
    // Checked again under the lock: destroy drains what is tracked, so nothing may be posted
    // once it has begun (a call racing mncl_comm_destroy on another thread).
    MNCL_CHECK(!destroyed_.load(), MNCL_ERR_INVALID_ARGUMENT, "%s: the communicator was destroyed",
               label.c_str());
    set_last_error("");
    void *handle = nullptr;
    bool threw = false;
    const mncl_status_t status = loader::call_plugin(
        backend(), "post", [&] { return table_->post(plugin_comm_, &op->coll, &handle); }, &threw);
    if (threw) backend_broke(last_error());  // it may have started: nothing tracks it now
    if (status != MNCL_OK) {
      throw Error(status, format("%s on %s: %s", label.c_str(), backend().c_str(), last_error()));
    }
    // Without a handle it could never be tested: a wait would have nothing to end it.
    MNCL_CHECK(handle != nullptr, MNCL_ERR_INTERNAL,
               "%s on %s: the backend's post returned MNCL_OK without a handle", label.c_str(),
               backend().c_str());
    op->native = true;
    op->native_handle = handle;
    op->native_slot = native_ops_.size();
    native_ops_.push_back(op);
    return;
  }
  if (op->coll.kind == MNCL_COLL_SENDRECV_BATCH && uses_p2p_lanes() && !op->p2p.empty()) {
    try {
      gate_peer_lanes(*op);
      enqueue(lane_for(op->coll), op);
    } catch (...) {
      if (op->gate) release_gate(*op->gate);  // the tokens already queued must not hold lanes
      throw;
    }
    return;
  }
  enqueue(lane_for(op->coll), op);
}

std::shared_ptr<Operation> Comm::start_batch(const char *fn, std::vector<mncl_p2p_v4_t> ops,
                                             void *stream, bool blocking) {
  const Inside inside(*this, fn);
  check_usable(fn);
  validate_batch(fn, ops.data(), ops.size(), rank_, size_, *table_);
  auto batch = std::make_shared<Operation>();
  batch->function = fn;
  // The same ops as single sends and receives: what runs them on a backend without the kind,
  // and what tells whether one of them needs staging.
  std::vector<mncl_coll_v1_t> singles;
  singles.reserve(ops.size());
  bool staged = false;
  for (const mncl_p2p_v4_t &o : ops) {
    const bool send = o.kind == MNCL_COLL_SEND;
    mncl_coll_v1_t c = kit::make_coll(o.kind, o.dtype, -1, o.peer, send ? o.buf : nullptr,
                                      send ? nullptr : o.buf, o.count);
    c.stream = stream;
    staged = staged || needs_staging(c);
    singles.push_back(c);
  }
  // Staging would hand the plugin host copies one op at a time; the plugin's own kind is used
  // when it takes the buffers as they are.
  if ((table_->coll_mask & MNCL_COLL_BIT(MNCL_COLL_SENDRECV_BATCH)) && !staged) {
    batch->p2p = std::move(ops);
    batch->coll =
        kit::make_batch_coll(batch->p2p.empty() ? nullptr : batch->p2p.data(), batch->p2p.size());
    batch->coll.stream = stream;
    validate_and_number(batch->coll);
    for (mncl_p2p_v4_t &o : batch->p2p) o.seq = next_p2p_seq(o.kind, o.peer);
    // Blocking on a backend that posts natively: its blocking form, as run() does (flat then
    // checks each message's size before receiving it). A stream-ordered one (nccl) keeps
    // post and wait, so a blocking batch still returns with its data moved.
    if (blocking && (table_->caps & MNCL_CAP_NATIVE_ASYNC) &&
        !(table_->caps & MNCL_CAP_STREAM_ORDERED)) {
      try {
        execute_now(batch->coll);
      } catch (const Error &e) {
        // execute_now names the kind's function; the caller may have been mncl_sendrecv.
        const std::string generic = coll_function_name(MNCL_COLL_SENDRECV_BATCH);
        const std::string what = e.what();
        if (what.compare(0, generic.size(), generic) != 0) throw;
        throw Error(e.status(), fn + what.substr(generic.size()));
      }
      batch->finished = true;
      return batch;
    }
    launch(batch);
    return batch;
  }
  batch->coll = kit::make_batch_coll(nullptr, singles.size());
  for (size_t i = 0; i < singles.size(); ++i) {
    // Checked for every op before any starts (start() would only find out op by op).
    MNCL_CHECK(table_->coll_mask & MNCL_COLL_BIT(singles[i].kind), MNCL_ERR_NOT_SUPPORTED,
               "%s: op %zu: backend '%s' implements neither batches nor %s", fn, i,
               backend().c_str(), singles[i].kind == MNCL_COLL_SEND ? "send" : "recv");
  }
  // A backend that posts operations natively runs a staged one to its end before returning
  // (Comm::launch): the next op of the batch would only start after it, and an exchange
  // deadlocks.
  MNCL_CHECK(!staged || singles.size() < 2 || !(table_->caps & MNCL_CAP_NATIVE_ASYNC),
             MNCL_ERR_NOT_SUPPORTED,
             "%s: backend %s takes CUDA buffers through host staging, one operation at a time, "
             "so the %zu ops of this batch could not progress together; pass host buffers, one "
             "op per call, or use a backend that takes CUDA memory (nccl, flat over a CUDA-aware "
             "MPI)",
             fn, backend().c_str(), singles.size());
  batch->parts.reserve(singles.size());
  for (size_t i = 0; i < singles.size(); ++i) {
    try {
      batch->parts.push_back(start(singles[i]));
    } catch (const Error &e) {
      // The ops already started end first (bounded by the timeout): no buffer of the batch is
      // in use once the caller has the error.
      for (const auto &part : batch->parts) wait(*part, -1);
      throw Error(e.status(), format("%s: op %zu (%s, peer %d) could not start: %s", fn, i,
                                     singles[i].kind == MNCL_COLL_SEND ? "send" : "recv",
                                     singles[i].root, e.what()));
    }
  }
  if (batch->parts.empty()) batch->finished = true;
  return batch;
}

void Comm::enqueue(Lane &lane, std::shared_ptr<Operation> op) {
  // cudaStreamPerThread names the issuing thread's default stream, but a queued operation runs
  // on a lane's thread (or a waiter's): staged there on that thread's own stream, its copies
  // would not wait for the caller's kernels (stale inputs, silently). A marker recorded here,
  // on the issuing thread, is what the lane waits for before it copies. Without events, the
  // legacy default stream, which waits for every blocking stream's work (the caller's
  // per-thread stream included, and all others too).
  if (op->coll.stream == cuda::kPerThreadStream && op->inputs_ready == nullptr &&
      needs_staging(op->coll)) {
    op->inputs_ready = staging_->mark_stream(op->coll);
    if (op->inputs_ready == nullptr) op->coll.stream = cuda::kLegacyStream;
  }
  std::string no_thread;
  {
    std::lock_guard<std::mutex> lock(lane.mutex);
    if (!lane.worker_alive) {
      if (lane.worker.joinable()) lane.worker.join();  // it has left its loop already
      try {
        lane.worker = std::thread([this, &lane] { work(lane); });
        lane.worker_alive = true;
      } catch (const std::system_error &e) {
        no_thread = format(
            "%s on %s: cannot start a thread to run it: %s (the system refused a thread: a "
            "limit on processes or threads, ulimit -u or a container's pids limit, or on "
            "memory)",
            describe_op(op->coll).c_str(), backend().c_str(), e.what());
      }
    }
    if (no_thread.empty()) {
      lane.queue.push_back(std::move(op));
      ++lane.outstanding;
    }
  }
  if (!no_thread.empty()) {
    // It was numbered: a retry would carry the next number here and this one elsewhere, and
    // the other ranks wait in this one. The communicator cannot go on (they are told).
    backend_broke(no_thread);
    throw Error(MNCL_ERR_SYSTEM, no_thread + "; the communicator is unusable now");
  }
  lane.cv.notify_all();
}

void Comm::work(Lane &lane) {
  // An idle worker leaves after a while, so a job that talked to many peers once does not keep
  // a thread per peer; the next operation on the lane starts a new one.
  constexpr auto kIdle = std::chrono::seconds(2);
  for (;;) {
    std::shared_ptr<Operation> op;
    {
      std::unique_lock<std::mutex> lock(lane.mutex);
      const bool ready = lane.cv.wait_for(
          lock, kIdle, [&] { return !lane.running && (lane.stopping || !lane.queue.empty()); });
      // Leave when stopping with nothing left, or idle; not while a waiter runs the lane.
      if (lane.queue.empty() && !lane.running) {
        lane.worker_alive = false;
        return;
      }
      if (!ready) continue;
      op = lane.queue.front();
      lane.queue.pop_front();
      lane.running = true;
    }
    // Measured before: a finished blocking call's arrays are its caller's again.
    const bool small = coll_bytes(op->coll) <= kLingerMaxBytes;
    complete_claimed(*op, lane);
    // After a small operation the next one often follows within microseconds (a ring of
    // exchanges): stay awake for it, yielding, instead of paying a sleep and a wake-up.
    // Not after large ones, whose transfers need every CPU more than we save.
    if (small && linger_ > std::chrono::microseconds(0)) {
      const auto until = Clock::now() + linger_;
      while (lane.outstanding.load(std::memory_order_acquire) == 0 && Clock::now() < until) {
        std::this_thread::yield();
      }
    }
  }
}

void Comm::complete_claimed(Operation &op, Lane &lane) {
  complete(op, lane);
  {
    std::lock_guard<std::mutex> lock(lane.mutex);
    lane.running = false;
  }
  lane.cv.notify_all();  // the worker (or a waiter) may go on with what is left
}

void Comm::complete(Operation &op, Lane &lane) {
  if (op.gate_token) {
    pass_gate(op, lane);
    return;
  }
  // A gated batch releases its tokens however it ends.
  struct Release {
    Comm &comm;
    LaneGate *gate;
    ~Release() {
      if (gate != nullptr) comm.release_gate(*gate);
    }
  } release{*this, op.gate.get()};
  mncl_status_t status = MNCL_OK;
  std::string error;
  int64_t given_ms = op.coll.timeout_ms;  // what the plugin got of the timeout
  try {
    // The timeout counts from the call that issued the operation, not from when its lane got
    // to it: the plugin gets what is left, so N queued operations behind a stuck one end
    // within one timeout, not N.
    // An abort first: the operations it ended report it, however long they were queued.
    MNCL_CHECK(!aborted_.load(), MNCL_ERR_ABORTED, "%s on %s: the communicator was aborted",
               describe_op(op.coll).c_str(), backend().c_str());
    if (op.gate) await_gate(op);
    const auto left = op.deadline - Clock::now();
    MNCL_CHECK(left > Clock::duration::zero(), MNCL_ERR_TIMEOUT,
               "%s on %s (rank %d of %d): its deadline passed while it was queued behind earlier "
               "operations (the timeout of %.1f s counts from the call that issued it); it "
               "never started",
               describe_op(op.coll).c_str(), backend().c_str(), rank_, size_, timeout_ms_ / 1000.0);
    mncl_coll_v1_t coll = op.coll;
    const auto left_ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    coll.timeout_ms = given_ms = std::min<int64_t>(coll.timeout_ms, left_ms);
    execute_now(coll, op.inputs_ready);
  } catch (const Error &e) {
    status = e.status();
    error = e.what();
    // The plugin's message names the time it had: say why that was less than the timeout.
    if (status == MNCL_ERR_TIMEOUT && given_ms < op.coll.timeout_ms) {
      error += format(
          " (it was queued behind earlier operations for %.3f s and ran with the %.3f s of its "
          "timeout left: the timeout counts from the call that issued it)",
          (op.coll.timeout_ms - given_ms) / 1000.0, given_ms / 1000.0);
    }
  } catch (const std::exception &e) {
    status = MNCL_ERR_INTERNAL;
    error = format("%s on %s: internal error: %s", describe_op(op.coll).c_str(), backend().c_str(),
                   e.what());
  } catch (abi::__forced_unwind &) {
    throw;         // thread cancellation (a plugin's pthread_exit): never swallowed
  } catch (...) {  // a lane's thread must never end the process
    status = MNCL_ERR_INTERNAL;
    error = format("%s on %s: internal error: an exception that is no std::exception",
                   describe_op(op.coll).c_str(), backend().c_str());
  }
  {
    std::lock_guard<std::mutex> lock(op.mutex);
    op.status = status;
    op.error = error;
    op.finished = true;
  }
  --lane.outstanding;
  op.finished_cv.notify_all();
}

bool Comm::run_queued_until(Lane &lane, const Operation &target) {
  for (;;) {
    std::shared_ptr<Operation> next;
    {
      std::lock_guard<std::mutex> lock(lane.mutex);
      if (lane.running) return false;
      const bool queued = std::any_of(lane.queue.begin(), lane.queue.end(),
                                      [&](const auto &op) { return op.get() == &target; });
      if (!queued) return false;
      next = lane.queue.front();
      lane.queue.pop_front();
      lane.running = true;
    }
    complete_claimed(*next, lane);
    if (next.get() == &target) return true;
  }
}

void Comm::stop_lane(Lane &lane) {
  {
    std::lock_guard<std::mutex> lock(lane.mutex);
    lane.stopping = true;
  }
  lane.cv.notify_all();
  if (lane.worker.joinable()) lane.worker.join();
  // A waiter may have been running the last operations: let it finish them.
  std::unique_lock<std::mutex> lock(lane.mutex);
  lane.cv.wait(lock, [&] { return !lane.running && lane.queue.empty(); });
}

size_t Comm::outstanding_everywhere() {
  size_t n = collectives_.outstanding.load();
  std::lock_guard<std::mutex> lock(lanes_mutex_);
  for (const auto &lane : p2p_) n += lane ? lane->outstanding.load() : 0;
  return n;
}

bool Comm::test(Operation &op) {
  return wait(op, 0);
}

bool settle(Operation &op) {
  {
    std::lock_guard<std::mutex> lock(op.mutex);
    if (op.finished) return true;
  }
  if (op.parts.empty()) return false;
  for (const auto &part : op.parts) {
    std::lock_guard<std::mutex> lock(part->mutex);
    if (!part->finished) return false;
  }
  std::lock_guard<std::mutex> lock(op.mutex);
  for (size_t i = 0; i < op.parts.size(); ++i) {
    const Operation &part = *op.parts[i];
    if (part.status == MNCL_OK) continue;
    op.status = part.status;
    op.error = format("%s: op %zu (%s, peer %d) of %zu failed: %s", op.function, i,
                      part.coll.kind == MNCL_COLL_SEND ? "send" : "recv", part.coll.root,
                      op.parts.size(), part.error.c_str());
    break;
  }
  op.finished = true;
  return true;
}

bool Comm::wait_parts(Operation &batch, int64_t timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0));
  for (const auto &part : batch.parts) {
    int64_t left = -1;
    if (timeout_ms >= 0) {
      left = std::max<int64_t>(
          0,
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    }
    if (!wait(*part, left)) return false;
  }
  return settle(batch);
}

bool Comm::test_native(Operation &op) {
  int32_t done = 0;
  set_last_error("");
  bool threw = false;
  const mncl_status_t status = loader::call_plugin(
      backend(), "test", [&] { return table_->test(plugin_comm_, op.native_handle, &done); },
      &threw);
  if (threw) {
    // Whether the operation still runs (and uses its buffers) is unknown, and its handle is
    // not tested again (testing it again threw again, thousands of times a second): it is
    // given up on now, as one that outlives its abort, with the broken backend as the cause.
    const std::string why = last_error();
    backend_broke(why);
    finish_native(
        op, MNCL_ERR_INTERNAL,
        format("%s on %s (rank %d of %d): %s; abandoned, the backend may still use its "
               "buffers",
               describe_op(op.coll).c_str(), backend().c_str(), rank_, size_, why.c_str()));
    return true;
  }
  if (!done && status == MNCL_OK) return false;
  // The ABI releases the handle with a failure too.
  if (status == MNCL_OK) {
    finish_native(op, status, std::string());
    return true;
  }
  const std::string backend_says = last_error();
  mncl_status_t reported = status;
  const std::string head = format("%s on %s (rank %d of %d): ", describe_op(op.coll).c_str(),
                                  backend().c_str(), rank_, size_);
  std::string message = head + backend_says;
  // Under native_mutex_: what the watch knows already, without looking (store reads).
  if (explain_by_peers(&reported, head, &message, false) || native_abort_reason_.empty()) {
    finish_native(op, reported, message);
  } else {
    // Ended by an abort (police_native_ops, or the user's): say so, with the backend's words.
    const bool overdue = !aborted_.load() && Clock::now() >= op.deadline;
    finish_native(
        op, overdue ? MNCL_ERR_TIMEOUT : MNCL_ERR_ABORTED,
        format("%s on %s (rank %d of %d): %s; %s (backend: %s)", describe_op(op.coll).c_str(),
               backend().c_str(), rank_, size_,
               overdue ? "not finished within its timeout" : "still running, and cut short",
               native_abort_reason_.c_str(), backend_says.c_str()));
  }
  return true;
}

void Comm::finish_native(Operation &op, mncl_status_t status, std::string error) {
  // Swap-and-pop out of native_ops_; `keep` holds the operation until it is recorded.
  const std::shared_ptr<Operation> keep = native_ops_[op.native_slot];
  native_ops_[op.native_slot] = native_ops_.back();
  native_ops_[op.native_slot]->native_slot = op.native_slot;
  native_ops_.pop_back();
  op.native_handle = nullptr;
  {
    std::lock_guard<std::mutex> lock(op.mutex);
    op.status = status;
    op.error = std::move(error);
    op.finished = true;
  }
  op.finished_cv.notify_all();
}

bool Comm::wait_native(Operation &op, int64_t timeout_ms) {
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0));
  // Polled without sleeping at first: a backend such as MPI progresses only inside its calls,
  // and even the shortest sleep lasts tens of microseconds, which a small message would wait
  // on each side (a 1 KiB exchange on flat took 150 us against MPI's 2). Then with backoff.
  const auto spin_until = start + kNativeSpin;
  // The first 50 us without yielding either: a yield on a busy core hands it to another
  // process for a time slice, which a small exchange would wait for at each of its steps.
  const auto eager_until = start + std::chrono::microseconds(50);
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(native_mutex_);
      // Another waiter, or destroy, may have ended it meanwhile.
      if (op.native_handle == nullptr || test_native(op)) return true;
      police_native_ops();  // past its deadline: no wait, -1 included, lasts for ever
      if (op.native_handle == nullptr) return true;
    }
    const auto now = Clock::now();
    if (timeout_ms >= 0 && now >= deadline) return false;
    if (now < spin_until) {
      if (now >= eager_until) std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

bool Comm::wait(Operation &op, int64_t timeout_ms) {
  {
    std::lock_guard<std::mutex> lock(op.mutex);
    if (op.finished) return true;
  }
  // A deadline that far ahead would overflow the clock's arithmetic (and end the wait at
  // once): it is a wait without a limit, bounded like -1 by the operation's own timeout.
  if (timeout_ms > kUnboundedWaitMs) timeout_ms = -1;
  if (!op.parts.empty()) return wait_parts(op, timeout_ms);
  if (op.native) return wait_native(op, timeout_ms);
  // Only an unbounded wait may run operations here: each one may take up to the timeout.
  if (timeout_ms < 0) run_queued_until(lane_for(op.coll), op);
  std::unique_lock<std::mutex> lock(op.mutex);
  if (timeout_ms < 0) {
    op.finished_cv.wait(lock, [&] { return op.finished; });
    return true;
  }
  return op.finished_cv.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                                 [&] { return op.finished; });
}

// ---------------------------------------------------------------------------------------------
// Abort, split, destroy
// ---------------------------------------------------------------------------------------------

void Comm::abort() {
  if (aborted_.exchange(true)) return;  // a second abort is harmless
  MNCL_INFO("communicator %s aborted on rank %d", id_.c_str(), rank_);
  {
    std::lock_guard<std::mutex> lock(forming_mutex_);
    if (forming_child_ != nullptr) forming_child_->plugin_stop_.store(true);
  }
  abort_plugin();
  // The others' waits in the store end on this note rather than at their timeout.
  if (peer_watch_ != nullptr) peer_watch_->publish_abort();
}

void Comm::backend_broke(const std::string &why) {
  {
    std::lock_guard<std::mutex> lock(watchdog_mutex_);
    if (!broken_reason_.empty()) return;
    broken_reason_ = why;
  }
  MNCL_WARN(
      "%s (rank %d of %d): %s; the backend's communicator is aborted, and this one "
      "unusable",
      label().c_str(), rank_, size_, why.c_str());
  abort_plugin();
  // The other ranks, whose operations may wait for this one's part, end on the note.
  if (peer_watch_ != nullptr) peer_watch_->publish_abort();
}

namespace {

// The communicators of this process that are served by its TCP store (it is the job's rank
// 0) and have a peer watch, for Comm::linger_at_exit. Allocated once and never freed: it is
// used from an atexit handler, after which the library's other statics go.
struct ExitRegistry {
  std::mutex mutex;
  std::vector<Comm *> comms;
  // The process that registered them: a child forked without exec has copies of them, and of
  // this mutex (maybe held), but none of their threads: it leaves them alone.
  std::atomic<pid_t> pid{0};
  bool handlers = false;  // atexit and pthread_atfork registered (under the mutex)
};
ExitRegistry &exit_registry() {
  static ExitRegistry *registry = new ExitRegistry;
  return *registry;
}

// In a child forked without exec (single-threaded there): the parent's communicators are not
// its own, and the mutex may have been copied held.
void exit_registry_after_fork_in_child() {
  ExitRegistry &registry = exit_registry();
  new (&registry.mutex) std::mutex;
  registry.comms.clear();
  registry.pid.store(::getpid());
}

void register_for_exit(Comm *comm) {
  ExitRegistry &registry = exit_registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  if (!registry.handlers) {
    registry.handlers = true;  // inherited by a forked child, which keeps the parent's handler
    // Registered after the statics that the linger uses (logging, settings, the store's),
    // which the first communicator has made: atexit runs it before they are destroyed.
    if (std::atexit(&Comm::linger_at_exit) != 0) {
      MNCL_INFO("cannot register the exit-time linger of the store's host (atexit failed)");
    }
    pthread_atfork(nullptr, nullptr, exit_registry_after_fork_in_child);
  }
  registry.pid.store(::getpid());
  registry.comms.push_back(comm);
}

void unregister_for_exit(Comm *comm) {
  ExitRegistry &registry = exit_registry();
  if (registry.pid.load() != ::getpid()) return;  // a forked child's copy (see ExitRegistry)
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.comms.erase(std::remove(registry.comms.begin(), registry.comms.end(), comm),
                       registry.comms.end());
}

}  // namespace

bool Comm::knows_of_failure() {
  return aborted_.load() || plugin_aborted_.load() ||
         (peer_watch_ != nullptr && peer_watch_->found().status != MNCL_OK);
}

void Comm::linger_at_exit() {
  // An application that returns from main, or calls exit(), after a failed operation without
  // destroying the communicator (a Python script ending on an exception outside `with`) took
  // the store, and the note of why the communicator failed, with its process: the other ranks,
  // still on their way to read it, found only that rank 0 had exited, and named it. Here the
  // process first waits, as an aborted communicator's destroy does, for the others to exit or
  // leave, bounded. Communicators that know of no failure are not waited for: an application
  // that merely forgets to destroy one exits at once, as before.
  ExitRegistry &registry = exit_registry();
  if (registry.pid.load() != ::getpid()) return;     // a forked child (see ExitRegistry)
  std::lock_guard<std::mutex> lock(registry.mutex);  // a destroy on another thread waits
  std::vector<Comm *> failed;
  int64_t bound_ms = kExitStoreLinger.count();
  for (Comm *comm : registry.comms) {
    if (comm->destroyed_.load() || !comm->knows_of_failure()) continue;
    failed.push_back(comm);
    bound_ms = std::min(bound_ms, comm->timeout_ms_);
  }
  if (failed.empty()) return;
  MNCL_INFO(
      "exiting without mncl_comm_destroy of %s, which failed: this process serves the "
      "store, and waits up to %.1f s for the other ranks to read why before it goes",
      failed.front()->label().c_str(), bound_ms / 1000.0);
  const auto give_up = Clock::now() + std::chrono::milliseconds(bound_ms);
  for (Comm *comm : failed) comm->linger_for_note(give_up);
}

void Comm::watch_peers() {
  if (size_ <= 1) return;
  std::vector<PeerWatch::Peer> peers;
  for (int r = 0; r < size_; ++r) {
    const Member &m = members_[static_cast<size_t>(r)];
    peers.push_back(PeerWatch::Peer{r, m.host, m.pid, m.identity});
  }
  // Rank 0's process, and this communicator's id: no other job's, nor another communicator's.
  const Member &first = members_[0];
  peer_watch_ = std::make_shared<PeerWatch>(
      comm_store_, rank_, std::move(peers),
      format("%s %s %d %s", id_.c_str(), first.host.c_str(), first.pid, first.identity.c_str()));
  peer_watch_->set_waiting([this] { return waiting_operations(); });
  if (job_ != nullptr && job_->hosts_tcp_store) register_for_exit(this);
}

void Comm::ensure_watchdog() {
  // Lanes may call this at the same time: the watchdog is made once (the flag keeps the common
  // case to one load).
  if (watchdog_started_.load(std::memory_order_acquire)) return;
  std::call_once(watchdog_once_, [this] {
    auto expired = [this](const OpHistory::Record &r) {
      {
        std::lock_guard<std::mutex> lock(watchdog_mutex_);
        watchdog_op_ = r;
        watchdog_report_ = format(
            "%s on %s (rank %d of %d): no result from the backend within the timeout of "
            "%.1f s (+%.1f s grace); the watchdog aborted the backend's communicator",
            op_label(coll_function_name(r.kind), r.kind, r.seq).c_str(), backend().c_str(), rank_,
            size_, timeout_ms_ / 1000.0, Watchdog::grace_ms(timeout_ms_) / 1000.0);
      }
      abort_plugin();
    };
    std::function<bool()> peer_check;
    if (peer_watch_ != nullptr) peer_check = [this] { return watch_peers_while_waiting(); };
    watchdog_ = std::make_unique<Watchdog>(history_, timeout_ms_, std::move(expired),
                                           std::move(peer_check), backend());
    watchdog_started_.store(true, std::memory_order_release);
  });
}

bool Comm::waits_on_peers() {
  const auto since = Clock::now() - kPeerWaitBeforeCheck;
  OpHistory::Record r;
  if (history_.running(&r) && r.start <= since) return true;
  std::lock_guard<std::mutex> lock(native_mutex_);
  for (const auto &op : native_ops_) {
    if (op->issued <= since) return true;
  }
  return false;
}

std::vector<PeerWatch::Waiting> Comm::waiting_operations() {
  std::vector<PeerWatch::Waiting> waiting;
  const auto add = [&](int kind, uint64_t seq) {
    waiting.push_back({kind, seq, op_label(coll_kind_name(kind), kind, seq)});
  };
  for (const OpHistory::Record &r : history_.all_running()) add(r.kind, r.seq);
  // Posted operations (flat, nccl): not waited for under launch's lock, which a plugin's post
  // holds (a store wait in it would come here).
  std::unique_lock<std::mutex> lock(native_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return waiting;
  for (const auto &op : native_ops_) add(op->coll.kind, op->coll.seq);
  return waiting;
}

bool Comm::watch_peers_while_waiting() {
  if (plugin_aborted_.load() || !waits_on_peers()) return false;
  // A plugin that waits in the store (naive) is told by its waits, which first take what a
  // rank wrote just before it exited.
  if (plugin_store_ != nullptr && plugin_store_->watching() > 0) return false;
  const PeerWatch::Finding cause = peer_watch_->check();
  if (cause.status == MNCL_OK) return false;
  MNCL_WARN(
      "%s (rank %d of %d): %s; aborting the backend's communicator, whose operations in "
      "progress fail",
      label().c_str(), rank_, size_, cause.reason.c_str());
  abort_plugin();
  return true;
}

bool Comm::explain_by_peers(mncl_status_t *status, const std::string &head, std::string *message,
                            bool look, const mncl_coll_v1_t *failed) {
  if (peer_watch_ == nullptr || aborted_.load()) return false;
  PeerWatch::Finding cause = peer_watch_->found();
  // REMOTE looks now: a closed connection (gloo) comes before the watchdog's peer check has
  // looked. A TIMEOUT does not: that check looked while the operation waited, and on a cut link
  // a store read would only add to the timeout.
  // So does the backend's abort by another rank (shm's abort word), which may have aborted
  // for a failure it found and told in its note: that is the cause.
  const bool peer_abort = *status == MNCL_ERR_ABORTED && !plugin_aborted_.load();
  std::optional<PeerWatch::Waiting> op;
  if (failed != nullptr) {
    op = PeerWatch::Waiting{failed->kind, failed->seq,
                            op_label(coll_kind_name(failed->kind), failed->kind, failed->seq)};
  }
  const PeerWatch::Waiting *op_ptr = op ? &*op : nullptr;
  if (look && cause.status == MNCL_OK && (*status == MNCL_ERR_REMOTE || peer_abort)) {
    cause = peer_watch_->check(op_ptr);
    // A killed rank's connections close as its last thread exits, an instant before /proc
    // shows it gone; and the watchdog's peer check may be reading the store (a check then
    // skips its read): one short pause per communicator (a REMOTE of another cause, such as
    // mismatched counts, would otherwise pay it on every operation).
    if (cause.status == MNCL_OK && !peer_cause_waited_.exchange(true)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      cause = peer_watch_->check(op_ptr);
    }
  }
  if (cause.status == MNCL_OK) return false;
  if (peer_abort && cause.status == MNCL_ERR_REMOTE) {
    *message = head + cause.reason + " (backend: " + message->substr(head.size()) + ")";
    *status = cause.status;
    return true;
  }
  if (*status == MNCL_ERR_ABORTED && plugin_aborted_.load()) {
    // The backend's own abort, which the watchdog's peer check made: the rank is the cause.
    *message = head + cause.reason + " (backend: " + message->substr(head.size()) + ")";
    *status = cause.status;
    return true;
  }
  if (*status == MNCL_ERR_REMOTE && message->find(cause.reason) != std::string::npos) {
    *status = cause.status;  // a store wait's (naive): a peer's abort reads as ABORTED
    return true;
  }
  if (*status == MNCL_ERR_REMOTE || *status == MNCL_ERR_TIMEOUT) {
    // The backend failed for a reason of its own (a closed connection, mismatched counts, its
    // timeout), which stays: the rank is added to it.
    *message += "; " + cause.reason;
    return true;
  }
  return false;
}

void Comm::abort_plugin() {
  plugin_stop_.store(true);  // wakes the plugin's store waits
  if (plugin_aborted_.exchange(true)) return;
  // Held by destroy() while the backend tears its communicator down and frees it: then the
  // flag above (which ends the backend's store waits) is all an abort may do.
  std::unique_lock<std::mutex> gate(plugin_gate_, std::try_to_lock);
  if (!gate.owns_lock()) return;
  if (plugin_comm_ != nullptr) {
    // On the caller's thread (mncl_comm_abort): its last error, the failure it aborts for, stays.
    const std::string saved_error = last_error();
    set_last_error("");
    if (loader::call_plugin(backend(), "comm_abort",
                            [&] { return table_->comm_abort(plugin_comm_); }) != MNCL_OK) {
      MNCL_WARN("backend %s: comm_abort failed: %s", backend().c_str(), last_error());
    }
    set_last_error(saved_error);
  }
}

std::string Comm::diagnosis(const mncl_coll_v1_t &coll, mncl_status_t status) {
  // Only failures that point at other ranks are worth a store exchange; not p2p (two ranks, or
  // a batch's few peers, which make no matching collective call).
  if ((status != MNCL_ERR_TIMEOUT && status != MNCL_ERR_REMOTE) || aborted_.load() ||
      coll.kind == MNCL_COLL_SEND || coll.kind == MNCL_COLL_RECV ||
      coll.kind == MNCL_COLL_SENDRECV_BATCH) {
    return "";
  }
  // A native gatherv/scatterv's REMOTE is a block of the wrong size, which the plugin's message
  // names on every rank that fails (gloo: both ends exchange their counts; shm: the others
  // quote the noting rank's message); a sender, or a rank whose block agreed, may well have
  // completed, so "no report" from it would mislead.
  if (status == MNCL_ERR_REMOTE && kit::is_rooted_v_kind(coll.kind)) return "";
  // On a helper thread, bounded: when the store itself is unreachable (a cut link), a store
  // call only fails after the full timeout, and the error must not wait for that.
  // One grace for the wait plus a little for reading; three on the store's host (it lingers).
  const bool host = job_ && job_->hosts_tcp_store;
  const int64_t grace = diagnosis_grace_ms(timeout_ms_);
  const auto limit = std::chrono::milliseconds(host ? 3 * grace + 100 : grace + 200);
  // Read only once the thread has finished (run_briefly's wait orders it after the write).
  auto text = std::make_shared<std::string>();
  // The call's fingerprint now: it reads the caller's arrays (counts), which the thread may
  // outlive.
  const bool done = run_briefly(
      limit, [text, store = comm_store_, seq = coll.seq, kind = coll.kind, call = fingerprint(coll),
              rank = rank_, size = size_, timeout = timeout_ms_, dump = history_.dump(4), host] {
        *text = diagnose_failure(*store, seq, kind, call, rank, size, timeout, dump, host);
      });
  if (!done) return "; (no diagnosis: the store did not answer in time, or no thread to ask it)";
  return *text;
}

namespace {

// What a split's config asks of the new communicator; -1 / empty: as the parent.
struct SplitSettings {
  bool inherit_backend = true;
  std::string backend;
  int64_t timeout_ms = -1;
  int device = -1;
};

SplitSettings read_split_config(const mncl_config_t *user, const char *fn) {
  SplitSettings out;
  if (user == nullptr) return out;
  const mncl_config_t config = read_user_config(user);
  MNCL_CHECK(config.rank == MNCL_FROM_ENV, MNCL_ERR_INVALID_ARGUMENT,
             "%s: config.rank is %d; a split takes the ranks from (color, key): leave it -1", fn,
             static_cast<int>(config.rank));
  MNCL_CHECK(config.size == MNCL_FROM_ENV, MNCL_ERR_INVALID_ARGUMENT,
             "%s: config.size is %d; a split takes the size from (color, key): leave it -1", fn,
             static_cast<int>(config.size));
  MNCL_CHECK(config.bootstrap == nullptr, MNCL_ERR_INVALID_ARGUMENT,
             "%s: config.bootstrap is set ('%s'); a split uses the parent's store: leave it NULL",
             fn, config.bootstrap);
  MNCL_CHECK(config.timeout_ms == MNCL_FROM_ENV ||
                 (config.timeout_ms > 0 && config.timeout_ms <= env::kMaxTimeoutMs),
             MNCL_ERR_INVALID_ARGUMENT,
             "%s: config.timeout_ms is %lld; give a positive number of milliseconds, at most %lld "
             "(one week), or -1 for the parent's",
             fn, static_cast<long long>(config.timeout_ms),
             static_cast<long long>(env::kMaxTimeoutMs));
  MNCL_CHECK(config.device >= MNCL_FROM_ENV, MNCL_ERR_INVALID_ARGUMENT,
             "%s: config.device is %d; give an ordinal, or -1 for the parent's", fn,
             static_cast<int>(config.device));
  if (config.backend != nullptr) {
    MNCL_CHECK(config.backend[0] != '\0', MNCL_ERR_INVALID_ARGUMENT,
               "%s: config.backend is empty; name a backend, or pass NULL for the parent's", fn);
    out.inherit_backend = false;
    out.backend = config.backend;
  }
  out.timeout_ms = config.timeout_ms;
  out.device = config.device;
  return out;
}

// Whether a backend spec ("auto", "gloo, auto", ...) has "auto" among its comma-separated items.
bool mentions_auto(const std::string &spec) {
  std::istringstream items(spec);
  for (std::string item; std::getline(items, item, ',');) {
    const size_t first = item.find_first_not_of(" \t"), last = item.find_last_not_of(" \t");
    if (first != std::string::npos && item.compare(first, last - first + 1, "auto") == 0) {
      return true;
    }
  }
  return false;
}

// How a rank split, as published: "color" (mncl_comm_split/_config) or "type <n>".
std::string describe_split(const std::string &how) {
  if (how == "type 0") return "MNCL_SPLIT_TYPE_HOST";
  if (how == "type 1") return "MNCL_SPLIT_TYPE_CROSS_HOST";
  if (how == "color") return "a color (mncl_comm_split/_config)";
  return how;
}

}  // namespace

std::unique_ptr<Comm> Comm::split(int color, int key, const mncl_config_t *config, const char *fn,
                                  bool has_newcomm) {
  return split_impl(color, key, false, -1, config, fn, has_newcomm);
}

Comm::HostInfo Comm::host_info() const {
  HostInfo info;
  if (members_.size() <= static_cast<size_t>(rank_)) return info;  // not joined (one rank)
  // Hosts numbered in order of their first rank: the same numbering on every rank.
  std::unordered_map<std::string, int> hosts;
  for (const Member &m : members_) hosts.emplace(m.host, static_cast<int>(hosts.size()));
  const std::string &mine = members_[static_cast<size_t>(rank_)].host;
  info.num_hosts = static_cast<int>(hosts.size());
  info.host_index = hosts.at(mine);
  info.local_rank = 0;
  info.local_size = 0;
  for (int r = 0; r < static_cast<int>(members_.size()); ++r) {
    if (members_[static_cast<size_t>(r)].host != mine) continue;
    ++info.local_size;
    if (r < rank_) ++info.local_rank;
  }
  return info;
}

std::unique_ptr<Comm> Comm::split_type(int type, int key, const mncl_config_t *config,
                                       bool has_newcomm) {
  const char *fn = "mncl_comm_split_type";
  int color = 0;
  if (type == MNCL_SPLIT_TYPE_HOST) {
    color = host_info().host_index;
  } else if (type == MNCL_SPLIT_TYPE_CROSS_HOST) {
    color = host_info().local_rank;
  }
  // An unknown type is reported to every rank by split_impl.
  return split_impl(color, key, true, type, config, fn, has_newcomm);
}

std::unique_ptr<Comm> Comm::split_impl(int color, int key, bool by_type, int type,
                                       const mncl_config_t *config, const char *fn,
                                       bool has_newcomm) {
  check_usable(fn);
  // A rank's own mistakes travel in the exchange, so that every rank fails alike instead of
  // the others waiting for it until the timeout.
  std::string local_error;
  mncl_status_t local_status = MNCL_ERR_INVALID_ARGUMENT;
  SplitSettings wanted;
  if (!has_newcomm) {
    local_error = format("%s: newcomm is NULL", fn);
  } else if (by_type && type != MNCL_SPLIT_TYPE_HOST && type != MNCL_SPLIT_TYPE_CROSS_HOST) {
    local_error = format(
        "%s: type %d is not MNCL_SPLIT_TYPE_HOST (0) or "
        "MNCL_SPLIT_TYPE_CROSS_HOST (1)",
        fn, type);
  } else if (color < 0 && color != MNCL_SPLIT_NONE) {
    local_error =
        format("%s: color %d is negative (use MNCL_SPLIT_NONE to join no group)", fn, color);
  } else {
    try {
      wanted = read_split_config(config, fn);
    } catch (const Error &e) {
      local_error = e.what();
      local_status = e.status();
    }
  }
  std::replace(local_error.begin(), local_error.end(), '\n', ' ');  // one line of the record
  // Splits are ordered with the collectives issued before them. Point-to-point lanes keep
  // running (a receive may stay posted across a split, as in MPI) unless the plugin splits
  // natively: its comm_split must not overlap an execute() on this communicator.
  auto pending = [&] {
    return table_->comm_split ? outstanding_everywhere() : collectives_.outstanding.load();
  };
  for (auto pause = std::chrono::microseconds(50); pending() != 0;) {
    std::this_thread::sleep_for(pause);
  }
  const uint64_t split_index = next_split_++;
  const std::string prefix = format("split%llu/", static_cast<unsigned long long>(split_index));
  // "color key\ncolor|type <n>\nok|error <status> <message>\n<timeout_ms>\n-|=<backend>"
  const std::string record =
      format("%d %d\n", color, key) + (by_type ? format("type %d", type) : "color") + "\n" +
      (local_error.empty() ? std::string("ok")
                           : format("error %d ", static_cast<int>(local_status)) + local_error) +
      "\n" + std::to_string(wanted.timeout_ms) + "\n" +
      (wanted.inherit_backend ? std::string("-") : "=" + wanted.backend);
  const auto values =
      exchange(*comm_store_, prefix, rank_, size_, record, timeout_ms_, &aborted_, fn);
  if (split_index > 0) {
    // Every rank has written this split's record, so every rank is done reading the last
    // split's: this rank's goes, and a parent split again and again holds one split's keys,
    // not one per split (a split per epoch grew the store host by ~170 B per rank and split).
    // A failure leaves the key (the parent's destroy erases it) and fails nothing: the other
    // ranks go on with the split.
    const std::string last =
        format("split%llu/%d", static_cast<unsigned long long>(split_index - 1), rank_);
    try {
      comm_store_->erase(last);
    } catch (const Error &e) {
      MNCL_INFO("%s: could not erase %s: %s", fn, last.c_str(), e.what());
    }
  }

  struct Entry {
    int color = 0, key = 0, parent_rank = 0;
    std::string how, status, timeout, backend;
  };
  std::vector<Entry> all;
  for (int r = 0; r < size_; ++r) {
    Entry e;
    e.parent_rank = r;
    std::istringstream in(values[r]);
    std::string line;
    std::getline(in, line);
    std::istringstream(line) >> e.color >> e.key;
    std::getline(in, e.how);
    std::getline(in, e.status);
    std::getline(in, e.timeout);
    std::getline(in, e.backend);
    all.push_back(e);
  }
  // Failures every rank sees alike: a rank's own error (the first one's status is every
  // rank's), ranks that split differently.
  std::string errors;
  mncl_status_t status = MNCL_OK;
  for (const Entry &e : all) {
    if (e.status.compare(0, 6, "error ") == 0) {
      char *message = nullptr;
      const long code = std::strtol(e.status.c_str() + 6, &message, 10);
      if (status == MNCL_OK) status = static_cast<mncl_status_t>(code);
      errors += format("\n  rank %d: %s", e.parent_rank, message + (*message == ' ' ? 1 : 0));
    } else if (e.how != all[0].how) {
      errors += format("\n  rank %d splits by %s, rank 0 by %s", e.parent_rank,
                       describe_split(e.how).c_str(), describe_split(all[0].how).c_str());
    }
  }
  if (!errors.empty()) {
    throw Error(
        status == MNCL_OK ? MNCL_ERR_INVALID_ARGUMENT : status,
        format("%s: the split of %s failed on every rank:%s", fn, label().c_str(), errors.c_str()));
  }

  // A backend that splits natively (MPI) needs exactly one comm_split call from every parent
  // rank: with its color when the new communicator is its own, else MNCL_SPLIT_NONE.
  bool parent_split_called = false;
  auto leave_native_split = [&] {
    if (table_->comm_split && !parent_split_called) {
      parent_split_called = true;
      void *none = nullptr;
      const std::string saved_error = last_error();  // the split's status does not depend on it
      loader::call_plugin(backend(), "comm_split", [&] {
        return table_->comm_split(plugin_comm_, MNCL_SPLIT_NONE, key, nullptr, &none);
      });
      set_last_error(saved_error);
    }
  };
  if (color == MNCL_SPLIT_NONE) {
    leave_native_split();
    return nullptr;
  }
  std::vector<Entry> group;
  for (const Entry &e : all) {
    if (e.color == color) group.push_back(e);
  }
  std::stable_sort(group.begin(), group.end(), [](const Entry &a, const Entry &b) {
    return a.key != b.key ? a.key < b.key : a.parent_rank < b.parent_rank;
  });
  std::unique_ptr<Comm> child;
  try {
    // The ranks of one group must ask for the same backend (the others' groups are theirs).
    std::string disagreement;
    for (const Entry &e : group) {
      if (e.backend != group[0].backend) {
        auto show = [](const std::string &b) {
          return b == "-" ? std::string("the parent's") : "'" + b.substr(1) + "'";
        };
        disagreement =
            format("rank %d asks for %s, rank %d for %s", group[0].parent_rank,
                   show(group[0].backend).c_str(), e.parent_rank, show(e.backend).c_str());
        break;
      }
    }
    MNCL_CHECK(disagreement.empty(), MNCL_ERR_INVALID_ARGUMENT,
               "%s: the ranks of color %d disagree on the backend: %s (config.backend must be "
               "the same string on every rank of a group)",
               fn, color, disagreement.c_str());
    // And on the timeout: one rank giving up early would fail alone.
    for (const Entry &e : group) {
      MNCL_CHECK(e.timeout == group[0].timeout, MNCL_ERR_INVALID_ARGUMENT,
                 "%s: the ranks of color %d disagree on config.timeout_ms: rank %d passes %s, "
                 "rank %d %s (-1: the parent's; it must be the same on every rank of a group)",
                 fn, color, group[0].parent_rank, group[0].timeout.c_str(), e.parent_rank,
                 e.timeout.c_str());
    }
    std::vector<int> parent_ranks;
    for (const Entry &e : group) parent_ranks.push_back(e.parent_rank);
    child = make_child(parent_ranks, split_index, color);
    {
      std::lock_guard<std::mutex> lock(forming_mutex_);
      forming_child_ = child.get();
      if (aborted_.load()) child->plugin_stop_.store(true);  // aborted since the exchange
    }
    child->device_ = wanted.device >= 0 ? wanted.device : device_;
    child->timeout_ms_ = wanted.timeout_ms > 0 ? wanted.timeout_ms : timeout_ms_;
    bool native = false;
    if (wanted.inherit_backend) {
      child->plugin_ = plugin_;
      native = table_->comm_split != nullptr;
    } else {
      LaunchSettings settings = *launch_;
      settings.backend_spec = normalized_backend_list(wanted.backend);
      settings.backend_origin = "config.backend";
      settings.rank = child->rank_;
      settings.size = child->size_;
      settings.local_rank = child->local_rank_;
      settings.local_size = child->local_size_;
      settings.timeout_ms = child->timeout_ms_;
      settings.device = child->device_;
      // An MPI launcher makes flat usable only for a group of the whole job, or natively from
      // a parent that splits (as flat does): elsewhere "auto" must not pick it. A backend
      // named outright is left to refuse such a group itself, with its own reason.
      settings.launched_by_mpi = launch_->launched_by_mpi &&
                                 (child->size_ == launch_->size || table_->comm_split != nullptr ||
                                  !mentions_auto(wanted.backend));
      const std::string what = format("%s (%s)", fn, child->label().c_str());
      child->plugin_ = agree_on_backend(*child->comm_store_, settings, child->local_size_,
                                        child->num_hosts_, &aborted_, what.c_str())
                           .plugin;
      native = child->plugin_.get() == plugin_.get() && table_->comm_split != nullptr;
    }
    child->table_ = &child->plugin_->table();
    child->staging_ =
        std::make_unique<cuda::StagingPool>(child->rank_, child->size_, child->backend());
    if (native) {
      parent_split_called = true;
      child->create_plugin_comm(child->bootstrap_for_plugin(), plugin_comm_, color, key);
    } else {
      leave_native_split();
      child->create_plugin_comm(child->bootstrap_for_plugin(), nullptr, 0, 0);
    }
    {
      std::lock_guard<std::mutex> lock(forming_mutex_);
      forming_child_ = nullptr;
    }
    // A backend may finish its creation despite the abort (its store waits were done): the
    // split still fails, as every call on an aborted communicator does.
    MNCL_CHECK(!aborted_.load(), MNCL_ERR_ABORTED, "%s: %s was aborted during the split", fn,
               label().c_str());
    MNCL_INFO("split %s -> %s: rank %d of %d on backend %s", id_.c_str(), child->id_.c_str(),
              child->rank_, child->size_, child->backend().c_str());
    return child;
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(forming_mutex_);
      forming_child_ = nullptr;
    }
    // The other groups' ranks may be waiting in the native split for this one: first that
    // call, then the half-made child's teardown. That one does not wait for the group's other
    // ranks to leave: they may have made theirs and be waiting for this rank elsewhere.
    leave_native_split();
    if (child) child->half_made_ = true;
    child.reset();
    throw;
  }
}

std::unique_ptr<Comm> Comm::make_child(const std::vector<int> &parent_ranks, uint64_t split_index,
                                       int color) {
  std::unique_ptr<Comm> child(new Comm());
  child->size_ = static_cast<int>(parent_ranks.size());
  std::set<std::string> hosts;
  int same_host_before = 0, same_host = 0;
  const std::string &my_host = members_[rank_].host;
  for (size_t i = 0; i < parent_ranks.size(); ++i) {
    const Member &m = members_[parent_ranks[i]];
    if (parent_ranks[i] == rank_) child->rank_ = static_cast<int>(i);
    child->members_.push_back(m);
    hosts.insert(m.host);
  }
  for (size_t i = 0; i < parent_ranks.size(); ++i) {
    if (child->members_[i].host != my_host) continue;
    ++same_host;
    if (static_cast<int>(i) < child->rank_) ++same_host_before;
  }
  child->num_hosts_ = static_cast<int>(hosts.size());
  child->local_rank_ = same_host_before;
  child->local_size_ = same_host;
  child->device_ = device_;
  child->timeout_ms_ = timeout_ms_;
  child->history_.set_max_running(max_lanes(child->size_));
  child->id_ =
      format("%s.s%llu.%d", id_.c_str(), static_cast<unsigned long long>(split_index), color);
  child->launch_ = launch_;
  child->job_store_ = job_store_;
  child->job_ = job_;
  ++job_->live;
  child->comm_store_ = bootstrap::make_prefix_store(job_store_, child->id_ + "/");
  child->watch_peers();
  child->plugin_store_ =
      std::make_unique<StoreBridge>(bootstrap::make_prefix_store(job_store_, child->id_ + "/p/"),
                                    &child->plugin_stop_, child->peer_watch_);
  child->debug_checks_ = debug_checks_;
  child->linger_ = linger_;
  child->joined_ = true;  // every member took part in the split's exchange
  return child;
}

void Comm::police_native_ops() {
  if (native_ops_.empty()) return;
  // As the watchdog does for a blocked call: a plugin gets an operation's timeout plus a grace
  // to report its end, then its communicator is aborted (which must end every call soon), and
  // after one more grace the core gives up on what is left.
  const auto now = Clock::now();
  // Every poll of every wait and test comes here: the scan below runs a few times a second at
  // most (on every poll, n outstanding requests made a sweep of tests O(n^2)).
  if (now < next_police_) return;
  next_police_ = now + kPolicePeriod;
  const auto grace = std::chrono::milliseconds(Watchdog::grace_ms(timeout_ms_));
  if (native_aborted_at_ == Clock::time_point::max()) {
    if (plugin_aborted_.load()) {
      // Aborted already (mncl_comm_abort, the watchdog): one grace from now, not a timeout.
      const PeerWatch::Finding cause =
          peer_watch_ != nullptr ? peer_watch_->found() : PeerWatch::Finding{};
      native_abort_reason_ = aborted_.load()           ? std::string("mncl_comm_abort was called")
                             : cause.status != MNCL_OK ? cause.reason
                                                       : std::string(
                                                             "the watchdog aborted the "
                                                             "backend's communicator");
      native_aborted_at_ = now;
      return;
    }
    const Operation *first = native_ops_.front().get();
    for (const auto &op : native_ops_) {
      if (op->deadline < first->deadline) first = op.get();
    }
    if (first->deadline == Clock::time_point::max() || now - first->deadline < grace) return;
    native_abort_reason_ = format(
        "the core aborted the backend's communicator when %s had outlived its timeout of "
        "%.1f s by %.1f s without the backend reporting its end",
        describe_op(first->coll).c_str(), timeout_ms_ / 1000.0, grace.count() / 1000.0);
    MNCL_WARN("%s: %s", label().c_str(), native_abort_reason_.c_str());
    native_aborted_at_ = now;
    abort_plugin();  // comm_abort may come from any thread (ABI), even with this lock held
    return;
  }
  if (now - native_aborted_at_ < grace) return;
  // The backend ignores its abort: its operations are left to it (never tested again, so their
  // handles leak), and their buffers may still be written.
  MNCL_WARN(
      "%s: %zu posted operation(s) still running after comm_abort; abandoned (backend %s may "
      "still use their buffers)",
      label().c_str(), native_ops_.size(), backend().c_str());
  const bool by_user = aborted_.load();
  // Aborted by the watchdog's peer check: the rank that exited or aborted is the cause.
  const mncl_status_t by_peer =
      by_user || peer_watch_ == nullptr ? MNCL_OK : peer_watch_->found().status;
  while (!native_ops_.empty()) {
    Operation &op = *native_ops_.back();
    const std::string what =
        by_user || by_peer != MNCL_OK
            ? format(
                  "the communicator was aborted (%s) and the backend did not end it "
                  "within %.3f s",
                  native_abort_reason_.c_str(), grace.count() / 1000.0)
            : format("not finished within its timeout of %.3f s, nor after %s",
                     timeout_ms_ / 1000.0, native_abort_reason_.c_str());
    finish_native(
        op,
        by_user              ? MNCL_ERR_ABORTED
        : by_peer != MNCL_OK ? by_peer
                             : MNCL_ERR_TIMEOUT,
        format("%s on %s (rank %d of %d): %s; abandoned, the backend may still use its "
               "buffers",
               describe_op(op.coll).c_str(), backend().c_str(), rank_, size_, what.c_str()));
  }
}

void Comm::retire_native_ops() {
  std::unique_lock<std::mutex> lock(native_mutex_);
  if (native_ops_.empty()) return;
  MNCL_INFO("mncl_comm_destroy(%s): waiting for %zu posted operation(s) to end", id_.c_str(),
            native_ops_.size());
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    // Backwards: finish_native moves the last operation into the slot it frees.
    for (size_t i = native_ops_.size(); i-- > 0;) {
      const std::shared_ptr<Operation> op = native_ops_[i];  // alive while test_native runs
      test_native(*op);
    }
    police_native_ops();
    if (native_ops_.empty()) return;
    lock.unlock();  // a waiter on another thread may test meanwhile
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
    lock.lock();
  }
}

void Comm::destroy(const std::atomic<int> *api_calls) {
  if (destroyed_.exchange(true)) return;
  if (peer_watch_ != nullptr && job_ != nullptr && job_->hosts_tcp_store) {
    unregister_for_exit(this);
  }
  const bool aborted_before = aborted_.load();
  // First the calls of other threads that are inside (a blocking one, or one about to queue an
  // operation: none may reach a lane once its thread is stopped below). Each ends by its own
  // timeout; the backend's communicator must outlive them (shm unmapped its segment under a
  // blocked mncl_recv, which crashed).
  try {
    wait_for_callers(api_calls);
  } catch (const Error &e) {
    MNCL_WARN("%s", e.what());
    callers_left_ = true;
  }
  // Let every issued operation finish (each is bounded by the timeout from its call), then stop
  // the threads; and end those posted to the plugin, which may use their buffers until then.
  stop_lane(collectives_);
  for (auto &lane : p2p_) {
    if (lane) stop_lane(*lane);
  }
  retire_native_ops();
  watchdog_.reset();  // before the plugin communicator it may abort goes away
  // This rank issues no more collectives: a rank waiting in a later one learns so now
  // (PeerWatch::publish_collectives), not at its timeout; before the backend's teardown, which
  // may wait for the others. Not while a call of another thread is still inside (it may yet
  // number one).
  if (peer_watch_ != nullptr && comm_store_ && joined_ && !aborted_before && !callers_left_) {
    try {
      peer_watch_->publish_collectives(next_seq_);
    } catch (const Error &e) {
      MNCL_INFO("mncl_comm_destroy(%s): could not publish its count of collectives: %s",
                id_.c_str(), e.what());
    }
  }

  std::string error;
  mncl_status_t status = MNCL_OK;
  // The backend's teardown and rank 0's wait for the others to leave share one timeout: gloo's
  // final exchange with a rank that never came took the whole timeout, then the leave wait
  // another (10 minutes at the default).
  const auto teardown_deadline = deadline_after(timeout_ms_);
  {
    // Under the gate: no comm_abort reaches a communicator the backend is freeing (a plugin
    // cannot guard the end of its own comm_destroy). An abort meanwhile still ends the
    // backend's store waits, and the core's own waits below.
    std::lock_guard<std::mutex> gate(plugin_gate_);
    if (plugin_comm_ != nullptr && !callers_left_) {
      set_last_error("");
      status = loader::call_plugin(backend(), "comm_destroy",
                                   [&] { return table_->comm_destroy(plugin_comm_); });
      if (status != MNCL_OK) {
        error = format("mncl_comm_destroy: backend '%s': %s", backend().c_str(), last_error());
      }
      plugin_comm_ = nullptr;
    }
  }
  // Leave protocol: rank 0 removes the communicator's keys once every rank is done with them
  // (and, on the job's rank 0, keeps the store server up until then). Skipped only when the
  // communicator was abandoned (aborted) before destroy; an abort during it cuts its waits.
  // Counted also for an aborted communicator, so that the job's last one still closes the
  // store properly (an aborted child before its world).
  const bool last_of_job = job_ && joined_ && comm_store_ && --job_->live == 0;
  if (comm_store_ && joined_ && aborted_before) leave_abandoned(last_of_job);
  if (comm_store_ && joined_ && !aborted_before) {
    try {
      const std::string mine = "leave/" + std::to_string(rank_);
      // The notes for this rank's end go before its leave key comes: past it the others may
      // take it for left, and its process then ends (the note would say it was lost).
      if (peer_watch_ != nullptr) peer_watch_->take_back_wills();
      comm_store_->set(mine, kLeftInTurn, 1);
      if (rank_ != 0) {
        try {
          erase_if_all_abandoned(*comm_store_, size_);
        } catch (const Error &e) {  // the keys stay; the destroy itself went well
          MNCL_INFO("mncl_comm_destroy(%s): could not erase an aborted rank 0's keys: %s",
                    id_.c_str(), e.what());
        }
      }
      // A half-made child's rank 0 leaves its keys behind rather than wait for ranks that may
      // be waiting for it (see split_impl).
      if (rank_ == 0 && !half_made_) {
        std::vector<std::string> leave;
        for (int r = 0; r < size_; ++r) leave.push_back("leave/" + std::to_string(r));
        // mncl_comm_abort from another thread cuts this wait short (a peer that died), and so
        // does finding that every rank still missing is one of this host's that exited: it
        // can never leave (the others' destroy waits for this one's end, on a TCP store).
        std::vector<std::string> missing;
        bool cut_short = false;  // by an abort
        bool store_gone = false;
        std::vector<int> exited;  // ranks not waited for: they exited without leaving
        const auto rank_of = [](const std::string &key) {
          return std::stoi(key.substr(std::strlen("leave/")));
        };
        try {
          for (;;) {
            const int64_t left =
                std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                         teardown_deadline - Clock::now())
                                         .count());
            const int64_t slice = peer_watch_ != nullptr ? std::min<int64_t>(left, 200) : left;
            missing = comm_store_->wait(leave, wait_options(slice, &aborted_));
            if (missing.empty() || slice >= left) break;
            std::vector<int> ranks;
            for (const auto &key : missing) ranks.push_back(rank_of(key));
            if (peer_watch_->all_gone(ranks)) {
              exited = ranks;
              break;
            }
          }
        } catch (const Error &e) {
          if (e.status() != MNCL_ERR_ABORTED) throw;
          try {
            missing = comm_store_->wait(leave, wait_options(0, nullptr));
          } catch (const Error &) {
            store_gone = true;  // the message names no ranks
          }
          // An abort that came once every rank had left cut nothing short.
          cut_short = store_gone || !missing.empty();
        }
        if (cut_short) {
          std::vector<int> ranks;
          for (const auto &k : missing) ranks.push_back(rank_of(k));
          if (error.empty()) {
            status = MNCL_ERR_ABORTED;
            error = format(
                "mncl_comm_destroy of %s: aborted while it waited for %s to leave; the "
                "communicator is freed",
                label().c_str(),
                store_gone
                    ? "the other ranks (the store could not tell which)"
                    : format("rank%s %s", ranks.size() > 1 ? "s" : "", list_ranks(ranks).c_str())
                          .c_str());
          }
        } else if (!exited.empty()) {
          MNCL_WARN(
              "mncl_comm_destroy of %s: rank%s %s exited without destroying the communicator; "
              "not waited for",
              label().c_str(), exited.size() > 1 ? "s" : "", list_ranks(exited).c_str());
        } else if (!missing.empty()) {
          MNCL_WARN(
              "mncl_comm_destroy of %s: %zu rank(s) did not destroy the communicator within "
              "%.1f s (do the ranks destroy their communicators in the same order?); its keys "
              "are removed without them",
              label().c_str(), missing.size(), timeout_ms_ / 1000.0);
        }
        // Every key of the communicator, in one request: the core's, the backend's (an aborted
        // operation's data on naive) and the last split's. A failure leaves them (logged) and
        // fails nothing: the store's host still waits for the job below.
        try {
          comm_store_->erase_prefix("");
        } catch (const Error &e) {
          MNCL_INFO("mncl_comm_destroy(%s): could not erase its keys: %s", id_.c_str(), e.what());
        }
      }
      if (last_of_job && job_->hosts_tcp_store && !wait_for_job_to_leave(teardown_deadline) &&
          error.empty()) {
        // The other processes may still use the store in communicators this one is no member
        // of (or of which it is not rank 0, which waits for the members above): it goes away
        // with this call, so only once every process has left the job, or the abort says so.
        status = MNCL_ERR_ABORTED;
        error = format(
            "mncl_comm_destroy of %s: aborted while other processes of the job still used the "
            "store this process serves; the communicator is freed, and the store goes with it",
            label().c_str());
      }
      if (last_of_job && job_->hosts_tcp_store) {
        // Only now: the others may open connections until they have left (a pool grows with
        // their concurrent calls). A world created again on this address meanwhile tells this
        // server from the next by its name (reach_own_server) and waits for the next.
        job_store_->stop_accepting();
      }
      if (last_of_job && job_->tcp_store && !job_->hosts_tcp_store) leave_job();
    } catch (const Error &e) {
      if (error.empty()) {
        status = e.status();
        error = format("mncl_comm_destroy: %s", e.what());
      }
    }
  }
  plugin_store_.reset();
  if (peer_watch_ != nullptr) peer_watch_->close();  // abort() may still use the watch itself
  comm_store_.reset();
  job_store_.reset();
  // plugin_ stays until the object goes: a mncl_wait on another thread may still hold this
  // communicator (its operation already ended) and read table_, which unloading would free.

  if (!error.empty()) throw Error(status, error);
}

}  // namespace mncl::core
