// The communicator's shared-memory segment: what lives where, and mapping it.
//
//   [Header: 4 KiB]  magic, geometry chosen by rank 0, abort and dead-peer words
//   [RankCtl x n]    per rank: its post counter (a Flag), pid, call stamp and v_count words,
//                    one 128-byte line each
//   [Channel x n*n]  point-to-point (src, dst): sent/acked flags and two slot headers
//   [p2p data]       n*n channels x 2 slots x p2p_slot bytes
//   [staging]        n ranks x 2 halves x chunk bytes: what each rank publishes per round
//                    (in the two-phase allreduce also its reduced slice)
//
// Every region starts on a 4 KiB boundary; staging strides carry a small skew so the n
// same-offset slices a reduction reads do not all fall into one cache set.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "shm/sync.h"

namespace mncl::shm {

constexpr uint32_t kMagic = 0x4d48534du;  // "MSHM"
// 2: call stamps, mismatch word; 3: single-copy offers; 4: v_count; 5: scatterv's counts in the
// root's staging (no longer in its receivers' v_count words); 6: one call stamp per staging half;
// 7: each rank's PID namespace; 8: the mismatch note
constexpr uint32_t kVersion = 8;

// Bytes of Header::note (the text is cut to fit, NUL included).
constexpr size_t kNoteBytes = 2048;

struct Header {
  uint32_t magic;
  uint32_t version;
  int32_t size;
  uint32_t reserved;
  uint64_t chunk;     // staging bytes per rank per half (one pipeline round)
  uint64_t small;     // allreduce/reduce: single-phase up to this many bytes
  uint64_t p2p_slot;  // bytes per point-to-point slot
  uint64_t nt_bytes;  // copy-outs of messages at least this large use non-temporal stores
  uint64_t total_bytes;
  // rank+1 of the first rank that called comm_abort, 0 if none. A futex is never waited on
  // here: aborting wakes every Flag instead.
  std::atomic<uint32_t> abort_word;
  // rank+1 of the first peer found dead, and rank+1 of who found it.
  std::atomic<uint32_t> dead_word;
  std::atomic<uint32_t> dead_seen_by;
  // rank+1 of the rank that found mismatched calls (or a root-only argument error in a rooted
  // call) and wrote `note`, 0 if none: the others then fail at once instead of waiting for
  // their timeout, quoting the note. Stored (release) only after the note is written.
  std::atomic<uint32_t> mismatch_word;
  // rank+1 of the first rank to claim `note`, 0 if none: only that rank writes the note, and
  // then sets mismatch_word; a rank that finds mismatch_word set (acquire) reads a whole note.
  std::atomic<uint32_t> note_owner;
  char note[kNoteBytes];  // that rank's error message, NUL-terminated
};
static_assert(sizeof(Header) <= 4096, "the header keeps to its 4 KiB page");

// The collective a rank is in, published before the first post of every collective that
// posts, so that a rank reading a peer's staging (or waiting on its posts) can first check
// that the peer makes the same call (issue 9). A seqlock: `head` is kStampWriting while the
// other words change. head = first post of the call (32 bits) | kind << 32 | dtype << 40.
// There is one stamp per staging half, written under the half's reuse rule (after its readers
// have posted past their last read of it) by the call whose first round uses that half: a rank
// that waits for nobody (a bcast root) can run two calls ahead, and with a single stamp its
// peers would find the stamp of a later call instead of the one they are checking.
struct CallStamp {
  std::atomic<uint64_t> head;
  // op (or -1) in the low 32 bits, root (or -1) in the high; allreduce_coalesced: the high
  // word is kit::split_digest of nbufs and counts (it has no root; count is the total)
  std::atomic<uint64_t> op_root;
  std::atomic<uint64_t> count;
  std::atomic<uint64_t> seq;
};
constexpr uint64_t kStampWriting = ~0ull;

struct alignas(128) RankCtl {
  Flag posts;                // collective progress: bumped once per phase of every collective
  std::atomic<int32_t> pid;  // for liveness checks; 0 until the rank has mapped the segment
  CallStamp call[2];         // per staging half; same line as posts, which the reader has loaded
  // Gatherv: a non-root's own count, which goes with round 0 of a call, one word per staging
  // half and under the half's reuse rule (written in a round that uses half h, before the post;
  // read before the reader's next post), so that the data keep the whole half. Only the line's
  // rank writes it (scatterv's counts travel in the root's staging instead: a rank that wrongly
  // acted as a root would otherwise overwrite the true root's words for its receivers).
  std::atomic<uint64_t> v_count[2];
  // The PID namespace `pid` is a number in (device and inode of /proc/self/ns/pid; 0 if
  // unknown), written with it: a peer uses `pid` (liveness checks, single-copy reads) only
  // when its own namespace is the same. Ranks in containers that share /dev/shm but not PIDs
  // (docker --ipc=host) pass the same-host check, and the pid would name another process.
  std::atomic<uint64_t> pidns_dev, pidns_ino;
};
static_assert(sizeof(RankCtl) == 128, "RankCtl is one 128-byte line per rank");

struct alignas(64) SlotHeader {
  uint64_t message_bytes;  // the whole message, to catch a send/recv size disagreement
  uint64_t chunk_bytes;    // payload in this slot
  uint64_t count;          // the send's count and dtype, which the receive must match
  int64_t dtype;
  // Non-zero: no payload, but an offer to read the whole message from the sender's memory at
  // this address (one copy, process_vm_readv). single_copy (atomic builtins) starts at
  // kSingleCopyOffered; the receiver claims it (kSingleCopyReading), then answers before it
  // acks: kSingleCopyDone, or kSingleCopyDeclined and the message follows through the slots.
  // A sender whose wait fails (timeout, abort) revokes the offer, claimed or not
  // (kSingleCopyRevoked), before it hands the buffer back, so a stuck reader cannot hold it past
  // its deadline; a receiver answers with a compare-and-swap from kSingleCopyReading and fails
  // if the offer was revoked meanwhile: no receiver returns what it read from a buffer its
  // owner may have reused.
  uint64_t remote_addr;
  uint64_t single_copy;
};
constexpr uint64_t kSingleCopyOffered = 0, kSingleCopyDone = 1, kSingleCopyDeclined = 2,
                   kSingleCopyReading = 3, kSingleCopyRevoked = 4;

struct alignas(128) Channel {
  alignas(64) Flag sent;   // chunks the sender has filled (bumped by src)
  alignas(64) Flag acked;  // chunks the receiver has emptied (bumped by dst)
  SlotHeader slot[2];
};

// Byte offsets of every region for a given geometry; identical on every rank.
struct Layout {
  int n = 0;
  size_t chunk = 0, p2p_slot = 0;
  size_t ctl = 0, channels = 0, p2p = 0, staging = 0, staging_stride = 0, total = 0;

