// Ring attention under mpirun (any number of ranks): each rank builds the same whole-sequence
// inputs, runs attn::scaled_dot_product_attention and its backward pass on all of them as the
// reference, then ring_attention_forward/_backward on its own shards, and compares its rows.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/random.hpp"
#include "attn/dist/collective_check.hpp"
#include "attn/dist/ring_attention.hpp"
#include "attn/dist/sequence_shards.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"
#include "test_support.hpp"

namespace attn::dist {
namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

Shape with_axis(const Shape& shape, int axis, int64_t size) {
  int64_t dims[Shape::kMaxRank];
  for (int a = 0; a < shape.rank(); ++a) dims[a] = shape[a];
  dims[axis < 0 ? axis + shape.rank() : axis] = size;
  return Shape::from_dims(dims, shape.rank());
}

// The rows of `chunks` (along axis −2 of a contiguous (..., rows, cols) array), concatenated.
std::vector<float> gather_rows(const float* data, const Shape& shape,
                               std::span<const SequenceChunk> chunks) {
  const int64_t rows = shape.dim(-2), cols = shape.dim(-1);
  const int64_t outer = rows * cols == 0 ? 0 : shape.numel() / (rows * cols);
  std::vector<float> local;
  for (int64_t o = 0; o < outer; ++o) {
    for (const SequenceChunk& chunk : chunks) {
      const float* begin = data + (o * rows + chunk.start) * cols;
      local.insert(local.end(), begin, begin + chunk.length * cols);
    }
  }
  return local;
}

Tensor shard_of(const Tensor& whole, std::span<const SequenceChunk> chunks) {
  int64_t rows = 0;
  for (const SequenceChunk& chunk : chunks) rows += chunk.length;
  return Tensor(with_axis(whole.shape(), -2, rows),
                gather_rows(whole.data(), whole.shape(), chunks));
}

// max |actual − expected| ≤ 1e−5 · max |expected|: the "within 1e−5 relative".
::testing::AssertionResult close(const std::vector<float>& actual,
                                 const std::vector<float>& expected, const std::string& what) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << what << ": " << actual.size() << " values, expected " << expected.size();
  }
  double largest = 0.0, worst = 0.0;
  size_t worst_index = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const bool both_negative_infinity = actual[i] == expected[i] && std::isinf(expected[i]);
    if (both_negative_infinity) continue;
    if (!std::isfinite(expected[i]) || !std::isfinite(actual[i])) {
      return ::testing::AssertionFailure()
             << what << "[" << i << "] = " << actual[i] << ", expected " << expected[i];
    }
    largest = std::max(largest, std::fabs(static_cast<double>(expected[i])));
    const double error = std::fabs(static_cast<double>(actual[i]) - expected[i]);
    if (error > worst) {
      worst = error;
      worst_index = i;
    }
  }
  if (worst <= 1e-5 * std::max(largest, 1e-30)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << " on rank " << world_rank() << ": max error " << worst << " at " << worst_index
         << " (" << actual[worst_index] << " vs " << expected[worst_index] << "), max |expected| "
         << largest;
}

std::vector<float> values_of(const Tensor& tensor) {
  return tensor.to_vector();
}

enum class Lengths { kNone, kPerBatch, kPerQuery };

struct RingCase {
  int rank = 4;  // of the inputs: (L, E), (B, L, E) or (B, H, L, E)
  int64_t batch = 2, heads = 4, kv_heads = 4, query_length = 37, key_length = 37;
  int64_t head_size = 16, value_size = 16;
  bool causal = false;
  DiagonalAlignment alignment = DiagonalAlignment::kTopLeft;
  int64_t diagonal_offset = 0;
  std::optional<SlidingWindow> window;
  std::optional<float> scale;
  std::optional<float> softcap;
  bool alibi = false;
  Lengths lengths = Lengths::kNone;
  Sharding sharding = Sharding::kZigZag;
  // Rank 4 only: the shards handed over as heads inside (B, L_r, H·E) arrays, through strides.
  bool split_heads = false;
  // false: scores so large (|lse| > 256) that dQ and dK, whose exact values there are nearly 0,
  // are float noise of order ulp(S) in any order of summation; they are required finite only.
  bool compare_score_gradients = true;
  uint64_t seed = 1;
};

