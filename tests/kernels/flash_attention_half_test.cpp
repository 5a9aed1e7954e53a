// The fused forward and backward kernels on fp16 and bf16 inputs, on every SIMD target this
// machine runs: against the double reference on the same rounded inputs (shapes with tails, odd
// depths, grouped heads, causal, windows with odd first keys, lengths 0 and m, sinks,
// soft-capping, bool masks, large scores, dropout), and, where the kernel widens to fp32,
// bit-equal to the fp32 kernel on widened inputs.
#include <gtest/gtest.h>
#include <hwy/targets.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <utility>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/half.hpp"
#include "attn/core/tensor_allocator.hpp"
#include "attn/kernels/amx.hpp"
#include "attn/kernels/bfloat16_dot.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "every_simd_target.hpp"
#include "kernels/cache_sizes.hpp"
#include "scoped_bf16_products.hpp"
#include "sdpa_reference.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

class FlashAttentionHalf : public testing::EverySimdTarget {};

struct HalfCase {
  int64_t batch, q_heads, kv_heads, queries, keys, depth, value_depth;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  bool lengths = false, sinks = false, bool_mask = false;
  float softcap = 0.0F;
  float magnitude = 1.0F;
  float dropout = 0.0F;
};

// Dense (B, H, rows, cols) half-precision heads.
struct HalfHeads {
  HalfHeads(int64_t batch_count, int64_t head_count, int64_t row_count, int64_t col_count)
      : batch(batch_count),
        heads(head_count),
        rows(row_count),
        cols(col_count),
        bits(static_cast<size_t>(batch * heads * rows * cols)) {}
  int64_t batch, heads, rows, cols;
  // Aligned as attn's tensors and PyTorch's are, so that rows of whole vectors can be streamed.
  std::vector<uint16_t, TensorAllocator<uint16_t>> bits;
  // Entry (b, head 0, row, col) set to `value` rounded to `type`.
  void set(HalfType type, int64_t b, int64_t row, int64_t col, float value) {
    bits[static_cast<size_t>((b * heads * rows + row) * cols + col)] =
        float_to_half_bits(type, value);
  }
  ConstHalfHeadsView view() const {
    return {bits.data(), batch, heads, rows, cols, heads * rows * cols, rows * cols, cols};
  }
  HalfHeadsView view() {
    return {bits.data(), batch, heads, rows, cols, heads * rows * cols, rows * cols, cols};
  }
  ConstHeadsView float_view(const std::vector<float>& data) const {
    return {data.data(), batch, heads, rows, cols, heads * rows * cols, rows * cols, cols};
  }
  HeadsView float_view(std::vector<float>& data) const {
    return {data.data(), batch, heads, rows, cols, heads * rows * cols, rows * cols, cols};
  }
};

// Random normal entries times `magnitude`, rounded to `type`; their exact values in `widened`.
HalfHeads random_heads(HalfType type, int64_t batch, int64_t heads, int64_t rows, int64_t cols,
                       float magnitude, Rng& rng, std::vector<float>& widened) {
  HalfHeads result(batch, heads, rows, cols);
  widened.resize(result.bits.size());
  for (size_t i = 0; i < result.bits.size(); ++i) {
    result.bits[i] = float_to_half_bits(type, rng.normal() * magnitude);
    widened[i] = half_bits_to_float(type, result.bits[i]);
  }
  return result;
}

// Element (b, h, r, t) of dense (B, heads, rows, cols) heads.
size_t at(int64_t heads, int64_t rows, int64_t cols, int64_t b, int64_t h, int64_t r, int64_t t) {
  return static_cast<size_t>(((b * heads + h) * rows + r) * cols + t);
}

// The half backward's gradients against the double reference run on the same rounded inputs.
// Per element: the fp32 kernels' 1e-5 of the gradient's magnitude (floor 1; times the scores'
// magnitude², as the forward), plus the gradient's rounding to `type` (half an ulp), plus what the
// stored output moves: the pass takes D_i = Σ_t dO_it·O_it from the output as rounded to `type`
// (as PyTorch's half kernels do), off the reference's by δ_i = Σ_t |dO_it|·|Õ_it − O_it|, which
// dS_ij = P_ij (Z_ij dP_ij − D_i) carries into dQ_it (c·δ_i·Σ_j P_ij |k_jt|), dK_jt
// (c·Σ_i P_ij δ_i |q_it|) and the sink's gradient (Σ_i p_sink,i δ_i); and, on the bf16 dot-product
// path, the bound of P ⊙ Z's and dS's bf16 form (`native_bounds`, from check_case) times 2⁻⁸
// rounded or 2⁻¹⁶ split in two parts (bf16_probabilities_split).
// Given the forward's residuals, the pass's D is that of the output they restore (`out` then):
// within 2⁻¹⁷ of the fp32 kernel's output in bf16, 2⁻²² in fp16, which the same term bounds.
void check_gradients_against_reference(
    HalfType type, const HalfCase& c, const reference::SdpaProblem& problem,
    const reference::SdpaForward& forward, const std::vector<double>& q,
    const std::vector<double>& k, const std::vector<double>& v, const std::vector<float>& out,
    const std::vector<float>& grad_out, bool native,
    const std::array<const std::vector<double>*, 3>& native_bounds,
    const std::array<const HalfHeads*, 3>& gradients, const std::vector<float>& sink_grads) {
  const std::vector<double> grad_out_d(grad_out.begin(), grad_out.end());
  const reference::SdpaGradients want = reference::sdpa_backward(problem, q, k, v, grad_out_d);
  const int64_t group = c.q_heads / c.kv_heads;
  std::vector<double> moved_q(want.q.size()), moved_k(want.k.size()),
      moved_sinks(want.sinks.size());
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.q_heads; ++h)
      for (int64_t i = 0; i < c.queries; ++i) {
        double delta = 0.0;
        for (int64_t t = 0; t < c.value_depth; ++t) {
          const size_t e = at(c.q_heads, c.queries, c.value_depth, b, h, i, t);
          delta += std::abs(static_cast<double>(grad_out[e])) * std::abs(out[e] - forward.out[e]);
        }
        const size_t row = static_cast<size_t>((b * c.q_heads + h) * c.queries + i);
        if (!moved_sinks.empty())
          moved_sinks[static_cast<size_t>(h)] += forward.sink_weight[row] * delta;
        for (int64_t j = 0; j < c.keys; ++j) {
          const double p = forward.weights[problem.score_index(b, h, i, j)];
          for (int64_t t = 0; t < c.depth; ++t) {
            moved_q[at(c.q_heads, c.queries, c.depth, b, h, i, t)] +=
                problem.scale * p * delta *
                std::abs(k[at(c.kv_heads, c.keys, c.depth, b, h / group, j, t)]);
            moved_k[at(c.kv_heads, c.keys, c.depth, b, h / group, j, t)] +=
                problem.scale * p * delta *
                std::abs(q[at(c.q_heads, c.queries, c.depth, b, h, i, t)]);
          }
        }
      }
  const double rounding = type == HalfType::kBFloat16 ? 0x1p-8 : 0x1p-11;
  const double probability_rounding = !native                                        ? 0.0
                                      : bf16_probabilities_split(amx_tiles_in_use()) ? 0x1p-16
                                                                                     : 0x1p-8;
  const double scores = std::max(1.0F, c.magnitude * c.magnitude);
  const std::vector<double>* wanted[] = {&want.q, &want.k, &want.v};
  const std::vector<double> no_move(want.v.size());
  const std::vector<double>* moved[] = {&moved_q, &moved_k, &no_move};
  const char* names[] = {"q", "k", "v"};
  for (size_t g = 0; g < 3; ++g) {
    double largest = 1.0;
    for (const double value : *wanted[g]) largest = std::max(largest, std::abs(value));
    for (size_t e = 0; e < wanted[g]->size(); ++e) {
      const double expected = (*wanted[g])[e];
      const double tolerance = 1e-5 * scores * largest + rounding * std::abs(expected) +
                               (*moved[g])[e] + probability_rounding * (*native_bounds[g])[e];
      ASSERT_NEAR(half_bits_to_float(type, gradients[g]->bits[e]), expected, tolerance)
          << "gradient " << names[g] << " against the double reference, element " << e
          << (type == HalfType::kBFloat16 ? " bf16" : " fp16") << " native=" << native
          << " n=" << c.queries << " m=" << c.keys << " d=" << c.depth;
    }
  }
  for (size_t h = 0; h < sink_grads.size(); ++h) {
    EXPECT_NEAR(sink_grads[h], want.sinks[h],
                1e-5 * scores * std::max(1.0, std::abs(want.sinks[h])) + moved_sinks[h])
        << "sink " << h << " against the double reference";
  }
}

