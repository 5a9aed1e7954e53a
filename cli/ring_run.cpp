// `attn run --ring`: each rank reads the headers of the .npy inputs and then only its zig-zag
// shard of their rows, runs attn::dist's ring attention forward (and backward with --out-grad),
// and rank 0 gathers the rows and writes --out and the gradients in the files' layouts.
#include "ring_run.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/dist/collective_check.hpp"
#include "attn/dist/ring_attention.hpp"
#include "attn/dist/sequence_shards.hpp"
#include "attn/io/npy.hpp"
#include "attn/io/npy_rows.hpp"
#include "command_support.hpp"
#include "progress_line.hpp"

namespace attn::cli {

namespace {

using dist::SequenceShards;

// MPI for the length of one run: initialised here unless the program already did (funneled:
// OpenMP threads compute, only this thread calls MPI), finalised on the way out.
class MpiSession {
 public:
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized == 0) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      owned_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiSession() { finalize(); }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  void finalize() {
    if (!owned_) return;
    owned_ = false;
    MPI_Finalize();
  }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  bool owned_ = false;
  int rank_ = 0;
  int size_ = 1;
};

// An error from attn::dist ("rank r: key: ...") with its flag and file named as a single-process
// run names them: "rank r: key: ... (key from --keys k.npy)".
[[noreturn]] void rethrow_ring_error(const Error& error, const RunArguments& arguments) {
  const std::string message = error.what();
  std::string prefix;
  if (message.starts_with("rank ")) {
    const size_t end = message.find(": ");
    if (end != std::string::npos) prefix = message.substr(0, end + 2);
  }
  try {
    rethrow_with_message(error, message.substr(prefix.size()));
  } catch (const Error& bare) {
    try {
      rethrow_with_sources(bare, arguments);
    } catch (const Error& named) {
      rethrow_with_message(named, prefix + named.what());
    }
  }
  throw;  // unreachable: each branch above throws
}

template <class Action>
decltype(auto) name_ring_sources(const RunArguments& arguments, Action&& action) {
  try {
    return std::forward<Action>(action)();
  } catch (const Error& error) {
    rethrow_ring_error(error, arguments);
  }
}

std::vector<NpyRowRange> row_ranges(const SequenceShards& shards, int rank) {
  std::vector<NpyRowRange> ranges;
  for (const dist::SequenceChunk& chunk : shards.chunks(rank))
    ranges.push_back({chunk.start, chunk.length});
  return ranges;
}

// FileError unless `dtype` is one a float input may have (the readers widen float16 exactly).
void require_float_data(const std::string& name, const std::string& path, NpyDType dtype) {
  if (dtype != NpyDType::kInt32 && dtype != NpyDType::kInt64 && dtype != NpyDType::kBool) return;
  throw FileError(name + " (" + path + "): expected float32, float64 or float16 data, got " +
                  (dtype == NpyDType::kBool    ? "bool"
                   : dtype == NpyDType::kInt32 ? "integer (int32)"
                                               : "integer (int64)") +
                  " data");
}

// This rank's rows (along axis −2, the sequence in both file layouts) of a float .npy file.
Tensor read_shard(const std::string& path, const std::string& name, const SequenceShards& shards,
                  int rank) {
  NpyArray array = read_npy_rows(path, -2, row_ranges(shards, rank));
  require_float_data(name, path, array.dtype);
  return Tensor(array.shape, std::move(array.floats));
}

Shape with_axis(const Shape& shape, int axis, int64_t size) {
  int64_t dims[Shape::kMaxRank];
  for (int a = 0; a < shape.rank(); ++a) dims[a] = shape[a];
  dims[axis < 0 ? axis + shape.rank() : axis] = size;
  return Shape::from_dims(dims, shape.rank());
}

// A (B, H, L, E) tensor of the functional layout in the files' (B, L, H·E) one.
Tensor merge_heads(const Tensor& heads) {
  const int64_t batch = heads.dim(0), count = heads.dim(1), rows = heads.dim(2),
                size = heads.dim(3);
  Tensor merged(Shape{batch, rows, count * size});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < count; ++h)
      for (int64_t i = 0; i < rows; ++i)
        std::copy_n(&heads(b, h, i, 0), size, &merged(b, i, h * size));
  return merged;
}

