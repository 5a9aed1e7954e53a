// ring_attention_forward / _backward: the checks every rank agrees on before data moves, the ring
// of non-blocking key/value transfers overlapping the functional API's calls on (query chunk, key
// chunk) pairs, pairs that masks hide skipped, and the log-sum-exp merge of partial results.
#include "attn/dist/ring_attention.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <numbers>
#include <string>
#include <tuple>
#include <utility>

#include "attn/core/error.hpp"
#include "attn/core/work_progress.hpp"
#include "attn/dist/collective_check.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"

namespace attn::dist {
namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();
constexpr float kPositiveInfinity = std::numeric_limits<float>::infinity();
// Tags on the call's own duplicate communicator: blocks travel one way, gradient partials too;
// MPI keeps messages of one tag between two ranks in order, which is all the ring relies on.
constexpr int kKeyValueTag = 1;
constexpr int kGradientTag = 2;

using Clock = std::chrono::steady_clock;
thread_local RingStatistics last_statistics;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The caller's communicator duplicated for one call, so the ring's messages can never match the
// caller's own traffic on it.
class Communicator {
 public:
  explicit Communicator(MPI_Comm comm) {
    MPI_Comm_dup(comm, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~Communicator() { MPI_Comm_free(&comm_); }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  MPI_Comm get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int left() const { return (rank_ + size_ - 1) % size_; }
  int right() const { return (rank_ + 1) % size_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

Shape with_axis(const Shape& shape, int axis, int64_t size) {
  int64_t dims[Shape::kMaxRank];
  for (int a = 0; a < shape.rank(); ++a) dims[a] = shape[a];
  dims[axis < 0 ? axis + shape.rank() : axis] = size;
  return Shape::from_dims(dims, shape.rank());
}

// The product of the axes before the last two: (..., H) of (..., H, rows, cols).
int64_t outer_size(const Shape& shape) {
  int64_t product = 1;
  for (int a = 0; a + 2 < shape.rank(); ++a) product *= shape[a];
  return product;
}

// Rows [begin, begin + count) along axis −2 of a (..., rows, cols) view, in place.
template <class T>
StridedView<T> rows_of(const StridedView<T>& view, int64_t begin, int64_t count) {
  return StridedView<T>(count > 0 ? view.data() + begin * view.stride(-2) : view.data(),
                        with_axis(view.shape(), -2, count), view.strides());
}

// Calls visit(pointer to row, flat row index) for each row along the last axis of a view of rank
// 2 to 4, in row-major order.
template <class T, class Visit>
void for_each_row(const StridedView<T>& view, const Visit& visit) {
  const int rank = view.rank();
  int64_t dims[4] = {1, 1, 1, 1}, strides[4] = {0, 0, 0, 0};
  for (int a = 0; a + 1 < rank; ++a) {
    dims[4 - rank + a] = view.shape()[a];
    strides[4 - rank + a] = view.stride(a);
  }
  int64_t row = 0;
  for (int64_t i = 0; i < dims[0]; ++i)
    for (int64_t j = 0; j < dims[1]; ++j)
      for (int64_t k = 0; k < dims[2]; ++k, ++row)
        visit(view.data() + i * strides[0] + j * strides[1] + k * strides[2], row);
}

// Copies a view of rank 2 to 4 (any strides) into contiguous floats.
void copy_contiguous(const ConstStridedView& view, float* destination) {
  const int64_t cols = view.dim(-1), stride = view.stride(-1);
  for_each_row(view, [&](const float* row, int64_t r) {
    float* out = destination + r * cols;
    for (int64_t c = 0; c < cols; ++c) out[c] = row[c * stride];
  });
}

// ValueError naming `name` and the flat index of its first NaN or ±∞; else max |x|.
float max_abs_finite(std::string_view name, const ConstStridedView& view) {
  const int64_t cols = view.dim(-1), stride = view.stride(-1);
  float largest = 0.0F;
  bool finite = true;
  for_each_row(view, [&](const float* row, int64_t) {
    for (int64_t c = 0; c < cols; ++c) {
      const float x = std::fabs(row[c * stride]);
      finite = finite && x <= std::numeric_limits<float>::max();
      largest = std::max(largest, x);
    }
  });
  if (finite) return largest;
  for_each_row(view, [&](const float* row, int64_t r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float x = row[c * stride];
      if (std::isfinite(x)) continue;
      throw ValueError(std::string(name) + ": expected finite values, got " +
                       (std::isnan(x) ? "NaN"
                        : x > 0       ? "inf"
                                      : "-inf") +
                       " at flat index " + std::to_string(r * cols + c) + " of this rank's shard");
    }
  });
  return largest;
}

// Adds (outer × rows × cols) contiguous floats into rows [offset, offset + rows) of
// (outer × total_rows × cols) contiguous floats.
void add_rows(float* destination, int64_t total_rows, int64_t offset, const float* source,
              int64_t outer, int64_t rows, int64_t cols) {
  for (int64_t o = 0; o < outer; ++o) {
    float* out = destination + (o * total_rows + offset) * cols;
    const float* in = source + o * rows * cols;
    for (int64_t x = 0; x < rows * cols; ++x) out[x] += in[x];
  }
}

// Merges one pair's partial attention (contiguous outer × rows × cols outputs, outer × rows
// log-sum-exps) into rows [offset, offset + rows) of the accumulated (outer × total_rows × cols)
// ones: lse = logaddexp(lse_a, lse_b), out = e^(lse_a − lse)·out_a + e^(lse_b − lse)·out_b — the
// online softmax's rescaling, once per block. A row with lse −∞ saw no key and adds nothing.
void merge_partial(float* output, float* log_sum_exp, int64_t total_rows, int64_t offset,
                   const float* part_output, const float* part_log_sum_exp, int64_t outer,
                   int64_t rows, int64_t cols) {
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < rows; ++i) {
      const float b = part_log_sum_exp[o * rows + i];
      if (b == kNegativeInfinity) continue;
      float& a = log_sum_exp[o * total_rows + offset + i];
      float* out = output + (o * total_rows + offset + i) * cols;
      const float* part = part_output + (o * rows + i) * cols;
      if (a == kNegativeInfinity) {
        std::copy_n(part, cols, out);
        a = b;
        continue;
      }
      const double high = std::max(a, b), low = std::min(a, b);
      const double merged = high + std::log1p(std::exp(low - high));
      const auto weight_a = static_cast<float>(std::exp(a - merged));
      const auto weight_b = static_cast<float>(std::exp(b - merged));
      for (int64_t c = 0; c < cols; ++c) out[c] = weight_a * out[c] + weight_b * part[c];
      a = static_cast<float>(merged);
    }
  }
}

// Adds a part's row denominator T_b·2^b to a row's accumulated T·2^a, kept at the larger
// exponent (a float the backward's scores meet bit for bit), the differences of floats exact in
// double: T = T·2^(a − M) + T_b·2^(b − M). Returns the two terms' shares of the new T, the weights
// of the row's old and new partial outputs.
struct DenominatorShares {
  double kept = 0.0;
  double added = 0.0;
};
DenominatorShares add_denominator(float& a, double& total, float b, double part_total) {
  const float high = std::max(a, b);
  const double kept = total * std::exp2(static_cast<double>(a) - high);
  const double added = part_total * std::exp2(static_cast<double>(b) - high);
  a = high;
  total = kept + added;
  return {kept / total, added / total};
}

// Merges one pair's base-2 log-sum-exps and row totals (scaled_dot_product_attention_log_sum_exp_
// base_two's, outer × rows) into rows [offset, offset + rows) of the accumulated ones.
void merge_base_two(float* log_sum_exp, double* totals, int64_t total_rows, int64_t offset,
                    const float* part_log_sum_exp, const float* part_totals, int64_t outer,
                    int64_t rows) {
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < rows; ++i) {
      const float b = part_log_sum_exp[o * rows + i];
      if (b == kNegativeInfinity) continue;
      add_denominator(log_sum_exp[o * total_rows + offset + i], totals[o * total_rows + offset + i],
                      b, part_totals[o * rows + i]);
    }
  }
}

