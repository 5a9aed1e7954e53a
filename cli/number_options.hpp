// Numeric options checked as text before CLI11 converts them. CLI11 2.1 reads an empty value as
// 0, wraps "-1" into an unsigned option, clamps an integer too large for its type to the largest,
// reads "010" as octal, and its range checks print a bound of 300 digits; every numeric option
// is declared with number_check instead, whose messages say what was expected and what was given
// (CLI11 puts the option's name in front: "--scale: expected a number, got ''").
#pragma once

#include <CLI/CLI.hpp>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

namespace attn::cli {

// What a numeric option accepts besides the values of its type. Integers: kAny is every value
// of the type. Floats: kAny is every number, NaN and infinities included (the commands that take
// them say why they refuse one); the bounded kinds, kFinite among them, take finite values only.
// A float written as a finite number is refused whatever the bounds when its type cannot hold it:
// 1e39 is no float, and 1e-50 is no float but 0.
struct NumberBounds {
  enum class Kind { kAny, kFinite, kPositive, kNonNegative, kRange };
  Kind kind = Kind::kAny;
  double min = 0.0;  // kRange: [min, max]
  double max = 0.0;
};

inline NumberBounds finite() {
  return {NumberBounds::Kind::kFinite};
}
inline NumberBounds positive() {
  return {NumberBounds::Kind::kPositive};
}
inline NumberBounds non_negative() {
  return {NumberBounds::Kind::kNonNegative};
}
inline NumberBounds from_to(double min, double max) {
  return {NumberBounds::Kind::kRange, min, max};
}

namespace number_detail {

// The number a value of T, or of a vector of T (a comma-separated option), is.
template <class T>
struct Element {
  using type = T;
};
template <class T>
struct Element<std::vector<T>> {
  using type = T;
};

// A bound as it is typed: 4096, 16777216, 0.5, 1e+300 (whole numbers below 2^53 in full: the
// default six digits printed 1 << 24 as 1.67772e+07).
inline std::string bound_text(double value) {
  if (value == std::trunc(value) && std::fabs(value) < 0x1p53) {
    return std::to_string(static_cast<int64_t>(value));
  }
  std::ostringstream text;
  text << value;
  return text.str();
}

template <class T>
std::string integer_limit(T value) {
  return std::to_string(value);
}

inline bool within(double value, const NumberBounds& bounds) {
  switch (bounds.kind) {
    case NumberBounds::Kind::kAny:
    case NumberBounds::Kind::kFinite:
      return true;
    case NumberBounds::Kind::kPositive:
      return value > 0.0;
    case NumberBounds::Kind::kNonNegative:
      return value >= 0.0;
    case NumberBounds::Kind::kRange:
      return value >= bounds.min && value <= bounds.max;
  }
  return false;
}

// "a positive integer", "a number from 0 to 1", ...
inline std::string expected(const NumberBounds& bounds, bool integer) {
  const std::string noun = integer ? "integer" : "finite number";
  switch (bounds.kind) {
    case NumberBounds::Kind::kAny:
      return integer ? "an integer" : "a number";
    case NumberBounds::Kind::kFinite:
      return "a " + noun;
    case NumberBounds::Kind::kPositive:
      return "a positive " + noun;
    case NumberBounds::Kind::kNonNegative:
      return "a non-negative " + noun;
    case NumberBounds::Kind::kRange:
      return std::string(integer ? "an integer" : "a number") + " from " + bound_text(bounds.min) +
             " to " + bound_text(bounds.max);
  }
  return "";
}

// Whether `text` is written as an integer: an optional sign, then decimal digits only.
inline bool integer_syntax(const std::string& text) {
  const size_t first = (!text.empty() && (text[0] == '-' || text[0] == '+')) ? 1 : 0;
  if (first == text.size()) return false;
  for (size_t at = first; at < text.size(); ++at) {
    if (text[at] < '0' || text[at] > '9') return false;
  }
  return true;
}

// An integer of type T: checked, then rewritten in plain decimal, which CLI11 (strtoll with base
// 0) reads as the same number ("010" would otherwise be octal 8).
template <class T>
std::string check_integer(std::string& text, const NumberBounds& bounds) {
  if (!integer_syntax(text)) return "expected " + expected(bounds, true) + ", got '" + text + "'";
  // from_chars takes no '+'.
  const char* begin = text.data() + (text[0] == '+' ? 1 : 0);
  const char* end = text.data() + text.size();
  T value{};
  const auto [stop, error] = std::from_chars(begin, end, value);
  if (error != std::errc() || stop != end) {
    // Well written but outside the type ("-1" for a seed, 20 digits): the type's range, within
    // the bounds.
    std::string range;
    switch (bounds.kind) {
      case NumberBounds::Kind::kRange:
        range = expected(bounds, true);
        break;
      case NumberBounds::Kind::kPositive:
        range = "an integer from 1 to " + integer_limit(std::numeric_limits<T>::max());
        break;
      case NumberBounds::Kind::kNonNegative:
        range = "an integer from 0 to " + integer_limit(std::numeric_limits<T>::max());
        break;
      case NumberBounds::Kind::kAny:
      case NumberBounds::Kind::kFinite:
        range = "an integer from " + integer_limit(std::numeric_limits<T>::min()) + " to " +
                integer_limit(std::numeric_limits<T>::max());
        break;
    }
    return "expected " + range + ", got " + text;
  }
  if (!within(static_cast<double>(value), bounds)) {
    return "expected " + expected(bounds, true) + ", got " + text;
  }
  text = std::to_string(value);
  return "";
}

// A float: the whole text a number (CLI11 reads it with strtold too, to the same value) that T
// holds, finite in T when bounded. Messages quote the text as typed, never the value it became.
template <class T>
std::string check_real(const std::string& text, const NumberBounds& bounds) {
  char* stop = nullptr;
  errno = 0;
  // strtold skips leading spaces, which CLI11 does not: refused as any other stray character.
  const long double parsed = text.empty() || std::isspace(static_cast<unsigned char>(text[0]))
                                 ? 0.0L
                                 : std::strtold(text.c_str(), &stop);
  const bool beyond_long_double = errno == ERANGE;
  if (stop == nullptr || stop != text.c_str() + text.size()) {
    return "expected " + expected(bounds, false) + ", got '" + text + "'";
  }
  const auto value = static_cast<T>(parsed);
  // "inf" and "nan" are typed as such; a finite number that T turns into an infinity or, from
  // nonzero, into 0 is one T cannot hold.
  const bool overflows = beyond_long_double ? std::fabs(parsed) > 1.0L
                                            : std::isfinite(parsed) && !std::isfinite(value);
  const bool underflows =
      (beyond_long_double && std::fabs(parsed) <= 1.0L) || (parsed != 0.0L && value == T{0});
  if (overflows || underflows) {
    const std::string type = std::is_same_v<T, float> ? "float" : "double";
    return "expected " + expected(bounds, false) + ", got " + text + ", which is out of " + type +
           " range (it " + (overflows ? "overflows to infinity" : "underflows to 0") + ")";
  }
  if (bounds.kind == NumberBounds::Kind::kAny) return "";
  if (!std::isfinite(value) || !within(static_cast<double>(value), bounds)) {
    return "expected " + expected(bounds, false) + ", got " + text;
  }
  return "";
}

// For --help, after the type: "INT:POSITIVE".
inline std::string description(const NumberBounds& bounds) {
  switch (bounds.kind) {
    case NumberBounds::Kind::kAny:
      return "";
    case NumberBounds::Kind::kFinite:
      return "FINITE";
    case NumberBounds::Kind::kPositive:
      return "POSITIVE";
    case NumberBounds::Kind::kNonNegative:
      return "NONNEGATIVE";
    case NumberBounds::Kind::kRange:
      return "in [" + bound_text(bounds.min) + " - " + bound_text(bounds.max) + "]";
  }
  return "";
}

}  // namespace number_detail

// The transform of an option read into `variable` (a number, or a vector of numbers for a
// delimited option, each checked): the text must be a number of its type within `bounds`.
// Declared as ->transform(number_check(variable, bounds)); the variable only picks the type.
template <class T>
CLI::Validator number_check(const T& /*variable*/, NumberBounds bounds = {}) {
  using Number = typename number_detail::Element<T>::type;
  static_assert(std::is_arithmetic_v<Number> && !std::is_same_v<Number, bool>,
                "number_check is for numeric options");
  return CLI::Validator(
      [bounds](std::string& text) -> std::string {
        if constexpr (std::is_integral_v<Number>) {
          return number_detail::check_integer<Number>(text, bounds);
        } else {
          return number_detail::check_real<Number>(text, bounds);
        }
      },
      number_detail::description(bounds));
}

}  // namespace attn::cli
