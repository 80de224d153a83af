// PeerWatch and liveness (sdk/core/peer_watch.h): which processes count as gone (an exited
// rank, a zombie, a reused pid) and which are never judged (another boot or pid namespace, no
// identity); the note that carries a finding to the ranks of other hosts, tagged with its job;
// and a plugin's store wait (StoreBridge) that ends on a finding instead of its timeout.
#include "core/peer_watch.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/memory_store.h"
#include "common/error.h"
#include "core/store_bridge.h"

namespace mncl::core {
namespace {

// A child that blocks until killed (its end of the pipe closes when it exits).
pid_t start_child() {
  const pid_t pid = fork();
  if (pid == 0) {
    for (;;) pause();
  }
  return pid;
}

// Waits until /proc shows pid as a zombie (exited, not reaped).
void wait_until_zombie(pid_t pid) {
  for (int i = 0; i < 500; ++i) {
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FAIL() << "pid " << pid << " did not exit";
}

TEST(Liveness, ThisProcessRuns) {
  const std::string me = process_identity(getpid());
  ASSERT_FALSE(me.empty()) << "no /proc here";
  EXPECT_EQ(liveness(me), Liveness::kRunning);
}

TEST(Liveness, ExitedChildIsGoneBeforeAndAfterItIsReaped) {
  const pid_t child = start_child();
  ASSERT_GT(child, 0);
  const std::string identity = process_identity(child);
  ASSERT_FALSE(identity.empty());
  EXPECT_EQ(liveness(identity), Liveness::kRunning);
  kill(child, SIGKILL);
  wait_until_zombie(child);
  EXPECT_EQ(liveness(identity), Liveness::kGone) << "a zombie has exited";
  waitpid(child, nullptr, 0);
  EXPECT_EQ(liveness(identity), Liveness::kGone);
}

TEST(Liveness, LeaderWhoseMainThreadEndedStillRuns) {
  // /proc shows such a process as a zombie ('Z') while its other threads run.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {
    pthread_t thread;
    pthread_create(
        &thread, nullptr,
        [](void *fd) -> void * {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          (void)!write(*static_cast<int *>(fd), "x", 1);
          for (;;) pause();
        },
        &ready[1]);
    // Ends this thread only, without unwinding (pthread_exit's unwind would reach gtest).
    syscall(SYS_exit, 0);
  }
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  EXPECT_EQ(liveness(process_identity(child)), Liveness::kRunning);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
}

TEST(Liveness, AProcessThatCannotBeReadIsNotGone) {
  // Out of descriptors, /proc cannot be opened: that says nothing of the process.
  const pid_t child = start_child();
  const std::string identity = process_identity(child);
  ASSERT_FALSE(identity.empty());
  std::vector<int> held;
  for (int fd; (fd = dup(0)) >= 0 && held.size() < 1000000;) held.push_back(fd);
  const Liveness seen = liveness(identity);
  for (int fd : held) close(fd);
  EXPECT_NE(seen, Liveness::kGone);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
}

TEST(Liveness, OnlyJudgedFromTheSameBootAndPidNamespace) {
  const std::string me = process_identity(getpid());
  ASSERT_FALSE(me.empty());
  EXPECT_EQ(liveness(""), Liveness::kUnknown);
  // Another boot id: the pid means nothing here.
  std::string other_boot = me;
  other_boot[0] = other_boot[0] == '0' ? '1' : '0';
  EXPECT_EQ(liveness(other_boot), Liveness::kUnknown);
  // This process's pid with another start time: the pid was reused.
  const size_t start = me.rfind(' ');
  EXPECT_EQ(liveness(me.substr(0, start) + " 1"), Liveness::kGone);
}

// Checks until something is found (at most 5 s), as the waits and the watchdog look again
// every 200 ms: one check may find nothing on a loaded machine, where a store read that has not
// answered within PeerWatch::kStoreReadWait counts as not answered yet.
PeerWatch::Finding check_until_found(PeerWatch &watch) {
  PeerWatch::Finding found;
  for (int i = 0; i < 500 && found.status == MNCL_OK; ++i) {
    found = watch.check();
    if (found.status == MNCL_OK) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return found;
}

// A store whose calls never answer (a cut link: a call lasts the store's whole timeout) until
// released: a check that waited for one would never return.
class SilentStore : public bootstrap::Store {
 public:
  void set(const std::string &, const void *, size_t) override { block(); }
  bootstrap::Bytes get(const std::string &, const bootstrap::WaitOptions &) override {
    block();
    throw Error(MNCL_ERR_TIMEOUT, "silent store");
  }
  int64_t add(const std::string &, int64_t) override {
    block();
    return 0;
  }
  std::vector<std::string> wait(const std::vector<std::string> &keys,
                                const bootstrap::WaitOptions &) override {
    block();
    return keys;
  }
  bool erase(const std::string &) override { return false; }
  size_t erase_prefix(const std::string &) override { return 0; }
  std::string describe() const override { return "silent"; }
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    cv_.notify_all();
  }
  int calls() const { return calls_.load(); }

 private:
  void block() {
    calls_.fetch_add(1);
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return released_; });
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  bool released_ = false;
  std::atomic<int> calls_{0};
};

struct Job {
  std::shared_ptr<bootstrap::Store> store = bootstrap::make_memory_store();
  // Two ranks of host "a" (this process and a child) and one of host "b".
  pid_t child = start_child();
  std::vector<PeerWatch::Peer> peers{
      {0, "a", static_cast<int>(getpid()), process_identity(getpid())},
      {1, "a", static_cast<int>(child), process_identity(child)},
      {2, "b", 1, "another boot 1 1"}};
  ~Job() {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  }
};

TEST(PeerWatch, FindsAnExitedRankAndTellsTheOtherHosts) {
  Job job;
  PeerWatch on_a(job.store, 0, job.peers, "job 1");
  // Host b cannot judge host a's processes (here it could: the same boot and pid namespace).
  std::vector<PeerWatch::Peer> seen_from_b = job.peers;
  for (PeerWatch::Peer &peer : seen_from_b) {
    if (peer.host == "a") peer.identity = "another boot " + std::to_string(peer.pid) + " 1";
  }
  PeerWatch on_b(job.store, 2, seen_from_b, "job 1");
  EXPECT_EQ(on_a.check().status, MNCL_OK);
  EXPECT_EQ(on_b.check().status, MNCL_OK);
  kill(job.child, SIGKILL);
  wait_until_zombie(job.child);
  const PeerWatch::Finding found = check_until_found(on_a);
  EXPECT_EQ(found.status, MNCL_ERR_REMOTE);
  EXPECT_NE(found.reason.find("rank 1 (pid " + std::to_string(job.child) + " on a) exited"),
            std::string::npos)
      << found.reason;
  // Rank 2 cannot see host a's processes: it learns of it from the note.
  const PeerWatch::Finding told = check_until_found(on_b);
  EXPECT_EQ(told.status, MNCL_ERR_REMOTE);
  EXPECT_NE(told.reason.find("exited (found by rank 0, on its host)"), std::string::npos)
      << told.reason;
}

TEST(PeerWatch, AnAbortReachesTheOthersAsAborted) {
  Job job;
  PeerWatch aborting(job.store, 1, job.peers, "job 1");
  PeerWatch other(job.store, 2, job.peers, "job 1");
  aborting.publish_abort();
  const PeerWatch::Finding told = check_until_found(other);
  EXPECT_EQ(told.status, MNCL_ERR_ABORTED);
  EXPECT_NE(told.reason.find("aborted by rank 1 (pid " + std::to_string(job.child) + " on a)"),
            std::string::npos)
      << told.reason;
}

TEST(PeerWatch, ARankThatLeftIsNoFailure) {
  // Rank 1 destroyed the communicator (its leave key) and exited; ranks 0 and 2 go on.
  Job job;
  PeerWatch watch(job.store, 0, job.peers, "job 1");
  job.store->set("leave/1", "1", 1);
  kill(job.child, SIGKILL);
  wait_until_zombie(job.child);
  EXPECT_EQ(watch.check().status, MNCL_OK);
}

TEST(PeerWatch, ARankThatAbortedThenExitedIsReportedAsAborted) {
  Job job;
  PeerWatch aborting(job.store, 1, job.peers, "job 1");
  PeerWatch watch(job.store, 0, job.peers, "job 1");
  aborting.publish_abort();
  job.store->set("leave/1", "1", 1);  // its destroy after the abort
  kill(job.child, SIGKILL);
  wait_until_zombie(job.child);
  const PeerWatch::Finding told = check_until_found(watch);
  EXPECT_EQ(told.status, MNCL_ERR_ABORTED) << told.reason;
  EXPECT_NE(told.reason.find("aborted by rank 1 "), std::string::npos) << told.reason;
}

TEST(PeerWatch, TheFirstCauseStays) {
  // Ranks that failed on rank 1's abort abort in turn (the documented way out): rank 2 must
  // still learn of rank 1's, whenever it looks.
  Job job;
  PeerWatch first(job.store, 1, job.peers, "job 1");
  PeerWatch after(job.store, 0, job.peers, "job 1");
  PeerWatch other(job.store, 2, job.peers, "job 1");
  first.publish_abort();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(check_until_found(after).status, MNCL_ERR_ABORTED);
  after.publish_abort();  // after its finding: writes nothing
  // Even one that aborts without having looked leaves the note as it was.
  PeerWatch unaware(job.store, 0, job.peers, "job 1");
  unaware.publish_abort();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const PeerWatch::Finding told = check_until_found(other);
  EXPECT_EQ(told.status, MNCL_ERR_ABORTED);
  EXPECT_NE(told.reason.find("aborted by rank 1 "), std::string::npos) << told.reason;
}

TEST(PeerWatch, AStoreThatDoesNotAnswerHoldsNoCheckUp) {
  // A cut link: every store call lasts the store's timeout. A check must not (it runs on the
  // watchdog's thread, whose timeout rule must go on, and in a failed operation's report, which
  // once waited out the store's 3 s after its own 3 s timeout), nor pile reads up on it.
  Job job;
  auto silent = std::make_shared<SilentStore>();
  PeerWatch watch(silent, 0, job.peers, "job 1");
  // They return (with nothing known: the note was not read) while the store holds the read.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(watch.check().status, MNCL_OK);
  EXPECT_EQ(silent->calls(), 1) << "one read at a time: the later checks skip theirs";
  // A rank of this host that exits is still found, once the store answers its leave key.
  kill(job.child, SIGKILL);
  wait_until_zombie(job.child);
  silent->release();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the stuck read ends
  const PeerWatch::Finding found = check_until_found(watch);
  EXPECT_EQ(found.status, MNCL_ERR_REMOTE) << found.reason;
}

TEST(PeerWatch, IgnoresAnotherJobsNote) {
  // An earlier job's note in a reused file store folder: another tag.
  Job job;
  PeerWatch earlier(job.store, 2, job.peers, "job 1");
  earlier.publish_abort();
  PeerWatch now(job.store, 0, job.peers, "job 2");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(now.check().status, MNCL_OK);
}

TEST(StoreBridge, WaitEndsOnAnExitedPeerInsteadOfItsTimeout) {
  Job job;
  std::atomic<bool> aborted{false};
  StoreBridge bridge(job.store, &aborted,
                     std::make_shared<PeerWatch>(job.store, 0, job.peers, "job 1"));
  const mncl_store_v1_t *table = bridge.table();
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    kill(job.child, SIGKILL);
  });
  void *value = nullptr;
  size_t len = 0;
  // 10 minutes: only the watch can end it.
  const mncl_status_t st = table->get(table->ctx, "never", &value, &len, 600000);
  killer.join();
  EXPECT_EQ(st, MNCL_ERR_REMOTE);
  EXPECT_NE(std::string(last_error()).find("rank 1"), std::string::npos) << last_error();
  const char *keys[] = {"never"};
  EXPECT_EQ(table->wait(table->ctx, keys, 1, 600000), MNCL_ERR_REMOTE) << "the finding stays";
}

