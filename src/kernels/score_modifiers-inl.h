// The steps between a raw score tile and the softmax, per SIMD target (a Highway "-inl.h" header):
// soft-capping, ALiBi, the attention mask and the key ranges, applied in that order to a
// transposed tile Sᵀ (keys × Br, queries along the lanes). The forward pass, the backward pass and
// the weights kernel all call ApplyScoreModifiers, so they agree on every score.

#if defined(ATTN_KERNELS_SCORE_MODIFIERS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_SCORE_MODIFIERS_INL_H_
#undef ATTN_KERNELS_SCORE_MODIFIERS_INL_H_
#else
#define ATTN_KERNELS_SCORE_MODIFIERS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "attn/kernels/fused_options.hpp"
#include "kernels/fast_math-inl.h"
#include "kernels/score_masks.hpp"
#include "kernels/transpose_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Whether ApplyScoreModifiers may run on scores not yet multiplied by the scale c, c entering
// the exponent after (c·S − max in one multiply-add): c > 0, so that the largest score stays the
// largest, and none of the modifiers that read a score's value — soft-cap, ALiBi, a float mask —
// is set; bool masks and key ranges write −∞, the same scaled or not.
inline bool ModifiersCommuteWithScale(const FlashAttentionOptions& options) {
  return options.scale > 0.0F && options.scale <= std::numeric_limits<float>::max() &&
         options.softcap == 0.0F && options.alibi_slopes == nullptr &&
         options.mask.kind != MaskKind::kFloat;
}

// One query tile of a head: where its lanes' queries are and which keys each sees.
struct QueryTile {
  int64_t batch = 0;
  int64_t head = 0;                // the query head
  int64_t first_query = 0;         // the query in lane 0
  size_t rows = 0;                 // real queries; lanes up to Br past them are padding
  int64_t queries = 0;             // n
  int64_t keys = 0;                // m
  const int32_t* first = nullptr;  // Br values: each lane's first visible key
  const int32_t* last = nullptr;   // Br values: one past each lane's last visible key
  TileKeyRanges ranges;
};

// What a mask entry adds to its score: a float mask's entry itself; a bool mask's 0 where it keeps
// the key and −∞ where it hides it (branch-free: a random bool mask's entries, tested one branch
// each, mispredicted often enough to take 3.2× the unmasked forward's time at n = m = 1024, Zen 5).
//
// A float entry below −2^127 (float's lowest, −3.4e38, which transformers' masks use) adds −2^127:
// the base-2 passes multiply entries by log2 e, which took float's lowest to −∞ and so hid a row
// that PyTorch averages (its scores all equal). −2^127 · log2 e stays finite, and no score can
// matter beside it (the score bound is 1e37); entries between −3.4e38 and −2^127 tie.
inline constexpr float kLowestMaskEntry = -0x1p127F;
HWY_INLINE float AddedScore(float entry) {
  return entry < kLowestMaskEntry && entry != -std::numeric_limits<float>::infinity()
             ? kLowestMaskEntry
             : entry;
}
HWY_INLINE float AddedScore(uint8_t entry) {
  return entry != 0 ? 0.0F : -std::numeric_limits<float>::infinity();
}
HWY_INLINE float AddedScore(BFloat16Entry entry) {
  return AddedScore(entry_value(entry));
}
HWY_INLINE float AddedScore(Float16Entry entry) {
  return AddedScore(entry_value(entry));
}
#if HWY_TARGET != HWY_SCALAR
// Float entries (a vector of them) as AddedScore adds them.
template <class D>
HWY_INLINE hn::Vec<D> AddedScoresOf(D d, hn::Vec<D> entry) {
  const auto hidden = hn::Eq(entry, hn::Set(d, -std::numeric_limits<float>::infinity()));
  return hn::IfThenElse(hidden, entry, hn::Max(entry, hn::Set(d, kLowestMaskEntry)));
}
// A vector of consecutive float mask entries in fp32: half ones widened exactly.
template <class D>
HWY_INLINE hn::Vec<D> LoadEntries(D d, const float* entries) {
  return hn::LoadU(d, entries);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadEntries(D d, const BFloat16Entry* entries) {
  const hn::Rebind<hwy::bfloat16_t, D> dh;
  return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::bfloat16_t*>(entries)));
}
template <class D>
HWY_INLINE hn::Vec<D> LoadEntries(D d, const Float16Entry* entries) {
  const hn::Rebind<hwy::float16_t, D> dh;
  const auto values =
      hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(entries)));
