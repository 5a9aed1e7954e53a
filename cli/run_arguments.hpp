// What `attn run` hands the functional attention API: its .npy or safetensors inputs read once and
// viewed in PyTorch's (..., H, L, E) layout through strides (rank-3 files split into heads in
// place, never copied), and AttentionOptions built from the flags (mask, window, causal, softcap,
// ALiBi, sinks).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/half.hpp"
#include "attn/core/shape.hpp"
#include "attn/core/strided_view.hpp"
#include "attn/core/tensor.hpp"
#include "attn/functional/attention_options.hpp"
#include "command_support.hpp"

namespace attn::cli {

// The files and values of one `attn run` call that shape the attention call; an empty optional is
// a flag that was not given.
struct RunArguments {
  std::string queries;
  std::string keys;
  std::string values;
  std::optional<std::string> valid_lens;
  std::optional<std::string> mask;
  std::optional<std::string> alibi;
  std::optional<std::string> sinks;
  std::optional<std::string> window;     // "L,R" as typed
  std::optional<std::string> causal;     // "top-left" or "bottom-right" as typed
  std::optional<std::string> alignment;  // the same, for --window and --alibi without --causal
  std::optional<int64_t> heads;
  std::optional<int64_t> kv_heads;
  std::optional<float> scale;
  std::optional<float> softcap;
  // Files read outside FunctionalInputs, named in messages about the tensors they hold.
  std::optional<std::string> out_grad;  // G: "grad_output"
  std::optional<std::string> params;    // additive's "W_q", "W_k", "w_v"
};

// Runs `action`; an attn::Error whose message begins with an argument's name as the library or
// this file spells it ("keys: ...", "key: ...", "attn_mask: ...") is re-thrown with the flag and
// file it came from added, e.g. " (attn_mask from --mask m.npy)": the user knows files, not names.
[[noreturn]] void rethrow_with_sources(const Error& error, const RunArguments& arguments);
template <class Action>
decltype(auto) name_sources(const RunArguments& arguments, Action&& action) {
  try {
    return std::forward<Action>(action)();
  } catch (const Error& error) {
    rethrow_with_sources(error, arguments);
  }
}

// Re-throws an error from reading --valid-lens (already "--valid-lens: ..."): a dtype the .npy
// reader does not know at all (int16, uint64) is said to be outside int32 and int64, the only
// dtypes valid lengths take, where the reader lists every dtype it reads, floats included.
[[noreturn]] void rethrow_valid_lens_error(const Error& error);
// Runs `action`, which reads --valid-lens, under "--valid-lens: " and rethrow_valid_lens_error.
template <class Action>
decltype(auto) reading_valid_lens(Action&& action) {
  try {
    return with_context("--valid-lens", std::forward<Action>(action));
  } catch (const Error& error) {
    rethrow_valid_lens_error(error);
  }
}

// "L,R" → a window; ValueError naming --window unless both are integers ≥ −1.
SlidingWindow parse_window(const std::string& text);
// "top-left" or "bottom-right" → the alignment; ValueError naming `flag` (--causal or
// --alignment) otherwise.
DiagonalAlignment parse_alignment(const std::string& text, const std::string& flag = "--causal");
// --causal and --alignment into `options`: causal with --causal, the alignment of either (top-left,
// PyTorch's, when neither says); ValueError when the two disagree.
void apply_causal_and_alignment(const RunArguments& arguments, AttentionOptions& options);

// An input file as read: float32 values, or its 16-bit words as stored (a float16 .npy; an F16 or
// BF16 safetensors tensor), never widened on reading. A path ending in .safetensors names a file
// holding one tensor; FILE.safetensors:NAME picks the tensor NAME of one holding several.
struct InputFile {
  Shape shape;
  std::optional<HalfType> half;  // set: `bits` holds the values
  Tensor floats;
  std::vector<uint16_t> bits;
  // The values as float32 (16-bit words widened exactly), leaving this file empty.
  Tensor take_floats();
};
InputFile read_input_file(const std::string& path, const std::string& name);
// The half type queries, keys and values are all stored in; none when they differ or are floats.
std::optional<HalfType> shared_half_type(const InputFile (&files)[3]);
// The half type a dot-product run computes in, given each input's stored type (queries, keys,
// values): none when all are float32 or float64; when one is float16 or bfloat16, all three must
// be (PyTorch refuses a mix), else a ValueError naming the first input that differs.
std::optional<HalfType> dot_product_half_type(const std::optional<HalfType> (&types)[3]);
// A safetensors path split into its file and the tensor's name: FILE.safetensors (name empty) or
// FILE.safetensors:NAME, FILE ending at the first ".safetensors" followed by ':' or the end, so
// that NAME may hold ':' itself; none when `path` is neither.
struct SafetensorsPath {
  std::string file, name;
};
std::optional<SafetensorsPath> split_safetensors_path(const std::string& path);
// Whether `path` names a safetensors file (FILE.safetensors or FILE.safetensors:NAME).
bool is_safetensors_path(const std::string& path);
// The file a path argument reads or writes: FILE of FILE.safetensors:NAME, any other path as it is
// (what the checks that an output overwrites no input and no other output compare).
std::string file_of_path(const std::string& path);
// The name a half-precision type goes by in messages: float16 or bfloat16.
std::string half_type_name(HalfType type);

// Which function the inputs are for. Dot products take every layout and option; additive scores
// need no equal query and key sizes, and take no heads (the command refuses --heads for them).
enum class ScoreFamily { kDotProduct, kAdditive };

// The inputs of one functional call. Three layouts:
//   rank-3 files (B, n, d), (B, m, d), (B, m, dv): one head per batch element, as the book's;
//   rank-3 files with --heads H [--kv-heads G]: (B, n, H·d), (B, m, G·d), (B, m, G·dv), head h
//     in columns [h·d, (h+1)·d) as multi-head projections lay them out, read as (B, H, n, d) and
//     (B, G, m, d) through strides;
//   rank-4 files (N, H, L, E), (N, G, S, E), (N, G, S, Ev): PyTorch's layout, G dividing H.
// Outputs and gradients keep the layout of the file they belong to.
// A rank-3 (B, L, heads·d) tensor read as (B, heads, L, d) in place: head h is columns
// [h·d, (h+1)·d), as multi-head projections lay them out. `heads` divides the last axis.
template <class T>
StridedView<T> split_heads(T* data, const Shape& shape, int64_t heads) {
  const int64_t rows = shape[1], width = shape[2], size = width / heads;
  const int64_t strides[] = {rows * width, size, width, 1};
  return StridedView<T>(data, Shape{shape[0], heads, rows, size}, strides);
}

class FunctionalInputs {
 public:
  // Reads every file and checks shapes and option values; errors name the argument and, through
  // name_sources, its flag and file. Nothing is copied after reading.
  FunctionalInputs(const RunArguments& arguments, ScoreFamily family);
  // The options hold views of this object's own storage.
  FunctionalInputs(const FunctionalInputs&) = delete;
  FunctionalInputs& operator=(const FunctionalInputs&) = delete;