// Merges one pair's partial attention with its row denominators exact (T·2^lse, as
// merge_base_two takes them) into rows [offset, offset + rows) of the accumulated ones, each
// output weighed by its denominator's share. The float natural log-sum-exps of merge_partial lose
// log(sum) beside scores past 2^24 (two keys tied at 1e15 on two ranks weighed 0.47 and 0.53;
// ALiBi slopes of −1e30 gave weights summing to 2).
void merge_partial_exact(float* output, float* log_sum_exp, double* totals, int64_t total_rows,
                         int64_t offset, const float* part_output, const float* part_log_sum_exp,
                         const float* part_totals, int64_t outer, int64_t rows, int64_t cols) {
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < rows; ++i) {
      const float b = part_log_sum_exp[o * rows + i];
      const double part_total = part_totals[o * rows + i];
      float& a = log_sum_exp[o * total_rows + offset + i];
      float* out = output + (o * total_rows + offset + i) * cols;
      if (std::isnan(b) || b == kPositiveInfinity || !std::isfinite(part_total)) {
        // Scores past float's range (ALiBi slopes near −1e37): the row is not finite, as its
        // first round's, for the callers' checks of the result; it stays so.
        std::fill_n(out, cols, std::numeric_limits<float>::quiet_NaN());
        a = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      if (b == kNegativeInfinity || !(part_total > 0.0) || std::isnan(a)) continue;
      const DenominatorShares shares =
          add_denominator(a, totals[o * total_rows + offset + i], b, part_total);
      const auto kept = static_cast<float>(shares.kept);
      const auto added = static_cast<float>(shares.added);
      const float* part = part_output + (o * rows + i) * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = kept * out[c] + added * part[c];
    }
  }
}

std::string shape_text(const Shape& shape, std::string_view rows_name) {
  std::string text = "(";
  for (int a = 0; a < shape.rank(); ++a) {
    if (a > 0) text += ", ";
    text += a == shape.rank() - 2 ? std::string(rows_name) : std::to_string(shape[a]);
  }
  return text + ")";
}

// A float spelled exactly (hexadecimal), so that ranks compare bits, not rounded decimals.
std::string exact(float value) {
  char text[32];
  std::snprintf(text, sizeof text, "%a", static_cast<double>(value));
  return text;
}

std::string alignment_name(DiagonalAlignment alignment) {
  switch (alignment) {
    case DiagonalAlignment::kTopLeft:
      return "top-left";
    case DiagonalAlignment::kBottomRight:
      return "bottom-right";
    case DiagonalAlignment::kOffset:
      return "offset";
  }
  return "?";
}

