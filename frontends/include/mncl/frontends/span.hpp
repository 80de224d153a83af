// A minimal std::span for C++17: a non-owning view of contiguous elements. Everything that takes
// buffers in the frontends takes a Span, so parameters and gradients can live in any tensor
// library (std::vector, Eigen, a framework's storage) without copies.
#ifndef MNCL_FRONTENDS_SPAN_HPP
#define MNCL_FRONTENDS_SPAN_HPP

#include <cstddef>
#include <type_traits>
#include <utility>
#if __cplusplus >= 202002L && __has_include(<ranges>)
#include <ranges>
#endif

namespace mncl {

template <class T>
class Span {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  using iterator = T *;

  constexpr Span() noexcept = default;
  constexpr Span(T *data, std::size_t size) noexcept : data_(data), size_(size) {}
  template <std::size_t N>
  constexpr Span(T (&array)[N]) noexcept : data_(array), size_(N) {}
  // Any contiguous container with data() and size() (std::vector, std::array, std::string...).
  // A Span of const elements may view a temporary (for the call it is passed to); a mutable one
  // only lvalues, whose changes would otherwise vanish.
  template <
      class Container,
      class = std::enable_if_t<
          !std::is_same_v<std::remove_cv_t<std::remove_reference_t<Container>>, Span> &&
          (std::is_const_v<T> || std::is_lvalue_reference_v<Container>)&&std::is_convertible_v<
              std::remove_pointer_t<decltype(std::declval<Container &>().data())> (*)[], T (*)[]>>>
  constexpr Span(Container &&container) noexcept
      : data_(container.data()), size_(container.size()) {}
  // Span<T> -> Span<const T>.
  template <class U, class = std::enable_if_t<!std::is_same_v<U, T> &&
                                              std::is_convertible_v<U (*)[], T (*)[]>>>
  constexpr Span(const Span<U> &other) noexcept : data_(other.data()), size_(other.size()) {}

  constexpr T *data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  constexpr bool empty() const noexcept { return size_ == 0; }
  constexpr T &operator[](std::size_t i) const noexcept { return data_[i]; }
  constexpr T *begin() const noexcept { return data_; }
  constexpr T *end() const noexcept { return data_ + size_; }
  // Elements [offset, offset + count), clamped to the view.
  constexpr Span subspan(std::size_t offset,
                         std::size_t count = static_cast<std::size_t>(-1)) const noexcept {
    if (offset > size_) offset = size_;
    if (count > size_ - offset) count = size_ - offset;
    return Span(data_ + offset, count);
  }

 private:
  T *data_ = nullptr;
  std::size_t size_ = 0;
};

namespace detail {
template <class T>
struct IsSpan : std::false_type {};
template <class T>
struct IsSpan<Span<T>> : std::true_type {};

// A "buffer": a Span or a contiguous container (data() + size()).
template <class B, class = void>
struct IsBuffer : std::false_type {};
template <class B>
struct IsBuffer<
    B, std::void_t<decltype(std::declval<B &>().data()), decltype(std::declval<B &>().size())>>
    : std::bool_constant<std::is_pointer_v<decltype(std::declval<B &>().data())>> {};
template <class B>
inline constexpr bool kIsBuffer = IsBuffer<std::remove_reference_t<B>>::value;
template <class B>
using EnableIfBuffer = std::enable_if_t<kIsBuffer<B>>;

// A view: it points at elements that outlive it (a Span; in C++20 any borrowed range, such as
// std::span). A non-blocking call may keep a pointer past the statement into a view, or into an
// lvalue container, but never into a temporary container (a std::vector returned by a call),
// which is freed at the end of the statement while the operation still reads or writes it.
template <class B>
inline constexpr bool kIsView = IsSpan<std::remove_cv_t<std::remove_reference_t<B>>>::value
#if __cplusplus >= 202002L && defined(__cpp_lib_ranges)
                                || std::ranges::borrowed_range<B>
#endif
    ;
// B as a forwarding reference deduces it: an lvalue reference for an lvalue argument.
template <class B>
inline constexpr bool kIsTemporaryContainer = !std::is_lvalue_reference_v<B> && !kIsView<B>;
// Buffers a non-blocking call may keep (lvalues and views), and those it must refuse.
template <class B>
using EnableIfLastingBuffer = std::enable_if_t<kIsBuffer<B> && !kIsTemporaryContainer<B>, int>;
template <class B>
using EnableIfTemporaryBuffer = std::enable_if_t<kIsBuffer<B> && kIsTemporaryContainer<B>, int>;
}  // namespace detail

// The Span over a buffer, element type deduced (const for const containers).
template <class Buffer>
constexpr auto as_span(Buffer &&buffer) noexcept {
  using Pointer = decltype(buffer.data());
  return Span<std::remove_pointer_t<Pointer>>(buffer.data(), buffer.size());
}
template <class Buffer>
constexpr auto as_const_span(const Buffer &buffer) noexcept {
  using Pointer = decltype(buffer.data());
  return Span<const std::remove_cv_t<std::remove_pointer_t<Pointer>>>(buffer.data(), buffer.size());
}

}  // namespace mncl

#endif  // MNCL_FRONTENDS_SPAN_HPP