// One rank's inputs: the files' headers, its shards of their rows, and the options from the flags.
// Read in two steps, so that the headers can be compared with rank 0's before any rank cuts its
// shard from them (a rank whose file held 14 keys against rank 0's 13 read rows of neither).
class RingInputs {
 public:
  // The headers alone (shapes and types), unchecked: a rank whose file differs from rank 0's is
  // named by that file before any check of one file against another names a consequence of it.
  explicit RingInputs(const RingRunRequest& request) {
    const RunArguments& arguments = request.arguments;
    const auto read = [&](const char* flag, const std::string& path) {
      return with_context(flag, [&] { return read_npy_header(path); });
    };
    query_header_ = read("--queries", arguments.queries);
    key_header_ = read("--keys", arguments.keys);
    value_header_ = read("--values", arguments.values);
    if (request.out_grad) out_grad_header_ = read("--out-grad", *request.out_grad);
    if (arguments.valid_lens) valid_lens_header_ = read("--valid-lens", *arguments.valid_lens);
    const auto text = [](const std::optional<NpyHeader>& header) {
      return header ? file_text(*header) : std::string("none");
    };
    fields_ = {{"--queries", file_text(query_header_)},
               {"--keys", file_text(key_header_)},
               {"--values", file_text(value_header_)},
               {"--out-grad", text(out_grad_header_)},
               {"--valid-lens", text(valid_lens_header_)}};
  }

  // Each input file's shape and type, as text, for the comparison with rank 0's.
  const std::vector<std::pair<std::string, std::string>>& file_fields() const { return fields_; }

  // The headers checked as a single-process run checks them, then this rank's shards of the
  // rows, and the options.
  void read_rows(const RingRunRequest& request, int rank, int ranks) {
    const RunArguments& arguments = request.arguments;
    name_sources(arguments, [&] { check_shapes(arguments); });
    if (out_grad_header_) {
      const Shape expected = output_file_shape();
      with_context("--out-grad", [&] {
        if (out_grad_header_->shape != expected) {
          throw ShapeError(*request.out_grad + " has shape " + out_grad_header_->shape.str() +
                           ", expected the shape of the output " + expected.str() +
                           " (G is the gradient of a loss with respect to it)");
        }
      });
    }
    name_sources(arguments, [&] {
      query_shards_ = SequenceShards(query_file().dim(-2), ranks);
      key_shards_ = SequenceShards(key_file().dim(-2), ranks);
      queries_ = with_context("--queries", [&] {
        return read_shard(arguments.queries, "queries", query_shards_, rank);
      });
      keys_ = with_context("--keys",
                           [&] { return read_shard(arguments.keys, "keys", key_shards_, rank); });
      values_ = with_context(
          "--values", [&] { return read_shard(arguments.values, "values", key_shards_, rank); });
      if (arguments.valid_lens) read_valid_lens(*arguments.valid_lens, rank);
      // Finite, and a positive softcap, as read (number_check in run_command.cpp).
      if (arguments.scale) options_.scale = arguments.scale;
      if (arguments.softcap) options_.softcap = arguments.softcap;
      if (arguments.window) options_.window = parse_window(*arguments.window);
      apply_causal_and_alignment(arguments, options_);
      if (arguments.alibi) {
        Tensor slopes = with_context(
            "--alibi", [&] { return load_npy_tensor(*arguments.alibi, "alibi_slopes"); });
        if (slopes.rank() != 1 || slopes.dim(0) != query_heads_) {
          throw ShapeError("alibi_slopes: expected one slope per query head, shape (" +
                           std::to_string(query_heads_) + ",), got shape " + slopes.shape().str());
        }
        alibi_ = slopes.to_vector();
        options_.alibi_slopes = alibi_;
      }
      options_.enable_gqa = kv_heads_ != query_heads_;
    });
    if (request.out_grad) {
      grad_output_ = with_context(
          "--out-grad", [&] { return read_shard(*request.out_grad, "G", query_shards_, rank); });
    }
  }
  RingInputs(const RingInputs&) = delete;
  RingInputs& operator=(const RingInputs&) = delete;