// What must agree between the ranks, as text: the shapes but for each rank's own rows, and every
// option. Text, so a difference is reported as the user would read it.
std::vector<std::pair<std::string, std::string>> agreement_fields(const ConstStridedView& query,
                                                                  const ConstStridedView& key,
                                                                  const ConstStridedView& value,
                                                                  const AttentionOptions& options,
                                                                  Sharding sharding) {
  std::string option_text = "causal=" + std::to_string(options.causal) +
                            " alignment=" + alignment_name(options.alignment) +
                            " diagonal_offset=" + std::to_string(options.diagonal_offset);
  option_text += " window=" + (options.window ? "(" + std::to_string(options.window->left) + ", " +
                                                    std::to_string(options.window->right) + ")"
                                              : std::string("none"));
  option_text += " scale=" + (options.scale ? exact(*options.scale) : std::string("default"));
  option_text += " enable_gqa=" + std::to_string(options.enable_gqa);
  option_text += " softcap=" + (options.softcap ? exact(*options.softcap) : std::string("none"));
  option_text += " alibi_slopes=[";
  for (const float slope : options.alibi_slopes) option_text += exact(slope) + " ";
  option_text += "] sharding=" + std::string(sharding_name(sharding));
  std::string lengths;
  switch (options.valid_lens.kind()) {
    case ValidLengths::Kind::kAll:
      lengths = "none";
      break;
    case ValidLengths::Kind::kPerBatch:
      lengths = "per batch element (";
      for (const int64_t length : options.valid_lens.values())
        lengths += std::to_string(length) + ",";
      lengths += ")";
      break;
    case ValidLengths::Kind::kPerQuery:
      lengths = "per query";
      break;
  }
  return {{"query", shape_text(query.shape(), "L_r")},
          {"key", shape_text(key.shape(), "S_r")},
          {"value", shape_text(value.shape(), "S_r")},
          {"options", option_text},
          {"valid_lens", lengths}};
}

// One (query chunk, key chunk) pair: where each lies in the sequence and in its shard or block.
struct Pair {
  SequenceChunk query;
  int64_t query_offset = 0;  // rows into this rank's query shard
  size_t query_index = 0;    // which of this rank's query chunks
  SequenceChunk key;
  int64_t key_offset = 0;  // rows into the key/value block
};

// Everything one call has checked and worked out.
class Ring {
 public:
  Ring(const Communicator& comm, const ConstStridedView& query, const ConstStridedView& key,
       const ConstStridedView& value, const AttentionOptions& options, Sharding sharding,
       int64_t query_length, int64_t key_length)
      : rank_(comm.rank()),
        ranks_(comm.size()),
        queries_(query_length, comm.size(), sharding),
        keys_(key_length, comm.size(), sharding),
        options_(options),
        query_shape_(query.shape()),
        key_shape_(key.shape()),
        value_shape_(value.shape()) {
    query_outer_ = outer_size(query.shape());
    kv_outer_ = outer_size(key.shape());
    head_size_ = key.dim(-1);
    value_size_ = value.dim(-1);
    switch (options.alignment) {
      case DiagonalAlignment::kTopLeft:
        global_diagonal_ = 0;
        break;
      case DiagonalAlignment::kBottomRight:
        global_diagonal_ = key_length - query_length;
        break;
      case DiagonalAlignment::kOffset:
        global_diagonal_ = options.diagonal_offset;
        break;
    }
    base_options_ = options;
    base_options_.valid_lens = ValidLengths();
    base_options_.alignment = DiagonalAlignment::kOffset;
    // The longest valid length of each local query row over the batch: a pair whose first key
    // lies at or beyond it for every row is hidden.
    const int64_t rows = query_length_local();
    row_lengths_.assign(static_cast<size_t>(rows), key_length);
    if (!options.valid_lens.is_all()) {
      const int64_t batch = query.dim(0);
      for (int64_t i = 0; i < rows; ++i) {
        int64_t longest = 0;
        for (int64_t b = 0; b < batch; ++b)
          longest = std::max(longest, options.valid_lens.length(b, i, key_length));
        row_lengths_[static_cast<size_t>(i)] = longest;
      }
    }
  }

  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  int64_t query_length_local() const { return queries_.local_length(rank_); }
  int64_t key_length() const { return keys_.length(); }
  int64_t query_outer() const { return query_outer_; }
  int64_t kv_outer() const { return kv_outer_; }
  int64_t head_size() const { return head_size_; }
  int64_t value_size() const { return value_size_; }

  // Floats of rank `owner`'s key/value block: its keys, then its values, each contiguous.
  int64_t block_floats(int owner) const {
    return kv_outer_ * keys_.local_length(owner) * (head_size_ + value_size_);
  }
  int64_t max_block_floats() const {
    return kv_outer_ * keys_.max_local_length() * (head_size_ + value_size_);
  }
  ConstStridedView block_keys(const float* block, int owner) const {
    return {block, with_axis(key_shape_, -2, keys_.local_length(owner))};
  }
  ConstStridedView block_values(const float* block, int owner) const {
    const int64_t rows = keys_.local_length(owner);
    return {block + kv_outer_ * rows * head_size_, with_axis(value_shape_, -2, rows)};
  }

  // The (query chunk, key chunk) pairs of this rank's queries against `owner`'s block.
  std::vector<Pair> pairs(int owner) const {
    std::vector<Pair> result;
    int64_t query_offset = 0;
    const std::span<const SequenceChunk> query_chunks = queries_.chunks(rank_);
    for (size_t index = 0; index < query_chunks.size(); ++index) {
      int64_t key_offset = 0;
      for (const SequenceChunk& k : keys_.chunks(owner)) {
        result.push_back({query_chunks[index], query_offset, index, k, key_offset});
        key_offset += k.length;
      }
      query_offset += query_chunks[index].length;
    }
    return result;
  }

  // Whether some query of the pair sees some key of it: causal, the window and valid lengths
  // bound each query row's keys to one interval; a pair none of whose rows meets its keys is
  // skipped, exactly as the kernels would have hidden every score of it.
  bool visible(const Pair& pair) const {
    if (pair.query.length == 0 || pair.key.length == 0) return false;
    const SlidingWindow window = options_.window.value_or(SlidingWindow{}).bounded();
    const int64_t left = window.left, right = window.right;
    for (int64_t i = 0; i < pair.query.length; ++i) {
      const int64_t diagonal = pair.query.start + i + global_diagonal_;
      int64_t first = pair.key.start;
      int64_t last = std::min(pair.key.start + pair.key.length,
                              row_lengths_[static_cast<size_t>(pair.query_offset + i)]) -
                     1;
      if (options_.causal) last = std::min(last, diagonal);
      if (right >= 0) last = std::min(last, diagonal + right);
      if (left >= 0) first = std::max(first, diagonal - left);
      if (first <= last) return true;
    }
    return false;
  }

