// The limits the file readers apply beyond a format's own rules, so that a small file cannot make
// attn allocate or compute without bound.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace attn::io_detail {

// An array with a zero dimension holds no data, so its other dimensions cost nothing to declare:
// a 128-byte .npy can claim 2^31 rows of width 0. Whatever is sized by them (one log-sum-exp per
// query row, a key loop per query) would then be bounded by nothing in the file, so their product
// is capped: 65536 keeps every such result at most 2^32 score pairs (a few seconds), and no honest
// empty array comes near it.
constexpr int64_t kMaxEmptyExtent = int64_t{1} << 16;

// The product of the non-zero dimensions of an array that has a zero dimension, saturating at
// kMaxEmptyExtent + 1; 0 for an array with data (or a scalar).
inline int64_t empty_extent(std::span<const int64_t> dims) {
  bool empty = false;
  int64_t product = 1;
  for (const int64_t dim : dims) {
    if (dim == 0) {
      empty = true;
    } else if (product <= kMaxEmptyExtent) {
      product = dim > kMaxEmptyExtent ? kMaxEmptyExtent + 1 : product * dim;
    }
  }
  if (!empty) return 0;
  return product > kMaxEmptyExtent ? kMaxEmptyExtent + 1 : product;
}

// The message for an empty array over the cap, after "shape <shape> ".
inline std::string empty_extent_message() {
  return "holds no data, but its other dimensions multiply to more than " +
         std::to_string(kMaxEmptyExtent) +
         ", the limit for an empty array (sizes no data backs would size what is computed from "
         "them)";
}

}  // namespace attn::io_detail