// Without `with_backward`, the forward pass alone.
void check_case(HalfType type, const HalfCase& c, Rng& rng, bool with_backward = true) {
  std::vector<float> q, k, v;
  const HalfHeads q16 =
      random_heads(type, c.batch, c.q_heads, c.queries, c.depth, c.magnitude, rng, q);
  const HalfHeads k16 =
      random_heads(type, c.batch, c.kv_heads, c.keys, c.depth, c.magnitude, rng, k);
  const HalfHeads v16 =
      random_heads(type, c.batch, c.kv_heads, c.keys, c.value_depth, 1.0F, rng, v);

  const float scale = 1.0F / std::sqrt(static_cast<float>(c.depth));
  reference::SdpaProblem problem = reference::problem_of_case(c, scale);

  FlashAttentionOptions options = testing::kernel_options(scale, c.causal, c.dropout, 1234);
  if (c.dropout > 0.0F) {
    // The kernel's keep/drop multipliers, (B·H, n, m), as the reference's scores-shaped ones.
    const Tensor multipliers =
        flash_attention_dropout_mask(options, c.batch * c.q_heads, c.queries, c.keys);
    problem.dropout.assign(multipliers.data(), multipliers.data() + multipliers.numel());
  }
  options.window_left = c.window_left;
  options.window_right = c.window_right;
  options.softcap = c.softcap;
  std::vector<float> sinks;
  if (c.sinks) {
    for (int64_t h = 0; h < c.q_heads; ++h) sinks.push_back(static_cast<float>(h % 3) - 1.0F);
    problem.sinks.assign(sinks.begin(), sinks.end());
    options.sinks = sinks.data();
  }
  std::vector<uint8_t> mask;
  if (c.bool_mask) {
    // (B, n, m), shared by the heads: every third key hidden, and query 1 sees nothing.
    problem.mask_kind = reference::SdpaProblem::Mask::kBool;
    problem.mask.resize(static_cast<size_t>(c.batch * c.q_heads * c.queries * c.keys));
    mask.resize(static_cast<size_t>(c.batch * c.queries * c.keys));
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = 0; i < c.queries; ++i)
        for (int64_t j = 0; j < c.keys; ++j) {
          const bool keep = i != 1 && (i + j + b) % 3 != 0;
          mask[static_cast<size_t>((b * c.queries + i) * c.keys + j)] = keep ? 1 : 0;
          for (int64_t h = 0; h < c.q_heads; ++h)
            problem.mask[problem.score_index(b, h, i, j)] = keep ? 1.0 : 0.0;
        }
    options.mask = {MaskKind::kBool, mask.data(), c.queries * c.keys, 0, c.keys, 1};
  }
  ValidLengths lengths;
  if (c.lengths) {
    // Lengths 0 and m, then random ones; queries 64-127 of the first sequence see no key, a whole
    // query tile (of 32 or 64) after tiles that saw keys: its output is zeros, whatever an earlier
    // tile left in the scratch.
    std::vector<int64_t> per_query;
    for (int64_t index = 0; index < c.batch * c.queries; ++index) {
      const bool empty_tile = index >= 64 && index < std::min<int64_t>(128, c.queries);
      per_query.push_back(
          index == 0 || empty_tile ? 0
          : index == 1             ? c.keys
                       : static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(c.keys + 1)));
    }
    lengths = ValidLengths::per_query(per_query, c.batch, c.queries);
    problem.lengths = per_query;
  }

  HalfHeads out16(c.batch, c.q_heads, c.queries, c.value_depth);
  std::vector<float> lse(static_cast<size_t>(c.batch * c.q_heads * c.queries));
  flash_attention_forward(type, q16.view(), k16.view(), v16.view(), lengths, options, out16.view(),
                          lse.data());

  const bool native = type == HalfType::kBFloat16 && flash_attention_bfloat16_native(c.depth);
  std::vector<float> out32(out16.bits.size());
  if (!native) {
    // Widened to fp32 as packed: the fp32 kernel on the widened values, rounded once.
    std::vector<float> lse32(lse.size());
    flash_attention_forward(q16.float_view(q), k16.float_view(k), v16.float_view(v), lengths,
                            options, out16.float_view(out32), lse32.data());
    for (size_t i = 0; i < out32.size(); ++i) {
      ASSERT_EQ(out16.bits[i], float_to_half_bits(type, out32[i])) << "element " << i;
    }
    EXPECT_EQ(lse, lse32);
  }

  const std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(v.begin(), v.end());
  const reference::SdpaForward expected = reference::sdpa_forward(problem, qd, kd, vd);
  double largest = 0.0;
  for (const double value : expected.out) largest = std::max(largest, std::abs(value));
  // Per element: the fp32 kernel's 1e-5 of the output's magnitude (scaled, as the fp32 test does,
  // by the scores' magnitude, whose float rounding enters the exponent), plus rounding the output
  // to `type` (half an ulp: 2⁻⁸ relative for bf16's 8 significant bits, 2⁻¹¹ for fp16's 11), plus,
  // on the bf16 dot-product path, P's bf16 form in P·V: rounded, 2⁻⁸·Σ_j P_ij·|v_j|; split
  // (bf16_probabilities_split), hi + lo each rounded, 2⁻¹⁶·Σ_j P_ij·|v_j|.
  const double output_rounding = type == HalfType::kBFloat16 ? 0x1p-8 : 0x1p-11;
  const double probability_rounding = !native                                        ? 0.0
                                      : bf16_probabilities_split(amx_tiles_in_use()) ? 0x1p-16
                                                                                     : 0x1p-8;
  const double base = 1e-5 * std::max(1.0F, c.magnitude * c.magnitude) * std::max(largest, 1e-30);
  const int64_t group = c.q_heads / c.kv_heads;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.q_heads; ++h)
      for (int64_t i = 0; i < c.queries; ++i)
        for (int64_t t = 0; t < c.value_depth; ++t) {
          const auto index =
              static_cast<size_t>(((b * c.q_heads + h) * c.queries + i) * c.value_depth + t);
          double weighted_magnitude = 0.0;
          for (int64_t j = 0; j < c.keys; ++j) {
            const size_t score = problem.score_index(b, h, i, j);
            weighted_magnitude +=
                expected.weights[score] * (problem.dropout.empty() ? 1.0 : problem.dropout[score]) *
                std::abs(vd[static_cast<size_t>(
                    ((b * c.kv_heads + h / group) * c.keys + j) * c.value_depth + t)]);
          }
          const double want = expected.out[index];
          const double tolerance =
              base + output_rounding * std::abs(want) + probability_rounding * weighted_magnitude;
          const double got = half_bits_to_float(type, out16.bits[index]);
          ASSERT_NEAR(got, want, tolerance)
              << (type == HalfType::kBFloat16 ? "bf16" : "fp16") << " native=" << native
              << " B=" << c.batch << " Hq=" << c.q_heads << " Hkv=" << c.kv_heads
              << " n=" << c.queries << " m=" << c.keys << " d=" << c.depth
              << " dv=" << c.value_depth << " at (" << b << ", " << h << ", " << i << ", " << t
              << ")";
        }

  if (!with_backward) return;
  // The backward pass on half-precision inputs widens every row exactly as it packs it and rounds
  // each gradient once: bit-equal to the fp32 backward on the widened values (itself checked
  // against the double reference by flash_attention_backward_test), rounded to `type`. The bf16
  // dot-product path computes the scores and dP from the same exact products summed in another
  // order, and rounds P ⊙ Z and dS to bf16 for the three products that reduce over queries or
  // keys, as its forward pass rounds P: each gradient element may then move by 2⁻⁸ times the sum
  // of its terms' magnitudes (dV_jt: Σ_i P_ij Z_ij |dO_it|; dK_jt: c Σ_i |dS_ij| |q_it|; dQ_it:
  // c Σ_j |dS_ij| |k_jt|, with |dS_ij| ≤ P_ij (Z_ij |dP_ij| + |D_i|) from the double reference),
  // plus the fp32 kernels' 1e-5 of the largest entry and the gradient's own rounding (2⁻⁸).
  // The backward's own path: on AMX tiles' CPUs (and their model) whole 64 × 64 tiles' products
  // run on the tiles (depths padded to whole tiles with zeros), the rest on vdpbf16ps: the same
  // pairs summed in another order, within the same bound.
  const bool backward_native = type == HalfType::kBFloat16 &&
                               flash_attention_bfloat16_backward_native(c.depth, c.value_depth);
  std::vector<float> grad_out;
  const HalfHeads grad_out16 =
      random_heads(type, c.batch, c.q_heads, c.queries, c.value_depth, 1.0F, rng, grad_out);
  std::vector<float> rounded_out(out16.bits.size());
  for (size_t i = 0; i < rounded_out.size(); ++i)
    rounded_out[i] = half_bits_to_float(type, out16.bits[i]);

  // The forward again with its rounding residuals: the same output and log-sum-exp, and on the
  // widened path each residual that of the fp32 kernel's output (output_residual).
  HalfHeads again16(c.batch, c.q_heads, c.queries, c.value_depth);
  HalfHeads residual16(c.batch, c.q_heads, c.queries, c.value_depth);
  std::vector<float> lse_again(lse.size());
  flash_attention_forward(type, q16.view(), k16.view(), v16.view(), lengths, options,
                          again16.view(), lse_again.data(), nullptr, residual16.view());
  ASSERT_EQ(again16.bits, out16.bits);
  EXPECT_EQ(lse_again, lse);
  std::vector<float> exact_out(out16.bits.size());
  for (size_t i = 0; i < exact_out.size(); ++i) {
    if (!native) {
      ASSERT_EQ(residual16.bits[i], output_residual(type, out32[i], out16.bits[i]))
          << "residual of element " << i;
    }
    exact_out[i] = output_with_residual(type, out16.bits[i], residual16.bits[i]);
  }

  // The backward from the rounded output alone, then with its residuals (D from exact_out).
  for (const bool with_residual : {false, true}) {
    SCOPED_TRACE(with_residual ? "with the forward's residuals" : "from the rounded output");
    const std::vector<float>& out = with_residual ? exact_out : rounded_out;
    HalfHeads grad_q16(c.batch, c.q_heads, c.queries, c.depth);
    HalfHeads grad_k16(c.batch, c.kv_heads, c.keys, c.depth);
    HalfHeads grad_v16(c.batch, c.kv_heads, c.keys, c.value_depth);
    std::vector<float> sink_grads16(sinks.size(), 0.0F), sink_grads32(sinks.size(), 0.0F);
    flash_attention_backward(
        type, q16.view(), k16.view(), v16.view(), out16.view(), grad_out16.view(), lse.data(),
        lengths, options, grad_q16.view(), grad_k16.view(), grad_v16.view(), {},
        c.sinks ? sink_grads16.data() : nullptr, nullptr,
        with_residual ? ConstHalfHeadsView(residual16.view()) : ConstHalfHeadsView{});
    std::vector<float> grad_q(grad_q16.bits.size()), grad_k(grad_k16.bits.size()),
        grad_v(grad_v16.bits.size());
    flash_attention_backward(q16.float_view(q), k16.float_view(k), v16.float_view(v),
                             out16.float_view(out), grad_out16.float_view(grad_out), lse.data(),
                             lengths, options, grad_q16.float_view(grad_q),
                             grad_k16.float_view(grad_k), grad_v16.float_view(grad_v), {},
                             c.sinks ? sink_grads32.data() : nullptr);
    const std::pair<const HalfHeads*, const std::vector<float>*> gradients[] = {
        {&grad_q16, &grad_q}, {&grad_k16, &grad_k}, {&grad_v16, &grad_v}};
    std::vector<double> bound_q(grad_q.size()), bound_k(grad_k.size()), bound_v(grad_v.size());
    if (backward_native) {
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t h = 0; h < c.q_heads; ++h)
          for (int64_t i = 0; i < c.queries; ++i) {
            double delta = 0.0;
            for (int64_t t = 0; t < c.value_depth; ++t) {
              const size_t e = at(c.q_heads, c.queries, c.value_depth, b, h, i, t);
              delta += static_cast<double>(grad_out[e]) * out[e];
            }
            for (int64_t j = 0; j < c.keys; ++j) {
              const size_t score = problem.score_index(b, h, i, j);
              const double p = expected.weights[score];
              if (p == 0.0) continue;
              const double z = problem.dropout.empty() ? 1.0 : problem.dropout[score];
              const int64_t kv = h / group;
              double grad_p = 0.0;
              for (int64_t t = 0; t < c.value_depth; ++t) {
                grad_p += static_cast<double>(
                              grad_out[at(c.q_heads, c.queries, c.value_depth, b, h, i, t)]) *
                          v[at(c.kv_heads, c.keys, c.value_depth, b, kv, j, t)];
              }
              const double grad_s = p * (z * std::abs(grad_p) + std::abs(delta));
              for (int64_t t = 0; t < c.depth; ++t) {
                bound_q[at(c.q_heads, c.queries, c.depth, b, h, i, t)] +=
                    scale * grad_s * std::abs(k[at(c.kv_heads, c.keys, c.depth, b, kv, j, t)]);
                bound_k[at(c.kv_heads, c.keys, c.depth, b, kv, j, t)] +=
                    scale * grad_s * std::abs(q[at(c.q_heads, c.queries, c.depth, b, h, i, t)]);
              }
              for (int64_t t = 0; t < c.value_depth; ++t) {
                bound_v[at(c.kv_heads, c.keys, c.value_depth, b, kv, j, t)] +=
                    p * z * std::abs(grad_out[at(c.q_heads, c.queries, c.value_depth, b, h, i, t)]);
              }
            }
          }
    }
    const std::vector<double>* bounds[] = {&bound_q, &bound_k, &bound_v};
    for (const auto& [half, wide] : gradients) {
      const char* name = half == &grad_q16 ? "q" : half == &grad_k16 ? "k" : "v";
      const std::vector<double>& bound = *bounds[half == &grad_q16 ? 0 : half == &grad_k16 ? 1 : 2];
      double largest_gradient = 0.0;
      for (const float value : *wide)
        largest_gradient = std::max<double>(largest_gradient, std::abs(value));
      for (size_t i = 0; i < wide->size(); ++i) {
        if (backward_native) {
          const double want = (*wide)[i];
          ASSERT_NEAR(half_bits_to_float(type, half->bits[i]), want,
                      0x1p-8 * (std::abs(want) + bound[i]) + 1e-5 * largest_gradient)
              << "gradient " << name << ", element " << i << ", n=" << c.queries << " m=" << c.keys
              << " d=" << c.depth;
        } else {
          ASSERT_EQ(half->bits[i], float_to_half_bits(type, (*wide)[i]))
              << "gradient " << name << ", element " << i << ", n=" << c.queries << " m=" << c.keys
              << " d=" << c.depth;
        }
      }
    }
    for (size_t h = 0; h < sinks.size(); ++h) {
      if (backward_native) {
        EXPECT_NEAR(sink_grads16[h], sink_grads32[h],
                    1e-5 * std::max(1.0F, std::abs(sink_grads32[h])));
      } else {
        EXPECT_EQ(sink_grads16[h], sink_grads32[h]);
      }
    }
    check_gradients_against_reference(type, c, problem, expected, qd, kd, vd, out, grad_out,
                                      backward_native, {&bound_q, &bound_k, &bound_v},
                                      {&grad_q16, &grad_k16, &grad_v16}, sink_grads16);
  }
}