  // The functional API's options for one pair: the diagonal placed by offset (query i of the
  // chunk sits at query.start + i, key j of the block's chunk at key.start + j), valid lengths
  // made block-local, clamp(length − key.start, 0, key.length).
  AttentionOptions pair_options(const Pair& pair) const {
    AttentionOptions options = base_options_;
    options.diagonal_offset = global_diagonal_ + pair.query.start - pair.key.start;
    // The backward's log-sum-exp is the whole row's (over every block's keys).
    options.log_sum_exp_spans_more_keys = true;
    const ValidLengths& lengths = options_.valid_lens;
    const auto local = [&](int64_t length) {
      return std::clamp<int64_t>(length - pair.key.start, 0, pair.key.length);
    };
    if (lengths.kind() == ValidLengths::Kind::kPerBatch) {
      std::vector<int64_t> values;
      for (const int64_t length : lengths.values()) values.push_back(local(length));
      options.valid_lens = ValidLengths::per_batch(std::move(values));
    } else if (lengths.kind() == ValidLengths::Kind::kPerQuery) {
      const int64_t batch = query_shape_[0];
      std::vector<int64_t> values(static_cast<size_t>(batch * pair.query.length));
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < pair.query.length; ++i)
          values[static_cast<size_t>(b * pair.query.length + i)] =
              local(lengths.length(b, pair.query_offset + i, key_length()));
      options.valid_lens = ValidLengths::per_query(std::move(values), batch, pair.query.length);
    }
    return options;
  }

  // The first query chunk against the first key chunk, one row each: a call of the functional API
  // on a few floats that checks everything the pair calls will meet (shapes, heads, options).
  Pair probe_pair() const {
    const SequenceChunk q = queries_.chunks(rank_)[0], k = keys_.chunks(rank_)[0];
    return {{q.start, std::min<int64_t>(1, query_length_local())},
            0,
            0,
            {k.start, std::min<int64_t>(1, keys_.local_length(rank_))},
            0};
  }

 private:
  int rank_, ranks_;
  SequenceShards queries_, keys_;
  const AttentionOptions& options_;
  AttentionOptions base_options_;
  Shape query_shape_, key_shape_, value_shape_;
  int64_t query_outer_ = 1, kv_outer_ = 1, head_size_ = 0, value_size_ = 0;
  int64_t global_diagonal_ = 0;
  std::vector<int64_t> row_lengths_;
};

// For the backward pass: the forward pass's results for this rank's queries, checked alongside.
struct SavedForward {
  ConstStridedView output;
  ConstStridedView grad_output;
  std::span<const float> log_sum_exp;
};

