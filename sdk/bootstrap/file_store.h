// The file store: one file per key in a directory every rank can see (NFS, Lustre, /tmp).
// Writes are atomic (temp file + rename); readers poll with backoff (1 ms doubling to 20 ms);
// add() serialises on flock() of a lock file in the directory, across threads and processes,
// polled with the same backoff: a lock held past lock_timeout fails with MNCL_ERR_TIMEOUT.
// Only this user's ranks should see the keys: files are 0600, no symbolic link in the folder is
// followed, and a folder that is another user's link, or another user's (not root's) that every
// user may write to, is refused.
#pragma once

#include <chrono>
#include <string>

#include "bootstrap/store.h"

namespace mncl::bootstrap {

class FileStore final : public Store {
 public:
  // Creates dir (0700; its parents as mkdir -p) if missing. Throws MNCL_ERR_BOOTSTRAP if it
  // cannot be used. Warns (once per folder) if every user may write to it.
  // lock_timeout bounds add()'s wait for the lock (open_store passes the job's timeout).
  explicit FileStore(std::string dir,
                     std::chrono::milliseconds lock_timeout = std::chrono::milliseconds(300000));

  void set(const std::string &key, const void *data, size_t len) override;
  Bytes get(const std::string &key, const WaitOptions &opts) override;
  int64_t add(const std::string &key, int64_t delta) override;
  std::vector<std::string> wait(const std::vector<std::string> &keys,
                                const WaitOptions &opts) override;
  bool erase(const std::string &key) override;
  size_t erase_prefix(const std::string &prefix) override;
  std::string describe() const override { return "file://" + dir_; }

 private:
  std::string path_of(const std::string &key) const;

  std::string dir_;
  std::chrono::milliseconds lock_timeout_;
};

// The file name of a key: "k_" then the key with bytes other than [A-Za-z0-9._-] as %XX. Names
// that would be too long for a file system end in a 64-bit hash of the whole key instead.
std::string key_file_name(const std::string &key);

}  // namespace mncl::bootstrap
