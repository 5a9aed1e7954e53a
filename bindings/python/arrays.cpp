// Conversions between Python arrays and attn tensors: zero-copy views of float32 C-contiguous CPU
// arrays, checked copies of the rest, valid lengths from lists or integer arrays, and results
// handed to NumPy or PyTorch without a copy.
#include "arrays.hpp"

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace attn::python {
namespace {

std::atomic<bool> strict_inputs_setting{false};

std::string python_type_name(nb::handle object) {
  return nb::type_name(object.type()).c_str();
}

std::string dtype_name(nb::dlpack::dtype dtype) {
  using Code = nb::dlpack::dtype_code;
  std::string kind;
  switch (static_cast<Code>(dtype.code)) {
    case Code::Int:
      kind = "int";
      break;
    case Code::UInt:
      kind = "uint";
      break;
    case Code::Float:
      kind = "float";
      break;
    case Code::Bfloat:
      kind = "bfloat";
      break;
    case Code::Complex:
      kind = "complex";
      break;
    case Code::Bool:
      return "bool";
    default:
      kind = "dtype code " + std::to_string(dtype.code) + " of ";
      break;
  }
  return kind + std::to_string(dtype.bits);
}

bool is_dtype(nb::dlpack::dtype dtype, nb::dlpack::dtype_code code, int bits) {
  return dtype.code == static_cast<uint8_t>(code) && dtype.bits == bits && dtype.lanes == 1;
}

std::string device_name(int device_type) {
  // DLPack's device codes (dlpack.h, DLDeviceType).
  switch (device_type) {
    case 2:
      return "CUDA";
    case 3:
      return "CUDA host memory";
    case 4:
      return "OpenCL";
    case 7:
      return "Vulkan";
    case 8:
      return "Metal";
    case 10:
      return "ROCm";
    case 13:
      return "CUDA managed memory";
    case 14:
      return "oneAPI";
    default:
      return "device type " + std::to_string(device_type);
  }
}

std::string shape_string(const nb::ndarray<nb::ro>& array) {
  std::string text = "(";
  for (size_t axis = 0; axis < array.ndim(); ++axis) {
    if (axis > 0) text += ", ";
    text += std::to_string(array.shape(axis));
  }
  return text + (array.ndim() == 1 ? ",)" : ")");
}

std::string strides_string(const nb::ndarray<nb::ro>& array) {
  std::string text = "(";
  for (size_t axis = 0; axis < array.ndim(); ++axis) {
    if (axis > 0) text += ", ";
    text += std::to_string(array.stride(axis));
  }
  return text + (array.ndim() == 1 ? ",)" : ")");
}

// torch._C.<name>, a new reference, or nullptr (the error cleared) where torch has none. Callers
// keep it for the process's life, looked up once torch is imported.
PyObject* torch_function(const char* name) {
  PyObject* module = PyImport_ImportModule("torch._C");
  PyObject* function = module == nullptr ? nullptr : PyObject_GetAttrString(module, name);
  Py_XDECREF(module);
  if (function == nullptr) PyErr_Clear();
  return function;
}

// A torch tensor as a DLPack capsule by torch._C._to_dlpack (what torch.utils.dlpack.to_dlpack
// calls): 0.3 µs, where the tensor's __dlpack__ method, which nanobind calls, takes 2 µs of Python
// checks. None where torch has no such function or it refuses the tensor (the caller then takes
// the __dlpack__ path, with its error messages).
nb::object torch_capsule(nb::handle tensor) {
  // Looked up once, while torch is imported (a tensor exists), and kept for the process's life.
  static PyObject* const to_dlpack = torch_function("_to_dlpack");
  if (to_dlpack == nullptr) return nb::none();
  PyObject* capsule = PyObject_CallOneArg(to_dlpack, tensor.ptr());
  if (capsule == nullptr) {
    PyErr_Clear();
    return nb::none();
  }
  return nb::steal(capsule);
}

// Whether a torch tensor has the negative bit set (tensor.is_neg()). An object of torch's without
// is_neg (PyTorch before 1.10 had no such bit) reads as one without.
bool is_negative_view(nb::handle tensor) {
  static PyObject* const name = PyUnicode_InternFromString("is_neg");
  PyObject* result = PyObject_CallMethodNoArgs(tensor.ptr(), name);
  if (result == nullptr) {
    PyErr_Clear();
    return false;
  }
  Py_DECREF(result);
  return result == Py_True;
}

// Imports any DLPack / buffer-protocol object as a read-only array without converting it; torch
// tensors that require grad are detached first (same storage), as DLPack refuses to export them.
nb::ndarray<nb::ro> import_array(nb::handle object, std::string_view name,
                                 std::string_view expected) {
  nb::object source = nb::borrow(object);
  nb::ndarray<nb::ro> array;
  if (framework_of(object) == Framework::kTorch) {
    // A tensor with the negative bit (a lazily negated view: `z.conj().imag`, torch._neg_view, and
    // their .detach(), .data or nn.Parameter) holds the unnegated values, and DLPack exports them
    // without the sign: resolve_neg() negates them into a copy first. ~0.07 µs a tensor (where
    // the export takes 0.3). The conjugate bit needs no check: only complex tensors have it, and
    // attn reads no complex dtype (their export is refused below, naming the dtype).
    if (is_negative_view(source)) source = source.attr("resolve_neg")();
    // torch._C._to_dlpack exports a tensor that requires grad as it is (the data, read only
    // here), without the two attribute reads and the detach that __dlpack__ needs.
    const nb::object capsule = torch_capsule(source);
    if (!capsule.is_none() && nb::try_cast(capsule, array, /*convert=*/false) &&
        array.device_type() == nb::device::cpu::value) {
      return array;
    }
    if (nb::hasattr(source, "requires_grad") && nb::cast<bool>(source.attr("requires_grad"))) {
      source = source.attr("detach")();
    }
  }
  if (!nb::try_cast(source, array, /*convert=*/false)) {
    PyErr_Clear();  // the failed export's
    if (framework_of(object) == Framework::kTorch) {
      // A tensor without DLPack export: one on the meta device (no data), or another backend's.
      const nb::object device_object = nb::getattr(object, "device", nb::none());
      const nb::object text = nb::steal(PyObject_Str(device_object.ptr()));
      const char* utf8 = text.is_valid() ? PyUnicode_AsUTF8(text.ptr()) : nullptr;
      if (utf8 == nullptr) PyErr_Clear();
      const std::string device = utf8 != nullptr ? utf8 : "cpu";
      if (device != "cpu") {
        throw nb::value_error((std::string(name) +
                               ": expected a tensor in CPU memory (attn computes on the CPU), got "
                               "one on " +
                               device)
                                  .c_str());
      }
      // A nested or sparse tensor: no strided data to export; its layout, not its type, is what
      // attn does not read.
      const nb::object nested = nb::getattr(object, "is_nested", nb::none());
      if (nested.ptr() == Py_True) {
        throw nb::type_error((std::string(name) +
                              ": expected a strided tensor, got a nested one (pad it, e.g. "
                              ".to_padded_tensor(0), and pass valid lengths or a mask)")
                                 .c_str());
      }
      const nb::object layout = nb::getattr(object, "layout", nb::none());
      const nb::object layout_text = nb::steal(PyObject_Str(layout.ptr()));
      const char* layout_utf8 =
          layout_text.is_valid() ? PyUnicode_AsUTF8(layout_text.ptr()) : nullptr;
      if (layout_utf8 == nullptr) PyErr_Clear();
      if (layout_utf8 != nullptr && std::string_view(layout_utf8) != "torch.strided" &&
          !layout.is_none()) {
        throw nb::type_error((std::string(name) +
                              ": expected a strided tensor, got one of layout " + layout_utf8 +
                              " (convert it with .to_dense())")
                                 .c_str());
      }
    }
    // An array of a dtype DLPack has no code for (object, strings, datetimes) fails the export:
    // name the dtype rather than the type, which was the one expected.
    std::string got = python_type_name(object);
    const nb::object dtype = nb::getattr(object, "dtype", nb::none());
    if (!dtype.is_none()) {
      const nb::object text = nb::steal(PyObject_Str(dtype.ptr()));
      const char* utf8 = text.is_valid() ? PyUnicode_AsUTF8(text.ptr()) : nullptr;
      if (utf8 == nullptr) PyErr_Clear();
      if (utf8 != nullptr) got += " of dtype " + std::string(utf8);
    }
    throw nb::type_error(
        (std::string(name) + ": expected " + std::string(expected) + ", got " + got).c_str());
  }
  if (array.device_type() != nb::device::cpu::value) {
    throw nb::value_error((std::string(name) + ": expected an array in CPU memory, got one on " +
                           device_name(array.device_type()) + " (move it with .cpu())")
                              .c_str());
  }
  return array;
}

bool is_c_contiguous(const nb::ndarray<nb::ro>& array) {
  int64_t expected_stride = 1;
  for (size_t axis = array.ndim(); axis-- > 0;) {
    const auto extent = static_cast<int64_t>(array.shape(axis));
    if (extent == 0) return true;  // no elements: any strides describe them
    if (extent != 1 && array.stride(axis) != expected_stride) return false;
    expected_stride *= extent;
  }
  return true;
}

// Reads element `index` (in elements, possibly negative) of a float64 array.
double read_double(const std::byte* base, int64_t index) {
  double value = 0.0;
  std::memcpy(&value, base + index * static_cast<int64_t>(sizeof(double)), sizeof(double));
  return value;
}

// Reads element `index` (in elements, possibly negative) of a float32 or float64 array; memcpy
// because the buffer need not be aligned.
float read_float(const std::byte* base, int64_t index, bool is_double) {
  if (is_double) {
    double value = 0.0;
    std::memcpy(&value, base + index * static_cast<int64_t>(sizeof(double)), sizeof(double));
    return static_cast<float>(value);
  }
  float value = 0.0F;
  std::memcpy(&value, base + index * static_cast<int64_t>(sizeof(float)), sizeof(float));
  return value;
}

// Reads element `index` of an integer array of `bits` bits, signed or not, as int64; throws
// ValueError for an unsigned value above INT64_MAX.
int64_t read_integer(const std::byte* base, int64_t index, int bits, bool is_signed,
                     std::string_view name) {
  const std::byte* element = base + index * (bits / 8);
  auto load = [element]<class T>(T zero) {
    T value = zero;
    std::memcpy(&value, element, sizeof(T));
    return value;
  };
  switch (bits) {
    case 8:
      return is_signed ? load(int8_t{}) : load(uint8_t{});
    case 16:
      return is_signed ? load(int16_t{}) : load(uint16_t{});
    case 32:
      return is_signed ? int64_t{load(int32_t{})} : int64_t{load(uint32_t{})};
    default: {
      if (is_signed) return load(int64_t{});
      const uint64_t value = load(uint64_t{});
      if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw nb::value_error(
            (std::string(name) + ": expected lengths that fit int64, got " + std::to_string(value))
                .c_str());
      }
      return static_cast<int64_t>(value);
    }
  }
}

// Visits every element of `array` (any rank) in row-major order with its offset in elements.
template <class Visit>
void for_each_offset(const nb::ndarray<nb::ro>& array, Visit visit) {
  const size_t rank = array.ndim();
  for (size_t axis = 0; axis < rank; ++axis) {
    if (array.shape(axis) == 0) return;
  }
  std::array<int64_t, Shape::kMaxRank> index{};
  int64_t offset = 0;
  for (;;) {
    visit(offset);
    // Advances the multi-index like an odometer, last axis fastest.
    size_t axis = rank;
    for (;;) {
      if (axis == 0) return;
      --axis;
      const auto extent = static_cast<int64_t>(array.shape(axis));
      if (++index[axis] < extent) {
        offset += array.stride(axis);
        break;
      }
      offset -= array.stride(axis) * (extent - 1);
      index[axis] = 0;
    }
  }
}

// The 16-bit elements (fp16 or bf16 bits) of `array`, in C order, into `bits`: a contiguous copy
// for views the kernels cannot read in place (negative strides, misaligned data).
void copy_bits16(const nb::ndarray<nb::ro>& array, std::vector<uint16_t>& bits) {
  const auto* base = static_cast<const std::byte*>(array.data());
  bits.clear();
  bits.reserve(array.size());
  for_each_offset(array, [&](int64_t offset) {
    uint16_t element = 0;
    std::memcpy(&element, base + offset * static_cast<int64_t>(sizeof(uint16_t)), sizeof(element));
    bits.push_back(element);
  });
}

Shape shape_of(const nb::ndarray<nb::ro>& array) {
  std::array<int64_t, Shape::kMaxRank> dims{};
  for (size_t axis = 0; axis < array.ndim(); ++axis) {
    dims[axis] = static_cast<int64_t>(array.shape(axis));
  }
  return Shape::from_dims(dims.data(), static_cast<int>(array.ndim()));
}

std::array<int64_t, Shape::kMaxRank> strides_of(const nb::ndarray<nb::ro>& array) {
  std::array<int64_t, Shape::kMaxRank> strides{};
  for (size_t axis = 0; axis < array.ndim(); ++axis) strides[axis] = array.stride(axis);
  return strides;
}

bool has_negative_stride(const nb::ndarray<nb::ro>& array) {
  for (size_t axis = 0; axis < array.ndim(); ++axis) {
    if (array.shape(axis) > 1 && array.stride(axis) < 0) return true;
  }
  return false;
}

// Strides with those of axes of extent ≤ 1 set to 0: such axes never move the address, and
// DLPack producers write anything there (even negative values).
std::array<int64_t, Shape::kMaxRank> normalized_strides(const nb::ndarray<nb::ro>& array) {
  std::array<int64_t, Shape::kMaxRank> strides = strides_of(array);
  for (size_t axis = 0; axis < array.ndim(); ++axis) {
    if (array.shape(axis) <= 1) strides[axis] = 0;
  }
  return strides;
}

std::string rank_range(int min_rank, int max_rank) {
  if (min_rank == max_rank) return "a " + std::to_string(min_rank) + "-d array";
  return "an array of rank " + std::to_string(min_rank) + " to " + std::to_string(max_rank);
}

// ValueError when a finite float64 element became ±∞ in `copy` (beyond float32's ±3.4e38):
// attn computes in float32, and an infinity made of a finite input used to pass as one (a state
// dict of 1e300 saved as inf), or surfaced later as "expected finite values, got inf".
void require_float_range(const nb::ndarray<nb::ro>& array, std::string_view name,
                         const std::byte* base, const Tensor& copy) {
  int64_t index = 0;
  for_each_offset(array, [&](int64_t offset) {
    const float narrowed = copy.data()[index];
    if (std::isinf(narrowed)) {
      const double value = read_double(base, offset);
      if (std::isfinite(value)) {
        std::ostringstream text;
        text << std::string(name) << ": expected values float32 holds (within ±3.4e38; attn "
             << "computes in float32), got " << value << " at flat index " << index;
        throw nb::value_error(text.str().c_str());
      }
    }
    ++index;
  });
}

// The float32 data the kernels read for an imported array: its own when it is float32, aligned and
// `in_place` (the layout the caller reads in place), else a C-contiguous float32 copy made into
// `copy` — refused under strict inputs, the message saying the `requirement` it missed. TypeError
// for a dtype other than float32 and float64.
const float* float_data(const nb::ndarray<nb::ro>& array, std::string_view name, bool in_place,
                        std::string_view requirement, Tensor& copy, bool& copied) {
  const bool is_float32 = is_dtype(array.dtype(), nb::dlpack::dtype_code::Float, 32);
  const bool is_float64 = is_dtype(array.dtype(), nb::dlpack::dtype_code::Float, 64);
  if (!is_float32 && !is_float64) {
    throw nb::type_error((std::string(name) +
                          ": expected float32 (or float64, copied to float32), got " +
                          dtype_name(array.dtype()))
                             .c_str());
  }
  const void* data = array.data();
  const bool aligned = reinterpret_cast<uintptr_t>(data) % alignof(float) == 0;
  if (is_float32 && aligned && in_place) return static_cast<const float*>(data);
  if (strict_inputs()) {
    if (!is_float32) {
      throw nb::type_error((std::string(name) +
                            ": expected float32 (strict inputs: no copies), got " +
                            dtype_name(array.dtype()))
                               .c_str());
    }
    if (!aligned) {
      throw nb::value_error((std::string(name) +
                             ": expected float32 data aligned to 4 bytes (strict inputs: no "
                             "copies), got an unaligned array (data address ≡ " +
                             std::to_string(reinterpret_cast<uintptr_t>(data) % alignof(float)) +
                             " mod 4)")
                                .c_str());
    }
    throw nb::value_error((std::string(name) + ": expected " + std::string(requirement) +
                           " (strict inputs: no copies), got strides " + strides_string(array) +
                           " (in elements) for shape " + shape_string(array))
                              .c_str());
  }
  copy = Tensor(shape_of(array));
  copied = true;
  const auto* base = static_cast<const std::byte*>(data);
  float* out = copy.data();
  for_each_offset(array, [&](int64_t offset) { *out++ = read_float(base, offset, is_float64); });
  if (is_float64) require_float_range(array, name, base, copy);
  return copy.data();
}

}  // namespace