// Checks every argument on every rank before anything moves (see the header) and returns the
// ring they describe; throws the same attn::Error on every rank when any rank's check fails.
Ring prepare_ring(const Communicator& comm, const ConstStridedView& query,
                  const ConstStridedView& key, const ConstStridedView& value,
                  const AttentionOptions& options, Sharding sharding,
                  const SavedForward* saved = nullptr) {
  const auto rows = [](const ConstStridedView& view) {
    return view.rank() >= 2 ? view.dim(-2) : int64_t{0};
  };
  // The whole sequences' lengths, and rank 0's shapes and options to compare with.
  long long local[2] = {static_cast<long long>(rows(query)), static_cast<long long>(rows(key))};
  long long total[2] = {0, 0};
  MPI_Allreduce(local, total, 2, MPI_LONG_LONG, MPI_SUM, comm.get());
  const auto fields = agreement_fields(query, key, value, options, sharding);
  const std::optional<FieldDifference> difference = first_difference_from_root(comm.get(), fields);

  float maxima[2] = {0.0F, 0.0F};
  check_on_all_ranks(comm.get(), [&] {
    for (const auto& [name, view] :
         {std::pair{"query", &query}, std::pair{"key", &key}, std::pair{"value", &value}}) {
      if (view->rank() < 2 || view->rank() > 4) {
        throw ShapeError(std::string(name) +
                         ": ring attention takes (L, E), (B, L, E) or (B, H, L, E) shards "
                         "(rank 2 to 4), got shape " +
                         view->shape().str());
      }
    }
    if (key.rank() != query.rank() || value.rank() != query.rank()) {
      throw ShapeError("key, value: expected the query's rank " + std::to_string(query.rank()) +
                       ", got shapes " + key.shape().str() + " and " + value.shape().str());
    }
    if (options.attn_mask.has_value() || !options.sinks.empty() || options.dropout != 0.0F) {
      const char* name = options.attn_mask.has_value() ? "attn_mask"
                         : !options.sinks.empty()      ? "sinks"
                                                       : "dropout";
      throw ValueError(std::string(name) +
                       ": not available in ring attention (which takes valid lengths, causal, "
                       "windows, scale, grouped heads, softcap and ALiBi)");
    }
    if (difference) {
      const std::string message = difference->name + ": expected what rank 0 has, " +
                                  difference->root_text + ", got " + difference->text +
                                  " (every rank holds the same axes but its own rows, with "
                                  "the same options)";
      if (difference->name == "options" || difference->name == "valid_lens") {
        throw ValueError(message);
      }
      throw ShapeError(message);
    }
    // The whole sequence's distances: a block pair's call checks only its own.
    check_alibi_slope_range(options.alibi_slopes, total[0] + total[1]);
    const SequenceShards query_shards(total[0], comm.size(), sharding);
    const SequenceShards key_shards(total[1], comm.size(), sharding);
    for (const auto& [name, view, shards, whole] :
         {std::tuple{"query", &query, &query_shards, "L"},
          std::tuple{"key", &key, &key_shards, "S"},
          std::tuple{"value", &value, &key_shards, "S"}}) {
      const int64_t expected = shards->local_length(comm.rank());
      if (view->dim(-2) != expected) {
        throw ShapeError(std::string(name) + ": expected " + std::to_string(expected) +
                         " rows along axis -2 (this rank's " +
                         std::string(sharding_name(sharding)) + " share of " + whole + " = " +
                         std::to_string(shards->length()) + " over " + std::to_string(comm.size()) +
                         " ranks), got shape " + view->shape().str());
      }
    }
    const int64_t blocks =
        outer_size(key.shape()) * key_shards.max_local_length() * (key.dim(-1) + value.dim(-1));
    if (blocks > INT_MAX) {
      throw ShapeError("key, value: a block of " + std::to_string(blocks) +
                       " floats exceeds one MPI message (2^31 - 1 elements); use more ranks");
    }
    if (!options.valid_lens.is_all()) {
      if (query.rank() < 3) {
        throw ValueError(
            "valid_lens: expected inputs of rank 3 or more (their first axis is the batch), got "
            "rank 2");
      }
      if (query.rank() == 3 && options.enable_gqa && query.dim(0) != key.dim(0)) {
        throw ValueError(
            "valid_lens: not available with enable_gqa on rank-3 inputs, whose first axis holds "
            "heads; give (N, H, L, E) inputs instead");
      }
      options.valid_lens.check("valid_lens", query.dim(0), query.dim(-2), total[1]);
    }
    const Ring ring(comm, query, key, value, options, sharding, total[0], total[1]);
    const Pair probe = ring.probe_pair();
    scaled_dot_product_attention(rows_of(query, 0, probe.query.length),
                                 rows_of(key, 0, probe.key.length),
                                 rows_of(value, 0, probe.key.length), ring.pair_options(probe));
    maxima[0] = max_abs_finite("query", query);
    maxima[1] = max_abs_finite("key", key);
    max_abs_finite("value", value);
    if (saved != nullptr) {
      const Shape expected = with_axis(query.shape(), -1, value.dim(-1));
      for (const auto& [name, view] :
           {std::pair{"output", &saved->output}, std::pair{"grad_output", &saved->grad_output}}) {
        if (view->shape() != expected) {
          throw ShapeError(std::string(name) + ": expected shape " + expected.str() +
                           " (the query shard's with the value's last axis), got " +
                           view->shape().str());
        }
        max_abs_finite(name, *view);
      }
      const int64_t expected_size = outer_size(query.shape()) * query.dim(-2);
      if (static_cast<int64_t>(saved->log_sum_exp.size()) != expected_size) {
        throw ShapeError("log_sum_exp: expected " + std::to_string(expected_size) +
                         " values (one per query row of this rank), got " +
                         std::to_string(saved->log_sum_exp.size()));
      }
    }
  });
  // Scores pair every rank's queries with every rank's keys: the functional API's overflow bound
  // |scale|·E·max|q|·max|k| on the largest of them all, so that no pair call can fail mid-ring.
  float global[2] = {0.0F, 0.0F};
  MPI_Allreduce(maxima, global, 2, MPI_FLOAT, MPI_MAX, comm.get());
  const double scale =
      options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(query.dim(-1)));
  const double bound =
      std::fabs(scale) * static_cast<double>(query.dim(-1)) * global[0] * global[1];
  if (bound >= 1e37) {
    throw ValueError("query, key: scores could overflow float32 (|scale|·E·max|q|·max|k| = " +
                     std::to_string(bound) + " over every rank's shards); scale the inputs down");
  }
  return Ring(comm, query, key, value, options, sharding, total[0], total[1]);
}

// Lets MPI move the blocks in flight while this rank computes (a library without a progress
// thread advances transfers only inside MPI calls).
void progress(std::span<MPI_Request> requests) {
  if (requests.empty()) return;
  int done = 0;
  MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
}

void wait(std::span<MPI_Request> requests, RingStatistics& statistics) {
  const auto start = Clock::now();
  MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  statistics.wait_seconds += seconds_since(start);
}

// A pass's pairs as the tasks of its work (attn::WorkProgress: attn run --ring's progress line):
// planned when the pass starts, each done as it is computed. A pair's own kernel tasks are counted
// apart, under a WorkProgress of its own that nobody reads, so that a watcher sees pairs, not the
// kernel calls that each pair starts again.
class PairsProgress {
 public:
  PairsProgress(const Ring& ring, const char* work) {
    int64_t visible = 0;
    for (int owner = 0; owner < ring.ranks(); ++owner) {
      for (const Pair& pair : ring.pairs(owner)) visible += ring.visible(pair) ? 1 : 0;
    }
    core_detail::note_tasks_planned(visible, work);
  }
  template <typename Compute>
  void run(Compute&& compute) const {
    {
      const WorkProgress kernel_tasks;
      std::forward<Compute>(compute)();
    }
    core_detail::note_task_done();
  }
};