const HalfCase kCases[] = {
    {1, 1, 1, 1, 1, 1, 1},
    {2, 1, 1, 1, 5, 3, 2},
    {2, 2, 1, 37, 45, 16, 16},
    {1, 4, 2, 70, 131, 64, 64, true},
    {1, 2, 1, 70, 90, 40, 40},  // 16-pair blocks of Qᵀ and a tail of 4 pairs, 64 + 6 queries
    {2, 2, 2, 65, 300, 63, 17, false, -1, -1, true},
    {1, 2, 2, 90, 211, 32, 33, false, 21, 6},  // windows: tiles start at odd keys
    {1, 2, 2, 50, 20, 8, 8, true, -1, -1, false, true},
    {1, 8, 1, 33, 129, 128, 128, false, -1, -1, false, false, true},
    {2, 3, 3, 20, 77, 24, 24, false, -1, -1, false, false, false, 5.0F},
    {1, 1, 1, 33, 200, 16, 16, false, -1, -1, false, false, false, 0.0F, 4.0F},
    // Scores spread over hundreds: a later key tile's maximum passes an earlier one's by more than
    // exp's range, which the bf16 path's lazy maximum must hand to the full step.
    {1, 2, 2, 33, 300, 16, 16, false, -1, -1, false, false, false, 0.0F, 8.0F},
    {2, 2, 1, 40, 150, 32, 32, true, -1, -1, true, false, false, 0.0F, 1.0F, 0.3F},  // dropout
    // One query head per key/value head, keys past the backward's largest block of the loop over
    // keys (1024): its scratch holds one block's key rows at a time; with lengths, some past it.
    {1, 2, 2, 20, 1300, 32, 32},
    {2, 1, 1, 70, 1200, 16, 24, false, -1, -1, true},
};

using testing::ScopedAmxUse;
using testing::ScopedBf16DotUse;

