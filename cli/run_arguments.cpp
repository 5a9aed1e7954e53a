// `attn run`'s functional inputs: reading and checking the files, the heads views, the options
// parsed from their flags, and the flag and file added to an error about an argument.
#include "run_arguments.hpp"

#include <charconv>
#include <cmath>
#include <map>
#include <system_error>

#include "attn/core/valid_lengths.hpp"
#include "attn/io/npy.hpp"
#include "attn/io/npy_rows.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/kernels/half_conversion.hpp"
#include "command_support.hpp"

namespace attn::cli {

namespace {

// The scores' axes by name, for mask messages: one head per batch element, or heads.
std::string scores_description(int rank) {
  return rank == 3 ? "(B, n, m)" : "(B, H, n, m)";
}

// Whether `shape` broadcasts to `target` by PyTorch's rules: aligned from the last axis, each
// axis equal or 1, no more axes than the target.
bool broadcasts(const Shape& shape, const Shape& target) {
  if (shape.rank() > target.rank()) return false;
  for (int axis = 1; axis <= shape.rank(); ++axis) {
    const int64_t size = shape.dim(-axis);
    if (size != 1 && size != target.dim(-axis)) return false;
  }
  return true;
}

// The integer in `text`, all of it, or nothing.
std::optional<int64_t> parse_integer(std::string_view text) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) return {};
  return value;
}

Shape with_last(const Shape& shape, int64_t last) {
  int64_t dims[Shape::kMaxRank];
  for (int axis = 0; axis < shape.rank(); ++axis) dims[axis] = shape[axis];
  dims[shape.rank() - 1] = last;
  return Shape::from_dims(dims, shape.rank());
}

[[noreturn]] void throw_overflow(const std::string& option, const std::string& value, int64_t index,
                                 const std::string& dtype) {
  throw ValueError(option + ": the result holds " + value + " at flat index " +
                   std::to_string(index) + " although every input is finite (it overflows " +
                   dtype + "); scale the inputs down");
}

}  // namespace

void rethrow_with_sources(const Error& error, const RunArguments& arguments) {
  const std::string message = error.what();
  // Layers name their inputs in the plural, the functional API in the singular; additive
  // attention's parameters by their short names.
  const std::vector<std::pair<std::string, std::pair<std::string, std::optional<std::string>>>>
      sources = {{"queries", {"--queries", arguments.queries}},
                 {"query", {"--queries", arguments.queries}},
                 {"keys", {"--keys", arguments.keys}},
                 {"key", {"--keys", arguments.keys}},
                 {"values", {"--values", arguments.values}},
                 {"value", {"--values", arguments.values}},
                 {"valid_lens", {"--valid-lens", arguments.valid_lens}},
                 {"attn_mask", {"--mask", arguments.mask}},
                 {"alibi_slopes", {"--alibi", arguments.alibi}},
                 {"sinks", {"--sinks", arguments.sinks}},
                 {"grad_output", {"--out-grad", arguments.out_grad}},
                 {"W_q", {"--params", arguments.params}},
                 {"W_k", {"--params", arguments.params}},
                 {"w_v", {"--params", arguments.params}}};
  for (const auto& [argument, source] : sources) {
    if (!source.second) continue;
    if (message.starts_with(argument + ":") || message.starts_with(argument + "[")) {
      // Parameters go by their state-dict names in the file.
      const std::string name = source.first == "--params" ? argument + ".weight" : argument;
      rethrow_with_message(
          error, message + " (" + name + " from " + source.first + " " + *source.second + ")");
    }
  }
  rethrow_with_message(error, message);
}

void rethrow_valid_lens_error(const Error& error) {
  const std::string message = error.what();
  const std::string unsupported = "unsupported dtype '";
  const size_t at = message.find(unsupported);
  const size_t end = at == std::string::npos ? at : message.find('\'', at + unsupported.size());
  if (end == std::string::npos) rethrow_with_message(error, message);
  const std::string dtype = message.substr(at, end + 1 - at).substr(unsupported.size() - 1);
  rethrow_with_message(error, message.substr(0, at) +
                                  "expected int32 ('<i4') or int64 ('<i8') valid lengths, got "
                                  "dtype " +
                                  dtype);
}

SlidingWindow parse_window(const std::string& text) {
  const size_t comma = text.find(',');
  std::optional<int64_t> left, right;
  if (comma != std::string::npos) {
    left = parse_integer(std::string_view(text).substr(0, comma));
    right = parse_integer(std::string_view(text).substr(comma + 1));
  }
  if (!left || !right || *left < -1 || *right < -1) {
    throw ValueError(
        "--window: expected L,R, two integers ≥ -1 (keys up to L before and R after "
        "each query's diagonal key; -1 leaves a side unbounded), got '" +
        text + "'");
  }
  return {*left, *right};
}