// Every rank's key/value block passes this rank once, in ring order, the next one arriving from the
// left while the current one goes right; `compute(pair, keys, values)` runs on each pair of this
// rank's query chunks and the block's key chunks that some query sees (the others are skipped),
// each a task of `work` (PairsProgress).
template <typename ComputePair>
void visit_every_block(const Communicator& ring_comm, const Ring& ring, ConstStridedView key,
                       ConstStridedView value, RingStatistics& statistics, const char* work,
                       ComputePair compute) {
  const int rank = ring.rank(), ranks = ring.ranks();
  const PairsProgress pairs_progress(ring, work);
  // Two blocks: the one being computed (and sent on), the one arriving.
  std::vector<float> current(static_cast<size_t>(ring.max_block_floats()));
  std::vector<float> next(current.size());
  copy_contiguous(key, current.data());
  copy_contiguous(value, current.data() + ring.kv_outer() * key.dim(-2) * ring.head_size());
  for (int step = 0; step < ranks; ++step) {
    const int owner = (rank - step + ranks) % ranks;
    std::array<MPI_Request, 2> requests{MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    const bool more = step + 1 < ranks;
    if (more) {
      const int incoming = (owner - 1 + ranks) % ranks;
      MPI_Irecv(next.data(), static_cast<int>(ring.block_floats(incoming)), MPI_FLOAT,
                ring_comm.left(), kKeyValueTag, ring_comm.get(), &requests[0]);
      MPI_Isend(current.data(), static_cast<int>(ring.block_floats(owner)), MPI_FLOAT,
                ring_comm.right(), kKeyValueTag, ring_comm.get(), &requests[1]);
      // A first poll at once: a large message's rendezvous starts only inside an MPI call.
      progress(requests);
    }
    const ConstStridedView keys = ring.block_keys(current.data(), owner);
    const ConstStridedView values = ring.block_values(current.data(), owner);
    for (const Pair& pair : ring.pairs(owner)) {
      if (!ring.visible(pair)) {
        ++statistics.pairs_skipped;
        continue;
      }
      const auto start = Clock::now();
      pairs_progress.run([&] { compute(pair, keys, values); });
      ++statistics.pairs_computed;
      statistics.compute_seconds += seconds_since(start);
      if (more) progress(requests);
    }
    if (more) {
      wait(requests, statistics);
      std::swap(current, next);
    }
  }
}

// A block pair's failure (an overflow the functional API names: a result past float's range)
// held until the ring is done: the rank passes on the blocks it owes without computing more
// pairs, and then every rank throws the lowest failing rank's error (report). Thrown at once it
// aborted the job from the failing rank alone, each rank printing its own copy.
class DeferredFailure {
 public:
  template <typename Action>
  void run(Action&& action) {
    if (failure_) return;
    try {
      std::forward<Action>(action)();
    } catch (const std::exception&) {
      failure_ = std::current_exception();
    }
  }
  // Collective: every rank calls it.
  void report(MPI_Comm comm) const {
    check_on_all_ranks(comm, [&] {
      if (failure_) std::rethrow_exception(failure_);
    });
  }

 private:
  std::exception_ptr failure_;
};

// Whether some rank's forward log-sum-exp is beyond float's precision
// (log_sum_exp_beyond_float_precision): the backward then takes base-2 log-sum-exps recomputed
// from its own scores.
bool some_log_sum_exp_loses_precision(const Communicator& ring_comm,
                                      std::span<const float> log_sum_exp) {
  const int local = log_sum_exp_beyond_float_precision(log_sum_exp) ? 1 : 0;
  int any = 0;
  MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_LOR, ring_comm.get());
  return any != 0;
}

}  // namespace

RingStatistics last_ring_statistics() {
  return last_statistics;
}

RingAttentionForward ring_attention_forward(MPI_Comm comm, ConstStridedView query,
                                            ConstStridedView key, ConstStridedView value,
                                            const AttentionOptions& options, Sharding sharding) {
  const Communicator ring_comm(comm);
  const Ring ring = prepare_ring(ring_comm, query, key, value, options, sharding);
  const int64_t rows = ring.query_length_local(), outer = ring.query_outer();
  const int64_t cols = ring.value_size();

  RingAttentionForward result;
  result.output = Tensor(with_axis(query.shape(), -1, cols));
  result.log_sum_exp.assign(static_cast<size_t>(outer * rows), kNegativeInfinity);
  RingStatistics statistics;
  DeferredFailure failure;
  // Where some row's log-sum-exp is past float's precision (|lse| > 256), the pairs' float
  // log-sum-exps weigh them inexactly: a second round merges every pair again by its exact
  // denominator (merge_partial_exact), as the backward takes its base-2 log-sum-exps.
  std::vector<float> part_output, part_log_sum_exp, part_totals, base_two;
  std::vector<double> totals;
  const auto forward_pair = [&](const Pair& pair, ConstStridedView keys, ConstStridedView values,
                                bool exact) {
    const int64_t q_rows = pair.query.length;
    part_output.resize(static_cast<size_t>(outer * q_rows * cols));
    part_log_sum_exp.resize(static_cast<size_t>(outer * q_rows));
    const ConstStridedView q = rows_of(query, pair.query_offset, q_rows);
    const ConstStridedView k = rows_of(keys, pair.key_offset, pair.key.length);
    const ConstStridedView v = rows_of(values, pair.key_offset, pair.key.length);
    const AttentionOptions pair_options = ring.pair_options(pair);
    scaled_dot_product_attention(
        q, k, v, pair_options,
        MutableStridedView(part_output.data(), with_axis(q.shape(), -1, cols)),
        exact ? std::span<float>() : std::span<float>(part_log_sum_exp));
    if (!exact) {
      merge_partial(result.output.data(), result.log_sum_exp.data(), rows, pair.query_offset,
                    part_output.data(), part_log_sum_exp.data(), outer, q_rows, cols);
      return;
    }
    part_totals.resize(part_log_sum_exp.size());
    scaled_dot_product_attention_log_sum_exp_base_two(q, k, v, pair_options, part_log_sum_exp,
                                                      part_totals);
    merge_partial_exact(result.output.data(), base_two.data(), totals.data(), rows,
                        pair.query_offset, part_output.data(), part_log_sum_exp.data(),
                        part_totals.data(), outer, q_rows, cols);
  };
  const auto round = [&](const char* work, bool exact) {
    try {
      if (exact) {  // (memory refused here is one rank's failure: inside, so the others do not
                    // wait)
        base_two.assign(result.log_sum_exp.size(), kNegativeInfinity);
        totals.assign(base_two.size(), 0.0);
      }
      visit_every_block(ring_comm, ring, key, value, statistics, work,
                        [&](const Pair& pair, ConstStridedView keys, ConstStridedView values) {
                          failure.run([&] { forward_pair(pair, keys, values, exact); });
                        });
    } catch (const std::exception& error) {
      abort_all_ranks(ring_comm.get(), std::string("ring attention forward: ") + error.what());
    }
    failure.report(ring_comm.get());
  };
  round("ring attention forward", false);
  if (some_log_sum_exp_loses_precision(ring_comm, result.log_sum_exp)) {
    std::fill(result.output.data(), result.output.data() + result.output.numel(), 0.0F);
    round("ring attention forward, exact merge", true);
    for (size_t row = 0; row < base_two.size(); ++row) {
      if (base_two[row] == kNegativeInfinity) continue;
      result.log_sum_exp[row] = static_cast<float>(
          (static_cast<double>(base_two[row]) + std::log2(totals[row])) * std::numbers::ln2);
    }
  }
  last_statistics = statistics;
  return result;
}

