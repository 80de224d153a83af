// Per-rank checkpoints that survive a rank dying mid-write (ChainerMN's multi-node
// checkpointer).
//
//   mncl::Checkpointer ckpt(comm, "/ckpt", "mlp");          // collective
//   if (auto it = ckpt.resume(state)) start = *it + 1;   // collective
//   ...; ckpt.save(iteration, state);                     // local, every rank
//
// Each rank writes `<directory>/<name>.<rank>.<iteration>` atomically (a temporary file,
// fsync, rename, fsync of the directory) with a header holding a magic, the rank, the
// communicator's size, the iteration, the payload length and CRC-32s of header and payload.
// After a save, the rank keeps only its `keep` newest snapshots.
//
// On a communicator of part of the job (a data-parallel group of split_hybrid, say), ranks of
// different groups share a rank number: there the file is `<name>.<group>.<rank>.<iteration>`
// and the header holds the group too (Communicator::group_path(), e.g. "s0c1" for color 1 of the
// world's first split, plus "u<CheckpointerOptions::group>"), so groups never write each
// other's files nor load each other's states. Where the communicator cannot tell its group
// (split_host, split_cross_host, adopt), the constructor throws InvalidArgument unless
// CheckpointerOptions::group names it. A group's path counts the splits made before it, so a
// rerun must split in the same order to find its snapshots (else it starts afresh).
//
// resume() lists and verifies this rank's snapshots (a partial, truncated or corrupt file is
// skipped with a message, never loaded), then the ranks agree on the newest iteration every
// one of them holds intact, load it, and confirm with an allreduce-min that every rank loaded
// it (else they try the next older one). Snapshots newer than the agreed one belonged to an
// abandoned run and are deleted, as are temporaries left by a writer that died. The state type
// follows the serialization concept.
//
// What is never lost: a snapshot whose header (checksummed) names a job of another size (same
// names: its ranks' files) is neither loaded, overwritten (save throws CheckpointError, on the
// ranks that hold such a file), pruned nor deleted, and a resume that finds nothing else
// throws CheckpointError on every rank naming that size instead of starting afresh. A snapshot
// whose load throws InvalidArgument (it decodes but does not fit this run's settings;
// SerializationError, a subclass, means it does not decode) makes every rank throw InvalidArgument
// naming the rank and reason, with nothing deleted and no older snapshot loaded in its place.
// When no iteration is intact on every rank, yet some rank holds several snapshots (no save cut
// short explains that: a rank's directory lost or not shared), resume throws CheckpointError on
// every rank naming the ranks with and without, instead of starting afresh and letting the
// first saves prune them. (With keep = 1 a save cut short can leave no iteration in common:
// that still starts afresh.)
#ifndef MNCL_FRONTENDS_CHECKPOINTER_HPP
#define MNCL_FRONTENDS_CHECKPOINTER_HPP

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mncl/frontends/communicator.hpp"
#include "mncl/frontends/serialize.hpp"

namespace mncl {

struct CheckpointerOptions {
  std::size_t keep = 2;  // snapshots each rank keeps (at least 1; 2 survives a crash mid-save)
  bool sync = true;      // fsync files and the directory (off only for tests on tmpfs)
  bool verbose = true;   // report skipped snapshots on stderr
  // Names this rank's group: needed where the communicator cannot tell it (made by split_host,
  // split_cross_host, or adopt without a group path), appended to its path otherwise. The ranks
  // of one group pass the same name, different groups different ones; [A-Za-z0-9_-] only.
  std::string group = {};
};

// CRC-32 (IEEE 802.3, the one zlib and PNG use).
uint32_t crc32(const void *data, std::size_t size, uint32_t crc = 0);

class Checkpointer {
 public:
  // Collective: every rank of `comm` constructs its Checkpointer together. Creates `directory`
  // if needed. `name` may not contain '/'. `comm` must outlive this object. Throws
  // InvalidArgument for a communicator whose group is unknown, see above. A rank whose
  // arguments or directory fail throws its own error, and every other rank RemoteError naming
  // it (one small allgather), instead of waiting for it in resume() until the timeout.
  Checkpointer(Communicator &comm, std::string directory, std::string name,
               CheckpointerOptions options = {});