DiagonalAlignment parse_alignment(const std::string& text, const std::string& flag) {
  if (text == "top-left") return DiagonalAlignment::kTopLeft;
  if (text == "bottom-right") return DiagonalAlignment::kBottomRight;
  throw ValueError(flag +
                   ": expected top-left (PyTorch's is_causal: query i sees keys j <= i) "
                   "or bottom-right (the book's layers' and FlashAttention's: j <= i + m - n), "
                   "got '" +
                   text + "'");
}

void apply_causal_and_alignment(const RunArguments& arguments, AttentionOptions& options) {
  if (arguments.alignment) {
    options.alignment = parse_alignment(*arguments.alignment, "--alignment");
  }
  if (arguments.causal) {
    const DiagonalAlignment causal = parse_alignment(*arguments.causal);
    if (arguments.alignment && causal != options.alignment) {
      throw ValueError("--alignment: " + *arguments.alignment + " disagrees with --causal " +
                       *arguments.causal +
                       " (the causal mask, --window and --alibi share one diagonal)");
    }
    options.causal = true;
    options.alignment = causal;
  }
}

FunctionalInputs::FunctionalInputs(const RunArguments& arguments, ScoreFamily family) {
  name_sources(arguments, [&] {
    read_inputs(arguments, family);
    if (arguments.valid_lens) {
      options_.valid_lens = reading_valid_lens(
          [&] { return load_npy_valid_lengths(*arguments.valid_lens, "valid_lens"); });
      check_valid_lens();
    }
    // Finite, and a positive softcap, as read (number_check in run_command.cpp).
    if (arguments.scale) options_.scale = arguments.scale;
    if (arguments.softcap) options_.softcap = arguments.softcap;
    if (arguments.window) options_.window = parse_window(*arguments.window);
    apply_causal_and_alignment(arguments, options_);
    read_mask(arguments);
    if (arguments.alibi) {
      alibi_ = read_per_head(*arguments.alibi, "--alibi", "alibi_slopes", "slope");
      options_.alibi_slopes = alibi_;
    }
    if (arguments.sinks) {
      sinks_ = read_per_head(*arguments.sinks, "--sinks", "sinks", "sink logit");
      options_.sinks = sinks_;
      if (read_npy_header(*arguments.sinks).dtype == NpyDType::kFloat16) {
        sinks_half_ = HalfType::kFloat16;
      }
    }
  });
}

std::optional<SafetensorsPath> split_safetensors_path(const std::string& path) {
  constexpr std::string_view kSuffix = ".safetensors";
  for (size_t at = path.find(kSuffix); at != std::string::npos; at = path.find(kSuffix, at + 1)) {
    const size_t end = at + kSuffix.size();
    if (end == path.size()) return SafetensorsPath{path, {}};
    if (path[end] == ':') return SafetensorsPath{path.substr(0, end), path.substr(end + 1)};
  }
  return std::nullopt;
}

bool is_safetensors_path(const std::string& path) {
  return split_safetensors_path(path).has_value();
}

std::string file_of_path(const std::string& path) {
  const std::optional<SafetensorsPath> split = split_safetensors_path(path);
  return split ? split->file : path;
}

std::string half_type_name(HalfType type) {
  return type == HalfType::kFloat16 ? "float16" : "bfloat16";
}

Tensor InputFile::take_floats() {
  if (!half) return std::move(floats);
  Tensor widened(shape);
  widen_half(*half, bits.data(), widened.data(), bits.size());
  bits = {};
  half.reset();
  return widened;
}

InputFile read_input_file(const std::string& path, const std::string& name) {
  InputFile file;
  if (const std::optional<SafetensorsPath> split = split_safetensors_path(path)) {
    SafetensorsTensor tensor = load_safetensors_tensor(split->file, split->name);
    file.shape = tensor.shape;
    file.half = tensor.half;
    file.floats = std::move(tensor.floats);
    file.bits = std::move(tensor.bits);
    return file;
  }
  if (read_npy_header(path).dtype == NpyDType::kFloat16) {
    NpyFloat16 half = load_npy_float16(path, name);
    file.shape = half.shape;
    file.half = HalfType::kFloat16;
    file.bits = std::move(half.bits);
    return file;
  }
  // Integer and bool files: load_npy_tensor's error naming the argument.
  file.floats = load_npy_tensor(path, name);
  file.shape = file.floats.shape();
  return file;
}

