// The bundled translation task: dates written in many human forms ("3 march 1987", "tuesday,
// march 3, 1987", "03/03/87", ...) paired with their ISO form ("1987-03-03"), generated from a
// seed, so training needs no download.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/seq2seq/corpus.hpp"

namespace attn {

// The number of human forms the generator writes; each example picks one uniformly.
inline constexpr int kDateFormats = 15;
// Dates are drawn uniformly from 1950-01-01 to 2049-12-31, so a two-digit year ("87", "03") names
// exactly one of them (50–99 → 19xx, 00–49 → 20xx).
inline constexpr int kFirstDateYear = 1950;
inline constexpr int kLastDateYear = 2049;

// `count` pairs (ValueError for a negative count); the same seed gives the same pairs.
std::vector<TextPair> generate_date_pairs(int64_t count, uint64_t seed);

// The date at `days` since 1950-01-01 written in form `format` (0 ≤ format < kDateFormats), and
// its ISO form; ValueError outside those ranges. Weekday names are the true ones.
TextPair write_date(int64_t days, int format);

}  // namespace attn