// Whether `target` is one of those with the bf16 kernels (AVX3, AVX3_DL).
bool AvxThreeTarget(int64_t target) {
  return target == HWY_AVX3 || target == HWY_AVX3_DL;
}

// vdpbf16ps where the target has AVX512-BF16 (widened elsewhere), AMX tiles off: on CPUs with
// AMX the default would put these shapes on the tiles, and on Intel's cores without tiles widen
// them to fp32 (vdpbf16ps slower there), leaving the vector products unchecked.
TEST_P(FlashAttentionHalf, BFloat16MatchesReferenceOnRoundedInputs) {
  const ScopedAmxUse vectors(AmxUse::kNever);
  const ScopedBf16DotUse dot(Bf16DotUse::kAlways);
  EXPECT_EQ(flash_attention_bfloat16_native(16),
            AvxThreeTarget(GetParam()) && bf16_dot_available());
  Rng rng(81);
  for (const HalfCase& c : kCases) check_case(HalfType::kBFloat16, c, rng);
}

// With neither tiles nor vdpbf16ps (Intel's cores without AMX, by default) bf16 widens to fp32:
// check_case then asserts every output and gradient bit-equal to the fp32 pass's, rounded once.
TEST_P(FlashAttentionHalf, BFloat16WidenedMatchesTheFloatPass) {
  const ScopedAmxUse vectors(AmxUse::kNever);
  const ScopedBf16DotUse widened(Bf16DotUse::kNever);
  EXPECT_FALSE(flash_attention_bfloat16_native(64));
  EXPECT_FALSE(flash_attention_bfloat16_backward_native(64, 64));
  Rng rng(86);
  for (const HalfCase& c : kCases) check_case(HalfType::kBFloat16, c, rng);
}

// The default without tiles: vdpbf16ps only where it outpaces fp32 FMAs (AMD's cores).
TEST_P(FlashAttentionHalf, BFloat16TakesTheDotProductsOnlyWhereFaster) {
  const ScopedAmxUse vectors(AmxUse::kNever);
  const ScopedBf16DotUse default_use(Bf16DotUse::kWhereFaster);
  EXPECT_EQ(flash_attention_bfloat16_native(64),
            AvxThreeTarget(GetParam()) && bf16_dot_outpaces_fma());
  EXPECT_EQ(flash_attention_bfloat16_native(20),
            AvxThreeTarget(GetParam()) && bf16_dot_outpaces_fma());
}

// Shapes for the AMX path: value depths off the 32-column tiles, key tiles and windows that start
// off the 32-key blocks, one query, one key, several key tiles; depths that fill whole tiles and
// depths padded to them (80 and 96, common head sizes, and an odd one).
const HalfCase kAmxCases[] = {
    {1, 1, 1, 1, 1, 32, 16},
    {1, 4, 2, 70, 131, 64, 64, true},
    {2, 2, 2, 65, 300, 64, 17, false, -1, -1, true},
    {1, 2, 2, 90, 211, 32, 33, false, 21, 6},
    {1, 2, 2, 50, 20, 96, 80, true, -1, -1, false, true},
    {1, 8, 1, 33, 129, 128, 128, false, -1, -1, false, false, true},
    {2, 3, 3, 20, 77, 64, 48, false, -1, -1, false, false, false, 5.0F},
    {1, 2, 2, 33, 300, 32, 32, false, -1, -1, false, false, false, 0.0F, 8.0F},
    {2, 2, 1, 40, 150, 32, 32, true, -1, -1, true, false, false, 0.0F, 1.0F, 0.3F},
    {1, 1, 1, 1, 1000, 64, 64},
    // Whole 64 × 64 tiles for the backward's products on the tiles, beside partial ones: grouped
    // heads; causal; lengths, sinks and dropout; a window with a bool mask and a soft cap.
    {1, 2, 1, 200, 260, 32, 64},
    {1, 1, 1, 128, 192, 128, 32, true},
    {1, 2, 2, 130, 200, 64, 64, false, -1, -1, true, true, false, 0.0F, 1.0F, 0.2F},
    {1, 1, 1, 192, 256, 64, 96, false, 40, 10, false, false, true, 6.0F},
    // Depths padded with zeros to whole tiles: 80 (5 of 6 pairs' tiles), 96 causal over grouped
    // heads, an odd 47 with a window and lengths.
    {2, 2, 1, 70, 150, 80, 80},
    {1, 4, 2, 100, 130, 96, 96, true},
    {1, 2, 2, 65, 97, 47, 20, false, 30, 3, true},
    // The same in whole 64 × 64 tiles, for the backward's products on the tiles: lengths, sinks and
    // dropout at d = 80, dv = 48; causal with a bool mask and a soft cap at d = 96, dv = 80.
    {1, 2, 1, 128, 192, 80, 48, false, -1, -1, true, true, false, 0.0F, 1.0F, 0.2F},
    {1, 1, 1, 128, 128, 96, 80, true, -1, -1, false, false, true, 5.0F},
    // Heads of at most 32 queries take 32-row query tiles on the tiles: causal with lengths, sinks
    // and dropout; a soft cap at an odd depth.
    {1, 2, 1, 30, 150, 64, 64, true, -1, -1, true, true, false, 0.0F, 1.0F, 0.2F},
    {2, 1, 1, 17, 70, 80, 40, false, -1, -1, false, false, false, 4.0F},
    // Past the backward's largest block of keys (1024) with one query head per key/value head, as
    // in kCases: on the tiles.
    {1, 2, 2, 40, 1300, 64, 64},
    {2, 1, 1, 64, 1150, 96, 80, false, -1, -1, true},
    // Heads of 256 over 1300 keys: the forward packs keys and values a quarter of the L2 at a time
    // (512 keys on a 2 MiB L2), so a head's tiles read several packs; with grouped heads and
    // lengths.
    {2, 2, 1, 40, 1300, 256, 256, false, -1, -1, true},
};

// The AMX shapes (depths of whole tiles) on vdpbf16ps, AMX tiles off.
TEST_P(FlashAttentionHalf, BFloat16AmxShapesOnVectorsMatchReference) {
  const ScopedAmxUse vectors(AmxUse::kNever);
  const ScopedBf16DotUse dot(Bf16DotUse::kAlways);
  Rng rng(85);
  for (const HalfCase& c : kAmxCases) check_case(HalfType::kBFloat16, c, rng);
}

// The tolerance is the vdpbf16ps path's: the tiles' products are the same bf16 pairs, summed in
// fp32 in another order.
TEST_P(FlashAttentionHalf, BFloat16OnAmxTileModelMatchesReference) {
  const ScopedAmxUse model(AmxUse::kModel);
  if (!flash_attention_bfloat16_native(64))
    GTEST_SKIP() << "no AVX512-BF16 on this target: the AMX path is not taken";
  // As on AMX hardware, the backward's products go on the tiles at every depth (padded to whole
  // tiles with zeros), whole 64 × 64 tiles of them; the rest on vdpbf16ps.
  EXPECT_TRUE(flash_attention_bfloat16_backward_native(64, 32));
  EXPECT_TRUE(flash_attention_bfloat16_backward_native(64, 17));
  EXPECT_TRUE(flash_attention_bfloat16_backward_native(48, 64));
  Rng rng(83);
  for (const HalfCase& c : kAmxCases) check_case(HalfType::kBFloat16, c, rng);
  for (const HalfCase& c : kCases) check_case(HalfType::kBFloat16, c, rng);
}

