// The exceptions attn throws. Every message names the argument, what was expected and what was
// given.
#pragma once

#include <stdexcept>
#include <string>

namespace attn {

// Base of every error attn reports; catch this to handle all of them.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

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

}  // namespace attn
