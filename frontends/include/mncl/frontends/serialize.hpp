// The serialization concept behind bcast_obj, gather_obj, scatter_dataset and the checkpointer.
//
// A type is serializable when it is one of:
//   - a user type with members    void save(mncl::OutArchive &) const;
//                                 void load(mncl::InArchive &);
//     (checked first, so a trivially copyable type may still choose its own format);
//   - std::vector, std::array, std::map, std::pair of serializable types, or std::string;
//   - any other trivially copyable, non-pointer type (copied as its bytes).
//
//   struct Model {
//     std::vector<float> w; int epoch;
//     void save(mncl::OutArchive &ar) const { ar << w << epoch; }
//     void load(mncl::InArchive &ar) { ar >> w >> epoch; }
//   };
//
// Bytes are in the host's order: every rank of a job is assumed to share one byte order.
// Decoding never reads past its input: truncated or absurd data throws SerializationError.
#ifndef MNCL_FRONTENDS_SERIALIZE_HPP
#define MNCL_FRONTENDS_SERIALIZE_HPP

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mncl/frontends/error.hpp"
#include "mncl/frontends/span.hpp"

namespace mncl {

class OutArchive;
class InArchive;

namespace detail {
template <class T, class = void>
struct HasSaveLoad : std::false_type {};
template <class T>
struct HasSaveLoad<
    T, std::void_t<decltype(std::declval<const T &>().save(std::declval<OutArchive &>())),
                   decltype(std::declval<T &>().load(std::declval<InArchive &>()))>>
    : std::true_type {};

template <class T>
struct IsVector : std::false_type {};
template <class T, class A>
struct IsVector<std::vector<T, A>> : std::true_type {};
template <class T>
struct IsStdArray : std::false_type {};
template <class T, std::size_t N>
struct IsStdArray<std::array<T, N>> : std::true_type {};
template <class T>
struct IsPair : std::false_type {};
template <class A, class B>
struct IsPair<std::pair<A, B>> : std::true_type {};
template <class T>
struct IsMap : std::false_type {};
template <class K, class V, class C, class A>
struct IsMap<std::map<K, V, C, A>> : std::true_type {};
}  // namespace detail

// Whether T satisfies the concept above (used in static_asserts with a readable message).
template <class T>
constexpr bool is_serializable() {
  if constexpr (detail::HasSaveLoad<T>::value) {
    return true;
  } else if constexpr (std::is_same_v<T, std::string>) {
    return true;
  } else if constexpr (detail::IsVector<T>::value || detail::IsStdArray<T>::value) {
    return is_serializable<typename T::value_type>();
  } else if constexpr (detail::IsPair<T>::value) {
    return is_serializable<typename T::first_type>() && is_serializable<typename T::second_type>();
  } else if constexpr (detail::IsMap<T>::value) {
    return is_serializable<typename T::key_type>() && is_serializable<typename T::mapped_type>();
  } else {
    return std::is_trivially_copyable_v<T> && !std::is_pointer_v<T>;
  }
}

// Appends values to a growing byte buffer.
class OutArchive {
 public:
  void write(const void *data, std::size_t size) {
    if (size == 0) return;
    const auto *bytes = static_cast<const uint8_t *>(data);
    bytes_.insert(bytes_.end(), bytes, bytes + size);
  }
  template <class T>
  OutArchive &operator<<(const T &value);

  const std::vector<uint8_t> &bytes() const noexcept { return bytes_; }
  std::vector<uint8_t> take() noexcept { return std::move(bytes_); }

 private:
  std::vector<uint8_t> bytes_;
};

// Reads values back from a byte range it does not own.
class InArchive {
 public:
  InArchive(const uint8_t *data, std::size_t size) noexcept : data_(data), size_(size) {}
  explicit InArchive(Span<const uint8_t> bytes) noexcept : InArchive(bytes.data(), bytes.size()) {}

  void read(void *out, std::size_t size) {
    if (size > remaining()) {
      throw SerializationError("deserialize: needs " + std::to_string(size) +
                               " more bytes but only " + std::to_string(remaining()) +
                               " are left (truncated or mismatched data)");
    }
    if (size) std::memcpy(out, data_ + offset_, size);
    offset_ += size;
  }
  // A length prefix, checked against what is left so garbage cannot trigger a huge allocation.
  std::size_t read_length(std::size_t min_bytes_per_element) {
    uint64_t length = 0;
    read(&length, sizeof length);
    if (min_bytes_per_element && length > remaining() / min_bytes_per_element) {
      throw SerializationError("deserialize: a length of " + std::to_string(length) +
                               " elements does not fit in the " + std::to_string(remaining()) +
                               " bytes left");
    }
    return static_cast<std::size_t>(length);
  }
  template <class T>
  InArchive &operator>>(T &value);

  std::size_t remaining() const noexcept { return size_ - offset_; }