#if HWY_TARGET >= HWY_SSE4
  // Without F16C Highway widens fp16's all-ones exponent as an ordinary one (−∞ became −65536,
  // which the mask would add): −∞, the one such entry a mask may hold, restored.
  const hn::Rebind<uint16_t, D> du16;
  const hn::RebindToUnsigned<D> du32;
  const auto bits =
      hn::PromoteTo(du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(entries)));
  return hn::IfThenElse(hn::RebindMask(d, hn::Eq(bits, hn::Set(du32, 0xfc00U))),
                        hn::Set(d, -std::numeric_limits<float>::infinity()), values);
#else
  return values;
#endif
}
// AddedScore of 4 (a vector of) consecutive float entries.
template <class D4, class Entry>
HWY_INLINE hn::Vec<D4> AddedScores(D4 d4, const Entry* entries) {
  return AddedScoresOf(d4, LoadEntries(d4, entries));
}
template <class D4>
HWY_INLINE hn::Vec<D4> AddedScores(D4 d4, const uint8_t* entries) {
  const hn::RebindToSigned<D4> di;
  const hn::Rebind<uint8_t, D4> d8;
  const auto hidden = hn::Eq(hn::PromoteTo(di, hn::LoadU(d8, entries)), hn::Zero(di));
  return hn::IfThenElseZero(hn::RebindMask(d4, hidden),
                            hn::Set(d4, -std::numeric_limits<float>::infinity()));
}
#endif

// score + unit · entry in one multiply-add, as AddMaskEntries' vector paths round it, so that a
// mask's entries give the same bits whichever path (layout) adds them; on targets without FMA
// both are Highway's multiply then add.
HWY_INLINE float ScaledEntryAdded(float score, float unit, float entry) {
  const hn::CappedTag<float, 1> d1;
  return hn::GetLane(hn::MulAdd(hn::Set(d1, entry), hn::Set(d1, unit), hn::Set(d1, score)));
}

// Sᵀ[j · br + i] += unit · AddedScore(row[i · stride + j]) for `count` queries i and the keys
// j in [first_key, bc), one entry at a time: the keys past a block of queries' whole steps.
template <class Entry>
HWY_INLINE void AddEntriesOneByOne(const Entry* row, int64_t stride, size_t count, size_t first_key,
                                   size_t bc, size_t br, float unit, float* HWY_RESTRICT scores) {
  for (size_t j = first_key; j < bc; ++j) {
    for (size_t i = 0; i < count; ++i) {
      float& score = scores[j * br + i];
      score = ScaledEntryAdded(
          score, unit, AddedScore(row[static_cast<int64_t>(i) * stride + static_cast<int64_t>(j)]));
    }
  }
}

