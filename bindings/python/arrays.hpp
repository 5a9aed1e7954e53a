// Conversions between Python arrays (NumPy, PyTorch, anything speaking DLPack or the buffer
// protocol) and attn's tensor views and valid lengths, shared by the binding files.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "attn/core/half.hpp"
#include "attn/core/strided_view.hpp"
#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/functional/attention_options.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"
#include "attn/nn/state_dict.hpp"

namespace attn::python {

namespace nb = nanobind;

// Which kind of array a result is returned as: the kind the caller passed in.
enum class Framework { kNumpy, kTorch };

// The framework of `object`: kTorch for a torch.Tensor (or a subclass such as nn.Parameter),
// kNumpy for anything else.
Framework framework_of(nb::handle object);

// `item` as a Python int where it is one or stands for one by __index__ (NumPy's integer scalars,
// as list(np.array(...)) gives them; 0-d integer tensors); an invalid object for anything else,
// a bool and a float included.
nb::object as_python_int(nb::handle item);

// ValueError naming `name` where `object` is a torch tensor that requires grad while grad mode is
// on: `function` (attn's, outside autograd) would return a result with requires_grad=False, the
// graph cut without a word, as tensor.numpy() refuses such tensors. `instead` names what records
// autograd; empty where nothing does (a cache that stores the tensor: no gradient flows through
// it). Non-torch objects and None pass.
void refuse_recording_tensor(nb::handle object, std::string_view name, std::string_view function,
                             std::string_view instead);

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

// A float32 view, with strides, of a Python array of rank `min_rank` to `max_rank`, for the
// functional API, whose kernels take any non-negative strides with a contiguous last axis: such an
// array (a transposed or sliced PyTorch view, say) is read in place; a float64 one, or one with a
// negative stride or a strided last axis, is copied once to a C-contiguous float32 array — or
// refused under strict inputs.
//
// With HalfInputs::kAccept, a float16 or bfloat16 array keeps its type instead (half_view()), read
// in place under the same conditions (2-byte alignment), else copied C-contiguous.
enum class HalfInputs { kRefuse, kAccept };
class StridedInput {
 public:
  StridedInput(nb::handle object, std::string_view name, int min_rank, int max_rank,
               HalfInputs half = HalfInputs::kRefuse);
  StridedInput(const StridedInput&) = delete;
  StridedInput& operator=(const StridedInput&) = delete;

  // The float32 view; empty for a half-precision input.
  const ConstStridedView& view() const { return view_; }
  const Shape& shape() const { return shape_; }
  Framework framework() const { return framework_; }
  bool copied() const { return copied_; }
  // A half-precision input's type and bits (HalfInputs::kAccept); std::nullopt for a float one.
  std::optional<HalfType> half_type() const { return half_type_; }
  const StridedView<const uint16_t>& half_view() const { return half_view_; }
  // The array's dtype as errors name it: "float32", "float16", "bfloat16", ... (made on request:
  // only errors read it).
  std::string dtype() const;

 private:
  nb::ndarray<nb::ro> array_;
  Tensor copy_;
  ConstStridedView view_;
  std::vector<uint16_t> half_copy_;
  StridedView<const uint16_t> half_view_;
  std::optional<HalfType> half_type_;
  Shape shape_;

  // Imports a float16 or bfloat16 array into half_view_; false for float32 and float64 (read as
  // floats), TypeError for other dtypes.
  bool import_half(std::string_view name, bool in_place);
  Framework framework_ = Framework::kNumpy;
  bool copied_ = false;
};

// scaled_dot_product_attention's attn_mask: None; a bool mask (true: the key takes part) or a
// float one (added to the scores; float32, float16 and bfloat16 read as they are, float64 copied
// to float32), read with its strides as given (a broadcast or expanded mask is not copied); or, for
// the book's calls, integer lengths (an integer array or tensor, or a Python list), which are valid
// lengths, not a mask.
class MaskInput {
 public:
  // What errors about such lengths call them: the argument the caller gave, and how it was read.
  static constexpr std::string_view kLengthsName = "attn_mask (integers, read as valid_lens)";
  MaskInput(nb::handle object, std::string_view name);
  MaskInput(const MaskInput&) = delete;
  MaskInput& operator=(const MaskInput&) = delete;