  Layout() = default;
  Layout(int nranks, size_t chunk_bytes, size_t p2p_slot_bytes);
};

// A mapped segment (unmapped on destruction). The name is unlinked by rank 0 as soon as every
// rank has mapped it; the mapping lives on until the last process unmaps or exits.
class Segment {
 public:
  Segment() = default;
  Segment(const Segment &) = delete;
  Segment &operator=(const Segment &) = delete;
  ~Segment();

  // Rank 0: creates a fresh, uniquely named segment of layout.total bytes with its pages
  // reserved (a full /dev/shm fails here, not with SIGBUS later). Throws kit::Error.
  void create(const Layout &layout);
  // Other ranks: maps the segment rank 0 created, after checking its size. Throws kit::Error.
  void attach(const std::string &name, const Layout &layout);
  // Removes the name (idempotent; the mapping stays valid).
  void unlink();

  const std::string &name() const { return name_; }
  unsigned char *base() const { return base_; }
  Header &header() const { return *reinterpret_cast<Header *>(base_); }
  RankCtl &ctl(int r) const { return reinterpret_cast<RankCtl *>(base_ + layout_.ctl)[r]; }
  Channel &channel(int src, int dst) const {
    return reinterpret_cast<Channel *>(base_ + layout_.channels)[src * layout_.n + dst];
  }
  unsigned char *p2p_slot(int src, int dst, int slot) const {
    return base_ + layout_.p2p +
           (static_cast<size_t>(src * layout_.n + dst) * 2 + static_cast<size_t>(slot)) *
               layout_.p2p_slot;
  }
  unsigned char *staging(int r, int half) const {
    return base_ + layout_.staging + static_cast<size_t>(r) * layout_.staging_stride +
           static_cast<size_t>(half) * layout_.chunk;
  }
  const Layout &layout() const { return layout_; }

 private:
  void map(int fd);

  Layout layout_;
  std::string name_;
  bool linked_ = false;
  unsigned char *base_ = nullptr;
};

// The name prefix of every segment in /dev/shm (tests check none is left behind).
constexpr const char *kNamePrefix = "mncl-shm-";

// "boot id|hostname": ranks that share it share the host (and its /dev/shm).
std::string host_identity();

// This process's PID namespace: device and inode of /proc/self/ns/pid, {0, 0} if unknown.
struct PidNamespace {
  uint64_t dev = 0, ino = 0;
  bool known() const { return ino != 0; }
};
PidNamespace pid_namespace();
// Writes this process's pid and PID namespace into its RankCtl line.
void publish_pid(RankCtl &ctl);

}  // namespace mncl::shm
