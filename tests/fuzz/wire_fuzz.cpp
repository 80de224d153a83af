// libFuzzer target for the TCP store's wire parser (bootstrap/wire.h), the only code that reads
// bytes from the network before a connection is authenticated. Besides "no crash, no UB, no
// read past the buffer" (AddressSanitizer, UBSan), it checks the parser's contract:
//   - kComplete: the frame fits in the input, and re-encoding the decoded message gives back
//     exactly the frame's bytes (nothing accepted that the encoders would not produce);
//   - kNeedMore: the announced frame size, when known, is larger than the input;
//   - kInvalid: comes with a reason.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bootstrap/wire.h"

namespace wire = mncl::bootstrap::wire;

namespace {

std::vector<uint8_t> with_value(std::vector<uint8_t> head, std::string_view value) {
  head.insert(head.end(), value.begin(), value.end());
  return head;
}

std::vector<uint8_t> reencode(const wire::Message &m) {
  switch (m.op) {
    case wire::Op::kHello: {
      // encode_hello always writes this library's version: put the decoded one back.
      auto frame = wire::encode_hello(m.text);
      for (int i = 0; i < 4; ++i)
        frame[wire::kHeaderBytes + i] = uint8_t(m.version >> (24 - 8 * i));
      return frame;
    }
    case wire::Op::kSet:
      return with_value(wire::encode_set_head(m.text, m.value.size()), m.value);
    case wire::Op::kGet:
      return wire::encode_get(m.text, m.wait_ms);
    case wire::Op::kAdd:
      return wire::encode_add(m.text, m.integer);
    case wire::Op::kWait: {
      std::vector<std::string> keys(m.keys.begin(), m.keys.end());
      return wire::encode_wait(keys, m.wait_ms);
    }
    case wire::Op::kErase:
      return wire::encode_erase(m.text);
    case wire::Op::kSetOnClose:
      return with_value(wire::encode_set_on_close_head(m.text, m.value.size()), m.value);
    case wire::Op::kCancelOnClose:
      return wire::encode_cancel_on_close(m.text);
    case wire::Op::kErasePrefix:
      return wire::encode_erase_prefix(m.text);
    case wire::Op::kOk:
      return wire::encode_ok();
    case wire::Op::kValue:
      return with_value(wire::encode_value_head(m.value.size()), m.value);
    case wire::Op::kNotYet:
      return wire::encode_not_yet();
    case wire::Op::kInteger:
      return wire::encode_integer(m.integer);
    case wire::Op::kMissing:
      return wire::encode_missing(m.keys);
    case wire::Op::kBool:
      return wire::encode_bool(m.flag);
    case wire::Op::kRefused:
      return wire::encode_refused(m.text);
    case wire::Op::kFailed:
      return wire::encode_failed(m.text);
  }
  std::abort();  // a complete frame with an unknown opcode
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const wire::ParseResult r = wire::parse_frame(data, size);
  switch (r.status) {
    case wire::ParseStatus::kComplete: {
      if (r.frame_size > size || r.frame_size < wire::kHeaderBytes) std::abort();
      const auto again = reencode(r.message);
      if (again.size() != r.frame_size || std::memcmp(again.data(), data, again.size()) != 0) {
        std::abort();
      }
      break;
    }
    case wire::ParseStatus::kNeedMore:
      if (r.frame_size != 0 && r.frame_size <= size) std::abort();
      break;
    case wire::ParseStatus::kInvalid:
      if (r.error.empty()) std::abort();
      break;
  }
  return 0;
}
