// The exceptions attn throws. Every message names the argument, what was expected and what was
// given.
#pragma once

#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>

namespace attn {

// Base of every error attn reports; catch this to handle all of them.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  // With the argument at fault as the throwing function names it ("weights", "panel_size"), so
  // that a caller which exposes it under another name (a CLI option) need not parse the message.
  // `argument` must be a string literal: the error keeps the pointer (copying stays noexcept).
  Error(const std::string& message, const char* argument)
      : std::runtime_error(message), argument_(argument) {}
  // The argument named at the throw, or "" where no single argument is at fault.
  std::string_view argument() const noexcept { return argument_; }

 private:
  const char* argument_ = "";
};

// A number as a message gives it: the shortest text that reads back as the same float (-1e-09,
// 1.0000001, 3.4028235e+38, nan, inf), where std::to_string's six fixed decimals showed -1e-9 as
// -0.000000 and a dropout just past 1 as 1.000000.
std::string number_text(float value);
std::string number_text(double value);

// A tensor of the wrong rank or shape, or shapes that do not agree with each other.
class ShapeError : public Error {
 public:
  using Error::Error;
};

// An argument whose value is out of range (a valid length beyond m, a dropout outside [0, 1], ...).
class ValueError : public Error {
 public:
  using Error::Error;
};

// A file that cannot be opened, is truncated, corrupt, or holds something other than expected.
class FileError : public Error {
 public:
  using Error::Error;
};

// Memory the system refused: a std::bad_alloc (what callers catch, and Python's MemoryError)
// whose message gives the request's size, "could not allocate 35184372088832 bytes (32 TiB)",
// where std::bad_alloc's own says only "std::bad_alloc".
class AllocationError : public std::bad_alloc {
 public:
  explicit AllocationError(std::size_t bytes);
  // "<context>: could not allocate … bytes (…)<detail>": what the memory was for, around the size.
  AllocationError(std::size_t bytes, std::string_view context, std::string_view detail);
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

}  // namespace attn