bool strict_inputs() {
  return strict_inputs_setting.load();
}
void set_strict_inputs(bool strict) {
  strict_inputs_setting.store(strict);
}

Framework framework_of(nb::handle object) {
  // The answer per type, remembered for the few types a program passes: reading a type's
  // __module__ interns a string and looks it up, 0.1 µs an input, 0.5 µs of a decode-sized call
  // that asks twice for each of its three tensors. The types are held (never freed), so an address
  // stays its type's. The GIL serialises the callers (the module is not free-threaded).
  struct Seen {
    PyTypeObject* type;
    Framework framework;
  };
  static std::array<Seen, 8> seen{};
  static size_t seen_count = 0;
  PyTypeObject* const type = Py_TYPE(object.ptr());
  for (size_t i = 0; i < seen_count; ++i) {
    if (seen[i].type == type) return seen[i].framework;
  }
  // torch.Tensor's module is "torch", nn.Parameter's "torch.nn.parameter"; a user's subclass of
  // torch.Tensor (class Sub(torch.Tensor)) has its own module, and torch's classes among its bases.
  Framework framework = Framework::kNumpy;
  PyObject* const bases = type->tp_mro;
  const Py_ssize_t count = bases != nullptr && PyTuple_Check(bases) ? PyTuple_GET_SIZE(bases) : 0;
  for (Py_ssize_t i = 0; i < count && framework == Framework::kNumpy; ++i) {
    const nb::object module = nb::getattr(PyTuple_GET_ITEM(bases, i), "__module__", nb::none());
    if (nb::isinstance<nb::str>(module)) {
      const std::string_view name = nb::borrow<nb::str>(module).c_str();
      if (name == "torch" || name.starts_with("torch.")) framework = Framework::kTorch;
    }
  }
  if (seen_count < seen.size()) {
    Py_INCREF(reinterpret_cast<PyObject*>(type));
    seen[seen_count++] = {type, framework};
  }
  return framework;
}