  ConstStridedView query() const { return as_heads(queries_, query_heads_); }
  ConstStridedView key() const { return as_heads(keys_, kv_heads_); }
  ConstStridedView value() const { return as_heads(values_, kv_heads_); }
  ConstStridedView grad_output() const { return as_heads(grad_output_, query_heads_); }
  const AttentionOptions& options() const { return options_; }
  const SequenceShards& query_shards() const { return query_shards_; }
  const SequenceShards& key_shards() const { return key_shards_; }
  const Shape& query_file() const { return query_header_.shape; }
  const Shape& key_file() const { return key_header_.shape; }
  const Shape& value_file() const { return value_header_.shape; }
  // The type the results are written in: float16 when the inputs all are, else float32.
  std::optional<HalfType> stored_half() const { return stored_half_; }

  // The output file's shape: the queries' layout with the values' size per head.
  Shape output_file_shape() const {
    if (!split_heads_) return with_axis(query_file(), -1, value_file().dim(-1));
    return Shape{query_file()[0], query_file()[1], query_heads_ * (value_file()[2] / kv_heads_)};
  }
  // A functional-layout result (contiguous) in its file's layout.
  Tensor to_file_layout(const Tensor& tensor) const {
    return split_heads_ ? merge_heads(tensor) : tensor;
  }

 private:
  ConstStridedView as_heads(const Tensor& tensor, int64_t heads) const {
    return split_heads_ ? split_heads(tensor.data(), tensor.shape(), heads)
                        : ConstStridedView(tensor);
  }