RingAttentionBackward ring_attention_backward(MPI_Comm comm, ConstStridedView query,
                                              ConstStridedView key, ConstStridedView value,
                                              ConstStridedView output, ConstStridedView grad_output,
                                              std::span<const float> log_sum_exp,
                                              const AttentionOptions& options, Sharding sharding) {
  const Communicator ring_comm(comm);
  const SavedForward saved{output, grad_output, log_sum_exp};
  const Ring ring = prepare_ring(ring_comm, query, key, value, options, sharding, &saved);
  const int rank = ring.rank(), ranks = ring.ranks();
  const int64_t rows = ring.query_length_local(), outer = ring.query_outer();
  const int64_t kv_outer = ring.kv_outer(), head = ring.head_size(), cols = ring.value_size();

  RingAttentionBackward result;
  result.query = Tensor(query.shape());
  RingStatistics statistics;
  // At scores beyond about ±1e4 the forward's float log-sum-exp sits a few of its ulps away from
  // the scores the backward computes, which moves P by 2^δ: a first round of the ring then takes
  // each row's log-sum-exp in base 2 from the very scores the backward computes, and the row's
  // total at it, which divides the row of grad_output (as the one-process backward does).
  const bool base_two = some_log_sum_exp_loses_precision(ring_comm, log_sum_exp);
  std::vector<float> base_two_log_sum_exp;
  Tensor grad_output_over_totals;
  DeferredFailure failure;
  try {
    if (base_two) {
      base_two_log_sum_exp.assign(static_cast<size_t>(outer * rows), kNegativeInfinity);
      std::vector<double> totals(base_two_log_sum_exp.size(), 0.0);
      std::vector<float> part_log_sum_exp, part_totals;
      visit_every_block(
          ring_comm, ring, key, value, statistics, "ring attention backward, log-sum-exps",
          [&](const Pair& pair, ConstStridedView keys, ConstStridedView values) {
            failure.run([&] {
              const int64_t q_rows = pair.query.length;
              part_log_sum_exp.resize(static_cast<size_t>(outer * q_rows));
              part_totals.resize(part_log_sum_exp.size());
              scaled_dot_product_attention_log_sum_exp_base_two(
                  rows_of(query, pair.query_offset, q_rows),
                  rows_of(keys, pair.key_offset, pair.key.length),
                  rows_of(values, pair.key_offset, pair.key.length), ring.pair_options(pair),
                  part_log_sum_exp, part_totals);
              merge_base_two(base_two_log_sum_exp.data(), totals.data(), rows, pair.query_offset,
                             part_log_sum_exp.data(), part_totals.data(), outer, q_rows);
            });
          });
      grad_output_over_totals = Tensor(grad_output.shape());
      copy_contiguous(grad_output, grad_output_over_totals.data());
      for (int64_t row = 0; row < outer * rows; ++row) {
        const double total = totals[static_cast<size_t>(row)];
        if (!(total > 0.0) || total == 1.0) continue;  // a row that sees nothing, or exact
        float* values = grad_output_over_totals.data() + row * cols;
        for (int64_t c = 0; c < cols; ++c)
          values[c] = static_cast<float>(static_cast<double>(values[c]) / total);
      }
      grad_output = grad_output_over_totals;
      log_sum_exp = base_two_log_sum_exp;
    }
    std::vector<float> current(static_cast<size_t>(ring.max_block_floats()));
    std::vector<float> next(current.size());
    copy_contiguous(key, current.data());
    copy_contiguous(value, current.data() + kv_outer * key.dim(-2) * head);
    // dK and dV of a block, laid out as the block: this rank's share (contribution), the share
    // of the ranks before it (incoming), and the sum sent on (outgoing, until its send is done).
    std::vector<float> contribution(current.size()), incoming(current.size()),
        outgoing(current.size());
    MPI_Request outgoing_request = MPI_REQUEST_NULL;
    // The forward pass's log-sum-exp (or the base-2 one) of each query chunk, contiguous as the
    // API takes it.
    std::vector<std::vector<float>> chunk_log_sum_exp;
    for (const Pair& pair : ring.pairs(rank)) {
      if (pair.query_index < chunk_log_sum_exp.size()) continue;  // one per query chunk
      std::vector<float>& chunk = chunk_log_sum_exp.emplace_back();
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < pair.query.length; ++i)
          chunk.push_back(log_sum_exp[static_cast<size_t>(o * rows + pair.query_offset + i)]);
    }
    Tensor grad_query, grad_key, grad_value;
    const PairsProgress pairs_progress(ring, "ring attention backward");
    for (int step = 0; step < ranks; ++step) {
      const int owner = (rank - step + ranks) % ranks;
      const int64_t block_rows = ring.block_keys(current.data(), owner).dim(-2);
      const int64_t key_floats = kv_outer * block_rows * head;
      std::array<MPI_Request, 3> requests{MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
      const bool more = step + 1 < ranks;
      if (more) {
        const int previous = (owner - 1 + ranks) % ranks;
        MPI_Irecv(next.data(), static_cast<int>(ring.block_floats(previous)), MPI_FLOAT,
                  ring_comm.left(), kKeyValueTag, ring_comm.get(), &requests[0]);
        MPI_Isend(current.data(), static_cast<int>(ring.block_floats(owner)), MPI_FLOAT,
                  ring_comm.right(), kKeyValueTag, ring_comm.get(), &requests[1]);
      }
      // The ranks before this one (owner, owner + 1, ...) sent their dK/dV of this block on.
      if (step > 0) {
        MPI_Irecv(incoming.data(), static_cast<int>(ring.block_floats(owner)), MPI_FLOAT,
                  ring_comm.left(), kGradientTag, ring_comm.get(), &requests[2]);
      }
      progress(requests);
      std::fill_n(contribution.begin(), ring.block_floats(owner), 0.0F);
      const ConstStridedView keys = ring.block_keys(current.data(), owner);
      const ConstStridedView values = ring.block_values(current.data(), owner);
      for (const Pair& pair : ring.pairs(owner)) {
        if (!ring.visible(pair)) {
          ++statistics.pairs_skipped;
          continue;
        }
        const auto start = Clock::now();
        pairs_progress.run([&] {
          failure.run([&] {
            const int64_t q_rows = pair.query.length, k_rows = pair.key.length;
            const ConstStridedView q = rows_of(query, pair.query_offset, q_rows);
            const ConstStridedView k = rows_of(keys, pair.key_offset, k_rows);
            const ConstStridedView v = rows_of(values, pair.key_offset, k_rows);
            if (grad_query.shape() != q.shape()) grad_query = Tensor(q.shape());
            if (grad_key.shape() != k.shape()) grad_key = Tensor(k.shape());
            if (grad_value.shape() != v.shape()) grad_value = Tensor(v.shape());
            // FlashAttention-2's backward decomposes over key blocks given the whole sequence's
            // output and log-sum-exp: this pair's exact share of dQ, and its queries' exact share
            // of this block's dK and dV.
            AttentionOptions pair_options = ring.pair_options(pair);
            pair_options.log_sum_exp_recomputed_base_two = base_two;
            scaled_dot_product_attention_backward(q, k, v,
                                                  rows_of(output, pair.query_offset, q_rows),
                                                  rows_of(grad_output, pair.query_offset, q_rows),
                                                  chunk_log_sum_exp[pair.query_index], pair_options,
                                                  grad_query, grad_key, grad_value);
            add_rows(result.query.data(), rows, pair.query_offset, grad_query.data(), outer, q_rows,
                     head);
            add_rows(contribution.data(), block_rows, pair.key_offset, grad_key.data(), kv_outer,
                     k_rows, head);
            add_rows(contribution.data() + key_floats, block_rows, pair.key_offset,
                     grad_value.data(), kv_outer, k_rows, cols);
          });
        });
        ++statistics.pairs_computed;
        statistics.compute_seconds += seconds_since(start);
        progress(requests);
        progress(std::span(&outgoing_request, 1));
      }
      if (step > 0) {
        wait(std::span(requests.data() + 2, 1), statistics);
        const int64_t floats = ring.block_floats(owner);
        for (int64_t x = 0; x < floats; ++x) {
          contribution[static_cast<size_t>(x)] += incoming[static_cast<size_t>(x)];
        }
      }
      if (ranks > 1) {
        // The sum so far goes on to the next rank; the last one to see the block (its owner's
        // left neighbour) sends it home.
        wait(std::span(&outgoing_request, 1), statistics);
        std::swap(outgoing, contribution);
        MPI_Isend(outgoing.data(), static_cast<int>(ring.block_floats(owner)), MPI_FLOAT,
                  ring_comm.right(), kGradientTag, ring_comm.get(), &outgoing_request);
      }
      if (more) {
        wait(std::span(requests.data(), 2), statistics);
        std::swap(current, next);
      }
    }
    // This rank's own block comes home with every rank's share summed.
    const std::vector<float>* finished = &contribution;
    if (ranks > 1) {
      MPI_Request home = MPI_REQUEST_NULL;
      MPI_Irecv(incoming.data(), static_cast<int>(ring.block_floats(rank)), MPI_FLOAT,
                ring_comm.left(), kGradientTag, ring_comm.get(), &home);
      wait(std::span(&home, 1), statistics);
      wait(std::span(&outgoing_request, 1), statistics);
      finished = &incoming;
    }
    const int64_t key_floats = kv_outer * key.dim(-2) * head;
    result.key =
        Tensor(key.shape(), std::vector<float>(finished->begin(), finished->begin() + key_floats));
    result.value = Tensor(value.shape(), std::vector<float>(finished->begin() + key_floats,
                                                            finished->begin() + key_floats +
                                                                kv_outer * key.dim(-2) * cols));
  } catch (const std::exception& error) {
    abort_all_ranks(ring_comm.get(), std::string("ring attention backward: ") + error.what());
  }
  failure.report(ring_comm.get());
  last_statistics = statistics;
  return result;
}

}  // namespace attn::dist