// Scores past 2^31 in base 2 on the tiles (bf16 queries of 1e4–4e9 against keys of 1 to 1e5):
// the exponent's c·S − max in one rounding is off by up to half an ulp of c·S there, past
// float's exponents, and P overflowed to ∞, the row's sum with it, the output to NaN (240 of 1120
// outputs at queries of 4e9). The steps scale Sᵀ in place first for such maxima: every output
// and log-sum-exp finite, each output within P's rounding (2⁻⁸ of max|v|) and its own of the fp32
// kernel's on the widened inputs, each log-sum-exp within 2⁻²⁰ of it. On the tile model, on the
// hardware where it has AMX, and on vdpbf16ps (tiles off).
TEST_P(FlashAttentionHalf, BFloat16ScoresPastTwoToTheThirtyOneStayFinite) {
  struct Case {
    int64_t queries, keys;
    float query_magnitude, key_magnitude;
  };
  const Case cases[] = {
      {70, 70, 4e9F, 1.0F}, {1, 40, 1e10F, 1.0F}, {20, 12, 1e5F, 1e5F}, {130, 200, 3e8F, 8.0F}};
  bool ran = false;
  for (const AmxUse use : {AmxUse::kModel, AmxUse::kWhereAvailable, AmxUse::kNever}) {
    if (use == AmxUse::kWhereAvailable && !amx_available()) continue;
    const ScopedAmxUse amx(use);
    const ScopedBf16DotUse dot(Bf16DotUse::kAlways);
    if (!flash_attention_bfloat16_native(16)) continue;
    ran = true;
    Rng rng(97);
    for (const Case& c : cases) {
      const HalfType type = HalfType::kBFloat16;
      std::vector<float> q, k, v;
      const HalfHeads q16 = random_heads(type, 1, 2, c.queries, 16, c.query_magnitude, rng, q);
      const HalfHeads k16 = random_heads(type, 1, 2, c.keys, 16, c.key_magnitude, rng, k);
      const HalfHeads v16 = random_heads(type, 1, 2, c.keys, 16, 1.0F, rng, v);
      const FlashAttentionOptions options = testing::kernel_options(0.25F, false, 0.0F, 0);
      HalfHeads out16(1, 2, c.queries, 16);
      std::vector<float> lse(static_cast<size_t>(2 * c.queries)), lse32(lse.size());
      flash_attention_forward(type, q16.view(), k16.view(), v16.view(), {}, options, out16.view(),
                              lse.data());
      std::vector<float> out32(out16.bits.size());
      flash_attention_forward(q16.float_view(q), k16.float_view(k), v16.float_view(v), {}, options,
                              out16.float_view(out32), lse32.data());
      float value_max = 0.0F;
      for (const float x : v) value_max = std::max(value_max, std::abs(x));
      for (size_t e = 0; e < out32.size(); ++e) {
        const float got = half_bits_to_float(type, out16.bits[e]);
        ASSERT_TRUE(std::isfinite(got)) << "output " << e << ", use " << static_cast<int>(use);
        ASSERT_NEAR(got, out32[e], 0x1p-8F * value_max + 0x1p-8F * std::abs(out32[e]))
            << "output " << e << ", use " << static_cast<int>(use) << ", queries " << c.queries;
      }
      for (size_t r = 0; r < lse.size(); ++r) {
        ASSERT_TRUE(std::isfinite(lse[r])) << "log_sum_exp " << r;
        ASSERT_NEAR(lse[r], lse32[r], 0x1p-20F * std::abs(lse32[r])) << "log_sum_exp " << r;
      }
    }
  }
  if (!ran) GTEST_SKIP() << "no AVX512-BF16 on this target: no bf16 products to check";
}

// Without tiles the backward's products follow the forward's: vdpbf16ps wherever it takes them.
TEST_P(FlashAttentionHalf, BFloat16BackwardOnVectorsWhereTheForwardIs) {
  const ScopedAmxUse vectors(AmxUse::kNever);
  for (const Bf16DotUse use : {Bf16DotUse::kNever, Bf16DotUse::kWhereFaster, Bf16DotUse::kAlways}) {
    const ScopedBf16DotUse dot(use);
    EXPECT_EQ(flash_attention_bfloat16_backward_native(64, 64),
              flash_attention_bfloat16_native(64));
    EXPECT_EQ(flash_attention_bfloat16_backward_native(20, 36),
              flash_attention_bfloat16_native(20));
  }
}

// On tiles the forward and the backward take every depth (padded to whole tiles), whether
// vdpbf16ps is in use or not.
TEST_P(FlashAttentionHalf, BFloat16TakesTheTilesAtEveryDepth) {
  const ScopedAmxUse model(AmxUse::kModel);
  if (!flash_attention_bfloat16_native(64))
    GTEST_SKIP() << "no AVX512-BF16 on this target: the AMX path is not taken";
  for (const Bf16DotUse use : {Bf16DotUse::kNever, Bf16DotUse::kAlways}) {
    const ScopedBf16DotUse dot(use);
    for (const int64_t depth : {1, 20, 32, 47, 80, 96, 256})
      EXPECT_TRUE(flash_attention_bfloat16_native(depth)) << "d = " << depth;
    EXPECT_TRUE(flash_attention_bfloat16_backward_native(80, 80));
    EXPECT_TRUE(flash_attention_bfloat16_backward_native(47, 20));
  }
}

TEST_P(FlashAttentionHalf, BFloat16OnAmxMatchesReference) {
  if (!amx_available())
    GTEST_SKIP() << "no AMX-BF16 on this CPU, or Linux refused this process the tile state";
  const ScopedAmxUse hardware(AmxUse::kWhereAvailable);
  if (!flash_attention_bfloat16_native(64))
    GTEST_SKIP() << "no AVX512-BF16 on this target: the AMX path is not taken";
  Rng rng(84);
  for (const HalfCase& c : kAmxCases) check_case(HalfType::kBFloat16, c, rng);
  for (const HalfCase& c : kCases) check_case(HalfType::kBFloat16, c, rng);
}

// Under each product family (the tile model, the hardware where it has AMX, vdpbf16ps) where
// native() says bf16 takes bf16 products: relative_error(choice), the largest error over the sum
// of its terms' magnitudes, within 2⁻¹⁶ + 2⁻²⁰ with `what` split and past 4 times that rounded.
// Whether any family ran.
template <class Native, class RelativeError>
bool SplitWithinItsBoundRoundedPastIt(const char* what, const Native& native,
                                      const RelativeError& relative_error) {
  constexpr double kBound = 0x1p-16 + 0x1p-20;
  bool ran = false;
  for (const AmxUse use : {AmxUse::kModel, AmxUse::kWhereAvailable, AmxUse::kNever}) {
    if (use == AmxUse::kWhereAvailable && !amx_available()) continue;
    const ScopedAmxUse amx(use);
    const ScopedBf16DotUse dot(Bf16DotUse::kAlways);
    if (!native()) continue;
    ran = true;
    EXPECT_LE(relative_error(Bf16Probabilities::kSplit), kBound)
        << what << " split, AMX use " << static_cast<int>(use);
    EXPECT_GT(relative_error(Bf16Probabilities::kRounded), 4 * kBound)
        << what << " rounded, AMX use " << static_cast<int>(use);
  }
  return ran;
}

// P's bf16 form in P·V, seen where a row's values cancel (|o| far under Σ_j P_j·|v_j|): 2048 keys
// of values ±1-ish against nearly uniform weights, the output before its rounding read back from
// the forward's residuals (within 2⁻¹⁷ of it). Split (hi + lo), each output is within
// 2⁻¹⁶·Σ P|v| of the double reference on the same rounded inputs, plus 2⁻²⁰·Σ P|v| for fp32's
// exponentials and sums, and 2⁻¹⁶|o| for the residual; rounded to bf16, P misses that bound
// by more than 4× somewhere (it is off by up to 2⁻⁸·Σ P|v|), so the bound would catch a split
// that fell back to rounding. On the tile model, the hardware where it has AMX, and vdpbf16ps.
TEST_P(FlashAttentionHalf, BFloat16SplitProbabilitiesKeepCancellingRowsExact) {
  const HalfType type = HalfType::kBFloat16;
  const int64_t heads = 2, queries = 32, keys = 2048, depth = 64;
  Rng rng(131);
  std::vector<float> q, k, v;
  const HalfHeads q16 = random_heads(type, 1, heads, queries, depth, 0.3F, rng, q);
  const HalfHeads k16 = random_heads(type, 1, heads, keys, depth, 0.3F, rng, k);
  const HalfHeads v16 = random_heads(type, 1, heads, keys, depth, 1.0F, rng, v);
  const float scale = 0.125F;
  // The double reference: o and Σ_j P_j·|v_j| per output element.
  std::vector<double> want(static_cast<size_t>(heads * queries * depth)), weighted(want.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < queries; ++i) {
      std::vector<double> p(static_cast<size_t>(keys));
      double largest = -std::numeric_limits<double>::infinity(), total = 0.0;
      for (int64_t j = 0; j < keys; ++j) {
        double score = 0.0;
        for (int64_t t = 0; t < depth; ++t)
          score += static_cast<double>(q[at(heads, queries, depth, 0, h, i, t)]) *
                   k[at(heads, keys, depth, 0, h, j, t)];
        p[static_cast<size_t>(j)] = score * scale;
        largest = std::max(largest, score * scale);
      }
      for (double& x : p) total += x = std::exp(x - largest);
      for (int64_t t = 0; t < depth; ++t) {
        const size_t e = at(heads, queries, depth, 0, h, i, t);
        for (int64_t j = 0; j < keys; ++j) {
          const double value = v[at(heads, keys, depth, 0, h, j, t)];
          want[e] += p[static_cast<size_t>(j)] / total * value;
          weighted[e] += p[static_cast<size_t>(j)] / total * std::abs(value);
        }
      }
    }
  const FlashAttentionOptions options = testing::kernel_options(scale, false, 0.0F, 0);
  // The largest error over Σ P|v| (less the residual's share) under `choice`.
  const auto relative_error = [&](Bf16Probabilities choice) {
    const testing::ScopedBf16Probabilities probabilities(choice);
    HalfHeads out16(1, heads, queries, depth), residual16(1, heads, queries, depth);
    std::vector<float> lse(static_cast<size_t>(heads * queries));
    flash_attention_forward(type, q16.view(), k16.view(), v16.view(), {}, options, out16.view(),
                            lse.data(), nullptr, residual16.view());
    double worst = 0.0;
    for (size_t e = 0; e < want.size(); ++e) {
      const double got = output_with_residual(type, out16.bits[e], residual16.bits[e]);
      worst =
          std::max(worst, (std::abs(got - want[e]) - 0x1p-16 * std::abs(want[e])) / weighted[e]);
    }
    return worst;
  };
  if (!SplitWithinItsBoundRoundedPastIt(
          "P", [&] { return flash_attention_bfloat16_native(depth); }, relative_error)) {
    GTEST_SKIP() << "no AVX512-BF16 on this target: bf16 is widened to fp32";
  }
}