  // The files' shapes.
  const Shape& query_shape() const { return query_shape_; }
  const Shape& key_shape() const { return key_shape_; }
  const Shape& value_shape() const { return value_shape_; }
  // The files' tensors as the functional API reads them (float runs).
  ConstStridedView query() const { return as_heads(queries_, query_heads_); }
  ConstStridedView key() const { return as_heads(keys_, kv_heads_); }
  ConstStridedView value() const { return as_heads(values_, kv_heads_); }
  const AttentionOptions& options() const { return options_; }

  // The output file's shape: the queries' layout with the values' size per head.
  Shape output_shape() const;
  // Tensors in the layout of the output (or of the queries) / of the keys and values, viewed as
  // the functional API writes or reads them.
  MutableStridedView like_query(Tensor& tensor) const { return as_heads(tensor, query_heads_); }
  ConstStridedView like_query(const Tensor& tensor) const { return as_heads(tensor, query_heads_); }
  MutableStridedView like_key(Tensor& tensor) const { return as_heads(tensor, kv_heads_); }

  // The type of the dot-product inputs when they are float16 or bfloat16 files: then the call
  // runs in half precision on these views of their bits, which are all that is read of them (no
  // float tensors).
  std::optional<HalfType> half() const { return half_; }
  // Additive inputs stored in one half type (widened to float32 for the call): the output is
  // rounded back to it, as PyTorch's output dtype follows its inputs'.
  std::optional<HalfType> stored_half() const { return stored_half_; }
  // float16 where the --mask or --sinks file holds float16: its gradient is written in that type,
  // as PyTorch's autograd gives a tensor's gradient its dtype.
  std::optional<HalfType> mask_stored_half() const { return mask_half_; }
  std::optional<HalfType> sinks_stored_half() const { return sinks_half_; }
  StridedView<const uint16_t> query16() const {
    return as_heads(query_halves_.data(), query_shape_, query_heads_);
  }
  StridedView<const uint16_t> key16() const {
    return as_heads(key_halves_.data(), key_shape_, kv_heads_);
  }
  StridedView<const uint16_t> value16() const {
    return as_heads(value_halves_.data(), value_shape_, kv_heads_);
  }
  // Bits laid out as the output / as the keys and values, viewed as the functional API writes them.
  StridedView<uint16_t> like_query16(std::vector<uint16_t>& bits, const Shape& shape) const {
    return as_heads(bits.data(), shape, query_heads_);
  }
  StridedView<uint16_t> like_key16(std::vector<uint16_t>& bits, const Shape& shape) const {
    return as_heads(bits.data(), shape, kv_heads_);
  }