 private:
  const uint8_t *data_;
  std::size_t size_;
  std::size_t offset_ = 0;
};

namespace detail {

template <class T>
void save(OutArchive &ar, const T &value) {
  static_assert(is_serializable<T>(),
                "not serializable: give the type save(OutArchive&) const and load(InArchive&) "
                "members, or make it trivially copyable");
  if constexpr (HasSaveLoad<T>::value) {
    value.save(ar);
  } else if constexpr (std::is_same_v<T, std::string>) {
    const uint64_t length = value.size();
    ar.write(&length, sizeof length);
    ar.write(value.data(), value.size());
  } else if constexpr (IsVector<T>::value) {
    using Element = typename T::value_type;
    const uint64_t length = value.size();
    ar.write(&length, sizeof length);
    if constexpr (std::is_same_v<Element, bool>) {  // vector<bool> has no contiguous storage
      for (bool b : value) ar << static_cast<uint8_t>(b);
    } else if constexpr (std::is_trivially_copyable_v<Element> && !HasSaveLoad<Element>::value) {
      ar.write(value.data(), value.size() * sizeof(Element));
    } else {
      for (const auto &element : value) save(ar, element);
    }
  } else if constexpr (IsStdArray<T>::value) {
    for (const auto &element : value) save(ar, element);
  } else if constexpr (IsPair<T>::value) {
    save(ar, value.first);
    save(ar, value.second);
  } else if constexpr (IsMap<T>::value) {
    const uint64_t length = value.size();
    ar.write(&length, sizeof length);
    for (const auto &[key, mapped] : value) {
      save(ar, key);
      save(ar, mapped);
    }
  } else {
    ar.write(&value, sizeof value);
  }
}

template <class T>
void load(InArchive &ar, T &value) {
  static_assert(is_serializable<T>(),
                "not serializable: give the type save(OutArchive&) const and load(InArchive&) "
                "members, or make it trivially copyable");
  if constexpr (HasSaveLoad<T>::value) {
    value.load(ar);
  } else if constexpr (std::is_same_v<T, std::string>) {
    value.resize(ar.read_length(1));
    ar.read(value.data(), value.size());
  } else if constexpr (IsVector<T>::value) {
    using Element = typename T::value_type;
    if constexpr (std::is_same_v<Element, bool>) {
      value.assign(ar.read_length(1), false);
      for (std::size_t i = 0; i < value.size(); ++i) {
        uint8_t b = 0;
        ar >> b;
        value[i] = b != 0;
      }
    } else if constexpr (std::is_trivially_copyable_v<Element> && !HasSaveLoad<Element>::value) {
      value.resize(ar.read_length(sizeof(Element)));
      ar.read(value.data(), value.size() * sizeof(Element));
    } else {
      // Elements may encode in zero bytes, so grow as they decode rather than trusting length.
      const std::size_t length = ar.read_length(0);
      value.clear();
      for (std::size_t i = 0; i < length; ++i) {
        if (i >= value.capacity()) value.reserve(std::min<std::size_t>(length, 2 * i + 16));
        value.emplace_back();
        load(ar, value.back());
      }
    }
  } else if constexpr (IsStdArray<T>::value) {
    for (auto &element : value) load(ar, element);
  } else if constexpr (IsPair<T>::value) {
    load(ar, value.first);
    load(ar, value.second);
  } else if constexpr (IsMap<T>::value) {
    const std::size_t length = ar.read_length(0);
    value.clear();
    for (std::size_t i = 0; i < length; ++i) {
      typename T::key_type key{};
      typename T::mapped_type mapped{};
      load(ar, key);
      load(ar, mapped);
      value.emplace(std::move(key), std::move(mapped));
    }
  } else {
    ar.read(&value, sizeof value);
  }
}

}  // namespace detail

template <class T>
OutArchive &OutArchive::operator<<(const T &value) {
  detail::save(*this, value);
  return *this;
}

template <class T>
InArchive &InArchive::operator>>(T &value) {
  detail::load(*this, value);
  return *this;
}

// One value to bytes and back. from_bytes insists that every byte is consumed: leftover bytes
// mean the sender and receiver disagree about the type.
template <class T>
std::vector<uint8_t> to_bytes(const T &value) {
  OutArchive ar;
  ar << value;
  return ar.take();
}

template <class T>
void from_bytes(Span<const uint8_t> bytes, T &value) {
  InArchive ar(bytes);
  ar >> value;
  if (ar.remaining() != 0) {
    throw SerializationError("deserialize: " + std::to_string(ar.remaining()) +
                             " bytes left over after the value (mismatched types?)");
  }
}

template <class T>
T from_bytes(Span<const uint8_t> bytes) {
  T value{};
  from_bytes(bytes, value);
  return value;
}

}  // namespace mncl

#endif  // MNCL_FRONTENDS_SERIALIZE_HPP