void refuse_recording_tensor(nb::handle object, std::string_view name, std::string_view function,
                             std::string_view instead) {
  if (object.is_none() || framework_of(object) != Framework::kTorch) return;
  // A read of the attribute (~0.03 µs); grad mode is asked only of a tensor that requires grad.
  static PyObject* const requires_grad_name = PyUnicode_InternFromString("requires_grad");
  PyObject* requires_grad = PyObject_GetAttr(object.ptr(), requires_grad_name);
  if (requires_grad == nullptr) {
    PyErr_Clear();  // not a tensor (torch.Size, a dtype): its conversion names it
    return;
  }
  Py_DECREF(requires_grad);
  if (requires_grad != Py_True) return;
  static PyObject* const is_grad_enabled = torch_function("is_grad_enabled");
  if (is_grad_enabled == nullptr) return;
  PyObject* enabled = PyObject_CallNoArgs(is_grad_enabled);
  if (enabled == nullptr) throw nb::python_error();
  Py_DECREF(enabled);
  if (enabled != Py_True) return;
  if (instead.empty()) {
    throw nb::value_error((std::string(name) + ": expected a tensor that does not require grad (" +
                           std::string(function) +
                           " stores it outside autograd: no gradient flows back through it), "
                           "got one that requires grad while grad mode is on; pass " +
                           std::string(name) + ".detach(), or call under torch.no_grad()")
                              .c_str());
  }
  throw nb::value_error((std::string(name) + ": expected a tensor that does not require grad (" +
                         std::string(function) +
                         " runs outside autograd: its result would not require grad, the graph "
                         "cut), got one that requires grad while grad mode is on; use " +
                         std::string(instead) + ", which records autograd, or pass " +
                         std::string(name) + ".detach(), or call under torch.no_grad()")
                            .c_str());
}

