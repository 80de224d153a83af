// The TCP store's wire protocol. Every message, in both directions, is one frame:
//
//   u32 length (big-endian) of what follows | u8 opcode | body (length - 1 bytes)
//
// Integers are big-endian. A "string" is a u32 length followed by its bytes. The last field of
// some bodies is "rest": everything up to the end of the frame, so a large value needs no length
// of its own and can be sent straight from (and received straight into) the caller's memory.
//
// A connection starts with HELLO (protocol version and MNCL_STORE_TOKEN); the server answers OK
// or REFUSED and then serves one request at a time, each answered by exactly one reply.
//
// Version 2 added SET_ON_CLOSE and CANCEL_ON_CLOSE: a connection's last will. A client asks
// the server to set a key if that connection ends before the client takes the request back
// (its process exited, was killed, or lost the server). The server acts when it sees the
// connection end (a FIN or reset: at once for a process that died, however it died, as the
// client keeps the connection out of the children it forks), never at
// its own shutdown, and only where the key is not set yet (the first cause stays). A version 2
// server serves version 1 clients too (they never ask for a will); a version 1 server refuses
// a version 2 client at HELLO ("protocol version 2, the server speaks 1"): every rank of a
// job must run a library as new as its store's host's.
//
// Version 3 added ERASE_PREFIX: every key that starts with a prefix goes in one request (a
// communicator's keys at its destroy, whatever left them: an aborted operation's, a split's).
// A version 3 server serves version 1 and 2 clients; older servers refuse version 3 clients.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mncl::bootstrap::wire {

constexpr uint32_t kProtocolVersion = 3;
// u32 length + u8 opcode.
constexpr size_t kHeaderBytes = 5;
// The largest length field accepted. Larger lengths are rejected before anything is allocated.
constexpr size_t kMaxFrameBytes = size_t{1} << 30;
// The server answers a waiting GET or WAIT after at most this long ("not yet"), so the client
// can check its abort flag and deadline and ask again.
constexpr uint32_t kMaxWaitSliceMs = 100;
// The most keys one WAIT (and so its MISSING reply) may name. The server holds a few dozen bytes
// per key it is asked about, so without a cap a frame of empty keys (4 bytes each) would cost it
// many times its size. A count over this is refused as soon as it arrives.
constexpr size_t kMaxWaitKeys = size_t{1} << 20;

enum class Op : uint8_t {
  // Requests, client to server.
  kHello = 1,  // u32 version | token (rest)
  kSet = 2,    // string key | value (rest)
  kGet = 3,    // u32 wait_ms | key (rest)
  kAdd = 4,    // i64 delta | key (rest)
  kWait = 5,   // u32 wait_ms | u32 count (<= kMaxWaitKeys) | count x string key (non-empty)
  kErase = 6,  // key (rest)
  // string key | value (rest): when this connection ends, set key to value unless it is set.
  // Registering a key again replaces its value. Replied OK, or FAILED past the per-connection
  // limit.
  kSetOnClose = 7,
  kCancelOnClose = 8,  // key (rest): takes SET_ON_CLOSE back; replied BOOL (was registered)
  kErasePrefix = 9,    // prefix (rest, non-empty): erases every key it begins; replied INTEGER
                       // (how many)
  // Replies, server to client.
  kOk = 64,       // (empty): HELLO accepted, SET done
  kValue = 65,    // value (rest): GET found the key
  kNotYet = 66,   // (empty): GET's wait slice ran out
  kInteger = 67,  // i64: ADD's new value, ERASE_PREFIX's count
  kMissing = 68,  // u32 count | count x string key: WAIT's keys still missing (none: all set)
  kBool = 69,     // u8 0 or 1: ERASE, whether the key existed
  kRefused = 70,  // reason (rest): HELLO refused ("token" or a version mismatch)
  kFailed = 71,   // message (rest): a request that failed (ADD on a non-integer, WAIT on "")
};

bool is_request(Op op);
const char *op_name(Op op);

// One decoded frame. Every view points into the buffer given to parse_frame.
struct Message {
  Op op = Op::kOk;
  uint32_t version = 0;  // kHello
  uint32_t wait_ms = 0;  // kGet, kWait
  int64_t integer = 0;   // kAdd (delta), kInteger
  bool flag = false;     // kBool
  // kHello: token; kSet/kGet/kAdd/kErase/kSetOnClose/kCancelOnClose: key; kErasePrefix: the
  // prefix; kRefused/kFailed: text.
  std::string_view text;
  std::vector<std::string_view> keys;  // kWait, kMissing
  std::string_view value;              // kSet, kSetOnClose, kValue
};

enum class ParseStatus { kComplete, kNeedMore, kInvalid };

struct ParseResult {
  ParseStatus status = ParseStatus::kNeedMore;
  // kComplete: bytes the frame took. kNeedMore: the whole frame's size once the length is
  // known, else 0.
  size_t frame_size = 0;
  Message message;    // kComplete only
  std::string error;  // kInvalid only: what was wrong
};

// Decodes the frame at the start of data[0, size). Pure: no I/O, no allocation beyond the
// result's key list, never reads past size. Safe on any input (a fuzzing target).
ParseResult parse_frame(const uint8_t *data, size_t size);

// Encoders. Each returns the complete frame, except the *_head ones, which return the frame
// without its trailing value of value_size bytes (sent separately from the caller's memory).
// Throw MNCL_ERR_INVALID_ARGUMENT if the frame would exceed kMaxFrameBytes (or name more than
// kMaxWaitKeys keys).
std::vector<uint8_t> encode_hello(std::string_view token);
std::vector<uint8_t> encode_set_head(std::string_view key, size_t value_size);
std::vector<uint8_t> encode_get(std::string_view key, uint32_t wait_ms);
std::vector<uint8_t> encode_add(std::string_view key, int64_t delta);
std::vector<uint8_t> encode_wait(const std::vector<std::string> &keys, uint32_t wait_ms);
std::vector<uint8_t> encode_erase(std::string_view key);
std::vector<uint8_t> encode_set_on_close_head(std::string_view key, size_t value_size);
std::vector<uint8_t> encode_cancel_on_close(std::string_view key);
std::vector<uint8_t> encode_erase_prefix(std::string_view prefix);
std::vector<uint8_t> encode_ok();
std::vector<uint8_t> encode_value_head(size_t value_size);
std::vector<uint8_t> encode_not_yet();
std::vector<uint8_t> encode_integer(int64_t value);
std::vector<uint8_t> encode_missing(const std::vector<std::string_view> &keys);
std::vector<uint8_t> encode_bool(bool value);
std::vector<uint8_t> encode_refused(std::string_view reason);
std::vector<uint8_t> encode_failed(std::string_view message);

}  // namespace mncl::bootstrap::wire