  const AttentionMask& mask() const { return mask_; }
  // Whether the argument held integer lengths; valid_lengths() holds them then.
  bool holds_valid_lengths() const { return holds_valid_lengths_; }
  const ValidLengths& valid_lengths() const { return valid_lengths_; }

 private:
  nb::ndarray<nb::ro> array_;
  std::vector<float> float_copy_;
  std::vector<uint16_t> half_copy_;
  std::vector<uint8_t> bool_copy_;
  AttentionMask mask_;
  ValidLengths valid_lengths_;
  bool holds_valid_lengths_ = false;
};

// A vector of floats from None (empty), a 1-d float array or tensor, or a list or tuple of
// numbers (alibi_slopes, sinks). TypeError/ValueError naming `name` otherwise.
std::vector<float> to_float_vector(nb::handle object, std::string_view name);

// Valid lengths from None (no mask), a Python list of ints (B) or of equal-length lists (B, n), or
// an integer array of shape (B) or (B, n). TypeError/ValueError naming `name` otherwise.
ValidLengths to_valid_lengths(nb::handle object, std::string_view name);

// Moves `tensor` into a new NumPy array, or a PyTorch tensor for kTorch, without copying.
nb::object to_python(Tensor tensor, Framework framework);
// Moves a half-precision tensor into a new array of its type without copying: a NumPy float16
// array, or a PyTorch tensor for kTorch — and for bfloat16 always, NumPy having none.
nb::object to_python(HalfTensor tensor, Framework framework);
// A copy of `tensor` as a NumPy array / PyTorch tensor, or None when `tensor` holds no result yet
// (its rank differs from `rank`).
nb::object copy_to_python(const Tensor& tensor, Framework framework, int rank);

// The arrays of a mapping of names to arrays (NumPy, PyTorch, ...) as views: float32
// C-contiguous arrays in place, others copied once (InputTensor); `argument` names the mapping in
// errors. Holds the arrays while it lives.
class StateInputs {
 public:
  StateInputs(nb::handle mapping, std::string_view argument);
  const StateViews& views() const { return views_; }

 private:
  std::vector<std::unique_ptr<InputTensor>> inputs_;  // each stays where it was made
  StateViews views_;
};

// A StateDict from a mapping of names to arrays (copies); `argument` names it in errors.
StateDict to_state_dict(nb::handle mapping, std::string_view argument);
// A dict of name → NumPy array (or PyTorch tensor): copies of the tensors, or the tensors
// themselves when the state dict is handed over (a layer's grads() or state_dict(), made for it).
nb::dict to_python(const StateDict& state, Framework framework);
nb::dict to_python(StateDict&& state, Framework framework);

// A scalar argument of `function` taken as an object and converted as nanobind's typed parameter
// would convert it (the same values accepted), so that a wrong type is a TypeError naming the
// argument in PyTorch's words ("f(): argument 'x' must be int, not str") rather than nanobind's
// list of the whole signature.
[[noreturn]] void throw_argument_type(std::string_view function, std::string_view name,
                                      std::string_view expected, nb::handle value);
// ValueError "<name>: expected a number float32 holds (within ±3.4e38; attn computes in
// float32), got <value>".
[[noreturn]] void throw_beyond_float(std::string_view name, double value);
template <typename Value>
Value scalar_argument(nb::handle value, std::string_view function, std::string_view name,
                      std::string_view expected) {
  Value converted{};
  if (!nb::try_cast(value, converted, /*convert=*/true))
    throw_argument_type(function, name, expected, value);
  if constexpr (std::is_same_v<Value, float>) {
    // A finite Python float beyond float32 (scale=1e300) became ±∞, refused downstream as
    // "expected a finite number, got inf": named as the number typed.
    double typed = 0.0;
    if (std::isinf(converted) && nb::try_cast(value, typed, /*convert=*/true) &&
        std::isfinite(typed)) {
      throw_beyond_float(name, typed);
    }
  }
  return converted;
}
template <typename Value>
std::optional<Value> optional_scalar_argument(nb::handle value, std::string_view function,
                                              std::string_view name, std::string_view expected) {
  if (value.is_none()) return std::nullopt;
  return scalar_argument<Value>(value, function, name, expected);
}

// Strict inputs: refuse, instead of copying, any array that is not float32, C-contiguous.
bool strict_inputs();
void set_strict_inputs(bool strict);

}  // namespace attn::python