InputTensor::InputTensor(nb::handle object, std::string_view name, int rank) {
  if (object.is_none()) {
    throw nb::type_error((std::string(name) + ": expected an array, got None").c_str());
  }
  framework_ = framework_of(object);
  array_ = import_array(object, name, "a NumPy array or a tensor supporting DLPack");

  const auto ndim = static_cast<int>(array_.ndim());
  if ((rank >= 0 && ndim != rank) || ndim > Shape::kMaxRank) {
    const std::string expected =
        rank >= 0 ? "a " + std::to_string(rank) + "-d array"
                  : "an array of rank at most " + std::to_string(Shape::kMaxRank);
    throw nb::value_error(
        (std::string(name) + ": expected " + expected + ", got shape " + shape_string(array_))
            .c_str());
  }
  const bool in_place = is_c_contiguous(array_);
  const float* data =
      float_data(array_, name, in_place, "a C-contiguous, aligned array", copy_, copied_);
  view_ = ConstTensorView(data, shape_of(array_));
}

StridedInput::StridedInput(nb::handle object, std::string_view name, int min_rank, int max_rank,
                           HalfInputs half) {
  if (object.is_none()) {
    throw nb::type_error((std::string(name) + ": expected an array, got None").c_str());
  }
  framework_ = framework_of(object);
  array_ = import_array(object, name, "a NumPy array or a tensor supporting DLPack");
  const auto ndim = static_cast<int>(array_.ndim());
  if (ndim < min_rank || ndim > max_rank) {
    throw nb::value_error((std::string(name) + ": expected " + rank_range(min_rank, max_rank) +
                           ", got shape " + shape_string(array_))
                              .c_str());
  }
  const bool in_place = (ndim == 0 || array_.shape(static_cast<size_t>(ndim - 1)) <= 1 ||
                         array_.stride(static_cast<size_t>(ndim - 1)) == 1) &&
                        !has_negative_stride(array_);
  shape_ = shape_of(array_);
  if (half == HalfInputs::kAccept && import_half(name, in_place)) return;
  const float* data = float_data(
      array_, name, in_place,
      "an aligned array with non-negative strides and a contiguous last axis", copy_, copied_);
  if (copied_) {
    view_ = ConstStridedView(copy_);
    return;
  }
  const auto strides = normalized_strides(array_);
  view_ = ConstStridedView(data, shape_of(array_),
                           std::span<const int64_t>(strides.data(), static_cast<size_t>(ndim)));
}

