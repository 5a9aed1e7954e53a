// An attention mask whose every row is one interval of visible keys (padding on either side, a
// static cache's empty slots, causal and sliding-window patterns, as transformers passes them),
// read as those intervals: the kernels then bound each row by its keys and read no mask.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/kernels/fused_options.hpp"

namespace attn::functional_detail {

// Each query row's visible keys as [first, last) when every row of a bool mask (or of a float
// mask of 0 and −∞ only) is one interval of keys; false otherwise (a gap, a float bias), after
// reading at most up to the first row that is not. `ranges` gets 2 values per (b, h, i) of
// `heads` heads and n queries (FlashAttentionOptions::key_ranges), the rows of a mask broadcast
// over the heads or the queries read once. One read of the mask, each row's hidden tail (most of
// a causal row) branch-free.
bool mask_intervals(const ScoreMask& mask, int64_t batch, int64_t heads, int64_t n, int64_t m,
                    std::vector<int64_t>& ranges);

}  // namespace attn::functional_detail