// Sᵀ[j · br + r] += unit · AddedScore of the mask's entry (query first_query + r, key key0 + j),
// Entry float or uint8_t (bool), for the `rows` real queries of the tile (and, for a mask
// broadcast over the queries, every lane to `width`); `unit` is ApplyScoreModifiers'. The mask's
// rows run along the keys and Sᵀ's along the queries: blocks of 4 queries × 4 keys are turned in
// registers (Transpose4x4, as TransposeScaledTile turns Q); element by element (the form a strided
// mask still takes) the additions cost a float-masked causal forward 1.7× the time of the same mask
// as bools.
template <class Entry, class D>
HWY_INLINE void AddMaskEntries(D d, const ScoreMask& mask, const QueryTile& tile, int64_t key0,
                               size_t bc, size_t br, size_t width, float unit,
                               float* HWY_RESTRICT scores) {
  const auto* entries = static_cast<const Entry*>(mask.data);
  if (mask.row_stride == 0) {  // one row for every query: each key's entry is added to all lanes
    const Entry* row = entries + mask.offset(tile.batch, tile.head, tile.first_query, key0);
    const auto unit_vector = hn::Set(d, unit);
    for (size_t j = 0; j < bc; ++j) {
      const auto entry = hn::Set(d, AddedScore(row[static_cast<int64_t>(j) * mask.col_stride]));
      for (size_t r = 0; r < width; r += hn::Lanes(d)) {
        float* score = scores + j * br + r;
        hn::Store(hn::MulAdd(entry, unit_vector, hn::Load(d, score)), d, score);
      }
    }
    return;
  }
  size_t r = 0;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // Float entries on AVX-512: blocks of 16 queries × 16 keys turned at once (TransposeWords16),
  // each key's 16 entries then one vector: a third of the 4 × 4 blocks' operations per entry (a
  // bf16 call of 16 queries against 4096 keys with a float mask had spent a quarter of its time
  // adding the mask, Sapphire Rapids-class core). Half entries are widened into a block first.
  if constexpr (!std::is_same_v<Entry, uint8_t>) {
    if (mask.col_stride == 1 && mask.row_stride > 0 && hn::Lanes(d) == 16) {
      const auto unit_vector = hn::Set(d, unit);
      const size_t full_keys = bc / 16 * 16;
      HWY_ALIGN float block[16 * 16];
      for (; r + 16 <= tile.rows; r += 16) {
        const Entry* row = entries + mask.offset(tile.batch, tile.head,
                                                 tile.first_query + static_cast<int64_t>(r), key0);
        const auto stride = static_cast<size_t>(mask.row_stride);
        for (size_t j = 0; j < full_keys; j += 16) {
          if constexpr (std::is_same_v<Entry, float>) {
            TransposeWords16(reinterpret_cast<const uint32_t*>(row + j), stride,
                             reinterpret_cast<uint32_t*>(block), 16);
          } else {
            HWY_ALIGN float widened[16 * 16];
            for (size_t i = 0; i < 16; ++i)
              hn::Store(LoadEntries(d, row + i * stride + j), d, widened + i * 16);
            TransposeWords16(reinterpret_cast<const uint32_t*>(widened), 16,
                             reinterpret_cast<uint32_t*>(block), 16);
          }
          for (size_t t = 0; t < 16; ++t) {
            float* at = scores + (j + t) * br + r;
            const auto entry = AddedScoresOf(d, hn::Load(d, block + t * 16));
            hn::StoreU(hn::MulAdd(entry, unit_vector, hn::LoadU(d, at)), d, at);
          }
        }
        AddEntriesOneByOne(row, mask.row_stride, 16, full_keys, bc, br, unit, scores + r);
      }
    }
  }
#endif
#if HWY_TARGET != HWY_SCALAR
  if (mask.col_stride == 1) {
    const hn::CappedTag<float, 4> d4;
    const auto unit4 = hn::Set(d4, unit);
    const size_t full_keys = bc / 4 * 4;
    for (; r + 4 <= tile.rows; r += 4) {
      const Entry* row = entries + mask.offset(tile.batch, tile.head,
                                               tile.first_query + static_cast<int64_t>(r), key0);
      const int64_t stride = mask.row_stride;
      for (size_t j = 0; j < full_keys; j += 4) {
        const auto a = AddedScores(d4, row + j);
        const auto b = AddedScores(d4, row + stride + j);
        const auto c = AddedScores(d4, row + 2 * stride + j);
        const auto e = AddedScores(d4, row + 3 * stride + j);
        float* column = scores + j * br + r;
        Transpose4x4(d4, a, b, c, e, [&](size_t t, auto entries_of_key) {
          float* at = column + t * br;
          hn::StoreU(hn::MulAdd(entries_of_key, unit4, hn::LoadU(d4, at)), d4, at);
        });
      }
      AddEntriesOneByOne(row, stride, 4, full_keys, bc, br, unit, scores + r);
    }
  }
#endif
  for (; r < tile.rows; ++r) {  // the rows left
    const Entry* row = entries + mask.offset(tile.batch, tile.head,
                                             tile.first_query + static_cast<int64_t>(r), key0);
    for (size_t j = 0; j < bc; ++j) {
      float& score = scores[j * br + r];
      score =
          ScaledEntryAdded(score, unit, AddedScore(row[static_cast<int64_t>(j) * mask.col_stride]));
    }
  }
}