Shape input_shape(const RingCase& c, int64_t heads, int64_t rows, int64_t size) {
  if (c.rank == 2) return Shape{rows, size};
  if (c.rank == 3) return Shape{c.batch, rows, size};
  return Shape{c.batch, heads, rows, size};
}

// A rank-4 (B, H, L, E) shard as the view (B, H, L, E) of a (B, L, H·E) array it fills.
struct SplitHeads {
  Tensor storage;
  ConstStridedView view;
};
SplitHeads split_heads(const Tensor& shard) {
  const int64_t batch = shard.dim(0), heads = shard.dim(1), rows = shard.dim(2),
                size = shard.dim(3);
  SplitHeads result{Tensor(Shape{batch, rows, heads * size}), {}};
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t e = 0; e < size; ++e) result.storage(b, i, h * size + e) = shard(b, h, i, e);
  const int64_t strides[] = {rows * heads * size, size, heads * size, 1};
  result.view = ConstStridedView(result.storage.data(), shard.shape(), strides);
  return result;
}

// A case with some fields changed from RingCase's defaults.
template <class Edit>
RingCase ring_case(Edit edit) {
  RingCase c;
  edit(c);
  return c;
}

// Runs one case on every rank and compares this rank's rows with the whole-sequence reference.
void run_case(const RingCase& c) {
  const int rank = world_rank(), ranks = world_size();
  Rng rng(c.seed);
  const Tensor query =
      testing::random_tensor(input_shape(c, c.heads, c.query_length, c.head_size), rng);
  const Tensor key =
      testing::random_tensor(input_shape(c, c.kv_heads, c.key_length, c.head_size), rng);
  const Tensor value =
      testing::random_tensor(input_shape(c, c.kv_heads, c.key_length, c.value_size), rng);
  const Tensor grad_output =
      testing::random_tensor(input_shape(c, c.heads, c.query_length, c.value_size), rng);

  AttentionOptions options;
  options.causal = c.causal;
  options.alignment = c.alignment;
  options.diagonal_offset = c.diagonal_offset;
  options.window = c.window;
  options.scale = c.scale;
  options.softcap = c.softcap;
  options.enable_gqa = c.kv_heads != c.heads;
  std::vector<float> slopes;
  if (c.alibi) {
    for (int64_t h = 0; h < c.heads; ++h) slopes.push_back(0.5F / static_cast<float>(h + 1));
    options.alibi_slopes = slopes;
  }
  const SequenceShards query_shards(c.query_length, ranks, c.sharding);
  const SequenceShards key_shards(c.key_length, ranks, c.sharding);
  AttentionOptions ring_options = options;
  if (c.lengths == Lengths::kPerBatch) {
    std::vector<int64_t> lengths;
    for (int64_t b = 0; b < c.batch; ++b)
      lengths.push_back(b == 0 ? c.key_length : (c.key_length * 2) / 5);
    options.valid_lens = ValidLengths::per_batch(lengths);
    ring_options.valid_lens = options.valid_lens;
  } else if (c.lengths == Lengths::kPerQuery) {
    std::vector<int64_t> lengths;
    for (int64_t x = 0; x < c.batch * c.query_length; ++x)
      lengths.push_back(static_cast<int64_t>(rng.uniform() * static_cast<float>(c.key_length + 1)));
    lengths[1] = 0;  // a query that sees nothing
    options.valid_lens = ValidLengths::per_query(lengths, c.batch, c.query_length);
    // This rank's queries' lengths, in its local order.
    std::vector<float> as_floats(lengths.begin(), lengths.end());
    const std::vector<float> local =
        gather_rows(as_floats.data(), Shape{c.batch, c.query_length, 1}, query_shards.chunks(rank));
    ring_options.valid_lens = ValidLengths::per_query(
        std::vector<int64_t>(local.begin(), local.end()), c.batch, query_shards.local_length(rank));
  }

  const AttentionForward whole = scaled_dot_product_attention(query, key, value, options);
  const AttentionBackward whole_grads = scaled_dot_product_attention_backward(
      query, key, value, whole.output, grad_output, whole.log_sum_exp, options);

  const Tensor q = shard_of(query, query_shards.chunks(rank));
  const Tensor k = shard_of(key, key_shards.chunks(rank));
  const Tensor v = shard_of(value, key_shards.chunks(rank));
  const Tensor g = shard_of(grad_output, query_shards.chunks(rank));
  std::optional<SplitHeads> q_split, k_split, v_split;
  ConstStridedView q_view = q, k_view = k, v_view = v;
  if (c.split_heads) {
    q_split = split_heads(q);
    k_split = split_heads(k);
    v_split = split_heads(v);
    q_view = q_split->view;
    k_view = k_split->view;
    v_view = v_split->view;
  }

  const RingAttentionForward forward =
      ring_attention_forward(MPI_COMM_WORLD, q_view, k_view, v_view, ring_options, c.sharding);
  EXPECT_TRUE(close(values_of(forward.output),
                    values_of(shard_of(whole.output, query_shards.chunks(rank))), "output"));
  const Shape lse_shape = with_axis(query.shape(), -1, 1);  // (..., H, L, 1)
  EXPECT_TRUE(close(forward.log_sum_exp,
                    gather_rows(whole.log_sum_exp.data(), lse_shape, query_shards.chunks(rank)),
                    "log_sum_exp"));

  const RingAttentionBackward grads =
      ring_attention_backward(MPI_COMM_WORLD, q_view, k_view, v_view, forward.output, g,
                              forward.log_sum_exp, ring_options, c.sharding);
  if (c.compare_score_gradients) {
    EXPECT_TRUE(close(values_of(grads.query),
                      values_of(shard_of(whole_grads.query, query_shards.chunks(rank))),
                      "grad query"));
    EXPECT_TRUE(close(values_of(grads.key),
                      values_of(shard_of(whole_grads.key, key_shards.chunks(rank))), "grad key"));
  } else {
    for (const Tensor* gradient : {&grads.query, &grads.key}) {
      for (const float x : gradient->span()) ASSERT_TRUE(std::isfinite(x));
    }
  }
  EXPECT_TRUE(close(values_of(grads.value),
                    values_of(shard_of(whole_grads.value, key_shards.chunks(rank))), "grad value"));
}