// dS's bf16 form in dQ = c·Σ_j dS_ij·k_j, seen where dQ cancels: every key the same row, so that
// Σ_j dS_ij = 0 makes dQ exactly 0 while its terms are not. Split (hi + lo), each dQ element is
// within 2⁻¹⁶ of the sum of its terms' magnitudes (c·Σ_j |dS_ij|·|k_jt|), plus what D moves
// (taken from the output restored by its residual, within 2⁻¹⁶ of it: c·|k_t|·2⁻¹⁶·Σ_t
// |dO_it·O_it|), plus 2⁻²⁰ of the terms for fp32's sums; rounded, dS misses that bound by more
// than 4× somewhere (each dS off by up to 2⁻⁸ of itself). On the tile model, the hardware where it
// has AMX, and vdpbf16ps.
TEST_P(FlashAttentionHalf, BFloat16SplitGradScoresKeepCancellingQueryGradientsExact) {
  const HalfType type = HalfType::kBFloat16;
  const int64_t queries = 64, keys = 1024, depth = 64;
  Rng rng(139);
  std::vector<float> q, k_row, v, grad_out;
  const HalfHeads q16 = random_heads(type, 1, 1, queries, depth, 1.0F, rng, q);
  const HalfHeads key_row = random_heads(type, 1, 1, 1, depth, 1.0F, rng, k_row);
  HalfHeads k16(1, 1, keys, depth);
  for (int64_t j = 0; j < keys; ++j)
    std::copy(key_row.bits.begin(), key_row.bits.end(), k16.bits.begin() + j * depth);
  const HalfHeads v16 = random_heads(type, 1, 1, keys, depth, 1.0F, rng, v);
  const HalfHeads grad_out16 = random_heads(type, 1, 1, queries, depth, 1.0F, rng, grad_out);
  const float scale = 0.125F;
  const FlashAttentionOptions options = testing::kernel_options(scale, false, 0.0F, 0);
  // The uniform weights' dS_ij = (dP_ij − D_i) / m, dP_ij = dO_i·v_j, D_i = Σ_j dP_ij / m.
  std::vector<double> terms(static_cast<size_t>(queries * depth)), moved(terms.size());
  for (int64_t i = 0; i < queries; ++i) {
    std::vector<double> dp(static_cast<size_t>(keys));
    double delta = 0.0, absolute = 0.0;
    for (int64_t j = 0; j < keys; ++j) {
      for (int64_t t = 0; t < depth; ++t)
        dp[static_cast<size_t>(j)] +=
            static_cast<double>(grad_out[at(1, queries, depth, 0, 0, i, t)]) *
            v[at(1, keys, depth, 0, 0, j, t)];
      delta += dp[static_cast<size_t>(j)] / static_cast<double>(keys);
    }
    for (const double x : dp) absolute += std::abs(x - delta) / static_cast<double>(keys);
    double output_terms = 0.0;  // Σ_t |dO_it·O_it|, O_it = Σ_j v_jt / m
    for (int64_t t = 0; t < depth; ++t) {
      double o = 0.0;
      for (int64_t j = 0; j < keys; ++j) o += v[at(1, keys, depth, 0, 0, j, t)];
      output_terms +=
          std::abs(grad_out[at(1, queries, depth, 0, 0, i, t)] * o / static_cast<double>(keys));
    }
    for (int64_t t = 0; t < depth; ++t) {
      const size_t e = at(1, queries, depth, 0, 0, i, t);
      terms[e] = scale * absolute * std::abs(k_row[static_cast<size_t>(t)]);
      moved[e] = scale * std::abs(k_row[static_cast<size_t>(t)]) * 0x1p-16 * output_terms;
    }
  }
  // The largest |dQ| (the reference's is 0) less what D moves, over the terms' magnitudes.
  const auto relative_error = [&](Bf16Probabilities choice) {
    const testing::ScopedBf16Probabilities probabilities(choice);
    HalfHeads out16(1, 1, queries, depth), residual16(1, 1, queries, depth);
    std::vector<float> lse(static_cast<size_t>(queries));
    flash_attention_forward(type, q16.view(), k16.view(), v16.view(), {}, options, out16.view(),
                            lse.data(), nullptr, residual16.view());
    HalfHeads grad_q(1, 1, queries, depth), grad_k(1, 1, keys, depth), grad_v(1, 1, keys, depth);
    flash_attention_backward(type, q16.view(), k16.view(), v16.view(), out16.view(),
                             grad_out16.view(), lse.data(), {}, options, grad_q.view(),
                             grad_k.view(), grad_v.view(), {}, nullptr, nullptr, residual16.view());
    double worst = 0.0;
    for (size_t e = 0; e < terms.size(); ++e) {
      const double got = std::abs(half_bits_to_float(type, grad_q.bits[e]));
      worst = std::max(worst, (got - moved[e]) / terms[e]);
    }
    return worst;
  };
  if (!SplitWithinItsBoundRoundedPastIt(
          "dS", [&] { return flash_attention_bfloat16_backward_native(depth, depth); },
          relative_error)) {
    GTEST_SKIP() << "no AVX512-BF16 on this target: bf16 is widened to fp32";
  }
}

// Each product family under the choice that is not its default: P (and the backward's P ⊙ Z and
// dS) split on vdpbf16ps, rounded on the tile model (and on the hardware where it has AMX), over
// the AMX shapes and kCases, forward and backward.
TEST_P(FlashAttentionHalf, BFloat16OtherProbabilityFormMatchesReference) {
  bool ran = false;
  for (const AmxUse use : {AmxUse::kNever, AmxUse::kModel, AmxUse::kWhereAvailable}) {
    if (use == AmxUse::kWhereAvailable && !amx_available()) continue;
    const ScopedAmxUse amx(use);
    const ScopedBf16DotUse dot(Bf16DotUse::kAlways);
    if (!flash_attention_bfloat16_native(64)) continue;
    const testing::ScopedBf16Probabilities probabilities(
        use == AmxUse::kNever ? Bf16Probabilities::kSplit : Bf16Probabilities::kRounded);
    ran = true;
    Rng rng(137);
    for (const HalfCase& c : kAmxCases) check_case(HalfType::kBFloat16, c, rng);
    for (const HalfCase& c : kCases) check_case(HalfType::kBFloat16, c, rng);
  }
  if (!ran) GTEST_SKIP() << "no AVX512-BF16 on this target: bf16 is widened to fp32";
}

// Half gradients larger than the L2s of every thread the call could use go out in streaming stores
// (rows of whole vectors): dK and dV of one head over enough keys of 64, with per-batch lengths, in
// bf16 (the default products of each target: AMX tiles, vdpbf16ps or widened) and fp16.
TEST_P(FlashAttentionHalf, GradientsPastTheThreadsL2sMatchReference) {
  const auto threads = static_cast<size_t>(omp_get_max_threads());
  const auto keys =
      static_cast<int64_t>(l2_cache_bytes() * threads / (2 * 64 * sizeof(uint16_t)) + 37);
  Rng rng(88);
  for (const HalfType type : {HalfType::kBFloat16, HalfType::kFloat16})
    check_case(type, {1, 1, 1, 20, keys, 64, 64, false, -1, -1, true}, rng);
}

