// Conversions between Python arrays (NumPy, PyTorch, anything speaking DLPack or the buffer
// protocol) and attn's tensor views and valid lengths, shared by the binding files.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>
#include <string_view>

#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/nn/state_dict.hpp"

namespace attn::python {

namespace nb = nanobind;

// Which kind of array a result is returned as: the kind the caller passed in.
enum class Framework { kNumpy, kTorch };

// The framework of `object`: kTorch for a torch.Tensor (or a subclass such as nn.Parameter),
// kNumpy for anything else.
Framework framework_of(nb::handle object);

// A float32 C-contiguous view of a Python array. A float32 C-contiguous CPU array is viewed in
// place (no copy); a float64 or non-contiguous one is copied into `copy`, unless strict inputs are
// on. Keeps the source array alive, so the view stays valid while this object lives.
class InputTensor {
 public:
  // `rank` -1 accepts any rank up to Shape::kMaxRank.
  InputTensor(nb::handle object, std::string_view name, int rank);
  // The view may point into copy_, so an InputTensor stays where it was made.
  InputTensor(const InputTensor&) = delete;
  InputTensor& operator=(const InputTensor&) = delete;

  ConstTensorView view() const { return view_; }
  const Shape& shape() const { return view_.shape(); }
  Framework framework() const { return framework_; }
  bool copied() const { return copied_; }

 private:
  nb::ndarray<nb::ro> array_;
  Tensor copy_;
  ConstTensorView view_;
  Framework framework_ = Framework::kNumpy;
  bool copied_ = false;
};

// Valid lengths from None (no mask), a Python list of ints (B) or of equal-length lists (B, n), or
// an integer array of shape (B) or (B, n). TypeError/ValueError naming `name` otherwise.
ValidLengths to_valid_lengths(nb::handle object, std::string_view name);

// Moves `tensor` into a new NumPy array, or a PyTorch tensor for kTorch, without copying.
nb::object to_python(Tensor tensor, Framework framework);
// A copy of `tensor` as a NumPy array / PyTorch tensor, or None when `tensor` holds no result yet
// (its rank differs from `rank`).
nb::object copy_to_python(const Tensor& tensor, Framework framework, int rank);

// A StateDict from a mapping of names to arrays (NumPy, PyTorch, ...); `argument` names it in
// errors.
StateDict to_state_dict(nb::handle mapping, std::string_view argument);
// A dict of name → NumPy array (or PyTorch tensor).
nb::dict to_python(const StateDict& state, Framework framework);

// Strict inputs: refuse, instead of copying, any array that is not float32, C-contiguous.
bool strict_inputs();
void set_strict_inputs(bool strict);

}  // namespace attn::python