// Sᵀ (keys key0 … key0 + bc − 1 × Br) from raw scores to the scores the softmax takes, in place:
// s → softcap·tanh(s/softcap), + ALiBi's −slope·|c_i − j|, + a float mask (or −∞ where a bool
// mask is false, when `apply_bool_mask`: callers skip it for tiles the mask covers entirely),
// −∞ outside each lane's key range, in the lanes [0, width) of each key's row (br apart; width a
// multiple of D's lanes: lanes past it, which no reader of the caller's reads, are left as they
// are). `softcap_tanh` (bc × Br or null) receives tanh(s/softcap), which the backward pass needs
// for the derivative 1 − tanh². `unit` 1, or log2 e for scores in base 2 (the fp32 forward's
// ForwardArgs::base_two): each modifier then adds unit times its natural value, the soft cap
// scaled by it (u·c·tanh(s/c) = (u·c)·tanh(u·s/(u·c))).
template <class D>
HWY_INLINE void ApplyScoreModifiers(D d, const FlashAttentionOptions& options,
                                    const QueryTile& tile, int64_t key0, size_t bc, size_t br,
                                    size_t width, bool apply_bool_mask, float* scores,
                                    float* softcap_tanh = nullptr, float unit = 1.0F) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  if (options.softcap > 0.0F) {
    const float softcap = unit * options.softcap;
    const V cap = hn::Set(d, softcap), inverse_cap = hn::Set(d, 1.0F / softcap);
    for (size_t j = 0; j < bc; ++j) {
      for (size_t r = 0; r < width; r += lanes) {
        float* score = scores + j * br + r;
        const V t = AdditiveTanh(d, hn::Mul(hn::Load(d, score), inverse_cap));
        if (softcap_tanh != nullptr) hn::Store(t, d, softcap_tanh + j * br + r);
        hn::Store(hn::Mul(t, cap), d, score);
      }
    }
  }
  if (options.alibi_slopes != nullptr) {
    // |c_i − j| with c_i = diagonal of lane r's query: (first diagonal − j) + r, exact in float
    // below 2^24.
    const V slope = hn::Set(d, unit * options.alibi_slopes[tile.head]);
    const int64_t first_diagonal = diagonal_key(options, tile.first_query, tile.queries, tile.keys);
    const V lane_index = hn::Iota(d, 0.0F);
    for (size_t j = 0; j < bc; ++j) {
      const auto offset = static_cast<float>(first_diagonal - key0 - static_cast<int64_t>(j));
      for (size_t r = 0; r < width; r += lanes) {
        float* score = scores + j * br + r;
        const V distance = hn::Abs(hn::Add(lane_index, hn::Set(d, offset + static_cast<float>(r))));
        hn::Store(hn::NegMulAdd(slope, distance, hn::Load(d, score)), d, score);
      }
    }
  }
  if (options.mask.kind == MaskKind::kFloat) {
    with_float_entries(options.mask.entries, [&](auto entry_type) HWY_ATTR {
      AddMaskEntries<decltype(entry_type)>(d, options.mask, tile, key0, bc, br, width, unit,
                                           scores);
    });
  } else if (options.mask.kind == MaskKind::kBool && apply_bool_mask) {
    AddMaskEntries<uint8_t>(d, options.mask, tile, key0, bc, br, width, unit, scores);
  }
  // Keys outside a lane's [first, last): only those some real query of the tile cannot see.
  const hn::RebindToSigned<D> di;
  const V minus_infinity = hn::Set(d, -std::numeric_limits<float>::infinity());
  for (size_t j = 0; j < bc; ++j) {
    const int64_t key = key0 + static_cast<int64_t>(j);
    if (key >= tile.ranges.common_begin && key < tile.ranges.common_end) continue;
    const auto key_index = hn::Set(di, static_cast<int32_t>(key));
    for (size_t r = 0; r < width; r += lanes) {
      const auto visible =
          hn::RebindMask(d, hn::And(hn::Not(hn::Lt(key_index, hn::Load(di, tile.first + r))),
                                    hn::Lt(key_index, hn::Load(di, tile.last + r))));
      float* score = scores + j * br + r;
      hn::Store(hn::IfThenElse(visible, hn::Load(d, score), minus_infinity), d, score);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_SCORE_MODIFIERS_INL_H_
