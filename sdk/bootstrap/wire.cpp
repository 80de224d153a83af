#include "bootstrap/wire.h"

#include <cstring>

#include "common/error.h"

namespace mncl::bootstrap::wire {

namespace {

uint32_t load_u32(const uint8_t *p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

uint64_t load_u64(const uint8_t *p) {
  return (uint64_t{load_u32(p)} << 32) | load_u32(p + 4);
}

// Reads fields off a frame body, remembering the first overrun instead of throwing.
class Reader {
 public:
  Reader(const uint8_t *data, size_t size) : data_(data), size_(size) {}
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == size_; }
  size_t remaining() const { return size_ - pos_; }

  uint8_t u8() { return take(1) ? data_[pos_ - 1] : 0; }
  uint32_t u32() { return take(4) ? load_u32(data_ + pos_ - 4) : 0; }
  int64_t i64() { return take(8) ? static_cast<int64_t>(load_u64(data_ + pos_ - 8)) : 0; }
  std::string_view string() {
    const uint32_t length = u32();
    if (!take(length)) return {};
    return view(pos_ - length, length);
  }
  std::string_view rest() {
    const size_t start = pos_;
    pos_ = size_;
    return view(start, size_ - start);
  }

 private:
  bool take(size_t n) {
    if (!ok_ || size_ - pos_ < n) {
      ok_ = false;
      return false;
    }
    pos_ += n;
    return true;
  }
  std::string_view view(size_t start, size_t length) const {
    return {reinterpret_cast<const char *>(data_ + start), length};
  }

  const uint8_t *data_;
  size_t size_;
  size_t pos_ = 0;
  bool ok_ = true;
};

bool is_known(uint8_t op) {
  return (op >= 1 && op <= 9) || (op >= 64 && op <= 71);
}

// Decodes the body of a known op; false if its fields do not fill the body exactly.
bool decode_body(Op op, Reader &in, Message &out) {
  switch (op) {
    case Op::kHello:
      out.version = in.u32();
      out.text = in.rest();
      break;
    case Op::kSet:
    case Op::kSetOnClose:
      out.text = in.string();
      out.value = in.rest();
      break;
    case Op::kGet:
      out.wait_ms = in.u32();
      out.text = in.rest();
      break;
    case Op::kAdd:
      out.integer = in.i64();
      out.text = in.rest();
      break;
    case Op::kWait:
    case Op::kMissing: {
      if (op == Op::kWait) out.wait_ms = in.u32();
      const uint32_t count = in.u32();
      // Each key takes at least its 4-byte length, so the body bounds the count (parse_frame
      // has refused a larger one already); the list is then allocated once, not regrown.
      if (count > kMaxWaitKeys || count > in.remaining() / 4) return false;
      out.keys.reserve(count);
      for (uint32_t i = 0; i < count && in.ok(); ++i) out.keys.push_back(in.string());
      break;
    }
    case Op::kErase:
    case Op::kCancelOnClose:
      out.text = in.rest();
      break;
    case Op::kErasePrefix:  // an empty prefix would erase the whole store: never sent
      out.text = in.rest();
      if (out.text.empty()) return false;
      break;
    case Op::kOk:
    case Op::kNotYet:
      break;
    case Op::kValue:
      out.value = in.rest();
      break;
    case Op::kInteger:
      out.integer = in.i64();
      break;
    case Op::kBool: {
      const uint8_t byte = in.u8();
      if (byte > 1) return false;
      out.flag = byte == 1;
      break;
    }
    case Op::kRefused:
    case Op::kFailed:
      out.text = in.rest();
      break;
  }
  return in.ok() && in.at_end();
}

// Builds one frame: reserves the header, appends fields, then writes the length.
class Writer {
 public:
  explicit Writer(Op op, size_t body_hint = 0) {
    bytes_.reserve(kHeaderBytes + body_hint);
    bytes_.resize(kHeaderBytes);
    bytes_[4] = static_cast<uint8_t>(op);
  }
  Writer &u8(uint8_t v) {
    bytes_.push_back(v);
    return *this;
  }
  Writer &u32(uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes_.push_back(static_cast<uint8_t>(v >> shift));
    return *this;
  }
  Writer &i64(int64_t v) {
    const auto u = static_cast<uint64_t>(v);
    u32(static_cast<uint32_t>(u >> 32));
    return u32(static_cast<uint32_t>(u));
  }
  Writer &string(std::string_view s) {
    check(s.size());
    u32(static_cast<uint32_t>(s.size()));
    return rest(s);
  }
  Writer &rest(std::string_view s) {
    check(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  // trailing: bytes of a value the caller sends after this frame head.
  std::vector<uint8_t> finish(size_t trailing = 0) {
    check(trailing);
    const size_t length = bytes_.size() - 4 + trailing;
    for (int i = 0; i < 4; ++i) bytes_[i] = static_cast<uint8_t>(length >> (24 - 8 * i));
    return std::move(bytes_);
  }

 private:
  void check(size_t more) const {
    MNCL_CHECK(more <= kMaxFrameBytes && bytes_.size() - 4 + more <= kMaxFrameBytes,
               MNCL_ERR_INVALID_ARGUMENT,
               "a store message of more than %zu bytes exceeds the store's limit of %zu bytes "
               "(1 GiB) per key or value",
               bytes_.size() - 4 + more, kMaxFrameBytes);
  }

  std::vector<uint8_t> bytes_;
};

// Checks a WAIT's or MISSING's key count; returns the size of their list on the wire, to
// reserve (0 if over the frame limit: the Writer then throws before allocating that much).
template <typename Keys>
size_t key_list_size(const Keys &keys) {
  MNCL_CHECK(keys.size() <= kMaxWaitKeys, MNCL_ERR_INVALID_ARGUMENT,
             "a store wait for %zu keys exceeds the TCP store's limit of %zu keys per wait",
             keys.size(), kMaxWaitKeys);
  size_t size = 4;
  for (const auto &key : keys) size += 4 + key.size();
  return size <= kMaxFrameBytes ? size : 0;
}

}  // namespace

bool is_request(Op op) {
  return static_cast<uint8_t>(op) >= 1 && static_cast<uint8_t>(op) <= 9;
}

const char *op_name(Op op) {
  switch (op) {
    case Op::kHello:
      return "HELLO";
    case Op::kSet:
      return "SET";
    case Op::kGet:
      return "GET";
    case Op::kAdd:
      return "ADD";
    case Op::kWait:
      return "WAIT";
    case Op::kErase:
      return "ERASE";
    case Op::kSetOnClose:
      return "SET_ON_CLOSE";
    case Op::kCancelOnClose:
      return "CANCEL_ON_CLOSE";
    case Op::kErasePrefix:
      return "ERASE_PREFIX";
    case Op::kOk:
      return "OK";
    case Op::kValue:
      return "VALUE";
    case Op::kNotYet:
      return "NOT_YET";
    case Op::kInteger:
      return "INTEGER";
    case Op::kMissing:
      return "MISSING";
    case Op::kBool:
      return "BOOL";
    case Op::kRefused:
      return "REFUSED";
    case Op::kFailed:
      return "FAILED";
  }
  return "?";
}

ParseResult parse_frame(const uint8_t *data, size_t size) {
  ParseResult result;
  if (size < 4) return result;
  const uint32_t length = load_u32(data);
  if (length == 0 || length > kMaxFrameBytes) {
    result.status = ParseStatus::kInvalid;
    result.error = format("frame length %u is outside [1, %zu]", length, kMaxFrameBytes);
    return result;
  }
  result.frame_size = size_t{4} + length;
  if (size < kHeaderBytes) return result;
  // The opcode is checked as soon as it arrives, so garbage is refused without buffering more.
  if (!is_known(data[4])) {
    result.status = ParseStatus::kInvalid;
    result.error = format("unknown opcode %u", data[4]);
    return result;
  }
  const auto op = static_cast<Op>(data[4]);
  // Likewise a key count over the limit, or over what the frame's length can hold, is refused
  // as soon as it arrives rather than after up to 1 GiB of keys has been buffered.
  if (op == Op::kWait || op == Op::kMissing) {
    const size_t count_end = kHeaderBytes + (op == Op::kWait ? 8 : 4);
    if (size >= count_end && count_end <= result.frame_size) {
      const uint32_t count = load_u32(data + count_end - 4);
      if (count > kMaxWaitKeys || count > (result.frame_size - count_end) / 4) {
        result.status = ParseStatus::kInvalid;
        result.error = format("%s of %u keys in a %u-byte body (at most %zu keys, 4+ bytes each)",
                              op_name(op), count, length - 1, kMaxWaitKeys);
        return result;
      }
    }
  }
  if (size < result.frame_size) return result;

  Reader body(data + kHeaderBytes, length - 1);
  result.message.op = op;
  if (!decode_body(op, body, result.message)) {
    result.status = ParseStatus::kInvalid;
    result.error = format("malformed %s body of %u bytes", op_name(op), length - 1);
    result.message = Message{};
    return result;
  }
  result.status = ParseStatus::kComplete;
  return result;
}

std::vector<uint8_t> encode_hello(std::string_view token) {
  return Writer(Op::kHello, 4 + token.size()).u32(kProtocolVersion).rest(token).finish();
}
std::vector<uint8_t> encode_set_head(std::string_view key, size_t value_size) {
  return Writer(Op::kSet, 4 + key.size()).string(key).finish(value_size);
}
std::vector<uint8_t> encode_get(std::string_view key, uint32_t wait_ms) {
  return Writer(Op::kGet, 4 + key.size()).u32(wait_ms).rest(key).finish();
}
std::vector<uint8_t> encode_add(std::string_view key, int64_t delta) {
  return Writer(Op::kAdd, 8 + key.size()).i64(delta).rest(key).finish();
}
std::vector<uint8_t> encode_wait(const std::vector<std::string> &keys, uint32_t wait_ms) {
  const size_t list_size = key_list_size(keys);
  Writer out(Op::kWait, list_size > 0 ? 4 + list_size : 0);
  out.u32(wait_ms).u32(static_cast<uint32_t>(keys.size()));
  for (const auto &key : keys) out.string(key);
  return out.finish();
}
std::vector<uint8_t> encode_erase(std::string_view key) {
  return Writer(Op::kErase, key.size()).rest(key).finish();
}
std::vector<uint8_t> encode_set_on_close_head(std::string_view key, size_t value_size) {
  return Writer(Op::kSetOnClose, 4 + key.size()).string(key).finish(value_size);
}
std::vector<uint8_t> encode_cancel_on_close(std::string_view key) {
  return Writer(Op::kCancelOnClose, key.size()).rest(key).finish();
}
std::vector<uint8_t> encode_erase_prefix(std::string_view prefix) {
  return Writer(Op::kErasePrefix, prefix.size()).rest(prefix).finish();
}
std::vector<uint8_t> encode_ok() {
  return Writer(Op::kOk).finish();
}
std::vector<uint8_t> encode_value_head(size_t value_size) {
  return Writer(Op::kValue).finish(value_size);
}
std::vector<uint8_t> encode_not_yet() {
  return Writer(Op::kNotYet).finish();
}
std::vector<uint8_t> encode_integer(int64_t value) {
  return Writer(Op::kInteger, 8).i64(value).finish();
}
std::vector<uint8_t> encode_missing(const std::vector<std::string_view> &keys) {
  Writer out(Op::kMissing, key_list_size(keys));
  out.u32(static_cast<uint32_t>(keys.size()));
  for (const auto &key : keys) out.string(key);
  return out.finish();
}
std::vector<uint8_t> encode_bool(bool value) {
  return Writer(Op::kBool, 1).u8(value).finish();
}
std::vector<uint8_t> encode_refused(std::string_view reason) {
  return Writer(Op::kRefused).rest(reason).finish();
}
std::vector<uint8_t> encode_failed(std::string_view message) {
  return Writer(Op::kFailed).rest(message).finish();
}

}  // namespace mncl::bootstrap::wire