  int64_t query_heads() const { return query_heads_; }
  bool has_float_mask() const { return options_.attn_mask.kind() == MaskKind::kFloat; }
  bool has_sinks() const { return !sinks_.empty(); }

 private:
  // Elements of `shape` at `data` (float or float16 bits) as the functional API reads them:
  // (B, heads, L, d) when the last axis holds the heads, else as they are.
  template <class T>
  StridedView<T> as_heads(T* data, const Shape& shape, int64_t heads) const {
    return split_heads_ ? split_heads(data, shape, heads) : StridedView<T>(data, shape);
  }
  ConstStridedView as_heads(const Tensor& tensor, int64_t heads) const {
    return as_heads(tensor.data(), tensor.shape(), heads);
  }
  MutableStridedView as_heads(Tensor& tensor, int64_t heads) const {
    return as_heads(tensor.data(), tensor.shape(), heads);
  }
  // The shape the functional API sees for a file of `shape`, whatever its dtype.
  Shape call_shape(const Shape& shape, int64_t heads) const {
    return as_heads(static_cast<const float*>(nullptr), shape, heads).shape();
  }
  // The scores the functional API computes: (B, n, m), or (B, H, n, m) with heads.
  Shape scores_shape() const;
  void read_inputs(const RunArguments& arguments, ScoreFamily family);
  void check_valid_lens() const;
  void read_mask(const RunArguments& arguments);
  std::vector<float> read_per_head(const std::string& path, const std::string& flag,
                                   const std::string& name, const std::string& what) const;

  Shape query_shape_, key_shape_, value_shape_;
  Tensor queries_, keys_, values_;  // float runs only
  std::optional<HalfType> half_, stored_half_, mask_half_, sinks_half_;
  std::vector<uint16_t> query_halves_, key_halves_, value_halves_;  // half runs only
  bool split_heads_ = false;
  int64_t query_heads_ = 1;
  int64_t kv_heads_ = 1;
  // Where the number of query heads came from, for messages about per-head values.
  std::string heads_source_;
  Shape mask_shape_;
  std::vector<uint8_t> bool_mask_;
  std::vector<float> float_mask_;
  std::vector<float> alibi_;
  std::vector<float> sinks_;
  AttentionOptions options_;
};

// A half run's result as the half kernels wrote it, or a float result rounded once to its inputs'
// type: 16-bit words of `type`.
struct HalfResult {
  HalfType type = HalfType::kFloat16;
  Shape shape;
  std::vector<uint16_t> bits;
};

// A result as it is written: float32 values, or 16-bit words (never widened: a float copy beside
// them cost an output-sized allocation, two passes).
using ResultTensor = std::variant<Tensor, HalfResult>;

// `values` as written for inputs stored in `type` (PyTorch's output dtype follows its inputs'):
// rounded once to it, or as they are when the inputs were float32.
ResultTensor in_stored_type(std::optional<HalfType> type, Tensor values);

// The last guard of "finite in, finite out": the functions and layers raise their own errors for a
// result that overflows, and no file holding an infinity or a NaN is ever written with exit 0. A
// ValueError naming `option`, the value, its index and the type it overflows.
void require_finite_result(const Tensor& tensor, const std::string& option);
void require_finite_result(const HalfResult& tensor, const std::string& option);
void require_finite_result(const ResultTensor& tensor, const std::string& option);

// float32 values, or 16-bit words, as they are: .npy, or one tensor of a safetensors file, named
// by FILE.safetensors:NAME or else `name`.
void save_tensor(const std::string& path, const ResultTensor& tensor, const std::string& name);

// Valid lengths of shape `lengths` ((B,) or (B, n)) against queries of shape (B, [H,] n, d) and
// `keys` keys: a ShapeError naming the scores they must match.
void check_valid_lens_shape(const Shape& lengths, const Shape& queries, int64_t keys);

}  // namespace attn::cli