std::optional<HalfType> shared_half_type(const InputFile (&files)[3]) {
  const bool shared = files[0].half == files[1].half && files[1].half == files[2].half;
  return shared ? files[0].half : std::nullopt;
}

std::optional<HalfType> dot_product_half_type(const std::optional<HalfType> (&types)[3]) {
  if (types[0] == types[1] && types[1] == types[2]) return types[0];
  const char* names[] = {"queries", "keys", "values"};
  const auto type_text = [](const std::optional<HalfType>& type) {
    return type ? half_type_name(*type) : std::string("float32 or float64");
  };
  // The odd one out is the input whose type the other two do not share (it named the first that
  // differed from the first half input: queries for float32 queries and values beside float16
  // keys).
  int odd = -1;
  for (int index = 0; index < 3; ++index) {
    if (types[(index + 1) % 3] == types[(index + 2) % 3]) odd = index;
  }
  if (odd < 0) {
    throw ValueError("queries, keys, values: expected one type for all three, got " +
                     type_text(types[0]) + ", " + type_text(types[1]) + " and " +
                     type_text(types[2]));
  }
  const std::optional<HalfType>& expected = types[(odd + 1) % 3];
  const std::string type = type_text(expected);
  const std::string reason =
      expected ? "a " + type + " run reads queries, keys and values all in " + type
               : "float16 or bfloat16 inputs run in their type when all three are";
  throw ValueError(std::string(names[odd]) + ": expected " + type +
                   " data like the other inputs (" + reason + "), got " + type_text(types[odd]));
}

void FunctionalInputs::read_inputs(const RunArguments& arguments, ScoreFamily family) {
  const std::string* paths[] = {&arguments.queries, &arguments.keys, &arguments.values};
  const char* names[] = {"queries", "keys", "values"};
  const char* flags[] = {"--queries", "--keys", "--values"};
  // Each input read once, into what the call reads: a half run its bits alone (a float copy
  // beside them held each input three times over), the others float tensors, float32 data read
  // straight into them (load_npy_tensor; through read_npy's arrays an input was held twice at once:
  // a 512 MiB key file made the run's peak 1.5 GiB where its inputs are 1 GiB).
  InputFile files[3];
  for (int index = 0; index < 3; ++index) {
    files[index] =
        with_context(flags[index], [&] { return read_input_file(*paths[index], names[index]); });
  }
  // Dot-product attention runs in float16 or bfloat16 when its inputs are, as PyTorch's does;
  // additive attention computes in float32 on any floats, and rounds its output to the inputs'
  // type when they share one.
  if (family == ScoreFamily::kDotProduct) {
    half_ = dot_product_half_type({files[0].half, files[1].half, files[2].half});
  } else {
    stored_half_ = shared_half_type(files);
  }
  Tensor* tensors[] = {&queries_, &keys_, &values_};
  std::vector<uint16_t>* halves[] = {&query_halves_, &key_halves_, &value_halves_};
  Shape* shapes[] = {&query_shape_, &key_shape_, &value_shape_};
  for (int index = 0; index < 3; ++index) {
    *shapes[index] = files[index].shape;
    if (half_) {
      *halves[index] = std::move(files[index].bits);
    } else {
      *tensors[index] = files[index].take_floats();
    }
  }
  const int rank = query_shape_.rank();
  if (rank != 3 && rank != 4) {
    throw ShapeError("queries: expected (B, n, d) or (N, H, L, E) (rank 3 or 4), got shape " +
                     query_shape_.str());
  }
  require_rank("keys", key_shape_, rank);
  require_rank("values", value_shape_, rank);
  require_dim("keys", key_shape_, 0, query_shape_.dim(0), "the batch size of queries");
  require_dim("values", value_shape_, 0, query_shape_.dim(0), "the batch size of queries");
  require_dim("values", value_shape_, -2, key_shape_.dim(-2), "the number of keys");
  const bool dot_product = family == ScoreFamily::kDotProduct;

  if (rank == 4) {
    for (const auto& [flag, given] : {std::pair{"--heads", arguments.heads.has_value()},
                                      std::pair{"--kv-heads", arguments.kv_heads.has_value()}}) {
      if (given) {
        throw ValueError(std::string(flag) +
                         ": the inputs are rank 4 (N, H, L, E), whose axis 1 holds the heads "
                         "already (" +
                         flag + " splits the last axis of rank-3 inputs)");
      }
    }
    query_heads_ = query_shape_.dim(1);
    kv_heads_ = key_shape_.dim(1);
    heads_source_ = "the heads from axis 1 of the queries";
    require_dim("values", value_shape_, 1, kv_heads_, "the heads of keys");
    if (!dot_product) {
      require_dim("keys", key_shape_, 1, query_heads_, "the heads of queries");
    } else if (kv_heads_ == 0 || query_heads_ % kv_heads_ != 0) {
      throw ShapeError("keys: expected a number of heads (axis 1) dividing the queries' " +
                       std::to_string(query_heads_) + " (grouped-query attention), got shape " +
                       key_shape_.str());
    }
    if (dot_product) {
      require_dim("keys", key_shape_, -1, query_shape_.dim(-1), "the size of each query");
    }
  } else if (arguments.heads) {
    query_heads_ = *arguments.heads;
    if (query_heads_ < 1) {
      throw ValueError("--heads: expected a positive number of heads, got " +
                       std::to_string(query_heads_));
    }
    kv_heads_ = arguments.kv_heads.value_or(query_heads_);
    const std::string kv_flag = arguments.kv_heads ? "--kv-heads" : "--heads";
    if (arguments.kv_heads && (kv_heads_ < 1 || query_heads_ % kv_heads_ != 0)) {
      throw ValueError("--kv-heads: expected a divisor of --heads " + std::to_string(query_heads_) +
                       " (each key/value head serves --heads / --kv-heads query heads), got " +
                       std::to_string(kv_heads_));
    }
    split_heads_ = true;
    heads_source_ = "the heads from --heads " + std::to_string(query_heads_);
    if (query_shape_.dim(2) % query_heads_ != 0) {
      throw ShapeError("queries: expected a last axis that splits into --heads " +
                       std::to_string(query_heads_) + " heads, got shape " + query_shape_.str());
    }
    const int64_t size = query_shape_.dim(2) / query_heads_;
    require_dim("keys", key_shape_, -1, kv_heads_ * size,
                kv_flag + " " + std::to_string(kv_heads_) + " × the queries' head size " +
                    std::to_string(size));
    if (value_shape_.dim(2) % kv_heads_ != 0) {
      throw ShapeError("values: expected a last axis that splits into " +
                       std::to_string(kv_heads_) + " heads (" + kv_flag + "), got shape " +
                       value_shape_.str());
    }
  } else {
    if (arguments.kv_heads) {
      throw ValueError("--kv-heads: needs --heads (the query heads that --kv-heads " +
                       std::to_string(*arguments.kv_heads) + " key/value heads serve)");
    }
    heads_source_ = "rank-3 inputs without --heads have one head";
    if (dot_product) {
      require_dim("keys", key_shape_, -1, query_shape_.dim(-1), "the size of each query");
    }
  }
  // Grouped-query attention: query head h reads key/value head h / (H / G), in place.
  options_.enable_gqa = kv_heads_ != query_heads_;
}