// Keys whose bf16 pairs outgrow half the L2 ((128 + 32) × 2 bytes a key: 3577 keys on a 2 MiB L2)
// send a head's query tiles through FlashForwardTileBF16 in blocks: on one thread 2 query heads of
// 9 tiles (550 queries) make two full blocks of 4 and a partial one, on vdpbf16ps, on the AMX
// tiles' model and on the hardware. Grouped heads with per-query lengths (a whole tile of no key
// among tiles that see keys); causal with sinks and dropout (each tile's own row keys); a soft
// cap. The forward pass alone: the backward runs no such blocks.
TEST_P(FlashAttentionHalf, BFloat16MatchesReferenceInQueryBlocks) {
  const auto keys = static_cast<int64_t>(l2_cache_bytes() / (2 * 2 * 160) + 300);
  const HalfCase cases[] = {
      {1, 2, 1, 550, keys, 128, 32, false, -1, -1, true},
      {1, 2, 2, 550, keys, 128, 32, true, -1, -1, false, true, false, 0.0F, 1.0F, 0.2F},
      {2, 1, 1, 550, keys, 128, 32, false, -1, -1, false, false, false, 8.0F, 2.0F}};
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  bool ran = false;
  for (const AmxUse use : {AmxUse::kNever, AmxUse::kModel, AmxUse::kWhereAvailable}) {
    if (use == AmxUse::kWhereAvailable && !amx_available()) continue;
    const ScopedAmxUse amx(use);
    const ScopedBf16DotUse dot(Bf16DotUse::kAlways);
    if (!flash_attention_bfloat16_native(128)) continue;
    Rng rng(89);
    for (const HalfCase& c : cases) check_case(HalfType::kBFloat16, c, rng, false);
    ran = true;
  }
  omp_set_num_threads(saved_threads);
  if (!ran) GTEST_SKIP() << "no AVX512-BF16 on this target: bf16 is widened to fp32";
}

TEST_P(FlashAttentionHalf, Float16MatchesReferenceOnRoundedInputs) {
  Rng rng(82);
  for (const HalfCase& c : kCases) check_case(HalfType::kFloat16, c, rng);
}

// fp16 widens to the fp32 pass, whose products go to the AMX tiles in three bf16 parts where the
// tiles are in use (forward and backward, whole 64 × 64 tiles in the backward): here in the tile
// model, at every length, on every CPU with AVX512-BF16.
TEST_P(FlashAttentionHalf, Float16OnAmxTileModelMatchesReferenceOnRoundedInputs) {
  const ScopedAmxUse model(AmxUse::kModel);
  const testing::ScopedFp32OnAmx on(true);
  if (!flash_attention_float_on_tiles())
    GTEST_SKIP() << "no AVX512-BF16 on this target: fp32 does not take the tiles";
  Rng rng(83);
  for (const HalfCase& c : kCases) check_case(HalfType::kFloat16, c, rng);
}

// Where one key dominates each row (q and k ×`magnitude`: scores in the hundreds), dS = P ⊙
// (dP − D) is a small difference, and D from the rounded output alone stands beside it: fp16's and
// bf16's dQ and dK then stray past the fp32 kernels' bound against the double reference (1e-5 of
// the largest gradient times the scores' magnitude², plus each element's own rounding; as
// PyTorch's half backward, which reads the rounded output too). With the forward's residuals,
// within it. On the widened path (fp16, and bf16 without bf16 products), where the output before
// rounding is the fp32 kernel's. Returns the elements past the bound [without, with residuals].
std::array<int64_t, 2> GradientsPastTheBound(HalfType type, float magnitude, uint64_t seed) {
  const HalfCase c{1, 1, 1, 64, 64, 128, 128, false, -1, -1, false, false, false, 0.0F, magnitude};
  Rng rng(seed);
  std::vector<float> q, k, v, grad_out;
  const HalfHeads q16 = random_heads(type, 1, 1, 64, 128, magnitude, rng, q);
  const HalfHeads k16 = random_heads(type, 1, 1, 64, 128, magnitude, rng, k);
  const HalfHeads v16 = random_heads(type, 1, 1, 64, 128, 1.0F, rng, v);
  const HalfHeads grad_out16 = random_heads(type, 1, 1, 64, 128, 1.0F, rng, grad_out);
  const float scale = 1.0F / std::sqrt(128.0F);
  const FlashAttentionOptions options = testing::kernel_options(scale, false, 0.0F, 0);
  HalfHeads out16(1, 1, 64, 128), residual16(1, 1, 64, 128);
  std::vector<float> lse(64);
  flash_attention_forward(type, q16.view(), k16.view(), v16.view(), {}, options, out16.view(),
                          lse.data(), nullptr, residual16.view());
  const std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(v.begin(), v.end()),
      grad_out_d(grad_out.begin(), grad_out.end());
  const reference::SdpaGradients want =
      reference::sdpa_backward(reference::problem_of_case(c, scale), qd, kd, vd, grad_out_d);
  const double rounding = type == HalfType::kBFloat16 ? 0x1p-8 : 0x1p-11;
  std::array<int64_t, 2> past{};
  for (const bool with_residual : {false, true}) {
    HalfHeads grad_q16(1, 1, 64, 128), grad_k16(1, 1, 64, 128), grad_v16(1, 1, 64, 128);
    flash_attention_backward(
        type, q16.view(), k16.view(), v16.view(), out16.view(), grad_out16.view(), lse.data(), {},
        options, grad_q16.view(), grad_k16.view(), grad_v16.view(), {}, nullptr, nullptr,
        with_residual ? ConstHalfHeadsView(residual16.view()) : ConstHalfHeadsView{});
    const std::pair<const HalfHeads*, const std::vector<double>*> pairs[] = {
        {&grad_q16, &want.q}, {&grad_k16, &want.k}, {&grad_v16, &want.v}};
    for (const auto& [got, expected] : pairs) {
      double largest = 1.0;
      for (const double value : *expected) largest = std::max(largest, std::abs(value));
      for (size_t e = 0; e < expected->size(); ++e) {
        const double tolerance = 1e-5 * std::max(1.0F, magnitude * magnitude) * largest +
                                 rounding * std::abs((*expected)[e]);
        if (std::abs(half_bits_to_float(type, got->bits[e]) - (*expected)[e]) > tolerance)
          ++past[with_residual ? 1 : 0];
      }
    }
  }
  return past;
}

TEST_P(FlashAttentionHalf, ResidualKeepsGradientsOfPeakedRowsWhereTheRoundedOutputLosesThem) {
  const ScopedAmxUse vectors(AmxUse::kNever);
  const ScopedBf16DotUse dot(Bf16DotUse::kNever);
  ASSERT_FALSE(flash_attention_bfloat16_native(128));
  for (const HalfType type : {HalfType::kFloat16, HalfType::kBFloat16}) {
    for (const float magnitude : {10.0F, 20.0F}) {
      int64_t without = 0;
      for (uint64_t seed = 1; seed <= 4; ++seed) {
        const std::array<int64_t, 2> past = GradientsPastTheBound(type, magnitude, seed);
        std::printf("%s x%g seed %d: %lld / %lld elements past the bound\n",
                    type == HalfType::kFloat16 ? "fp16" : "bf16", magnitude, int(seed),
                    static_cast<long long>(past[0]), static_cast<long long>(past[1]));
        EXPECT_EQ(past[1], 0) << "with residuals, x" << magnitude << " seed " << seed;
        without += past[0];
      }
      EXPECT_GT(without, 0) << "without residuals, x" << magnitude;
    }
  }
}

TEST_P(FlashAttentionHalf, RejectsInconsistentShapes) {
  std::vector<float> unused;
  Rng rng(3);
  const HalfHeads q = random_heads(HalfType::kBFloat16, 1, 2, 4, 8, 1.0F, rng, unused);
  const HalfHeads k = random_heads(HalfType::kBFloat16, 1, 2, 5, 7, 1.0F, rng, unused);
  HalfHeads out(1, 2, 4, 8);
  EXPECT_THROW(flash_attention_forward(HalfType::kBFloat16, q.view(), k.view(), k.view(), {},
                                       testing::kernel_options(1.0F), out.view()),
               ShapeError);
  // The backward pass names the gradient whose shape is off.
  const HalfHeads k8 = random_heads(HalfType::kBFloat16, 1, 2, 5, 8, 1.0F, rng, unused);
  HalfHeads grad_q(1, 2, 4, 8), grad_k(1, 2, 5, 8), grad_v(1, 2, 5, 8), wrong(1, 2, 5, 7);
  const std::vector<float> lse(8, 0.0F);
  EXPECT_THROW_MESSAGE(
      flash_attention_backward(HalfType::kBFloat16, q.view(), k8.view(), k8.view(), out.view(),
                               out.view(), lse.data(), {}, testing::kernel_options(1.0F),
                               grad_q.view(), grad_k.view(), wrong.view()),
      ShapeError, "grad_v: expected 1 × 2 heads of 5 × 8");
  EXPECT_THROW_MESSAGE(
      flash_attention_backward(HalfType::kBFloat16, q.view(), k8.view(), k8.view(), out.view(),
                               out.view(), nullptr, {}, testing::kernel_options(1.0F),
                               grad_q.view(), grad_k.view(), grad_v.view()),
      ValueError, "log_sum_exp");
}