TEST(SequenceShards, ZigZagPairsEarlyAndLateChunksAndCoversEveryPosition) {
  const SequenceShards shards(37, 3);  // 6 chunks: 7, 6, 6, 6, 6, 6
  ASSERT_EQ(shards.chunks(0).size(), 2U);
  EXPECT_EQ(shards.chunks(0)[0].start, 0);
  EXPECT_EQ(shards.chunks(0)[0].length, 7);
  EXPECT_EQ(shards.chunks(0)[1].start, 31);
  EXPECT_EQ(shards.chunks(2)[0].start, 13);  // chunks 2 and 3: the middle of the sequence
  EXPECT_EQ(shards.chunks(2)[1].start, 19);
  std::vector<int> seen(37, 0);
  for (int r = 0; r < 3; ++r)
    for (const SequenceChunk& chunk : shards.chunks(r))
      for (int64_t i = 0; i < chunk.length; ++i) ++seen[static_cast<size_t>(chunk.start + i)];
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 37);
  EXPECT_EQ(shards.local_length(0) + shards.local_length(1) + shards.local_length(2), 37);
  const SequenceShards contiguous(10, 4, Sharding::kContiguous);
  EXPECT_EQ(contiguous.chunks(1)[0].start, 3);
  EXPECT_EQ(contiguous.local_length(3), 2);
  EXPECT_THROW(SequenceShards(-1, 2), ValueError);
  EXPECT_THROW(SequenceShards(8, 0), ValueError);
}

TEST(RingAttention, NoMask) {
  run_case(RingCase{});
}

