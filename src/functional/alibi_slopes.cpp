// The per-head logits the kernels' base-2 scores can hold: ALiBi slopes (the public range check,
// which ring attention calls with the whole sequence's distances, and the functional calls'
// checks around it) and sinks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "attn/core/error.hpp"
#include "attn/functional/attention_options.hpp"
#include "functional/attention_layout.hpp"

namespace attn {

void check_alibi_slope_range(std::span<const float> slopes, int64_t longest_distance) {
  const double largest =
      static_cast<double>(std::numeric_limits<float>::max()) / std::numbers::log2e;
  const double steepest_rise =
      largest / static_cast<double>(std::max<int64_t>(1, longest_distance));
  for (size_t h = 0; h < slopes.size(); ++h) {
    const double slope = slopes[h];
    if (std::fabs(slope) > largest) {
      throw ValueError("alibi_slopes: expected slopes of magnitude at most " +
                       number_text(static_cast<float>(largest)) +
                       " (float's largest over log2 e: the kernels' base-2 scores take the slope "
                       "times log2 e), got " +
                       number_text(slopes[h]) + " at index " + std::to_string(h));
    }
    if (-slope > steepest_rise) {
      throw ValueError("alibi_slopes: expected negative slopes of magnitude at most " +
                       number_text(static_cast<float>(steepest_rise)) +
                       " (float's largest over log2 e and the " + std::to_string(longest_distance) +
                       " positions a query can be from a key: its score would overflow to +∞), "
                       "got " +
                       number_text(slopes[h]) + " at index " + std::to_string(h));
    }
  }
}

namespace functional_detail {

void require_sinks(std::span<const float> sinks, int64_t heads) {
  require_per_head("sinks", sinks, heads);
  // 2^127, the bound of an additive mask's entries: past float's largest over log2 e a sink
  // overflowed in the base-2 scores (NaN gradients), and below −2^127 it fell under a row that a
  // mask of float's lowest hides, whose entries are raised to −2^127 (the values' average came
  // out where the sink takes every weight).
  const double largest = std::ldexp(1.0, 127);
  for (size_t h = 0; h < sinks.size(); ++h) {
    if (std::fabs(static_cast<double>(sinks[h])) > largest) {
      throw ValueError(
          "sinks: expected logits of magnitude at most 2^127 (1.7e38, as an additive "
          "mask's entries), got " +
          number_text(sinks[h]) + " at index " + std::to_string(h));
    }
  }
}

void require_alibi_slopes(std::span<const float> slopes, int64_t heads, int64_t longest_distance) {
  require_per_head("alibi_slopes", slopes, heads);
  check_alibi_slope_range(slopes, longest_distance);
}

}  // namespace functional_detail
}  // namespace attn