  // Local: writes this rank's snapshot of `state` for `iteration`, then prunes old ones.
  template <class State>
  void save(uint64_t iteration, const State &state) {
    save_bytes(iteration, to_bytes(state));
  }
  // Collective: loads the newest snapshot that every rank holds intact into `state` and returns
  // its iteration, or returns nullopt (state untouched) when there is none. If a snapshot that
  // verified fails to deserialize on some rank, state may be partly overwritten before an older
  // one loads; when no older one loads everywhere, every rank throws CheckpointError (some
  // ranks' states were changed) instead of returning nullopt. Throws InvalidArgument when the
  // newest one's load refuses this run's settings, and CheckpointError when there is nothing
  // to resume but snapshots of a job of another size (see above).
  template <class State>
  std::optional<uint64_t> resume(State &state) {
    return resume_with([&state](Span<const uint8_t> payload) { from_bytes(payload, state); });
  }

  void save_bytes(uint64_t iteration, Span<const uint8_t> payload);
  // Collective: like resume(), handing the payload to `load` (which throws if it cannot use it).
  std::optional<uint64_t> resume_with(const std::function<void(Span<const uint8_t>)> &load);

  // This rank's snapshots that verify, oldest first.
  std::vector<uint64_t> local_iterations() const;
  // The payload of this rank's snapshot, or nullopt with the reason in *why.
  std::optional<std::vector<uint8_t>> read_snapshot(uint64_t iteration,
                                                    std::string *why = nullptr) const;
  std::string path(uint64_t iteration) const;
  const std::string &directory() const noexcept { return directory_; }
  // Which group of the job the snapshots belong to ("" for the whole job).
  const std::string &group() const noexcept { return group_; }

 private:
  // This rank's snapshots: those that verify, and those whose header names a job of another
  // size (oldest first).
  struct Scan {
    std::vector<uint64_t> valid;
    std::vector<std::pair<uint64_t, uint32_t>> another_job;  // iteration, job size
  };
  // The constructor's checks and the directory, on this rank.
  void set_up();
  Scan scan() const;
  // The header's checks (magic, checksum, version, rank, iteration, group); the payload's
  // offset, or nullopt with the reason in *why.
  std::optional<std::size_t> check_header(const std::vector<uint8_t> &bytes, uint64_t iteration,
                                          std::string *why) const;
  // The job size in a snapshot's header that verifies (read alone, not the payload).
  std::optional<uint32_t> written_job_size(uint64_t iteration) const;
  bool of_another_job_size(uint64_t iteration) const;
  // Collective: the first rank's non-empty reason, as "rank r: reason".
  std::string first_reason(const std::string &mine) const;
  // Iterations of this rank's snapshot files, verified or not (and its temporaries' paths).
  std::vector<uint64_t> listed_iterations(std::vector<std::string> *temporaries = nullptr) const;
  // After resume: snapshots newer than the resumed one, and temporaries of dead writers.
  void remove_leftovers(std::optional<uint64_t> resumed) const;
  // resume() with no iteration in common: throws where starting afresh would lose snapshots.
  void refuse_to_start_afresh_over(const std::vector<std::vector<uint64_t>> &everyone) const;
  void remove_snapshot(uint64_t iteration) const;
  void prune(uint64_t newest_kept) const;
  // "<name>.[<group>.]<rank>.": this rank's files start with it.
  std::string file_prefix() const;

  Communicator *comm_;
  std::string directory_, name_, group_;
  CheckpointerOptions options_;
};

}  // namespace mncl

#endif  // MNCL_FRONTENDS_CHECKPOINTER_HPP