TEST(RingAttention, CausalTopLeft) {
  run_case(ring_case([](RingCase& c) { c.causal = true; }));
}

TEST(RingAttention, CausalBottomRightWithMoreKeysThanQueries) {
  run_case(ring_case([](RingCase& c) {
    c.query_length = 29;
    c.key_length = 41;
    c.causal = true;
    c.alignment = DiagonalAlignment::kBottomRight;
  }));
}

TEST(RingAttention, CausalWindowAtAnOffset) {
  run_case(ring_case([](RingCase& c) {
    c.causal = true;
    c.alignment = DiagonalAlignment::kOffset;
    c.diagonal_offset = 3;
    c.window = SlidingWindow{5, 0};
  }));
}

TEST(RingAttention, TwoSidedWindow) {
  run_case(ring_case([](RingCase& c) { c.window = SlidingWindow{6, 3}; }));
}

TEST(RingAttention, ValidLengthsPerBatchWithCausal) {
  run_case(ring_case([](RingCase& c) {
    c.causal = true;
    c.lengths = Lengths::kPerBatch;
  }));
}

TEST(RingAttention, ValidLengthsPerQuery) {
  run_case(ring_case([](RingCase& c) { c.lengths = Lengths::kPerQuery; }));
}

TEST(RingAttention, GroupedQueryHeadsCausal) {
  run_case(ring_case([](RingCase& c) {
    c.heads = 4;
    c.kv_heads = 2;
    c.causal = true;
  }));
}

TEST(RingAttention, ScaleSoftcapAlibi) {
  run_case(ring_case([](RingCase& c) {
    c.causal = true;
    c.scale = 0.3F;
    c.softcap = 5.0F;
    c.alibi = true;
  }));
}

// Scores of order 1e5: the forward's float log-sum-exp is some ulps of 0.01 off the scores the
// backward computes, which moved every P of a row by 2^δ (dV 0.6% off at scale 1e4, half off at
// 1e10); the backward's base-2 round makes dV the one-process backward's, exact at any magnitude.
TEST(RingAttention, ScoresOfLargeMagnitudeGiveTheOneProcessGradients) {
  for (const float scale : {1e4F, 1e10F}) {
    run_case(ring_case([&](RingCase& c) {
      c.scale = scale;
      c.compare_score_gradients = false;
    }));
    run_case(ring_case([&](RingCase& c) {
      c.scale = scale;
      c.causal = true;
      c.kv_heads = 2;
      c.lengths = Lengths::kPerBatch;
      c.compare_score_gradients = false;
    }));
  }
}

// Keys tied at a score past float's precision, in one chunk and across ranks: each query weighs
// them alike, so its output is their values' mean. The pairs' float log-sum-exps lose log(sum)
// beside such scores (1e15 + log 2 is 1e15 in float, and the merge's sum in double an eighth):
// two keys tied at 1e15 on two ranks weighed 0.47 and 0.53, at 1e20 one took all.
TEST(RingAttention, KeysTiedAtScoresPastFloatPrecisionWeighAlike) {
  const int rank = world_rank(), ranks = world_size();
  const int64_t length = 16;
  const std::vector<int64_t> tied = {0, 1, 5, 9, 14};
  for (const float big : {1e7F, 1e15F, 1e30F}) {
    Tensor query(Shape{length, 1}), key(Shape{length, 1}), value(Shape{length, 1});
    for (int64_t j = 0; j < length; ++j) {
      query(j, 0) = 1.0F;
      key(j, 0) = std::find(tied.begin(), tied.end(), j) != tied.end() ? big : 0.0F;
      value(j, 0) = static_cast<float>(j);
    }
    const SequenceShards shards(length, ranks);
    const Tensor q = shard_of(query, shards.chunks(rank));
    const Tensor k = shard_of(key, shards.chunks(rank));
    const Tensor v = shard_of(value, shards.chunks(rank));
    AttentionOptions options;
    options.scale = 1.0F;
    const RingAttentionForward forward =
        ring_attention_forward(MPI_COMM_WORLD, q, k, v, options, Sharding::kZigZag);
    const std::vector<float> mean(static_cast<size_t>(q.dim(0)), (0 + 1 + 5 + 9 + 14) / 5.0F);
    EXPECT_TRUE(close(values_of(forward.output), mean, "output at " + std::to_string(big)));
    // The log-sum-exp is the scores' too: big + log 5, to float's rounding of big.
    for (const float lse : forward.log_sum_exp) EXPECT_NEAR(lse, big, 2e-7 * big + 1.61);
  }
}