Shape FunctionalInputs::scores_shape() const {
  return with_last(call_shape(query_shape_, query_heads_),
                   call_shape(key_shape_, kv_heads_).dim(-2));
}

void FunctionalInputs::check_valid_lens() const {
  const Shape valid_shape = options_.valid_lens.shape();
  if (valid_shape.rank() == 0) return;
  check_valid_lens_shape(valid_shape, call_shape(query_shape_, query_heads_),
                         call_shape(key_shape_, kv_heads_).dim(-2));
}

// The functional API checks the lengths against (B, n, m) alone and names those as "the scores",
// which for rank-4 inputs, or heads, are (B, H, n, m): the shape the user can recognise is named
// here first.
void check_valid_lens_shape(const Shape& lengths, const Shape& queries, int64_t keys) {
  const Shape scores = with_last(queries, keys);
  const bool matches =
      lengths.dim(0) == scores.dim(0) && (lengths.rank() == 1 || lengths.dim(1) == scores.dim(-2));
  if (matches) return;
  const std::string expected =
      lengths.rank() == 1 ? Shape{scores.dim(0)}.str() : Shape{scores.dim(0), scores.dim(-2)}.str();
  throw ShapeError("valid_lens: expected shape " + expected + " to match the scores " +
                   scores.str() + " " + scores_description(scores.rank()) + ", got shape " +
                   lengths.str());
}