std::string StridedInput::dtype() const {
  return dtype_name(array_.dtype());
}

bool StridedInput::import_half(std::string_view name, bool in_place) {
  using Code = nb::dlpack::dtype_code;
  const bool is_float16 = is_dtype(array_.dtype(), Code::Float, 16);
  const bool is_bfloat16 = is_dtype(array_.dtype(), Code::Bfloat, 16);
  if (!is_float16 && !is_bfloat16) {
    const bool is_float =
        is_dtype(array_.dtype(), Code::Float, 32) || is_dtype(array_.dtype(), Code::Float, 64);
    if (is_float) return false;
    throw nb::type_error((std::string(name) +
                          ": expected float32 (float64 is copied to it), float16 or bfloat16, "
                          "got " +
                          dtype())
                             .c_str());
  }
  half_type_ = is_float16 ? HalfType::kFloat16 : HalfType::kBFloat16;
  const auto* base = static_cast<const std::byte*>(array_.data());
  const auto ndim = static_cast<size_t>(array_.ndim());
  const bool aligned = reinterpret_cast<uintptr_t>(base) % alignof(uint16_t) == 0;
  if (in_place && aligned) {
    const auto strides = normalized_strides(array_);
    half_view_ = StridedView<const uint16_t>(reinterpret_cast<const uint16_t*>(base), shape_,
                                             std::span<const int64_t>(strides.data(), ndim));
    return true;
  }
  if (strict_inputs()) {
    throw nb::value_error((std::string(name) +
                           ": expected an aligned array with non-negative strides and a "
                           "contiguous last axis (strict inputs: no copies), got strides " +
                           strides_string(array_) + " (in elements) for shape " +
                           shape_string(array_))
                              .c_str());
  }
  copy_bits16(array_, half_copy_);
  half_view_ = StridedView<const uint16_t>(half_copy_.data(), shape_);
  copied_ = true;
  return true;
}