TEST(RingAttention, ValueSizeDiffersFromHeadSize) {
  run_case(ring_case([](RingCase& c) {
    c.head_size = 16;
    c.value_size = 8;
    c.causal = true;
  }));
}

TEST(RingAttention, RankThreeInputsWithLengths) {
  run_case(ring_case([](RingCase& c) {
    c.rank = 3;
    c.causal = true;
    c.lengths = Lengths::kPerBatch;
  }));
}

TEST(RingAttention, RankTwoInputsWithWindow) {
  run_case(ring_case([](RingCase& c) {
    c.rank = 2;
    c.causal = true;
    c.window = SlidingWindow{4, 0};
  }));
}

TEST(RingAttention, FewerPositionsThanChunks) {
  // 3 positions over 2P chunks: most chunks, and with P ≥ 2 whole shards, are empty.
  run_case(ring_case([](RingCase& c) {
    c.query_length = 3;
    c.key_length = 3;
    c.causal = true;
  }));
}

TEST(RingAttention, ContiguousSharding) {
  run_case(ring_case([](RingCase& c) {
    c.causal = true;
    c.lengths = Lengths::kPerQuery;
    c.sharding = Sharding::kContiguous;
  }));
}

TEST(RingAttention, HeadsSplitFromProjectionsThroughStrides) {
  run_case(ring_case([](RingCase& c) {
    c.heads = 4;
    c.kv_heads = 2;
    c.causal = true;
    c.split_heads = true;
  }));
}

// Zig-zag under a causal mask: each rank computes 2P + 1 of its 4P pairs, the rest skipped.
TEST(RingAttention, CausalZigZagSkipsHiddenPairsAndBalancesRanks) {
  const int ranks = world_size();
  const int64_t length = 8 * ranks;
  Rng rng(5);
  const SequenceShards shards(length, ranks);
  const Tensor q = testing::random_tensor(Shape{1, 2, shards.local_length(world_rank()), 8}, rng);
  AttentionOptions options;
  options.causal = true;
  (void)ring_attention_forward(MPI_COMM_WORLD, q, q, q, options);
  const RingStatistics statistics = last_ring_statistics();
  EXPECT_EQ(statistics.pairs_computed, 2 * ranks + 1);
  EXPECT_EQ(statistics.pairs_skipped, 2 * ranks - 1);
}

// The shards of a small valid case, for the error tests to spoil on one rank.
struct Shards {
  Tensor query, key, value;
};
Shards valid_shards(int64_t heads = 2) {
  const SequenceShards shards(13, world_size());
  Rng rng(9);
  const int64_t rows = shards.local_length(world_rank());
  return {testing::random_tensor(Shape{2, heads, rows, 8}, rng),
          testing::random_tensor(Shape{2, heads, rows, 8}, rng),
          testing::random_tensor(Shape{2, heads, rows, 8}, rng)};
}

// After an error every rank must still be in step: a clean call right after it succeeds.
void expect_ranks_still_in_step() {
  const Shards shards = valid_shards();
  const RingAttentionForward forward = ring_attention_forward(
      MPI_COMM_WORLD, shards.query, shards.key, shards.value, AttentionOptions{});
  EXPECT_EQ(forward.output.shape(), shards.query.shape());
}

std::string rank_prefix(int rank) {
  return world_size() > 1 ? "rank " + std::to_string(rank) + ": " : "";
}