  // The files' shapes from their headers, checked as a single-process run checks them.
  void check_shapes(const RunArguments& arguments) {
    // Integer or bool data named before the types are compared (integer keys beside float16
    // queries read "expected float16 data ..., got float32 or float64").
    for (const auto& [flag, name, path, header] :
         {std::tuple{"--queries", "queries", &arguments.queries, &query_header_},
          std::tuple{"--keys", "keys", &arguments.keys, &key_header_},
          std::tuple{"--values", "values", &arguments.values, &value_header_}}) {
      with_context(flag, [&] { require_float_data(name, *path, header->dtype); });
    }
    // As a single-process run: float16 files, all three, give float16 results; a mix of float16
    // and float files is refused, naming the input that differs.
    const auto half_of = [](const NpyHeader& header) {
      return header.dtype == NpyDType::kFloat16 ? std::optional<HalfType>(HalfType::kFloat16)
                                                : std::nullopt;
    };
    stored_half_ = dot_product_half_type(
        {half_of(query_header_), half_of(key_header_), half_of(value_header_)});
    const int rank = query_file().rank();
    if (rank != 3 && rank != 4) {
      throw ShapeError("queries: expected (B, n, d) or (N, H, L, E) (rank 3 or 4), got shape " +
                       query_file().str());
    }
    require_rank("keys", key_file(), rank);
    require_rank("values", value_file(), rank);
    require_dim("keys", key_file(), 0, query_file()[0], "the batch size of queries");
    require_dim("values", value_file(), 0, query_file()[0], "the batch size of queries");
    require_dim("values", value_file(), -2, key_file().dim(-2), "the number of keys");
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
      query_heads_ = query_file()[1];
      kv_heads_ = key_file()[1];
      require_dim("values", value_file(), 1, kv_heads_, "the heads of keys");
      if (kv_heads_ == 0 || query_heads_ % kv_heads_ != 0) {
        throw ShapeError("keys: expected a number of heads (axis 1) dividing the queries' " +
                         std::to_string(query_heads_) + " (grouped-query attention), got shape " +
                         key_file().str());
      }
      // Here, not in a rank's shard: the attention's own check named a shard's shape, (1, 2, 1,
      // 7) for a file of (1, 2, 6, 7).
      require_dim("keys", key_file(), -1, query_file().dim(-1), "the size of each query");
    } else if (arguments.heads) {
      query_heads_ = *arguments.heads;
      if (query_heads_ < 1) {
        throw ValueError("--heads: expected a positive number of heads, got " +
                         std::to_string(query_heads_));
      }
      kv_heads_ = arguments.kv_heads.value_or(query_heads_);
      const std::string kv_flag = arguments.kv_heads ? "--kv-heads" : "--heads";
      if (arguments.kv_heads && (kv_heads_ < 1 || query_heads_ % kv_heads_ != 0)) {
        throw ValueError("--kv-heads: expected a divisor of --heads " +
                         std::to_string(query_heads_) +
                         " (each key/value head serves --heads / --kv-heads query heads), got " +
                         std::to_string(kv_heads_));
      }
      split_heads_ = true;
      if (query_file()[2] % query_heads_ != 0) {
        throw ShapeError("queries: expected a last axis that splits into --heads " +
                         std::to_string(query_heads_) + " heads, got shape " + query_file().str());
      }
      const int64_t size = query_file()[2] / query_heads_;
      require_dim("keys", key_file(), -1, kv_heads_ * size,
                  kv_flag + " " + std::to_string(kv_heads_) + " × the queries' head size " +
                      std::to_string(size));
      if (value_file()[2] % kv_heads_ != 0) {
        throw ShapeError("values: expected a last axis that splits into " +
                         std::to_string(kv_heads_) + " heads (" + kv_flag + "), got shape " +
                         value_file().str());
      }
    } else if (arguments.kv_heads) {
      throw ValueError("--kv-heads: needs --heads (the query heads that --kv-heads " +
                       std::to_string(*arguments.kv_heads) + " key/value heads serve)");
    } else {
      require_dim("keys", key_file(), -1, query_file().dim(-1), "the size of each query");
    }
  }

  // Per batch element (B): read whole; per query (B, n): this rank's queries' columns only.
  void read_valid_lens(const std::string& path, int rank) {
    options_.valid_lens = reading_valid_lens([&] {
      const NpyHeader header = read_npy_header(path);
      // The file's shape against the whole scores', as a single-process run checks it: a rank's
      // columns of it named a shard's shapes ((1, 4) for (1, 12)).
      if (header.shape.rank() == 1 || header.shape.rank() == 2) {
        check_valid_lens_shape(header.shape, query_file(), key_file().dim(-2));
      }
      if (header.shape.rank() == 2) {
        const NpyArray lengths = read_npy_rows(path, 1, row_ranges(query_shards_, rank));
        if (!lengths.is_integer()) {
          throw FileError("valid_lens (" + path +
                          "): expected int32 or int64 valid lengths, got a float or bool dtype");
        }
        return ValidLengths::from_shape(std::span<const int64_t>(lengths.integers), lengths.shape);
      }
      return load_npy_valid_lengths(path, "valid_lens");
    });
  }

  // "(2, 13, 8) float32": what rank 0's file of the same flag must hold too.
  static std::string file_text(const NpyHeader& header) {
    // Indexed by NpyDType, in its order.
    static constexpr const char* kTypes[] = {"float32", "float64", "float16",
                                             "int32",   "int64",   "bool"};
    static_assert(static_cast<size_t>(NpyDType::kBool) + 1 == std::size(kTypes));
    return header.shape.str() + " " + kTypes[static_cast<size_t>(header.dtype)];
  }

  NpyHeader query_header_, key_header_, value_header_;
  std::optional<NpyHeader> out_grad_header_, valid_lens_header_;
  std::vector<std::pair<std::string, std::string>> fields_;
  SequenceShards query_shards_{0, 1}, key_shards_{0, 1};
  Tensor queries_, keys_, values_, grad_output_;
  bool split_heads_ = false;
  std::optional<HalfType> stored_half_;
  int64_t query_heads_ = 1, kv_heads_ = 1;
  std::vector<float> alibi_;
  AttentionOptions options_;
};