MaskInput::MaskInput(nb::handle object, std::string_view name) {
  if (object.is_none()) return;
  if (nb::isinstance<nb::list>(object) || nb::isinstance<nb::tuple>(object)) {
    valid_lengths_ = to_valid_lengths(object, kLengthsName);
    holds_valid_lengths_ = true;
    return;
  }
  array_ = import_array(object, name,
                        "None, a bool or float mask (array or tensor), or integer valid lengths");
  const nb::dlpack::dtype dtype = array_.dtype();
  using Code = nb::dlpack::dtype_code;
  if (dtype.code == static_cast<uint8_t>(Code::Int) ||
      dtype.code == static_cast<uint8_t>(Code::UInt)) {
    // The book's call scaled_dot_product_attention(q, k, v, valid_lens): PyTorch never takes an
    // integer attn_mask, so integers here can only be lengths.
    valid_lengths_ = to_valid_lengths(object, kLengthsName);
    holds_valid_lengths_ = true;
    return;
  }
  if (array_.ndim() > static_cast<size_t>(Shape::kMaxRank)) {
    throw nb::value_error((std::string(name) + ": expected a mask of rank at most " +
                           std::to_string(Shape::kMaxRank) + ", got shape " + shape_string(array_))
                              .c_str());
  }
  const auto rank = static_cast<size_t>(array_.ndim());
  const Shape shape = shape_of(array_);
  const bool is_bool = is_dtype(dtype, Code::Bool, 8);
  const bool is_float32 = is_dtype(dtype, Code::Float, 32);
  const bool is_float64 = is_dtype(dtype, Code::Float, 64);
  const bool is_float16 = is_dtype(dtype, Code::Float, 16);
  const bool is_bfloat16 = is_dtype(dtype, Code::Bfloat, 16);
  if (!is_bool && !is_float32 && !is_float64 && !is_float16 && !is_bfloat16) {
    throw nb::type_error((std::string(name) +
                          ": expected a bool mask, a float32, float16 or bfloat16 (or float64) "
                          "additive mask, or integer valid lengths, got " +
                          dtype_name(dtype))
                             .c_str());
  }
  const auto* base = static_cast<const std::byte*>(array_.data());
  const auto strides = normalized_strides(array_);
  const std::span<const int64_t> stride_span(strides.data(), rank);
  if (is_float16 || is_bfloat16) {
    // Read in place as the kernels widen it (a float32 copy per call, made by the caller or here,
    // cost a bf16 call on two threads more than the mask's own additions: the copy's lines move
    // between the cores).
    const HalfType type = is_float16 ? HalfType::kFloat16 : HalfType::kBFloat16;
    if (reinterpret_cast<uintptr_t>(base) % alignof(uint16_t) == 0 &&
        !has_negative_stride(array_)) {
      mask_ = AttentionMask::additive(
          type,
          StridedView<const uint16_t>(reinterpret_cast<const uint16_t*>(base), shape, stride_span));
      return;
    }
    if (strict_inputs()) {
      throw nb::value_error((std::string(name) +
                             ": expected an aligned mask with non-negative strides (strict "
                             "inputs: no copies), got strides " +
                             strides_string(array_) + " (in elements) for shape " +
                             shape_string(array_))
                                .c_str());
    }
    copy_bits16(array_, half_copy_);
    mask_ = AttentionMask::additive(type, StridedView<const uint16_t>(half_copy_.data(), shape));
    return;
  }
  if (is_bool) {
    if (!has_negative_stride(array_)) {
      mask_ = AttentionMask::boolean(
          StridedView<const uint8_t>(reinterpret_cast<const uint8_t*>(base), shape, stride_span));
      return;
    }
    for_each_offset(array_, [&](int64_t offset) {
      bool_copy_.push_back(static_cast<uint8_t>(base[offset]) != 0 ? 1 : 0);
    });
    mask_ = AttentionMask::boolean(StridedView<const uint8_t>(bool_copy_.data(), shape));
    return;
  }
  const bool aligned = reinterpret_cast<uintptr_t>(base) % alignof(float) == 0;
  if (is_float32 && aligned && !has_negative_stride(array_)) {
    mask_ = AttentionMask::additive(
        StridedView<const float>(reinterpret_cast<const float*>(base), shape, stride_span));
    return;
  }
  if (strict_inputs()) {
    if (!is_float32) {
      throw nb::type_error((std::string(name) +
                            ": expected a bool or float32 mask (strict inputs: no copies), got " +
                            dtype_name(dtype))
                               .c_str());
    }
    throw nb::value_error((std::string(name) +
                           ": expected an aligned mask with non-negative strides (strict inputs: "
                           "no copies), got strides " +
                           strides_string(array_) + " (in elements) for shape " +
                           shape_string(array_))
                              .c_str());
  }
  float_copy_.reserve(static_cast<size_t>(shape.numel()));
  // A finite float64 entry beyond float32 becomes float's largest, not ±∞: −1e300 then hides a
  // key as float's lowest does (a row of them ties and is averaged, as PyTorch's math gives it),
  // where −∞ would have hidden the row wholly.
  constexpr float kLargest = std::numeric_limits<float>::max();
  for_each_offset(array_, [&](int64_t offset) {
    const float entry = read_float(base, offset, is_float64);
    float_copy_.push_back(std::isinf(entry) && is_float64 &&
                                  std::isfinite(read_double(base, offset))
                              ? std::copysign(kLargest, entry)
                              : entry);
  });
  mask_ = AttentionMask::additive(StridedView<const float>(float_copy_.data(), shape));
}

void throw_beyond_float(std::string_view name, double value) {
  std::ostringstream text;
  text << std::string(name) << ": expected a number float32 holds (within ±3.4e38; attn computes "
       << "in float32), got " << value;
  throw nb::value_error(text.str().c_str());
}

std::vector<float> to_float_vector(nb::handle object, std::string_view name) {
  std::vector<float> values;
  if (object.is_none()) return values;
  if (nb::isinstance<nb::list>(object) || nb::isinstance<nb::tuple>(object)) {
    const auto size = static_cast<int64_t>(nb::len(object));
    for (int64_t index = 0; index < size; ++index) {
      const nb::object item = object[nb::int_(index)];
      double value = 0.0;
      if (nb::isinstance<nb::bool_>(item) || !nb::try_cast(item, value, /*convert=*/true)) {
        throw nb::type_error((std::string(name) + "[" + std::to_string(index) +
                              "]: expected a number, got " + python_type_name(item))
                                 .c_str());
      }
      const auto narrowed = static_cast<float>(value);
      // As require_float_range does for arrays: a finite double beyond float32's range would
      // otherwise reach the checks downstream as "expected finite values, got inf".
      if (std::isinf(narrowed) && std::isfinite(value)) {
        throw_beyond_float(std::string(name) + "[" + std::to_string(index) + "]", value);
      }
      values.push_back(narrowed);
    }
    return values;
  }
  const StridedInput array(object, name, 1, 1);
  const ConstStridedView& view = array.view();
  values.reserve(static_cast<size_t>(view.numel()));
  for (int64_t index = 0; index < view.numel(); ++index) {
    values.push_back(view.data()[index * view.stride(0)]);
  }
  return values;
}