TEST(RingAttentionErrors, NonFiniteKeyOnTheLastRankFailsEveryRank) {
  Shards shards = valid_shards();
  const int last = world_size() - 1;
  if (world_rank() == last) shards.key.data()[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW_MESSAGE(ring_attention_forward(MPI_COMM_WORLD, shards.query, shards.key,
                                              shards.value, AttentionOptions{}),
                       ValueError, rank_prefix(last) + "key: expected finite values, got NaN");
  expect_ranks_still_in_step();
}

TEST(RingAttentionErrors, HeadsDifferingOnOneRankFailEveryRank) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  const int last = world_size() - 1;
  const Shards shards = valid_shards(world_rank() == last ? 3 : 2);
  EXPECT_THROW_MESSAGE(ring_attention_forward(MPI_COMM_WORLD, shards.query, shards.key,
                                              shards.value, AttentionOptions{}),
                       ShapeError, rank_prefix(last) + "query: expected what rank 0 has, (2, 2,");
  expect_ranks_still_in_step();
}

TEST(RingAttentionErrors, AShardOfTheWrongLengthFailsEveryRank) {
  if (world_size() == 1) GTEST_SKIP() << "one rank holds whatever length it is given";
  Rng rng(3);
  const int64_t rows = world_rank() == 0 ? 9 : 2;
  const Tensor q = testing::random_tensor(Shape{1, 1, rows, 8}, rng);
  EXPECT_THROW_MESSAGE(ring_attention_forward(MPI_COMM_WORLD, q, q, q, AttentionOptions{}),
                       ShapeError, "rows along axis -2 (this rank's zig-zag share");
  expect_ranks_still_in_step();
}

TEST(RingAttentionErrors, OptionsDifferingBetweenRanksFailEveryRank) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  const Shards shards = valid_shards();
  AttentionOptions options;
  options.causal = world_rank() == 1;
  EXPECT_THROW_MESSAGE(
      ring_attention_forward(MPI_COMM_WORLD, shards.query, shards.key, shards.value, options),
      ValueError, rank_prefix(1) + "options: expected what rank 0 has, causal=0");
  expect_ranks_still_in_step();
}

TEST(RingAttentionErrors, UnsupportedOptionsAndBadBackwardArguments) {
  const Shards shards = valid_shards();
  const std::vector<uint8_t> mask(1, 1);
  AttentionOptions options;
  options.attn_mask = AttentionMask::boolean(StridedView<const uint8_t>(mask.data(), Shape{1}));
  EXPECT_THROW_MESSAGE(
      ring_attention_forward(MPI_COMM_WORLD, shards.query, shards.key, shards.value, options),
      ValueError, "attn_mask: not available in ring attention");
  const RingAttentionForward forward = ring_attention_forward(
      MPI_COMM_WORLD, shards.query, shards.key, shards.value, AttentionOptions{});
  std::vector<float> short_lse(forward.log_sum_exp.begin(), forward.log_sum_exp.end() - 1);
  EXPECT_THROW_MESSAGE(
      ring_attention_backward(MPI_COMM_WORLD, shards.query, shards.key, shards.value,
                              forward.output, forward.output, short_lse, AttentionOptions{}),
      ShapeError, "log_sum_exp: expected");
  expect_ranks_still_in_step();
}

TEST(RingAttentionErrors, CheckOnAllRanksCarriesTheKindAndMessage) {
  const int last = world_size() - 1;
  EXPECT_THROW_MESSAGE(check_on_all_ranks(MPI_COMM_WORLD,
                                          [&] {
                                            if (world_rank() == last)
                                              throw FileError("q.npy: missing");
                                          }),
                       FileError, rank_prefix(last) + "q.npy: missing");
  EXPECT_NO_THROW(check_on_all_ranks(MPI_COMM_WORLD, [] {}));
}

// Only rank 0 prints GoogleTest's progress; the others print their failures, named by rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace attn::dist

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = attn::dist::world_rank();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new attn::dist::FailurePrinter(rank));
  }
  const int failed = RUN_ALL_TESTS();
  // One rank's failure fails the run on every rank, so mpirun's exit status reports it.
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("ring attention tests on %d ranks: %s\n", attn::dist::world_size(),
                any_failed ? "FAILED on some rank" : "passed on every rank");
  }
  MPI_Finalize();
  return any_failed;
}