// With no queries to back-propagate from (every length 0 leaves the keys unseen, and an empty
// value axis leaves no work), the half gradients are zero, as the float pass's are.
TEST_P(FlashAttentionHalf, BackwardWithoutWorkGivesZeroGradients) {
  std::vector<float> unused;
  Rng rng(4);
  const HalfHeads q = random_heads(HalfType::kFloat16, 1, 1, 3, 4, 1.0F, rng, unused);
  const HalfHeads k = random_heads(HalfType::kFloat16, 1, 1, 5, 4, 1.0F, rng, unused);
  const HalfHeads v(1, 1, 5, 0), out(1, 1, 3, 0);
  HalfHeads grad_q(1, 1, 3, 4), grad_k(1, 1, 5, 4), grad_v(1, 1, 5, 0);
  std::fill(grad_q.bits.begin(), grad_q.bits.end(), uint16_t{0x3c00});  // 1.0 in fp16
  std::fill(grad_k.bits.begin(), grad_k.bits.end(), uint16_t{0x3c00});
  const std::vector<float> lse(3, 0.0F);
  flash_attention_backward(HalfType::kFloat16, q.view(), k.view(), v.view(), out.view(), out.view(),
                           lse.data(), {}, testing::kernel_options(0.5F), grad_q.view(),
                           grad_k.view(), grad_v.view());
  EXPECT_EQ(std::vector<uint16_t>(grad_q.bits.begin(), grad_q.bits.end()),
            std::vector<uint16_t>(12, 0));
  EXPECT_EQ(std::vector<uint16_t>(grad_k.bits.begin(), grad_k.bits.end()),
            std::vector<uint16_t>(20, 0));
}

// The paths a half input takes here: bf16 on vdpbf16ps pairs (widened where the target has no
// AVX512-BF16), bf16 on the AMX tile model, fp16 widened.
struct HalfPath {
  HalfType type;
  AmxUse amx;
  const char* name;
};
constexpr HalfPath kHalfPaths[] = {{HalfType::kBFloat16, AmxUse::kNever, "bf16 on vectors"},
                                   {HalfType::kBFloat16, AmxUse::kModel, "bf16, AMX tile model"},
                                   {HalfType::kFloat16, AmxUse::kNever, "fp16"}};

// `read` reports the largest magnitude of every query row and of the key and value rows the pass
// reads, as the floats the inputs widen to, on each path a half input takes here: bf16 on
// vdpbf16ps pairs, on the AMX tile model (blocks of 32 keys) and widened where the target has
// neither, fp16 widened. Top-left causal with n = 70 < m = 300 reads keys [0, 96) at most, so an ∞
// key and a NaN value at rows 200 and 250 are not reported, while NaN and −∞ in rows read are.
TEST_P(FlashAttentionHalf, ReportsTheMagnitudesOfTheRowsItReads) {
  for (const HalfPath path : kHalfPaths) {
    SCOPED_TRACE(path.name);
    const ScopedAmxUse amx(path.amx);
    Rng rng(85);
    std::vector<float> widened;
    // Normal entries of σ = 0.1 stay far below the planted magnitudes, which both types hold.
    HalfHeads q = random_heads(path.type, 2, 1, 70, 64, 0.1F, rng, widened);
    HalfHeads k = random_heads(path.type, 2, 1, 300, 64, 0.1F, rng, widened);
    HalfHeads v = random_heads(path.type, 2, 1, 300, 32, 0.1F, rng, widened);
    const auto set = [&](HalfHeads& heads, int64_t b, int64_t row, int64_t col, float value) {
      heads.set(path.type, b, row, col, value);
    };
    const float infinity = std::numeric_limits<float>::infinity();
    set(q, 1, 33, 63, -7.5F);
    set(k, 1, 69, 0, -6.25F);     // the last key a query sees
    set(k, 0, 200, 3, infinity);  // never read
    set(v, 0, 10, 31, 5.5F);
    set(v, 1, 250, 2, std::nanf(""));  // never read
    HalfHeads out(2, 1, 70, 32);
    FlashAttentionOptions options = testing::kernel_options(0.125F, true);
    options.alignment = DiagonalAlignment::kTopLeft;
    const auto run = [&] {
      ReadMagnitudes read{-1.0F, -1.0F, -1.0F};
      flash_attention_forward(path.type, q.view(), k.view(), v.view(), {}, options, out.view(),
                              nullptr, &read);
      return read;
    };
    ReadMagnitudes read = run();
    EXPECT_EQ(read.query, 7.5F);
    EXPECT_EQ(read.key, 6.25F);
    EXPECT_EQ(read.value, 5.5F);
    for (const uint16_t bits : out.bits)
      ASSERT_TRUE(std::isfinite(half_bits_to_float(path.type, bits)));
    set(k, 0, 3, 63, std::nanf(""));
    set(v, 1, 0, 0, -infinity);
    read = run();
    EXPECT_EQ(read.query, 7.5F);
    EXPECT_TRUE(std::isnan(read.key)) << read.key;
    EXPECT_EQ(read.value, infinity);
  }
}

// The backward pass's `read` likewise: every row of q, out and grad_out, and the key and value
// rows of the 64-key tiles some query reaches (keys [0, 128) for top-left causal with n = 70), as
// the floats they widen to, on bf16 pairs, the AMX tile model and widened rows (fp16, and bf16
// where the target has no AVX512-BF16); NaN and ±∞ in rows read are reported, those in rows 200
// and 250 are not.
TEST_P(FlashAttentionHalf, BackwardReportsTheMagnitudesOfTheRowsItReads) {
  for (const HalfPath path : kHalfPaths) {
    SCOPED_TRACE(path.name);
    const ScopedAmxUse amx(path.amx);
    Rng rng(86);
    std::vector<float> widened;
    // Normal entries of σ = 0.1 stay far below the planted magnitudes, which both types hold.
    HalfHeads q = random_heads(path.type, 2, 1, 70, 64, 0.1F, rng, widened);
    HalfHeads k = random_heads(path.type, 2, 1, 300, 64, 0.1F, rng, widened);
    HalfHeads v = random_heads(path.type, 2, 1, 300, 32, 0.1F, rng, widened);
    HalfHeads grad_out = random_heads(path.type, 2, 1, 70, 32, 0.1F, rng, widened);
    const auto set = [&](HalfHeads& heads, int64_t b, int64_t row, int64_t col, float value) {
      heads.set(path.type, b, row, col, value);
    };
    const float infinity = std::numeric_limits<float>::infinity();
    set(q, 1, 33, 63, -7.5F);
    set(k, 1, 100, 0, -6.25F);    // no query sees it, but its 64-key tile is read
    set(k, 0, 200, 3, infinity);  // never read
    set(v, 0, 10, 31, 5.5F);
    set(v, 1, 250, 2, std::nanf(""));  // never read
    set(grad_out, 0, 69, 5, 3.25F);
    FlashAttentionOptions options = testing::kernel_options(0.125F, true);
    options.alignment = DiagonalAlignment::kTopLeft;
    HalfHeads out(2, 1, 70, 32), grad_q(2, 1, 70, 64), grad_k(2, 1, 300, 64), grad_v(2, 1, 300, 32);
    std::vector<float> lse(2 * 70);
    flash_attention_forward(path.type, q.view(), k.view(), v.view(), {}, options, out.view(),
                            lse.data());
    float out_max = 0.0F;
    for (const uint16_t bits : out.bits)
      out_max = std::max(out_max, std::abs(half_bits_to_float(path.type, bits)));
    const auto run = [&] {
      BackwardReadMagnitudes read{-1.0F, -1.0F, -1.0F, -1.0F, -1.0F};
      flash_attention_backward(path.type, q.view(), k.view(), v.view(), out.view(), grad_out.view(),
                               lse.data(), {}, options, grad_q.view(), grad_k.view(), grad_v.view(),
                               {}, nullptr, &read);
      return read;
    };
    BackwardReadMagnitudes read = run();
    EXPECT_EQ(read.query, 7.5F);
    EXPECT_EQ(read.key, 6.25F);
    EXPECT_EQ(read.value, 5.5F);
    EXPECT_EQ(read.output, out_max);
    EXPECT_EQ(read.grad_output, 3.25F);
    set(k, 0, 127, 63, std::nanf(""));
    set(v, 1, 0, 0, -infinity);
    set(grad_out, 1, 0, 0, infinity);
    read = run();
    EXPECT_EQ(read.query, 7.5F);
    EXPECT_TRUE(std::isnan(read.key)) << read.key;
    EXPECT_EQ(read.value, infinity);
    EXPECT_EQ(read.output, out_max);
    EXPECT_EQ(read.grad_output, infinity);
  }
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(FlashAttentionHalf);

}  // namespace
}  // namespace attn