TEST(StoreBridge, APeersAbortReachesThePluginAsRemote) {
  // To a plugin MNCL_ERR_ABORTED means its own abort (naive words its message by it); the
  // core turns the operation's REMOTE into ABORTED (Comm::execute_now).
  Job job;
  std::atomic<bool> aborted{false};
  auto watch = std::make_shared<PeerWatch>(job.store, 0, job.peers, "job 1");
  StoreBridge bridge(job.store, &aborted, watch);
  PeerWatch(job.store, 2, job.peers, "job 1").publish_abort();
  void *value = nullptr;
  size_t len = 0;
  const mncl_status_t st = bridge.table()->get(bridge.table()->ctx, "never", &value, &len, 600000);
  EXPECT_EQ(st, MNCL_ERR_REMOTE);
  EXPECT_NE(std::string(last_error()).find("aborted by rank 2"), std::string::npos) << last_error();
  EXPECT_EQ(watch->found().status, MNCL_ERR_ABORTED);
}

TEST(StoreBridge, TimeoutNamesTheWholeWait) {
  Job job;
  std::atomic<bool> aborted{false};
  StoreBridge bridge(job.store, &aborted,
                     std::make_shared<PeerWatch>(job.store, 0, job.peers, "job 1"));
  void *value = nullptr;
  size_t len = 0;
  const mncl_status_t st = bridge.table()->get(bridge.table()->ctx, "never", &value, &len, 700);
  EXPECT_EQ(st, MNCL_ERR_TIMEOUT);
  EXPECT_NE(std::string(last_error()).find("not set within 0.7 s"), std::string::npos)
      << last_error();
}

}  // namespace
}  // namespace mncl::core