void FunctionalInputs::read_mask(const RunArguments& arguments) {
  if (!arguments.mask) return;
  NpyArray mask = with_context("--mask", [&] { return read_npy(*arguments.mask); });
  if (mask.is_integer()) {
    throw FileError(
        "attn_mask: expected a bool or floating-point (float16, bfloat16, float32, float64) mask, "
        "got an integer array (valid lengths go to --valid-lens)");
  }
  const Shape scores = scores_shape();
  if (!broadcasts(mask.shape, scores)) {
    throw ShapeError("attn_mask: expected a shape that broadcasts to the scores " + scores.str() +
                     " " + scores_description(scores.rank()) +
                     " (PyTorch's rules: aligned from the last axis, each axis equal or 1), got " +
                     mask.shape.str());
  }
  mask_shape_ = mask.shape;
  if (mask.dtype == NpyDType::kFloat16) mask_half_ = HalfType::kFloat16;
  if (mask.is_bool()) {
    bool_mask_ = std::move(mask.bools);
    options_.attn_mask =
        AttentionMask::boolean(StridedView<const uint8_t>(bool_mask_.data(), mask_shape_));
  } else {
    float_mask_ = std::move(mask.floats);
    options_.attn_mask =
        AttentionMask::additive(StridedView<const float>(float_mask_.data(), mask_shape_));
  }
}

std::vector<float> FunctionalInputs::read_per_head(const std::string& path, const std::string& flag,
                                                   const std::string& name,
                                                   const std::string& what) const {
  Tensor tensor = with_context(flag, [&] { return load_npy_tensor(path, name); });
  if (tensor.rank() != 1 || tensor.dim(0) != query_heads_) {
    throw ShapeError(name + ": expected one " + what + " per query head, shape (" +
                     std::to_string(query_heads_) + ",) (" + heads_source_ + "), got shape " +
                     tensor.shape().str());
  }
  return tensor.to_vector();
}

Shape FunctionalInputs::output_shape() const {
  if (!split_heads_) return with_last(query_shape_, value_shape_.dim(-1));
  return Shape{query_shape_.dim(0), query_shape_.dim(1),
               query_heads_ * (value_shape_.dim(2) / kv_heads_)};
}

// `values` as written for inputs stored in `type` (PyTorch's output dtype follows its inputs'):
// rounded once to it, or as they are when the inputs were float32.
ResultTensor in_stored_type(std::optional<HalfType> type, Tensor values) {
  if (!type) return values;
  HalfResult half{*type, values.shape(),
                  std::vector<uint16_t>(static_cast<size_t>(values.numel()))};
  narrow_to_half(*type, values.data(), half.bits.data(), half.bits.size());
  return half;
}

void require_finite_result(const Tensor& tensor, const std::string& option) {
  // The vectorised scan first (element by element with numel() per step, this check was 2% of an
  // n = 4096 run with 32 heads on two threads), the culprit searched for only when there is one.
  if (all_finite(tensor)) return;
  for (int64_t index = 0; index < tensor.numel(); ++index) {
    if (!std::isfinite(tensor.data()[index])) {
      throw_overflow(option, std::to_string(tensor.data()[index]), index, "float32");
    }
  }
}

void require_finite_result(const HalfResult& tensor, const std::string& option) {
  // Infinities and NaNs are the bits whose exponent field is all ones.
  const uint16_t exponent = tensor.type == HalfType::kFloat16 ? 0x7C00 : 0x7F80;
  const auto culprit =
      std::find_if(tensor.bits.begin(), tensor.bits.end(),
                   [exponent](uint16_t bits) { return (bits & exponent) == exponent; });
  if (culprit == tensor.bits.end()) return;
  const float value = half_bits_to_float(tensor.type, *culprit);
  throw_overflow(option, std::to_string(value), culprit - tensor.bits.begin(),
                 half_type_name(tensor.type));
}

void require_finite_result(const ResultTensor& tensor, const std::string& option) {
  std::visit([&](const auto& values) { require_finite_result(values, option); }, tensor);
}

// float32 values, or 16-bit words, as they are: .npy, or one tensor of a safetensors file, named
// by FILE.safetensors:NAME or else `name`.
void save_tensor(const std::string& path, const ResultTensor& tensor, const std::string& name) {
  const auto* half = std::get_if<HalfResult>(&tensor);
  if (const std::optional<SafetensorsPath> split = split_safetensors_path(path)) {
    const std::string& tensor_name = split->name.empty() ? name : split->name;
    if (half != nullptr)
      return save_safetensors_half(split->file, tensor_name, half->type, half->shape, half->bits);
    StateDict one;
    one.emplace(tensor_name, std::get<Tensor>(tensor));
    return save_safetensors(split->file, one);
  }
  if (half != nullptr) return save_npy_float16(path, half->bits, half->shape);
  save_npy(path, std::get<Tensor>(tensor));
}

}  // namespace attn::cli