nb::object as_python_int(nb::handle item) {
  if (nb::isinstance<nb::bool_>(item)) return {};
  if (nb::isinstance<nb::int_>(item)) return nb::borrow(item);
  if (PyObject* index = PyNumber_Index(item.ptr())) return nb::steal(index);
  PyErr_Clear();
  return {};
}

ValidLengths to_valid_lengths(nb::handle object, std::string_view name) {
  if (object.is_none()) return {};
  const std::string label(name);
  if (nb::isinstance<nb::list>(object) || nb::isinstance<nb::tuple>(object)) {
    auto to_length = [&](nb::handle item, const std::string& where) {
      const nb::object integer = as_python_int(item);
      int64_t value = 0;
      if (!integer.is_valid() || !nb::try_cast(integer, value, /*convert=*/false)) {
        throw nb::type_error((where + ": expected an integer length, got " +
                              (integer.is_valid() ? nb::str(integer).c_str() +
                                                        std::string(", out of the int64 range")
                                                  : python_type_name(item)))
                                 .c_str());
      }
      return value;
    };
    std::vector<int64_t> lengths;
    const auto rows = static_cast<int64_t>(nb::len(object));
    int64_t columns = -1;  // -1: a flat list (one length per batch element)
    for (int64_t row = 0; row < rows; ++row) {
      const nb::object item = object[nb::int_(row)];
      const std::string where = label + "[" + std::to_string(row) + "]";
      const bool nested = nb::isinstance<nb::list>(item) || nb::isinstance<nb::tuple>(item);
      if (row == 0) columns = nested ? static_cast<int64_t>(nb::len(item)) : -1;
      if (nested != (columns >= 0)) {
        throw nb::value_error((label + ": expected a list of ints (B) or a list of equal-length "
                                       "lists (B, n), got a mix of both")
                                  .c_str());
      }
      if (!nested) {
        lengths.push_back(to_length(item, where));
        continue;
      }
      if (static_cast<int64_t>(nb::len(item)) != columns) {
        throw nb::value_error((where + ": expected " + std::to_string(columns) +
                               " lengths (as in row 0), got " + std::to_string(nb::len(item)))
                                  .c_str());
      }
      for (int64_t column = 0; column < columns; ++column) {
        lengths.push_back(to_length(nb::borrow(item)[nb::int_(column)],
                                    where + "[" + std::to_string(column) + "]"));
      }
    }
    if (columns < 0) return ValidLengths::per_batch(std::move(lengths));
    return ValidLengths::per_query(std::move(lengths), rows, columns);
  }

  const nb::ndarray<nb::ro> array = import_array(
      object, name, "None, a list of ints, or an int32/int64 array of shape (B,) or (B, n)");
  const nb::dlpack::dtype dtype = array.dtype();
  const bool is_signed = dtype.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int);
  const bool is_unsigned = dtype.code == static_cast<uint8_t>(nb::dlpack::dtype_code::UInt);
  const bool supported_bits =
      dtype.bits == 8 || dtype.bits == 16 || dtype.bits == 32 || dtype.bits == 64;
  if (!(is_signed || is_unsigned) || !supported_bits || dtype.lanes != 1) {
    throw nb::type_error(
        (label + ": expected integer lengths (int32 or int64), got " + dtype_name(dtype)).c_str());
  }
  if (array.ndim() != 1 && array.ndim() != 2) {
    throw nb::value_error(
        (label + ": expected shape (B,) or (B, n), got shape " + shape_string(array)).c_str());
  }
  std::vector<int64_t> lengths;
  lengths.reserve(array.size());
  const auto* base = static_cast<const std::byte*>(array.data());
  for_each_offset(array, [&](int64_t offset) {
    lengths.push_back(read_integer(base, offset, dtype.bits, is_signed, name));
  });
  if (array.ndim() == 1) return ValidLengths::per_batch(std::move(lengths));
  return ValidLengths::per_query(std::move(lengths), static_cast<int64_t>(array.shape(0)),
                                 static_cast<int64_t>(array.shape(1)));
}