// Rank 0 receives every rank's rows (a contiguous tensor in the file's layout, the sequence on
// axis −2) and lays them out as the whole `shape`; the other ranks send theirs and get nothing.
Tensor gather_rows(const Tensor& local, const SequenceShards& shards, const Shape& shape, int rank,
                   int ranks) {
  constexpr int kTag = 7;
  // MPI's counts are ints: a rank's rows go in pieces of at most 2^30 floats, the same on both
  // sides (rows past 2^31 floats, 8.6 GB, had sent a count wrapped around), in order (messages
  // of one tag from one rank do not overtake each other).
  static constexpr int64_t kPiece = int64_t{1} << 30;
  const auto pieces = [](int64_t count, const auto& each) {
    for (int64_t at = 0; at < count; at += kPiece)
      each(at, static_cast<int>(std::min(kPiece, count - at)));
  };
  const int64_t cols = shape.dim(-1), rows = shape.dim(-2);
  const int64_t outer = rows * cols == 0 ? 0 : shape.numel() / (rows * cols);
  if (rank != 0) {
    pieces(local.numel(), [&](int64_t at, int count) {
      MPI_Send(local.data() + at, count, MPI_FLOAT, 0, kTag, MPI_COMM_WORLD);
    });
    return {};
  }
  Tensor whole(shape);
  std::vector<float> received;
  for (int r = 0; r < ranks; ++r) {
    const int64_t local_rows = shards.local_length(r);
    const float* data = local.data();
    if (r != 0) {
      received.resize(static_cast<size_t>(outer * local_rows * cols));
      pieces(static_cast<int64_t>(received.size()), [&](int64_t at, int count) {
        MPI_Recv(received.data() + at, count, MPI_FLOAT, r, kTag, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
      });
      data = received.data();
    }
    for (int64_t o = 0; o < outer; ++o) {
      int64_t row = 0;
      for (const dist::SequenceChunk& chunk : shards.chunks(r)) {
        std::copy_n(data + (o * local_rows + row) * cols, chunk.length * cols,
                    whole.data() + (o * rows + chunk.start) * cols);
        row += chunk.length;
      }
    }
  }
  return whole;
}

double slowest(double seconds) {
  double result = 0.0;
  MPI_Allreduce(&seconds, &result, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return result;
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f s", seconds);
  return text;
}

// Every file the run reads, and every file it writes (the gradients' once their folder exists),
// for the same checks as a single-process run (command_support.hpp's check_outputs).
std::vector<CommandFile> input_files(const RingRunRequest& request) {
  const RunArguments& arguments = request.arguments;
  std::vector<CommandFile> inputs = {
      {"--queries", arguments.queries}, {"--keys", arguments.keys}, {"--values", arguments.values}};
  for (const auto& [option, path] :
       {std::pair{"--valid-lens", arguments.valid_lens}, std::pair{"--alibi", arguments.alibi},
        std::pair{"--out-grad", request.out_grad}}) {
    if (path) inputs.push_back({option, *path});
  }
  return inputs;
}

std::filesystem::path gradient_path(const RingRunRequest& request, const std::string& name) {
  return std::filesystem::path(*request.grads_out) / (name + ".npy");
}

std::vector<OutputFile> output_files(const RingRunRequest& request, bool gradients) {
  // A one-process run also writes safetensors; rank 0 writes the gathered results as .npy only.
  const std::string reason = "--ring writes .npy files only";
  std::vector<OutputFile> outputs = {{"--out", request.out, OutputKind::kNpy, reason}};
  if (gradients) {
    for (const char* name : {"queries", "keys", "values"}) {
      outputs.push_back({"--grads-out (" + std::string(name) + ")", gradient_path(request, name),
                         OutputKind::kNpy, reason});
    }
  }
  return outputs;
}

// What the ranks computed together: on rank 0 the whole output and gradients, in the files'
// layouts; empty tensors elsewhere.
struct RingResults {
  Tensor output, grad_queries, grad_keys, grad_values;
  std::optional<HalfType> stored_half;  // the inputs' type, which the files are written in
  double forward_seconds = 0.0, forward_wait = 0.0, backward_seconds = 0.0;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The collective part: every rank reads and checks its shards (a failure anywhere is the same
// attn::Error on all), then the ring forward and backward passes, then the gathers to rank 0.
RingResults compute_on_every_rank(const RingRunRequest& request, const MpiSession& session) {
  const int rank = session.rank(), ranks = session.size();
  const RunArguments& arguments = request.arguments;
  std::optional<RingInputs> inputs;
  dist::check_on_all_ranks(MPI_COMM_WORLD, [&] {
    if (request.layer != "dot-product") {
      throw ValueError("--ring: only --layer dot-product runs as ring attention, got --layer " +
                       request.layer);
    }
    for (const auto& [flag, given] : {std::pair{"--mask", arguments.mask.has_value()},
                                      std::pair{"--sinks", arguments.sinks.has_value()}}) {
      if (given) {
        throw ValueError(std::string(flag) +
                         ": not available with --ring, which takes --valid-lens, --causal, "
                         "--alignment, --window, --scale, --heads/--kv-heads, --softcap and "
                         "--alibi");
      }
    }
    for (const auto& [flag, path] :
         {std::pair{"--queries", &arguments.queries}, std::pair{"--keys", &arguments.keys},
          std::pair{"--values", &arguments.values}}) {
      if (is_safetensors_path(*path)) {
        throw ValueError(std::string(flag) +
                         ": --ring reads .npy inputs (each rank reads its own rows of the file), "
                         "got the safetensors file '" +
                         *path + "'");
      }
    }
    if (!request.refused_flags.empty()) {
      throw ValueError(request.refused_flags.front() +
                       ": not available with --ring (the whole (n, m) weights are what ring "
                       "attention never holds)");
    }
    // Before any work: --out is not an input, has a .npy name in an existing folder, ... on
    // rank 0, which alone writes (on several machines the others need not have its folders: they
    // stopped the run, "rank 1: --out sub/o.npy: the folder 'sub' does not exist").
    if (rank == 0) {
      check_outputs(output_files(request, false), input_files(request));
      if (request.grads_out) check_gradients_directory(*request.grads_out);
    }
    inputs.emplace(request);
  });
  // Every rank reads the same inputs (on several machines, each one's copy of the files): a
  // file that differs from rank 0's in shape or type is named before any rank reads its rows.
  const std::optional<dist::FieldDifference> difference =
      dist::first_difference_from_root(MPI_COMM_WORLD, inputs->file_fields());
  dist::check_on_all_ranks(MPI_COMM_WORLD, [&] {
    if (difference) {
      throw ShapeError(difference->name + ": expected the array rank 0 reads, " +
                       difference->root_text + ", got " + difference->text +
                       " (every rank reads the same inputs; on several machines, each one's "
                       "copy of a file must hold the same array)");
    }
    inputs->read_rows(request, rank, ranks);
  });

  RingResults results;
  results.stored_half = inputs->stored_half();
  // Rank 0's pairs done, on its standard error (mpirun forwards it: a line every 10 s from 10 s).
  std::optional<ProgressLine> progress;
  if (rank == 0) progress.emplace("attn run --ring");
  auto start = std::chrono::steady_clock::now();
  const dist::RingAttentionForward forward = name_ring_sources(arguments, [&] {
    return dist::ring_attention_forward(MPI_COMM_WORLD, inputs->query(), inputs->key(),
                                        inputs->value(), inputs->options());
  });
  results.forward_seconds = slowest(seconds_since(start));
  results.forward_wait = slowest(dist::last_ring_statistics().wait_seconds);
  std::optional<dist::RingAttentionBackward> grads;
  if (request.out_grad) {
    start = std::chrono::steady_clock::now();
    grads = name_ring_sources(arguments, [&] {
      return dist::ring_attention_backward(MPI_COMM_WORLD, inputs->query(), inputs->key(),
                                           inputs->value(), forward.output, inputs->grad_output(),
                                           forward.log_sum_exp, inputs->options());
    });
    results.backward_seconds = slowest(seconds_since(start));
  }
  progress.reset();
  // Past the checks, a failure is one rank's alone (memory): stop every rank rather than leave
  // the others waiting for its rows.
  try {
    results.output = gather_rows(inputs->to_file_layout(forward.output), inputs->query_shards(),
                                 inputs->output_file_shape(), rank, ranks);
    if (grads) {
      results.grad_queries = gather_rows(inputs->to_file_layout(grads->query),
                                         inputs->query_shards(), inputs->query_file(), rank, ranks);
      results.grad_keys = gather_rows(inputs->to_file_layout(grads->key), inputs->key_shards(),
                                      inputs->key_file(), rank, ranks);
      results.grad_values = gather_rows(inputs->to_file_layout(grads->value), inputs->key_shards(),
                                        inputs->value_file(), rank, ranks);
    }
  } catch (const std::exception& error) {
    dist::abort_all_ranks(MPI_COMM_WORLD, std::string("gathering the results: ") + error.what());
  }
  return results;
}

// A result as its file holds it, as a single-process run writes it (PyTorch's output dtype follows
// its inputs'): rounded once to float16 when the inputs were float16 (in_stored_type), else
// float32; checked finite, naming `option`, before any file is written (an output of NaN, from
// ALiBi slopes of −1e37, was written with exit 0 where a single-process run refuses it).
ResultTensor stored_result(Tensor values, std::optional<HalfType> stored_half,
                           const std::string& option) {
  ResultTensor result = in_stored_type(stored_half, std::move(values));
  require_finite_result(result, option);
  return result;
}

// Rank 0 alone, after every collective step: a failure here cannot leave a rank waiting. Every
// file is checked before the first is written, and all are written or none (StagedOutputs, as a
// single-process run's): the gradients' directory, when this run creates it, goes again with them.
void write_results(const RingRunRequest& request, RingResults results, int ranks) {
  const bool gradients = request.out_grad.has_value();
  std::string summary = "attn run: dot-product attention as ring attention over " +
                        std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks") +
                        " (zig-zag shards), output " + results.output.shape().str() + " -> " +
                        request.out;
  std::vector<std::pair<std::string, ResultTensor>> gradient_files;
  if (gradients) {
    for (auto& [name, gradient] :
         {std::pair{"queries", &results.grad_queries}, std::pair{"keys", &results.grad_keys},
          std::pair{"values", &results.grad_values}}) {
      gradient_files.emplace_back(name, stored_result(std::move(*gradient), results.stored_half,
                                                      "--grads-out (" + std::string(name) + ")"));
    }
  }
  const ResultTensor output =
      stored_result(std::move(results.output), results.stored_half, "--out");
  write_with_gradients_directory(gradients ? *request.grads_out : std::string(), [&] {
    check_outputs(output_files(request, gradients), input_files(request));
    StagedOutputs staged;
    for (const auto& [name, gradient] : gradient_files) {
      staged.write(
          "--grads-out", gradient_path(request, name),
          [&](const std::filesystem::path& file) { save_tensor(file.string(), gradient, name); });
    }
    staged.write("--out", request.out, [&](const std::filesystem::path& file) {
      save_tensor(file.string(), output, "output");
    });
    staged.commit();
  });
  if (gradients)
    summary += ", gradients of sum(output * G) (queries, keys, values) -> " + *request.grads_out;
  summary += "; forward " + seconds_text(results.forward_seconds) + " (slowest rank, " +
             seconds_text(results.forward_wait) + " waiting for blocks)";
  if (request.out_grad) summary += ", backward " + seconds_text(results.backward_seconds);
  std::cout << summary << "\n";
}

}  // namespace

namespace {
bool started = false;
}  // namespace

bool ring_started() {
  return started;
}

void run_ring(const RingRunRequest& request) {
  started = true;
  MpiSession session;
  std::optional<RingResults> results;
  try {
    results = compute_on_every_rank(request, session);
  } catch (const Error& error) {
    // Every rank is here with the same error. Rank 0 prints it before any rank exits: Open MPI
    // ends the whole job at the first non-zero exit, which could cut rank 0 off mid-message.
    if (session.rank() == 0) std::cerr << "attn: error: " << error.what() << std::endl;
    MPI_Barrier(MPI_COMM_WORLD);
    session.finalize();
    std::exit(1);
  } catch (const std::exception& error) {
    // One rank's own failure between collective steps (memory): the others would wait for it.
    dist::abort_all_ranks(MPI_COMM_WORLD, error.what());
  }
  // MPI ends on every rank before rank 0 writes, so the others exit: a signal that stops the job
  // then reaches rank 0, whose handlers remove its staged files. While the others waited in
  // MPI_Finalize, mpirun's SIGTERM ended one of them and the job's SIGKILL took rank 0 mid-write,
  // leaving hidden full-size temporaries behind (about one interrupted run in five).
  const int rank = session.rank(), ranks = session.size();
  session.finalize();
  if (rank == 0) write_results(request, std::move(*results), ranks);
}

}  // namespace attn::cli