namespace {

// An array over `data` (of `shape`) whose capsule owns `storage`, freeing it when the array is
// collected: a PyTorch tensor for kTorch (or when `numpy` is false), else a NumPy array.
template <class Storage>
nb::object owned_array(std::unique_ptr<Storage> storage, void* data, const Shape& shape,
                       nb::dlpack::dtype dtype, Framework framework, bool numpy = true) {
  std::array<size_t, Shape::kMaxRank> dims{};
  const auto rank = static_cast<size_t>(shape.rank());
  for (size_t axis = 0; axis < rank; ++axis) {
    dims[axis] = static_cast<size_t>(shape[static_cast<int>(axis)]);
  }
  nb::capsule owner(storage.get(), [](void* pointer) noexcept {
    std::unique_ptr<Storage>(static_cast<Storage*>(pointer)).reset();
  });
  storage.release();
  if (framework == Framework::kTorch || !numpy) {
    // A DLPack capsule handed to torch._C._from_dlpack, as torch.utils.dlpack.from_dlpack does
    // for a capsule: nanobind's torch export goes through that Python function and the
    // __dlpack__ protocol, 0.5 µs more a call.
    static PyObject* const from_dlpack = torch_function("_from_dlpack");
    if (from_dlpack != nullptr) {
      const nb::object capsule =
          nb::ndarray<>(data, rank, dims.data(), owner, nullptr, dtype).cast();
      PyObject* tensor = PyObject_CallOneArg(from_dlpack, capsule.ptr());
      if (tensor == nullptr) nb::raise_python_error();
      return nb::steal(tensor);
    }
    return nb::ndarray<nb::pytorch>(data, rank, dims.data(), owner, nullptr, dtype).cast();
  }
  return nb::ndarray<nb::numpy>(data, rank, dims.data(), owner, nullptr, dtype).cast();
}

}  // namespace

nb::object to_python(Tensor tensor, Framework framework) {
  auto owned = std::make_unique<Tensor>(std::move(tensor));
  float* data = owned->data();
  const Shape shape = owned->shape();
  return owned_array(std::move(owned), data, shape, nb::dtype<float>(), framework);
}

nb::object to_python(HalfTensor tensor, Framework framework) {
  using Code = nb::dlpack::dtype_code;
  const nb::dlpack::dtype dtype{
      static_cast<uint8_t>(tensor.type == HalfType::kFloat16 ? Code::Float : Code::Bfloat), 16, 1};
  // NumPy has no bfloat16: those are always torch tensors.
  const bool numpy = tensor.type == HalfType::kFloat16;
  auto owned = std::make_unique<HalfTensor>(std::move(tensor));
  uint16_t* data = owned->bits.data();
  const Shape shape = owned->shape;
  return owned_array(std::move(owned), data, shape, dtype, framework, numpy);
}

nb::object copy_to_python(const Tensor& tensor, Framework framework, int rank) {
  if (tensor.rank() != rank) return nb::none();
  return to_python(Tensor(tensor), framework);
}

StateInputs::StateInputs(nb::handle mapping, std::string_view argument) {
  if (!nb::hasattr(mapping, "items")) {
    throw nb::type_error((std::string(argument) +
                          ": expected a mapping of parameter names to arrays, got " +
                          python_type_name(mapping))
                             .c_str());
  }
  for (nb::handle item : mapping.attr("items")()) {
    const nb::object key = item[0];
    if (!nb::isinstance<nb::str>(key)) {
      throw nb::type_error(
          (std::string(argument) + ": expected str keys, got " + python_type_name(key)).c_str());
    }
    // Every character of the name (c_str() stopped at a NUL: 'a' and 'a\0b' became one entry, a
    // tensor lost without a word), and a ValueError for a str UTF-8 cannot encode (a lone
    // surrogate made a null pointer, "basic_string: construction from null").
    Py_ssize_t size = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(key.ptr(), &size);
    if (utf8 == nullptr) {
      PyErr_Clear();
      throw nb::value_error((std::string(argument) + ": expected names UTF-8 can encode, got " +
                             nb::repr(key).c_str())
                                .c_str());
    }
    const std::string name(utf8, static_cast<size_t>(size));
    inputs_.push_back(
        std::make_unique<InputTensor>(item[1], std::string(argument) + "['" + name + "']", -1));
    views_.insert_or_assign(name, inputs_.back()->view());
  }
}

StateDict to_state_dict(nb::handle mapping, std::string_view argument) {
  const StateInputs inputs(mapping, argument);
  StateDict state;
  for (const auto& [name, view] : inputs.views()) state.emplace(name, Tensor::from(view));
  return state;
}

nb::dict to_python(const StateDict& state, Framework framework) {
  return to_python(StateDict(state), framework);
}

nb::dict to_python(StateDict&& state, Framework framework) {
  nb::dict result;
  for (auto& [name, tensor] : state)
    result[nb::str(name.data(), name.size())] = to_python(std::move(tensor), framework);
  return result;
}

void throw_argument_type(std::string_view function, std::string_view name,
                         std::string_view expected, nb::handle value) {
  const std::string head =
      std::string(function) + "(): argument '" + std::string(name) + "' must be ";
  // An int out of the parameter's range: the value, and the range where `expected` leaves it out.
  if (nb::isinstance<nb::int_>(value) && !nb::isinstance<nb::bool_>(value) &&
      expected.find("int") != std::string_view::npos) {
    const std::string range =
        expected.find('[') == std::string_view::npos ? " in [-2**63, 2**63)" : "";
    throw nb::type_error(
        (head + std::string(expected) + range + ", got " + nb::str(value).c_str()).c_str());
  }
  // The type qualified by its module unless a builtin: NumPy's bool is "numpy.bool", not "bool".
  const nb::handle type = value.type();
  const std::string module = nb::str(type.attr("__module__")).c_str();
  const std::string qualified = nb::str(type.attr("__qualname__")).c_str();
  throw nb::type_error((head + std::string(expected) + ", not " +
                        (module == "builtins" ? qualified : module + "." + qualified))
                           .c_str());
}

}  // namespace attn::python
