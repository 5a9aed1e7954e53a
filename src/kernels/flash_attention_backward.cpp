// Fused scaled dot-product attention, backward (FlashAttention-2): per (batch, head), key tiles in
// the outer loop so each tile's dK and dV stay in scratch, query tiles inside, the probabilities
// recomputed from the forward pass's log-sum-exp. Layout and notation as the forward kernel.
//
// Derivation, with S = c·Q Kᵀ (c the scale), P = softmax(S) masked, O = P V:
//   dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ⊙ (dP − D) with D_i = Σ_t dO_it O_it (= Σ_j P_ij dP_ij),
//   dQ = c · dS K,   dK = c · dSᵀ Q.
// Everything runs on transposed tiles (keys × queries) so the per-query D and log-sum-exp are
// lane-wise, and every product is the tile GEMM of tile_gemm-inl.h.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <numbers>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/kernels/amx.hpp"
#include "attn/kernels/bfloat16_probabilities.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "core/magnitude_scan.hpp"
#include "kernels/cache_sizes.hpp"
#include "kernels/cpu_features.hpp"
#include "kernels/dropout_hash.hpp"
#include "kernels/kernel_arguments.hpp"
#include "kernels/parallel_tasks.hpp"
#include "kernels/rows_view.hpp"
#include "kernels/score_masks.hpp"
#include "kernels/scratch_memory.hpp"
#include "kernels/split_parts_range.hpp"

#ifndef ATTN_FLASH_ATTENTION_BACKWARD_SHARED
#define ATTN_FLASH_ATTENTION_BACKWARD_SHARED
namespace attn::flash_backward_detail {

struct BackwardArgs {
  ConstHeadsView q, k, v, out, grad_out;
  const float* log_sum_exp;
  const ValidLengths* valid_lens;
  FlashAttentionOptions options;
  HeadsView grad_q, grad_k, grad_v;
  ScoreMaskGradient grad_mask;  // data null: not wanted
  float* grad_sinks;            // null: not wanted
  // Half-precision inputs and gradients (the half overload): the float views above then give
  // shapes and strides only, and rows are widened as the kernel packs them, gradients rounded as
  // it writes them.
  bool half = false;
  HalfType half_type = HalfType::kBFloat16;
  ConstHalfHeadsView q16{}, k16{}, v16{}, out16{}, grad_out16{};
  ConstHalfHeadsView residual16{};  // data not null: out16's rounding residuals (out_residual)
  HalfHeadsView grad_q16{}, grad_k16{}, grad_v16{};
  // fp32 passes: when not null, five running maxima (q, k, v, out, grad_out) of the magnitude bits
  // of the rows the pass reads (flash_attention_backward's `read`), raised as each task ends.
  std::atomic<uint32_t>* read_magnitude_bits = nullptr;
  // fp32 gradients larger than the threads' L2s (FlashBackward sets it): rows of whole aligned
  // vectors written with streaming stores (WriteGradientRow).
  bool stream_gradients = false;
  // False: the fp32 products never go to the AMX tiles in three bf16 parts, as FlashBackward
  // reruns a pass whose operands lay outside split_parts_in_range.
  bool parts_on_tiles = true;
  // log_sum_exp is flash_attention_recomputed_log_sum_exp's (LogSumExpKind::kRecomputedBaseTwo):
  // in base 2 already, from scores computed as this pass's FMA products compute them, so the pass
  // takes those for every tile's scores (no AMX tiles; FewQueryProducts only in heads of at most
  // kFewQueries queries, as the recount).
  bool recomputed_log_sum_exp = false;
};

constexpr size_t kQueryVectors = 4;
constexpr size_t kKeyTile = kBackwardKeyTile;  // keys_read_in_tiles tells the callers its reads
constexpr size_t kMaxKeyBlockTiles = 16;       // 1024 keys: beyond it a block saves no more reads
// Query tiles of at least this many queries take the AMX tiles' products where those are in use,
// the lanes past the queries padding (FlashBackwardQueryHead); fewer stay on vdpbf16ps. A bf16
// training step of 8 query heads against 1024 keys, one thread of a Sapphire Rapids-class core,
// padded from 1 query on: 0.89x at n = 1, 0.91x at 4, 0.97x at 8, 1.13x at 16, 1.60x at 32,
// 2.28x at 48, 1.62x at 100 (its second tile of 36).
[[maybe_unused]] constexpr size_t kFewestTileQueries = 16;  // read by the AVX-512 targets only
// The fewest queries and keys per head (the shorter of the two) for which the fp32 products go to
// the AMX tiles in three bf16 parts: the forward's threshold (flash_attention.cpp,
// kMinRowsOnTiles), below which its tiles lost to FMAs.
[[maybe_unused]] constexpr int64_t kMinRowsOnTiles = 384;  // read by the AVX-512 targets only

}  // namespace attn::flash_backward_detail
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/flash_attention_backward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers must follow foreach_target.h.
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "core/fork_safety.hpp"
#include "kernels/amx_tiles-inl.h"
#include "kernels/backward_tiles-inl.h"
#include "kernels/dropout-inl.h"
#include "kernels/fast_math-inl.h"
#include "kernels/half_rows-inl.h"
#include "kernels/magnitude_bits-inl.h"
#include "kernels/score_modifiers-inl.h"
#include "kernels/tile_gemm-inl.h"
#include "kernels/tile_gemm_bf16-inl.h"
#include "kernels/transpose_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using flash_backward_detail::BackwardArgs;

// Where the backward's products run: fp32 FMAs (fp32 and fp16 inputs, and bf16 widened where
// flash_attention_bfloat16_backward_native(d, dv) is false), vdpbf16ps on bf16 pairs, or those on
// AMX tiles for the tiles they fill (hardware, or its C++ model in tests).
enum class BackwardProducts { kFloat, kVector, kAmx, kAmxModel };

BackwardProducts ChooseBackwardProducts(const BackwardArgs& args) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (!args.half || args.half_type != HalfType::kBFloat16 ||
      !flash_attention_bfloat16_backward_native(args.q.cols, args.v.cols)) {
    return BackwardProducts::kFloat;
  }
  if (!amx_tiles_in_use()) return BackwardProducts::kVector;
  return amx_use() == AmxUse::kModel ? BackwardProducts::kAmxModel : BackwardProducts::kAmx;
#else
  (void)args;  // the bf16 products exist only in the AVX-512 targets
  return BackwardProducts::kFloat;
#endif
}

// Whether the fp32 products (Sᵀ = K·c·Qᵀ, dPᵀ = V·dOᵀ, dV += (P ⊙ Z)ᵀ·dO, dK += dSᵀ·Q, dQ +=
// dS·K) run on AMX tiles for the tiles of whole Br queries and Bc keys: each operand split into
// three bf16 parts and six tile products each, as the fp32 forward on tiles
// (flash_attention_float_on_tiles(), the same routing: no dropout, no sliding window, heads of at
// least kMinRowsOnTiles queries and keys, any length in the tile model), for heads whose d and dv
// are multiples of 32: the tiles' C rows (dQ, dK, dV) are whole tiles of 32 columns, and the FMA
// products beside them (partial tiles) read rows of d_padded floats, the caller's own rows where
// they lie dense (d floats) — padding d to 32 overran them. The accumulating three
// load and store their C tiles around each call's six products a step, work enough to carry that
// traffic (the bf16 backward's single products are held back by it).
bool FloatProductsOnTiles(const BackwardArgs& args, BackwardProducts products) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const FlashAttentionOptions& options = args.options;
  return products == BackwardProducts::kFloat && args.parts_on_tiles &&
         !args.recomputed_log_sum_exp && options.dropout == 0.0F && options.window_left < 0 &&
         options.window_right < 0 && args.q.cols % 32 == 0 && args.v.cols % 32 == 0 &&
         (amx_use() == AmxUse::kModel ||
          std::min(args.q.rows, args.k.rows) >= flash_backward_detail::kMinRowsOnTiles) &&
         cpu_has_avx512_bf16() && fp32_on_amx() && amx_tiles_in_use();
#else
  (void)args;  // the tiles' products exist only in the AVX-512 targets
  (void)products;
  return false;
#endif
}

// Whether each key tile's dK and dV rows get a single contribution, which the products can store
// straight into the gradients instead of summing into zeroed scratch rows and copying them out:
// one query head per key/value head, all its queries in one tile, fp32 products and gradients,
// and rows of whole vectors (the products store d_padded = d floats a row). One query against
// 2 × 2 heads of 1024 keys, d = 64: the scratch's zeroing and copy were 25-30% of the backward.
bool KeyValueGradientsStored(const BackwardArgs& args, BackwardProducts products, size_t lanes) {
  return products == BackwardProducts::kFloat && !args.half && args.q.heads == args.k.heads &&
         static_cast<size_t>(args.q.rows) <= flash_backward_detail::kQueryVectors * lanes &&
         static_cast<size_t>(args.q.cols) % lanes == 0 &&
         static_cast<size_t>(args.v.cols) % lanes == 0;
}

// Rows a product writes: the gradient's own rows (first 0), or a thread's scratch holding rows
// from `first` on.
struct MutableRows {
  float* data = nullptr;
  size_t stride = 0;
  size_t first = 0;
  float* row(size_t i) const { return data + (i - first) * stride; }
};

// Per-thread scratch for one (batch, key/value head) task at a time; sized once per call.
struct BackwardScratch : BackwardTileBuffers {
  ScratchMemory memory;
  // With BackwardArgs::read_magnitude_bits: the magnitudes of the q, k, v, out and grad_out rows
  // this thread's tasks have read.
  MagnitudeBits read[5];
  float* q_rows;        // n × d_padded: Q, unscaled (unless read in place)
  float* q_transposed;  // tiles × d × Br: c·Qᵀ per query tile, rows TileWidth lanes apart
  // The key side's rows below hold key_rows rows from key row key_rows_base on: all m where a
  // key/value head serves several query heads (each of them reads every block), one block of the
  // loop over keys where it serves one (TaskKeyBlocks moves them along block by block, and they
  // stay in the L2).
  size_t key_rows = 0, key_rows_base = 0;
  bool block_rows = false;
  float* k_rows;  // key_rows × d_padded (unless read in place)
  float* v_rows;  // key_rows × dv_padded (unless read in place)
  float* row;     // max(d_padded, dv_padded): one row widened or rounded
  float* grad_q;  // n_padded × d_padded
  float* grad_k;  // key_rows × d_padded: dK of the key/value head, summed over its query heads
  float* grad_v;  // key_rows × dv_padded
  // The rows' widths in the layouts above and below: d and dv rounded up to whole vectors (on AMX
  // tiles to the tiles' 32 columns), and the pairs of a row of the pair layouts, (d + 1) / 2 and
  // (dv + 1) / 2 (on AMX tiles d_padded / 2 and dv_padded / 2: whole tiles of 16 pairs). Padding
  // is zero, so heads of any size (80, 96) take the tiles.
  size_t d_padded = 0, dv_padded = 0, d_pairs = 0, dv_pairs = 0;
  // The bf16 dot-product path (BFloat16Products) also keeps bf16 pairs of adjacent dimensions, as
  // the forward pass's: Qᵀ and dOᵀ per query tile (tiles × d_pairs × Br, dv_pairs × Br), the key
  // and value rows (key_rows × d_pairs, key_rows × dv_pairs), the pairs past d (dv) 0.
  uint32_t* query_pairs = nullptr;
  uint32_t* grad_out_pairs = nullptr;
  uint32_t* key_pairs = nullptr;
  uint32_t* value_pairs = nullptr;
  // ... and, for the products that reduce over queries or keys (dV, dK, dQ), pairs of adjacent
  // rows: Q and dO rows 2p and 2p + 1 interleaved (n/2 × d_padded, n/2 × dv_padded, 0 past n), K
  // rows likewise (key_rows/2 × d_padded), and a tile's P ⊙ Z and dS rounded to bf16 as pairs of
  // adjacent queries (Bc × Br/2) and dS as pairs of adjacent keys (Bc/2 × Br).
  uint32_t* query_row_pairs = nullptr;
  uint32_t* grad_out_row_pairs = nullptr;
  uint32_t* key_row_pairs = nullptr;
  uint32_t* used_query_pairs = nullptr;
  uint32_t* grad_score_query_pairs = nullptr;
  uint32_t* grad_score_key_pairs = nullptr;
  // P ⊙ Z's and dS's parts: 2 (hi + lo, bf16_probabilities_split()) or 1 (rounded); each part of
  // used_query_pairs and grad_score_query_pairs tile_pair_words after the one before, of
  // grad_score_key_pairs key_pair_words.
  size_t probability_parts = 1, tile_pair_words = 0, key_pair_words = 0;
  // On AMX tiles, Kᵀ's rows of pairs of adjacent keys per key tile (key_rows/2 × d_padded, as
  // split_key_transposed below): A of dQᵀ += Kᵀ·dSᵀ, whose B is dS's pairs of adjacent keys.
  uint32_t* key_transposed_pairs = nullptr;
  // The fp32 products on AMX tiles (FloatProductsOnTiles): Qᵀ times c (in the softmax's unit)
  // and dOᵀ per whole query tile, and the key and value rows, each as three bf16 parts' pairs of
  // adjacent dimensions (SplitThreeBF16), part p *_part_words after part 0. Pairs per row:
  // split_d_pairs and split_dv_pairs, whole tiles of 16 (zeros past d, dv). Qᵀ and dOᵀ lay out
  // tiles × pairs × Br words a part, the key side key_rows × pairs.
  bool split_products = false;
  size_t split_d_pairs = 0, split_dv_pairs = 0;
  size_t query_part_words = 0, grad_out_part_words = 0, key_part_words = 0, value_part_words = 0;
  uint32_t* split_query_pairs = nullptr;
  uint32_t* split_grad_out_pairs = nullptr;
  uint32_t* split_key_pairs = nullptr;
  uint32_t* split_value_pairs = nullptr;
  uint16_t* split_staging = nullptr;  // a query tile's three parts as rows, before the transpose
  // ... and for dV += (P ⊙ Z)ᵀ·dO and dK += dSᵀ·Q on the tiles: Q (unscaled) and dO rows 2p and
  // 2p + 1 interleaved in three parts (n_padded/2 × d_padded and × dv_padded words a part), and a
  // tile's (P ⊙ Z)ᵀ and dSᵀ as rows of pairs of adjacent queries in three parts (Bc × Br/2 words).
  size_t query_row_part_words = 0, grad_out_row_part_words = 0, tile_part_words = 0;
  uint32_t* split_query_row_pairs = nullptr;
  uint32_t* split_grad_out_row_pairs = nullptr;
  uint32_t* split_used = nullptr;
  uint32_t* split_grad_scores = nullptr;
  // ... and for dQᵀ += Kᵀ·dSᵀ: K rows 2p and 2p + 1 interleaved in three parts (key_rows/2 ×
  // d_padded words a part; staging), turned per key tile into Kᵀ's d_padded rows of Bc/2 pairs of
  // adjacent keys (split_key_transposed, the same words a part), a tile's dSᵀ as Bc/2 rows of Br
  // pairs of adjacent keys in three parts (Bc × Br/2 words a part), and the head's dQᵀ per query
  // tile (d_padded × Br floats each), added into grad_q's rows at the head's end. dQ = dS·K took
  // dS as Br rows of Bc/2 pairs, turned from its pairs in 16 × 16 blocks for every tile pair (5%
  // of the backward's samples at n = 1024); Kᵀ is turned once per key tile of a task.
  size_t key_row_part_words = 0;
  uint32_t* split_key_row_pairs = nullptr;
  uint32_t* split_key_transposed = nullptr;
  uint32_t* split_grad_score_key_pairs = nullptr;
  float* grad_q_transposed = nullptr;
  // Whether whole tiles' products run on AMX tiles (ChooseBackwardProducts), and the C++ model
  // of the tiles that stands in for them in tests (null on hardware).
  bool amx_products = false;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  std::unique_ptr<amx::AmxTileModel> amx_model;
#endif
  // Key tiles per block of the loop over keys (FlashBackwardQueryHead): as many as fill half of
  // the L2 with their K, V, dK and dV rows, the other half left to a query tile's rows.
  size_t key_block_tiles = 1;
  // KeyValueGradientsStored: dK and dV go straight to the gradients' rows (grad_k and grad_v
  // stay unallocated); the head loop stores each key tile it visits, zeros for a tile no query
  // sees. It visits every tile of the task's rows (TaskKeyRows): they end where its queries'
  // keys end, and the tiles before the first any query sees are tiles it skips.
  bool store_key_value = false;
  // Where the fp32 products put dK and dV: grad_k and grad_v, or the gradients (store_key_value);
  // set per task.
  MutableRows grad_k_rows, grad_v_rows;
  // Q, K and V as the fp32 products read them: the caller's rows when `rows_in_place` (all three
  // DenseRows), else q_rows, k_rows and v_rows; set per head (Q) and per task (K, V).
  bool rows_in_place = false;
  RowsView queries, keys, values;

  BackwardScratch(size_t n, size_t m, size_t d, size_t dv, size_t lanes, BackwardProducts products,
                  bool float_on_tiles, bool in_place, bool store_gradients, bool one_query_head,
                  bool split_probabilities)
      : block_rows(one_query_head),
        split_products(float_on_tiles),
        amx_products(products == BackwardProducts::kAmx || products == BackwardProducts::kAmxModel),
        store_key_value(store_gradients),
        rows_in_place(in_place) {
    const bool bf16_pairs = products != BackwardProducts::kFloat;
    probability_parts = bf16_pairs && split_probabilities ? 2 : 1;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    if (products == BackwardProducts::kAmxModel || (split_products && amx_use() == AmxUse::kModel))
      amx_model = std::make_unique<amx::AmxTileModel>();
#endif
    const size_t br = flash_backward_detail::kQueryVectors * lanes,
                 bc = flash_backward_detail::kKeyTile;
    const size_t n_padded = (n + br - 1) / br * br;
    const size_t columns = amx_products ? 32 : lanes;  // (the fp32 tiles' heads: d, dv of 32s)
    d_padded = hwy::RoundUpTo(d, columns);
    dv_padded = hwy::RoundUpTo(dv, columns);
    d_pairs = PairsOfRow(d, amx_products);
    dv_pairs = PairsOfRow(dv, amx_products);
    const size_t split = split_products ? 1 : 0;
    split_d_pairs = split * hwy::RoundUpTo(d, 32) / 2;
    split_dv_pairs = split * hwy::RoundUpTo(dv, 32) / 2;
    // (A key's three parts: 6 bytes an element of K and V, and of K again as row pairs, beside
    // the 16 of K, V, dK and dV.)
    const size_t key_tile_bytes =
        bc * ((2 * d_padded + 2 * dv_padded) * sizeof(float) +
              3 * (2 * split_d_pairs + split_dv_pairs) * sizeof(uint32_t));
    key_block_tiles = std::clamp<size_t>(l2_cache_bytes() / 2 / key_tile_bytes, 1,
                                         flash_backward_detail::kMaxKeyBlockTiles);
    key_rows = block_rows ? std::min(m, key_block_tiles * bc) : m;
    memory = carve_scratch(lanes, [&](const auto& take) {
      take_tile_buffers(take, n, br, bc, dv, dv_padded);
      // The fp32 products' operands; the bf16 path reads its pairs instead.
      const size_t fp32 = bf16_pairs ? 0 : 1, copies = bf16_pairs || in_place ? 0 : 1;
      q_rows = take(copies * n * d_padded);
      q_transposed = take(fp32 * n_padded * d);
      k_rows = take(copies * key_rows * d_padded);
      v_rows = take(copies * key_rows * dv_padded);
      row = take(std::max(d_padded, dv_padded));
      grad_q = take(n_padded * d_padded);  // rows past n: AMX tiles' padding lanes
      const size_t summed = store_gradients ? 0 : 1;
      grad_k = take(summed * key_rows * d_padded);
      grad_v = take(summed * key_rows * dv_padded);
      if (bf16_pairs) {
        query_pairs = as_uint32(take(n_padded * d_pairs));
        grad_out_pairs = as_uint32(take(n_padded * dv_pairs));
        key_pairs = as_uint32(take(key_rows * d_pairs));
        value_pairs = as_uint32(take(key_rows * dv_pairs));
        query_row_pairs = as_uint32(take(n_padded / 2 * d_padded));
        grad_out_row_pairs = as_uint32(take(n_padded / 2 * dv_padded));
        key_row_pairs = as_uint32(take((key_rows + 1) / 2 * d_padded));
        tile_pair_words = bc * br / 2;
        key_pair_words = (bc + 1) / 2 * br;
        used_query_pairs = as_uint32(take(probability_parts * tile_pair_words));
        grad_score_query_pairs = as_uint32(take(probability_parts * tile_pair_words));
        grad_score_key_pairs = as_uint32(take(probability_parts * key_pair_words));
        key_transposed_pairs = as_uint32(take(amx_products ? (key_rows + 1) / 2 * d_padded : 0));
      }
      query_part_words = n_padded * split_d_pairs;
      grad_out_part_words = n_padded * split_dv_pairs;
      key_part_words = key_rows * split_d_pairs;
      value_part_words = key_rows * split_dv_pairs;
      split_query_pairs = as_uint32(take(3 * query_part_words));
      split_grad_out_pairs = as_uint32(take(3 * grad_out_part_words));
      split_key_pairs = as_uint32(take(3 * key_part_words));
      split_value_pairs = as_uint32(take(3 * value_part_words));
      // (Two bf16 a float.)
      split_staging =
          reinterpret_cast<uint16_t*>(take(3 * br * std::max(split_d_pairs, split_dv_pairs)));
      query_row_part_words = split * n_padded / 2 * d_padded;
      grad_out_row_part_words = split * n_padded / 2 * dv_padded;
      tile_part_words = split * bc * br / 2;
      split_query_row_pairs = as_uint32(take(3 * query_row_part_words));
      split_grad_out_row_pairs = as_uint32(take(3 * grad_out_row_part_words));
      split_used = as_uint32(take(3 * tile_part_words));
      split_grad_scores = as_uint32(take(3 * tile_part_words));
      key_row_part_words = split * (key_rows + 1) / 2 * d_padded;
      split_key_row_pairs = as_uint32(take(3 * key_row_part_words));
      split_key_transposed = as_uint32(take(3 * key_row_part_words));
      split_grad_score_key_pairs = as_uint32(take(3 * tile_part_words));
      grad_q_transposed = take(split_products || amx_products ? n_padded * d_padded : 0);
    });
  }
};

// Copies rows [first_row, end_row) of matrix (b, h) of `view` — or of `half`, widened, when the
// pass has half-precision inputs — into a row-major buffer of `padded` columns whose first row is
// row first_row, zero-filling the padding.
void PadRows(const BackwardArgs& args, const ConstHeadsView& view, const ConstHalfHeadsView& half,
             int64_t b, int64_t h, size_t first_row, size_t end_row, size_t padded,
             float* destination) {
  const hn::ScalableTag<float> d;
  const auto cols = static_cast<size_t>(view.cols);
  constexpr size_t kPrefetchRows = 16;  // PrefetchMatrixRow: rows requested this far ahead
  for (size_t r = first_row; r < end_row; ++r) {
    if (r + kPrefetchRows < end_row)
      PrefetchMatrixRow(args.half, view, half, b, h, static_cast<int64_t>(r + kPrefetchRows));
    float* row = destination + (r - first_row) * padded;
    if (args.half) {
      WidenRow(d, args.half_type, half.matrix(b, h) + static_cast<int64_t>(r) * half.row_stride,
               cols, row);
    } else {
      std::copy_n(view.matrix(b, h) + static_cast<int64_t>(r) * view.row_stride, cols, row);
    }
    std::fill(row + cols, row + padded, 0.0F);
  }
}

// Row i of a gradient matrix: `count` floats times `scale`, stored as floats or rounded to the
// pass's half type. Where the gradients outgrow the threads' L2s (BackwardArgs::stream_gradients),
// rows of whole aligned vectors are written with streaming stores: ordinary stores waited on a read
// for ownership per line; streamed, the write-out's samples fell from 3.0-3.4% to 1.8-2.1% of the
// backward's (n = 1024; 1.0 to 0.5% at 4096; B = 4, 8 heads of 64 on the layers' layout, Emerald
// Rapids). Requesting the lines ahead (PREFETCHW) only moved the wait into the requests. The
// caller's task ends with hwy::FlushStream, so the rows are visible before another thread reads.
// Half rows likewise: at 16 queries against 2 × 4096 keys of 256 (bf16, one thread, Xeon dev) the
// write-out's ordinary stores waited on their lines for 16% of the pass.
void WriteGradientRow(const BackwardArgs& args, const HeadsView& view, const HalfHeadsView& half,
                      int64_t b, int64_t h, size_t i, const float* values, size_t count,
                      float scale) {
  const auto offset = static_cast<int64_t>(i);
  if (!args.half) {
    float* row = view.matrix(b, h) + offset * view.row_stride;
    const hn::ScalableTag<float> d;
    const size_t lanes = hn::Lanes(d);
    if (args.stream_gradients && reinterpret_cast<uintptr_t>(row) % (lanes * sizeof(float)) == 0 &&
        count % lanes == 0) {
      const auto factor = hn::Set(d, scale);
      for (size_t t = 0; t < count; t += lanes)
        hn::Stream(hn::Mul(hn::LoadU(d, values + t), factor), d, row + t);
      return;
    }
    for (size_t t = 0; t < count; ++t) row[t] = values[t] * scale;
    return;
  }
  uint16_t* row = half.matrix(b, h) + offset * half.row_stride;
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  // Streamed in whole vectors of halves of at least 16 bytes (AVX2's and AVX-512's): the narrower
  // targets' half vectors would be partial stores.
  const size_t vector_bytes = lanes * sizeof(uint16_t);
  const bool stream = args.stream_gradients && vector_bytes >= 16 &&
                      reinterpret_cast<uintptr_t>(row) % vector_bytes == 0 && count % lanes == 0;
  NarrowScaledRow(d, args.half_type, values, count, scale, stream, row);
}

// Row i of a gradient matrix set to zero (a key no query sees), in either storage.
void WriteZeroGradientRow(const BackwardArgs& args, const HeadsView& view,
                          const HalfHeadsView& half, int64_t b, int64_t h, size_t i) {
  const auto offset = static_cast<int64_t>(i);
  if (args.half) {
    std::fill_n(half.matrix(b, h) + offset * half.row_stride, half.cols, uint16_t{0});
  } else {
    std::fill_n(view.matrix(b, h) + offset * view.row_stride, view.cols, 0.0F);
  }
}

// Adds `rows` rows of matrix (b, h) from row `first` on to `read`: the floats of `view`, or the
// rows of `half` by their bits.
void AddReadRows(const BackwardArgs& args, const ConstHeadsView& view,
                 const ConstHalfHeadsView& half, int64_t b, int64_t h, size_t first, size_t rows,
                 MagnitudeBits& read) {
  const auto cols = static_cast<size_t>(view.cols);
  if (!args.half) {
    read.AddRows(view.matrix(b, h) + static_cast<int64_t>(first) * view.row_stride,
                 static_cast<size_t>(view.row_stride), rows, cols);
    return;
  }
  for (size_t r = first; r < first + rows; ++r) {
    const uint16_t* row = half.matrix(b, h) + static_cast<int64_t>(r) * half.row_stride;
    if (args.half_type == HalfType::kBFloat16) {
      read.AddBFloat16(row, cols);
    } else {
      read.AddFloat16(row, cols);
    }
  }
}

// Rows [first_row, end_row) of matrix (b, h) of bf16 `half` as pairs of adjacent elements,
// `pairs` ≥ (cols + 1) / 2 per row (the pairs past cols 0, an odd count's last one half 0), into
// `destination` from its first row on: a row's adjacent bf16 already are its pairs in memory.
void RowPairs(const ConstHalfHeadsView& half, int64_t b, int64_t h, int64_t first_row,
              int64_t end_row, size_t pairs, uint32_t* destination) {
  const auto cols = static_cast<size_t>(half.cols);
  for (int64_t r = first_row; r < end_row; ++r) {
    CopyRowAsPairs(half.matrix(b, h) + r * half.row_stride, cols, pairs,
                   destination + static_cast<size_t>(r - first_row) * pairs);
  }
}

// The same rows transposed per tile of br rows: tile t holds pairs × br words, word p·br + r the
// pair p of row t·br + r (0 past the last row, and for the pairs past (cols + 1) / 2), the layout
// of Qᵀ and dOᵀ in pairs.
void TransposedRowPairs(const ConstHalfHeadsView& half, int64_t b, int64_t h, size_t br,
                        size_t pairs, uint32_t* destination) {
  const auto rows = static_cast<size_t>(half.rows), cols = static_cast<size_t>(half.cols);
  const size_t written = (cols + 1) / 2, tiles = (rows + br - 1) / br;
  // Only the last tile has rows past the matrix, whose words stay 0.
  if (rows % br != 0) std::fill_n(destination + (tiles - 1) * pairs * br, pairs * br, 0U);
  const auto stride = static_cast<size_t>(half.row_stride);
  for (size_t t = 0; t < tiles; ++t) {
    uint32_t* tile = destination + t * pairs * br;
    TransposeRowPairs(half.matrix(b, h) + t * br * stride, stride, std::min(br, rows - t * br),
                      cols, br, tile);
    std::fill(tile + written * br, tile + pairs * br, 0U);
  }
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// Rows 2p and 2p + 1 of matrix (b, h) of bf16 `half` interleaved into pairs, pair rows
// [first_pair, end_pair) of `padded` words into `destination` from its first row on (rows past the
// matrix read as zeros).
ATTN_BF16_TARGET void InterleavedRowPairs(const ConstHalfHeadsView& half, int64_t b, int64_t h,
                                          size_t first_pair, size_t end_pair, size_t padded,
                                          uint32_t* destination) {
  const auto cols = static_cast<size_t>(half.cols);
  for (size_t p = first_pair; p < end_pair; ++p) {
    const auto row = static_cast<int64_t>(2 * p);
    uint32_t* pairs = destination + (p - first_pair) * padded;
    if (row >= half.rows) {
      std::fill_n(pairs, padded, 0U);
      continue;
    }
    const uint16_t* first = half.matrix(b, h) + row * half.row_stride;
    InterleaveRowPairs(first, row + 1 < half.rows ? first + half.row_stride : nullptr, cols, padded,
                       pairs);
  }
}

// Each of `rows` rows of a transposed tile (br floats) as bf16 pairs of adjacent lanes, over its
// lanes [0, width) rounded up to 32 (RowToPairs' step; the lanes past width are not read): rounded
// to bf16, or with `parts` 2 as hi and lo (RowToPairParts), part 1 `part_words` after part 0.
ATTN_BF16_TARGET void TileRowsToPairs(const float* tile, size_t rows, size_t br, size_t width,
                                      uint32_t* pairs, size_t parts, size_t part_words) {
  const size_t lanes = hwy::RoundUpTo(width, 32);
  for (size_t j = 0; j < rows; ++j) {
    if (parts == 2) {
      RowToPairParts(tile + j * br, lanes, pairs + j * br / 2, part_words);
    } else {
      RowToPairs(tile + j * br, lanes, pairs + j * br / 2);
    }
  }
}

// dSᵀ (bc × br) in bf16 twice over (in `s.probability_parts` parts), its lanes [0, width): pairs
// of adjacent queries (dK's operand) and pairs of adjacent keys (dQ's).
ATTN_BF16_TARGET void GradScorePairs(const float* grad_scores, size_t bc, size_t br, size_t width,
                                     const BackwardScratch& s) {
  TileRowsToPairs(grad_scores, bc, br, width, s.grad_score_query_pairs, s.probability_parts,
                  s.tile_pair_words);
  PackProbabilityParts(grad_scores, bc, br, width, s.grad_score_key_pairs, s.key_pair_words,
                       s.probability_parts);
}

// The AMX tiles of the thread: configured for the products of a query head, released after them.
ATTN_AMX_TARGET void ConfigureTiles(BackwardScratch& s) {
  if (s.amx_model != nullptr) return s.amx_model->Configure(amx::kFullTiles);
  amx::AmxHardwareTiles tiles;
  tiles.Configure(amx::kFullTiles);
}
ATTN_AMX_TARGET void ReleaseTiles(BackwardScratch& s) {
  if (s.amx_model != nullptr) return s.amx_model->Release();
  amx::AmxHardwareTiles tiles;
  tiles.Release();
}

// amx::ProductOnTiles on the thread's tiles (hardware, or the model in tests).
template <bool kAccumulate>
ATTN_AMX_TARGET void TileProduct(BackwardScratch& s, const uint32_t* a, size_t a_stride,
                                 const uint32_t* b, size_t b_stride, size_t pairs, float* c,
                                 size_t c_stride, size_t rows, size_t cols) {
  if (s.amx_model != nullptr) {
    return amx::ProductOnTiles<kAccumulate>(*s.amx_model, a, a_stride, b, b_stride, pairs, c,
                                            c_stride, rows, cols);
  }
  amx::AmxHardwareTiles tiles;
  amx::ProductOnTiles<kAccumulate>(tiles, a, a_stride, b, b_stride, pairs, c, c_stride, rows, cols);
}

// amx::SplitProductOnTiles (C = A·B, or C += A·B with kAccumulate, over operands of three bf16
// parts each) on the thread's tiles, in the order of fewest tile loads: the five products' B
// operands come from L2 as their A operands do.
// `parts`: how many of each operand's parts may be nonzero (amx::SplitPartCounts).
template <bool kAccumulate>
ATTN_AMX_TARGET void SplitTileProduct(BackwardScratch& s, const uint32_t* a, size_t a_stride,
                                      size_t a_part, const uint32_t* b, size_t b_stride,
                                      size_t b_part, size_t pairs, float* c, size_t c_stride,
                                      size_t rows, size_t cols, amx::SplitPartCounts parts) {
  if (s.amx_model != nullptr) {
    return amx::SplitProductOnTiles<kAccumulate, true>(*s.amx_model, a, a_stride, a_part, b,
                                                       b_stride, b_part, pairs, c, c_stride, rows,
                                                       cols, amx::kPairs, parts);
  }
  amx::AmxHardwareTiles tiles;
  amx::SplitProductOnTiles<kAccumulate, true>(tiles, a, a_stride, a_part, b, b_stride, b_part,
                                              pairs, c, c_stride, rows, cols, amx::kPairs, parts);
}

// The bf16 path's accumulating products on the tiles: TileProduct where P ⊙ Z and dS are rounded,
// SplitTileProduct over their two parts (`parts`: the operands' part counts, 2 for P ⊙ Z or dS, 1
// for the bf16 inputs) where they are split.
ATTN_AMX_TARGET void PartsTileProduct(BackwardScratch& s, const uint32_t* a, size_t a_stride,
                                      size_t a_part, const uint32_t* b, size_t b_stride,
                                      size_t b_part, size_t pairs, float* c, size_t c_stride,
                                      size_t rows, size_t cols, amx::SplitPartCounts parts) {
  if (parts.a == 1 && parts.b == 1) {
    return TileProduct<true>(s, a, a_stride, b, b_stride, pairs, c, c_stride, rows, cols);
  }
  SplitTileProduct<true>(s, a, a_stride, a_part, b, b_stride, b_part, pairs, c, c_stride, rows,
                         cols, parts);
}

// Rows first + 2p and first + 2p + 1 of `rows` (`count` rows of `cols` floats from `first` on;
// rows past them read as 0) interleaved as pairs, each element split into three bf16 parts
// (SplitThreeBF16): pair row p of part k at out + k·part_words + p·padded words, for p in
// [0, pair_rows), zeros past cols. B of the accumulating products on the tiles: Q and dO (dV +=
// Pᵀ·dO, dK += dSᵀ·Q, reducing over queries) and K (dQ += dS·K, over keys).
ATTN_BF16_TARGET void SplitInterleavedRowPairs(const RowsView& rows, size_t first, size_t count,
                                               size_t pair_rows, size_t cols, size_t padded,
                                               uint32_t* out, size_t part_words) {
  for (size_t p = 0; p < pair_rows; ++p) {
    const float* even = 2 * p < count ? rows.row(first + 2 * p) : nullptr;
    const float* odd = 2 * p + 1 < count ? rows.row(first + 2 * p + 1) : nullptr;
    for (size_t t = 0; t < padded; t += 16) {
      const size_t left = cols > t ? std::min<size_t>(cols - t, 16) : 0;
      const auto mask = static_cast<__mmask16>((1U << left) - 1U);
      const SplitParts a = SplitThreeBF16(even != nullptr ? _mm512_maskz_loadu_ps(mask, even + t)
                                                          : _mm512_setzero_ps());
      const SplitParts b = SplitThreeBF16(odd != nullptr ? _mm512_maskz_loadu_ps(mask, odd + t)
                                                         : _mm512_setzero_ps());
      uint32_t* here = out + p * padded + t;
      _mm512_storeu_si512(here, PartPairs(a.hi, b.hi));
      _mm512_storeu_si512(here + part_words, PartPairs(a.mid, b.mid));
      _mm512_storeu_si512(here + 2 * part_words, PartPairs(a.lo, b.lo));
    }
  }
}

// Rows [first, first + count) of `rows` (`cols` floats each) as their three bf16 parts' rows of
// `pairs` pairs of adjacent elements (zeros past cols): row r's part p at out + p·part_words +
// r·pairs words. The key and value rows of the scores on tiles.
ATTN_BF16_TARGET void SplitRowPairs(const RowsView& rows, size_t first, size_t count, size_t cols,
                                    size_t pairs, uint32_t* out, size_t part_words) {
  for (size_t r = 0; r < count; ++r) {
    auto* hi = reinterpret_cast<uint16_t*>(out + r * pairs);
    SplitRowBF16x3(rows.row(first + r), cols, 2 * pairs, 1.0F, hi, hi + 2 * part_words,
                   hi + 4 * part_words);
  }
}

// `count` floats (a multiple of 32) as three bf16 parts (SplitThreeBF16) of pairs of adjacent
// elements, part p at out + p·part_words: a transposed tile (Bc × Br, rows Br apart) then holds
// rows of pairs of adjacent queries, A of dV += (P ⊙ Z)ᵀ·dO (dS's: SplitGradScores). Whole
// vectors, no masks: row by row through SplitRowBF16x3 this took 11% of the backward at n = 1024.
ATTN_BF16_TARGET void SplitTilePairs(const float* tile, size_t count, uint32_t* out,
                                     size_t part_words) {
  for (size_t i = 0; i < count; i += 32) {
    const SplitParts low = SplitThreeBF16(_mm512_loadu_ps(tile + i));
    const SplitParts high = SplitThreeBF16(_mm512_loadu_ps(tile + i + 16));
    uint32_t* here = out + i / 2;
    // Exact: each part is a bf16 already.
    _mm512_storeu_si512(here, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(high.hi, low.hi)));
    _mm512_storeu_si512(here + part_words,
                        reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(high.mid, low.mid)));
    _mm512_storeu_si512(here + 2 * part_words,
                        reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(high.lo, low.lo)));
  }
}

// A whole query tile's br rows from `first` on, times `scale`, as three bf16 parts' transposed
// pairs (Qᵀ's layout on the tiles: `pairs` rows of br words a part, part p at out + p·part_words),
// through `staging` (3 · br · 2·pairs bf16): each part's rows, then their transpose.
ATTN_BF16_TARGET void SplitTransposedTile(const RowsView& rows, size_t first, size_t br,
                                          size_t cols, size_t pairs, float scale, uint16_t* staging,
                                          uint32_t* out, size_t part_words) {
  const size_t row_halves = 2 * pairs, part_halves = br * row_halves;
  for (size_t r = 0; r < br; ++r) {
    uint16_t* row = staging + r * row_halves;
    SplitRowBF16x3(rows.row(first + r), cols, row_halves, scale, row, row + part_halves,
                   row + 2 * part_halves);
  }
  for (size_t part = 0; part < 3; ++part) {
    TransposeRowPairs(staging + part * part_halves, row_halves, br, row_halves, br,
                      out + part * part_words);
  }
}

// dSᵀ (bc × br floats, rows br apart) in three bf16 parts (SplitThreeBF16), each element split
// once for both of its layouts: rows of pairs of adjacent queries (`query_pairs`, bc × br/2 words
// a part: A of dK += dSᵀ·Q, as SplitTilePairs) and pairs of adjacent keys (PartPairs of rows 2k
// and 2k + 1 into `key_pairs`, bc/2 × br words a part: B of dQᵀ += Kᵀ·dSᵀ); parts part_words
// apart in both. (Splitting twice, once per layout, took the same share of the backward's samples
// at n = 1024: the stores bound it, not the split.)
ATTN_BF16_TARGET void SplitGradScores(const float* grad_scores, size_t bc, size_t br,
                                      uint32_t* query_pairs, uint32_t* key_pairs,
                                      size_t part_words) {
  for (size_t k = 0; k < bc / 2; ++k) {
    const float* even = grad_scores + 2 * k * br;
    for (size_t i = 0; i < br; i += 32) {
      const SplitParts a0 = SplitThreeBF16(_mm512_loadu_ps(even + i));
      const SplitParts a1 = SplitThreeBF16(_mm512_loadu_ps(even + i + 16));
      const SplitParts b0 = SplitThreeBF16(_mm512_loadu_ps(even + br + i));
      const SplitParts b1 = SplitThreeBF16(_mm512_loadu_ps(even + br + i + 16));
      const __m512 a_low[3] = {a0.hi, a0.mid, a0.lo}, a_high[3] = {a1.hi, a1.mid, a1.lo};
      const __m512 b_low[3] = {b0.hi, b0.mid, b0.lo}, b_high[3] = {b1.hi, b1.mid, b1.lo};
      for (size_t part = 0; part < 3; ++part) {
        uint32_t* keys_here = key_pairs + part * part_words + k * br + i;
        _mm512_storeu_si512(keys_here, PartPairs(a_low[part], b_low[part]));
        _mm512_storeu_si512(keys_here + 16, PartPairs(a_high[part], b_high[part]));
        // Exact: each part is a bf16 already.
        uint32_t* queries_here = query_pairs + part * part_words + (2 * k * br + i) / 2;
        _mm512_storeu_si512(queries_here, reinterpret_cast<__m512i>(
                                              _mm512_cvtne2ps_pbh(a_high[part], a_low[part])));
        _mm512_storeu_si512(queries_here + br / 2, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(
                                                       b_high[part], b_low[part])));
      }
    }
  }
}

// Whole key tiles of K's interleaved row pairs (`count` pair rows of `padded` words from `pairs`
// on; `parts` of them, part_words apart) as Kᵀ's rows of pairs of adjacent keys, A of dQᵀ +=
// Kᵀ·dSᵀ: the tile of pair rows [p0, p0 + Bc/2) at out + p0·padded, its row c (a dimension) at
// c·Bc/2 words there; parts part_words apart. A last partial tile is left: its products run on
// FMAs (or vdpbf16ps).
ATTN_BF16_TARGET void TransposeKeyTilePairs(const uint32_t* pairs, size_t count, size_t padded,
                                            uint32_t* out, size_t parts, size_t part_words) {
  constexpr size_t kTilePairs = flash_backward_detail::kKeyTile / 2;
  for (size_t part = 0; part < parts; ++part) {
    for (size_t p0 = 0; p0 + kTilePairs <= count; p0 += kTilePairs) {
      const uint32_t* tile = pairs + part * part_words + p0 * padded;
      uint32_t* turned = out + part * part_words + p0 * padded;
      for (size_t p = 0; p < kTilePairs; p += 16) {
        for (size_t c = 0; c < padded; c += 16)
          TransposeWords16(tile + p * padded + c, padded, turned + c * kTilePairs + p, kTilePairs);
      }
    }
  }
}

// grad_q's rows of whole query tiles (`tiles` of br rows, d_padded floats each) += the head's dQᵀ
// per query tile (d_padded × br floats each, from TransposeKeyTilePairs' products).
ATTN_BF16_TARGET void AddTransposedGradQ(const float* transposed, size_t tiles, size_t br,
                                         size_t d_padded, float* grad_q) {
  alignas(64) uint32_t block[16 * 16];
  for (size_t tile = 0; tile < tiles; ++tile) {
    const float* from = transposed + tile * br * d_padded;
    float* rows = grad_q + tile * br * d_padded;
    for (size_t c = 0; c < d_padded; c += 16) {
      for (size_t r = 0; r < br; r += 16) {
        TransposeWords16(reinterpret_cast<const uint32_t*>(from + c * br + r), br, block, 16);
        for (size_t i = 0; i < 16; ++i) {
          float* row = rows + (r + i) * d_padded + c;
          _mm512_storeu_ps(row,
                           _mm512_add_ps(_mm512_loadu_ps(row),
                                         _mm512_castsi512_ps(_mm512_load_si512(block + i * 16))));
        }
      }
    }
  }
}

// KeysOverVisibleQueries on bf16 pairs of adjacent queries (dV += (P ⊙ Z)ᵀ dO, dK += dSᵀ Q): A
// holds each key's Br/2 query pairs (`a_stride` words apart), B the tile's interleaved row pairs
// (`b_stride` floats apart). Each band of kVisibleBand keys sums over the pairs from the one
// holding the first query that sees one of its keys to the one holding the last: the queries a
// band's pairs add beside those have P = dS = 0.
HWY_INLINE void KeysOverVisibleQueryPairs(const int32_t* first, const int32_t* last, size_t rows,
                                          int64_t key0, size_t bc, const uint32_t* a,
                                          size_t a_stride, const uint32_t* b, size_t b_stride,
                                          size_t vectors, float* c, size_t c_stride) {
  for_each_key_band(first, last, rows, key0, bc, kVisibleBand,
                    [&](size_t j0, size_t keys, size_t low, size_t high) {
                      const auto [pair_begin, pair_end] = PairsHolding(low, high);
                      GemmBF16<true>(keys, vectors, a + j0 * a_stride + pair_begin, a_stride, 1,
                                     b + pair_begin * b_stride, b_stride, pair_end - pair_begin,
                                     c + j0 * c_stride, c_stride, nullptr);
                    });
}

// QueriesOverVisibleKeys on bf16 pairs of adjacent keys (dQ += dS K): A holds a pair's Br queries
// (`br` words), B the key tile's interleaved row pairs. Each band of kVisibleBand queries sums
// over the pairs holding the keys it sees.
HWY_INLINE void QueriesOverVisibleKeyPairs(const int32_t* first, const int32_t* last, size_t rows,
                                           int64_t key0, size_t bc,
                                           const uint32_t* grad_score_pairs, size_t br,
                                           const uint32_t* key_row_pairs, size_t key_stride,
                                           size_t vectors, float* grad_q, size_t grad_q_stride) {
  for_each_query_band(
      first, last, rows, key0, bc, kVisibleBand, [&](size_t r0, size_t band, KeyRange seen) {
        if (seen.begin >= seen.end) return;
        const auto [pair_begin, pair_end] = PairsHolding(static_cast<size_t>(seen.begin - key0),
                                                         static_cast<size_t>(seen.end - key0));
        GemmBF16<true>(band, vectors, grad_score_pairs + pair_begin * br + r0, 1, br,
                       key_row_pairs + pair_begin * key_stride, key_stride, pair_end - pair_begin,
                       grad_q + r0 * grad_q_stride, grad_q_stride, nullptr);
      });
}
#endif

// Rows [first, first + count) of `rows`, `cols` floats each, set to zero.
void ZeroRows(const MutableRows& rows, size_t first, size_t count, size_t cols) {
  for (size_t j = first; j < first + count; ++j) std::fill_n(rows.row(j), cols, 0.0F);
}

// The same rows multiplied by `scale`.
void ScaleRows(const MutableRows& rows, size_t first, size_t count, size_t cols, float scale) {
  for (size_t j = first; j < first + count; ++j) {
    float* row = rows.row(j);
    for (size_t t = 0; t < cols; ++t) row[t] *= scale;
  }
}

// C[j] += Σ_i A[j, i] · B[i] over a key tile's bc keys j (A: a transposed tile, rows `width`
// apart: (P ⊙ Z)ᵀ for dV, dSᵀ for dK; B: the tile's query rows, dO or Q) where key ranges cross
// the tile: each band of kVisibleBand keys sums over the queries from the first to the last that
// sees one of its keys. Every query left out has P = 0, so dS = 0, for all of the band's keys:
// the sums lose only terms of zero.
template <class D>
HWY_INLINE void KeysOverVisibleQueries(D d, const int32_t* first, const int32_t* last, size_t rows,
                                       int64_t key0, size_t bc, const float* a, size_t width,
                                       const float* b, size_t b_stride, size_t vectors, float* c,
                                       size_t c_stride) {
  for_each_key_band(first, last, rows, key0, bc, kVisibleBand,
                    [&](size_t j0, size_t keys, size_t low, size_t high) {
                      Gemm<true>(d, keys, vectors, a + j0 * width + low, width, 1,
                                 b + low * b_stride, b_stride, high - low, c + j0 * c_stride,
                                 c_stride);
                    });
}

// dQ += dS K over a key tile crossed by key ranges: each band of kVisibleBand queries sums over
// the keys from the first to the last one of them sees (dS = 0 for the others).
template <class D>
HWY_INLINE void QueriesOverVisibleKeys(D d, const int32_t* first, const int32_t* last, size_t rows,
                                       int64_t key0, size_t bc, const float* grad_scores,
                                       size_t width, const float* key_rows, size_t key_stride,
                                       size_t vectors, float* grad_q, size_t grad_q_stride) {
  for_each_query_band(first, last, rows, key0, bc, kVisibleBand,
                      [&](size_t r0, size_t band, KeyRange seen) {
                        if (seen.begin >= seen.end) return;
                        const auto j0 = static_cast<size_t>(seen.begin - key0);
                        Gemm<true>(d, band, vectors, grad_scores + j0 * width + r0, 1, width,
                                   key_rows + j0 * key_stride, key_stride,
                                   static_cast<size_t>(seen.end - seen.begin),
                                   grad_q + r0 * grad_q_stride, grad_q_stride);
                      });
}

// dV += (P ⊙ Z)ᵀ dO or dK += dSᵀ Q on the fp32 products (C[j] (+)= Σ_i A[j, i] · B[i], as
// KeysOverVisibleQueries) into the key tile's rows of `c` (`cols` floats each): summed per band
// where key ranges cross the tile; with `store` (the tile's one contribution, straight into the
// gradient) stored, a crossed tile's rows zeroed before its band sums; else added.
template <class D>
HWY_INLINE void KeysOverQueries(D d, bool crossed, bool store, const int32_t* first,
                                const int32_t* last, size_t rows, size_t key0, size_t bc,
                                const float* a, size_t width, const float* b, size_t b_stride,
                                size_t vectors, size_t cols, const MutableRows& c) {
  if (crossed) {
    if (store) ZeroRows(c, key0, bc, cols);
    KeysOverVisibleQueries(d, first, last, rows, static_cast<int64_t>(key0), bc, a, width, b,
                           b_stride, vectors, c.row(key0), c.stride);
  } else if (store) {
    Gemm<false>(d, bc, vectors, a, width, 1, b, b_stride, rows, c.row(key0), c.stride);
  } else {
    Gemm<true>(d, bc, vectors, a, width, 1, b, b_stride, rows, c.row(key0), c.stride);
  }
}

// The keys a task covers, in key tiles [first_tile, last_tile), and where its dQ goes: written to
// the gradient when the task covers all the keys, else its partial sums, unscaled, into
// `partial_grad_q` (the group's query heads, n × d each) for FlashBackward to add up.
struct KeyChunk {
  size_t first_tile = 0, last_tile = 0;
  float* partial_grad_q = nullptr;
};

// A task's key rows [first_row, end_row) (TaskKeyRows), made ready block by block of the loop over
// keys: before a block's first products K and V packed and dK and dV zeroed (by the task's first
// query head), after its last the block's dK and dV written out (by its last query head). Done for
// the whole task at once, these sweeps ran through the L3 wherever its rows outgrew the L2: a bf16
// training step of 16 queries against 2 × 4096 keys of 256 spent 45% of its time in them.
struct TaskKeyBlocks {
  const BackwardArgs& args;
  int64_t b = 0, kv_head = 0;
  size_t first_row = 0, end_row = 0;
  BackwardScratch& s;

  // Rows [begin, end) of the block that the task covers.
  std::pair<size_t, size_t> Covered(size_t begin, size_t end) const {
    return {std::max(begin, first_row), std::min(end, end_row)};
  }

  // Also moves the scratch's key rows to this block where they hold one block (s.block_rows).
  void Prepare(size_t block_begin, size_t block_end) const {
    if (s.block_rows) MoveKeyRows(block_begin);
    const auto [begin, end] = Covered(block_begin, block_end);
    if (begin >= end) return;
    const size_t slot = begin - s.key_rows_base;       // the scratch's row of key row `begin`
    if (s.key_pairs == nullptr && !s.rows_in_place) {  // the fp32 products' operands
      PadRows(args, args.k, args.k16, b, kv_head, begin, end, s.d_padded,
              s.k_rows + slot * s.d_padded);
      PadRows(args, args.v, args.v16, b, kv_head, begin, end, s.dv_padded,
              s.v_rows + slot * s.dv_padded);
    }
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    if (s.key_pairs != nullptr) {  // the bf16 path's pairs
      const auto first = static_cast<int64_t>(begin), last = static_cast<int64_t>(end);
      RowPairs(args.k16, b, kv_head, first, last, s.d_pairs, s.key_pairs + slot * s.d_pairs);
      RowPairs(args.v16, b, kv_head, first, last, s.dv_pairs, s.value_pairs + slot * s.dv_pairs);
      // begin and the base are multiples of the key tile, so even: pair rows start at row pairs.
      InterleavedRowPairs(args.k16, b, kv_head, begin / 2, (end + 1) / 2, s.d_padded,
                          s.key_row_pairs + slot / 2 * s.d_padded);
      if (s.amx_products) {
        TransposeKeyTilePairs(s.key_row_pairs + slot / 2 * s.d_padded, (end - begin) / 2,
                              s.d_padded, s.key_transposed_pairs + slot / 2 * s.d_padded, 1, 0);
      }
    }
    if (s.split_products) {  // the fp32 rows packed above (or in place), in three bf16 parts
      SplitRowPairs(s.keys, begin, end - begin, static_cast<size_t>(args.k.cols), s.split_d_pairs,
                    s.split_key_pairs + slot * s.split_d_pairs, s.key_part_words);
      SplitRowPairs(s.values, begin, end - begin, static_cast<size_t>(args.v.cols),
                    s.split_dv_pairs, s.split_value_pairs + slot * s.split_dv_pairs,
                    s.value_part_words);
      // (begin and the base are multiples of the key tile: pair rows start at row pairs.)
      SplitInterleavedRowPairs(s.keys, begin, end - begin, (end - begin + 1) / 2,
                               static_cast<size_t>(args.k.cols), s.d_padded,
                               s.split_key_row_pairs + slot / 2 * s.d_padded, s.key_row_part_words);
      TransposeKeyTilePairs(s.split_key_row_pairs + slot / 2 * s.d_padded, (end - begin) / 2,
                            s.d_padded, s.split_key_transposed + slot / 2 * s.d_padded, 3,
                            s.key_row_part_words);
    }
#endif
    if (args.read_magnitude_bits != nullptr) {
      AddReadRows(args, args.k, args.k16, b, kv_head, begin, end - begin, s.read[1]);
      AddReadRows(args, args.v, args.v16, b, kv_head, begin, end - begin, s.read[2]);
    }
    if (!s.store_key_value) {
      std::fill_n(s.grad_k + slot * s.d_padded, (end - begin) * s.d_padded, 0.0F);
      std::fill_n(s.grad_v + slot * s.dv_padded, (end - begin) * s.dv_padded, 0.0F);
    }
  }

  // The scratch's key rows (and the views of them) from key row `base` on.
  void MoveKeyRows(size_t base) const {
    s.key_rows_base = base;
    if (!s.rows_in_place && s.key_pairs == nullptr) {
      s.keys.first = base;
      s.values.first = base;
    }
    if (!s.store_key_value) {
      s.grad_k_rows.first = base;
      s.grad_v_rows.first = base;
    }
  }

  void Finish(size_t block_begin, size_t block_end) const {
    if (s.store_key_value) return;  // the head's products stored these rows
    const auto [begin, end] = Covered(block_begin, block_end);
    const auto depth = static_cast<size_t>(args.q.cols), dv = static_cast<size_t>(args.v.cols);
    for (size_t j = begin; j < end; ++j) {
      const size_t slot = j - s.key_rows_base;
      WriteGradientRow(args, args.grad_k, args.grad_k16, b, kv_head, j,
                       s.grad_k + slot * s.d_padded, depth, args.options.scale);
      WriteGradientRow(args, args.grad_v, args.grad_v16, b, kv_head, j,
                       s.grad_v + slot * s.dv_padded, dv, 1.0F);
    }
  }
};

// One query head h of batch element b, against the key/value head packed in s.k_rows and s.v_rows
// and the keys of `chunk`: accumulates its share of dK and dV into s.grad_k_rows and s.grad_v_rows
// (stores them there, dK scaled, when s.store_key_value), writes its dQ (or partial dQ at
// `partial_grad_q`), and returns its sink gradient −Σ_i exp(sink − lse_i)·D_i (0 without sinks, and
// for every chunk but the first: it depends on no key).
float FlashBackwardQueryHead(const BackwardArgs& args, int64_t b, int64_t h, const KeyChunk& chunk,
                             float* partial_grad_q, const ScoreMaskGradient& grad_mask,
                             const TaskKeyBlocks& key_blocks, bool first_head, bool last_head,
                             BackwardScratch& s) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const size_t br = flash_backward_detail::kQueryVectors * lanes;
  const size_t n = static_cast<size_t>(args.q.rows), m = static_cast<size_t>(args.k.rows);
  const size_t depth = static_cast<size_t>(args.q.cols), dv = static_cast<size_t>(args.v.cols);
  const size_t d_padded = s.d_padded, dv_padded = s.dv_padded;
  const size_t tiles = (n + br - 1) / br;
  const FlashAttentionOptions& options = args.options;
  const float scale = options.scale;
  // The fp32 products' scores are in base 2, log2 e in Qᵀ's scale and in the log-sum-exp, so that P
  // is 2^(S − lse) (ProbabilityExp2: an exact reduction in place of e^x's Cody–Waite,
  // one polynomial term fewer); dS = P ⊙ (dP − D) stays the gradient of the natural scores, so dQ
  // and dK keep c. The bf16 products' path stays in base e (AMX scales in P's exponent).
  const bool bf16_products = s.query_pairs != nullptr;
  const float score_unit = bf16_products ? 1.0F : std::numbers::log2e_v<float>;
  const float score_scale = scale * score_unit;
  // On AMX tiles Sᵀ is left unscaled and c enters P's exponent where the modifiers allow it.
  [[maybe_unused]] const bool scale_in_exponent = ModifiersCommuteWithScale(options);
  const float* head_lse = args.log_sum_exp + (b * args.q.heads + h) * args.q.rows;
  // A recomputed log-sum-exp is in base 2 already.
  const float lse_unit = args.recomputed_log_sum_exp ? 1.0F : score_unit;
  // Heads of at most kFewQueries queries compute Sᵀ and dPᵀ by FewQueryProducts; every tile of a
  // longer head, its last too, by the Gemm, as the forward's and the recount's tiles sum them
  // (FewQueryProducts sums in another order, other bits: the SCALAR target's tiles of 4 rows, or a
  // last tile of a few rows, would otherwise break P's agreement with their log-sum-exp).
  const size_t few_queries = n <= kFewQueries ? kFewQueries : 0;

  // The query side: padded and transposed copies, D, log-sum-exp and key ranges per query.
  // The fp32 products' operands (the bf16 path has its pairs instead).
  if (!bf16_products && s.rows_in_place) {
    s.queries = {args.q.matrix(b, h), static_cast<size_t>(args.q.row_stride)};
  } else if (!bf16_products) {
    PadRows(args, args.q, args.q16, b, h, 0, n, d_padded, s.q_rows);
    s.queries = {s.q_rows, d_padded};
  }
  std::fill(s.grad_q, s.grad_q + tiles * br * d_padded, 0.0F);
  if (s.split_products || s.amx_products)
    std::fill(s.grad_q_transposed, s.grad_q_transposed + tiles * br * d_padded, 0.0F);
  [[maybe_unused]] const size_t depth_pairs = s.d_pairs, dv_pairs = s.dv_pairs;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (bf16_products) {
    TransposedRowPairs(args.q16, b, h, br, depth_pairs, s.query_pairs);
    TransposedRowPairs(args.grad_out16, b, h, br, dv_pairs, s.grad_out_pairs);
    InterleavedRowPairs(args.q16, b, h, 0, tiles * br / 2, d_padded, s.query_row_pairs);
    InterleavedRowPairs(args.grad_out16, b, h, 0, tiles * br / 2, dv_padded, s.grad_out_row_pairs);
  }
#endif
  const HalfQuerySide half_query_side{args.half_type, args.out16, args.grad_out16, s.row,
                                      args.residual16};
  if (args.read_magnitude_bits != nullptr) {
    // The head's query-side rows, just before PrepareQueryTiles and the products read them again
    // (from cache where a head's rows fit it).
    AddReadRows(args, args.q, args.q16, b, h, 0, n, s.read[0]);
    AddReadRows(args, args.out, args.out16, b, h, 0, n, s.read[3]);
    AddReadRows(args, args.grad_out, args.grad_out16, b, h, 0, n, s.read[4]);
  }
  const int64_t extent =
      PrepareQueryTiles(args.out, args.grad_out, head_lse, *args.valid_lens, options, args.k.rows,
                        b, h, br, dv_padded, s, args.half ? &half_query_side : nullptr,
                        /*transposed=*/false, lse_unit);
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (s.split_products) {  // B of dK += dSᵀ·Q and dV += (P ⊙ Z)ᵀ·dO on the tiles
    SplitInterleavedRowPairs(s.queries, 0, n, tiles * br / 2, depth, d_padded,
                             s.split_query_row_pairs, s.query_row_part_words);
    SplitInterleavedRowPairs(s.grad_out, 0, n, tiles * br / 2, dv, dv_padded,
                             s.split_grad_out_row_pairs, s.grad_out_row_part_words);
  }
#endif
  // Qᵀ and dOᵀ for the fp32 products' Gemm; a tile of few queries reads their rows instead
  // (FewQueryProducts), and transposing them cost more than its products: 16 lanes of stores,
  // most of them padding, per element of a query row.
  for (size_t tile = 0; tile < tiles && !bf16_products; ++tile) {
    const size_t rows = std::min(br, n - tile * br), width = TileWidth(d, rows, br);
    if (rows <= few_queries) continue;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    if (s.split_products && rows == br) {  // a whole tile's scores on the tiles: three parts each
      SplitTransposedTile(s.queries, tile * br, br, depth, s.split_d_pairs, score_scale,
                          s.split_staging, s.split_query_pairs + tile * s.split_d_pairs * br,
                          s.query_part_words);
      SplitTransposedTile(s.grad_out, tile * br, br, dv, s.split_dv_pairs, 1.0F, s.split_staging,
                          s.split_grad_out_pairs + tile * s.split_dv_pairs * br,
                          s.grad_out_part_words);
      // The last key tile, short of Bc keys, stays on FMAs and reads Qᵀ and dOᵀ as floats.
      if (m % flash_backward_detail::kKeyTile == 0) continue;
    }
#endif
    TransposeScaledTile(s.queries.row(tile * br), s.queries.stride, rows, depth, score_scale, width,
                        width, s.q_transposed + tile * depth * br);
    TransposeScaledTile(s.grad_out.row(tile * br), s.grad_out.stride, rows, dv, 1.0F, width, width,
                        s.grad_out_transposed + tile * dv * br);
  }

  const bool dropout = options.dropout > 0.0F;
  // fp16 inputs on the split products: K, V, Q and dO, widened unscaled, have lo parts of 0
  // (amx::SplitPartCounts: two parts); c·Qᵀ, P and dS do not.
  [[maybe_unused]] const size_t input_parts = args.half ? 2 : 3;
  const DropoutApplier<decltype(d)> dropout_applier(d, options.dropout);
  const size_t keys_end =
      std::min(static_cast<size_t>(extent), chunk.last_tile * flash_backward_detail::kKeyTile);
  // Key tiles in blocks of key_block_tiles, query tiles inside a block, the block's key tiles
  // inside a query tile: a query tile's rows (Qᵀ, dOᵀ, dO, dQ) are read from L2 once per block
  // rather than once per key tile, while the block's K, V, dK and dV stay in L2. Every sum still
  // runs in the order of one key tile at a time (dK, dV over query tiles; dQ over key tiles), so
  // the block size changes no bit of the result.
  const size_t block_keys = s.key_block_tiles * flash_backward_detail::kKeyTile;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (s.amx_products || s.split_products) ConfigureTiles(s);
#endif
  // The blocks run on past this head's keys to the task's last row where the head prepares or
  // finishes the task's rows (key_blocks), their products only up to keys_end.
  const size_t blocks_end =
      first_head || last_head ? std::max(keys_end, key_blocks.end_row) : keys_end;
  for (size_t block0 = chunk.first_tile * flash_backward_detail::kKeyTile; block0 < blocks_end;
       block0 += block_keys) {
    if (first_head) key_blocks.Prepare(block0, block0 + block_keys);
    const size_t block_end = std::min(keys_end, block0 + block_keys);
    for (size_t tile = 0; tile < tiles && block0 < block_end; ++tile) {
      const TileKeyRanges ranges = s.tile_ranges(tile);
      const size_t first = tile * br, rows = std::min(br, n - first);
      for (size_t key0 = block0; key0 < block_end; key0 += flash_backward_detail::kKeyTile) {
        const size_t bc = std::min(flash_backward_detail::kKeyTile, m - key0);
        const auto key_begin = static_cast<int64_t>(key0),
                   key_end = static_cast<int64_t>(key0 + bc);
        // The scratch's key rows (K, V and their pairs, dK, dV) hold this tile from row `slot` on.
        [[maybe_unused]] const size_t slot = key0 - s.key_rows_base;
        // Stored gradients: every visited tile's rows are written, zeros where no query sees them.
        const bool store = s.store_key_value;
        const auto zero_tile = [&] {
          ZeroRows(s.grad_k_rows, key0, bc, depth);
          ZeroRows(s.grad_v_rows, key0, bc, dv);
        };
        if (ranges.end <= key_begin || ranges.begin >= key_end) {  // sees none of these
          if (store) zero_tile();
          continue;
        }
        const MaskCoverage coverage =
            mask_coverage(options.mask, b, h, static_cast<int64_t>(first), rows, key_begin, bc);
        if (coverage == MaskCoverage::kNone) {
          if (store) zero_tile();
          continue;
        }
        // The causal diagonal, a window's edge or a valid length crosses this key tile: the
        // reductions over queries (dV, dK) and over keys (dQ) skip what no band's row sees.
        const bool crossed = crosses_key_ranges(ranges, key_begin, key_end);
        // The lanes the steps compute: the query vectors that hold a query (TileWidth; all of them
        // in a whole tile, as the AMX tiles take). On the fp32 path the tile's transposed buffers
        // (Qᵀ, dOᵀ, Sᵀ, Pᵀ, dPᵀ, dSᵀ) are laid out that narrow too; the bf16 path's pairs keep
        // rows of Br lanes.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
        // A tile of Bc keys on AMX tiles where they are in use: the same pairs, laid out as
        // vdpbf16ps reads them, summed in fp32 in the tiles' order. A tile of fewer than Br
        // queries takes them too, its lanes past the queries computed as queries of no key: zero
        // query and dO pairs, D and log-sum-exp 0 (PrepareQueryTiles), so each adds zeros to dV,
        // dK and dQ (dO's zeros; dS = P ⊙ (dP − D) = 0), and dQ's rows past n are never read.
        const bool on_tiles = s.amx_products && bc == flash_backward_detail::kKeyTile &&
                              rows >= flash_backward_detail::kFewestTileQueries;
        // A whole tile's fp32 products on the tiles (FloatProductsOnTiles); the others on FMAs.
        const bool split_tile =
            s.split_products && bc == flash_backward_detail::kKeyTile && rows == br;
#else
        constexpr bool on_tiles = false;
#endif
        const size_t width = on_tiles ? br : TileWidth(d, rows, br),
                     stride = bf16_products ? br : width;
        const QueryTile query_tile{b,
                                   h,
                                   static_cast<int64_t>(first),
                                   rows,
                                   args.q.rows,
                                   args.k.rows,
                                   s.first + first,
                                   s.last + first,
                                   ranges};
        // Sᵀ = K c·Qᵀ, the modifiers and masks, then Pᵀ = exp(Sᵀ − lse).
        float exponent_scale = 1.0F;  // c where Sᵀ is left unscaled for P's exponent
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
        if (on_tiles) {
          TileProduct<false>(s, s.key_pairs + slot * depth_pairs, depth_pairs,
                             s.query_pairs + tile * depth_pairs * br, br, depth_pairs,
                             s.probabilities, br, bc, br);
          // Scaled as GemmBF16 scales on storing, or in P's exponent (the forward's AMX path).
          if (!scale_in_exponent) amx::ScaleInPlace(s.probabilities, bc * br, scale);
          exponent_scale = scale_in_exponent ? scale : 1.0F;
        } else if (bf16_products) {
          // Exact products of the bf16 inputs, summed in fp32 as the forward pass's bf16 path sums
          // them: the same scores, so P agrees with its log-sum-exp.
          GemmBF16<false>(bc, width / lanes, s.key_pairs + slot * depth_pairs, depth_pairs, 1,
                          s.query_pairs + tile * depth_pairs * br, br, depth_pairs, s.probabilities,
                          br, nullptr, scale);
        } else if (split_tile) {  // Qᵀ's parts carry c in the softmax's unit, as q_transposed
          SplitTileProduct<false>(
              s, s.split_key_pairs + slot * s.split_d_pairs, s.split_d_pairs, s.key_part_words,
              s.split_query_pairs + tile * s.split_d_pairs * br, br, s.query_part_words,
              s.split_d_pairs, s.probabilities, width, bc, br, {input_parts, 3});
        } else
#endif
            if (rows <= few_queries) {
          FewQueryProducts(bc, rows, width, s.keys.row(key0), s.keys.stride, s.queries.row(first),
                           s.queries.stride, depth, score_scale, s.probabilities);
        } else {
          Gemm<false>(d, bc, width / lanes, s.keys.row(key0), s.keys.stride, 1,
                      s.q_transposed + tile * depth * br, width, depth, s.probabilities, width);
        }
        ApplyScoreModifiers(d, options, query_tile, key_begin, bc, stride, width,
                            coverage == MaskCoverage::kSome, s.probabilities, s.softcap_tanh,
                            score_unit);
        if (bf16_products && s.probability_parts == 2) {  // P in fp32's accuracy, split next
          ProbabilitiesFromScores<ProbabilityExp::kNatural>(d, bc, stride, width, s.lse + first,
                                                            s.probabilities, exponent_scale);
        } else if (bf16_products) {
          ProbabilitiesFromScores<ProbabilityExp::kRoundedToBFloat16>(
              d, bc, stride, width, s.lse + first, s.probabilities, exponent_scale);
        } else {
          ProbabilitiesFromScores<ProbabilityExp::kBaseTwo>(d, bc, stride, width, s.lse + first,
                                                            s.probabilities);
        }
        // With dropout, the forward pass multiplied V by P ⊙ Z: regenerate Z from the hash.
        const float* used = s.probabilities;
        if (dropout) {
          ApplyDropout(d, dropout_applier, bc, key0, stride, width, s.row_keys + first,
                       s.probabilities, s.dropped);
          used = s.dropped;
        }
        // dV += (P ⊙ Z)ᵀ dO: on the bf16 path with P ⊙ Z in bf16 as the forward pass gives P to
        // P·V: in two parts (s.probability_parts), or rounded (as FlashAttention's bf16 kernels
        // round P and dS).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
        if (bf16_products) {
          TileRowsToPairs(used, bc, br, width, s.used_query_pairs, s.probability_parts,
                          s.tile_pair_words);
        }
        if (on_tiles) {
          PartsTileProduct(s, s.used_query_pairs, br / 2, s.tile_pair_words,
                           s.grad_out_row_pairs + first / 2 * dv_padded, dv_padded, 0, br / 2,
                           s.grad_v + slot * dv_padded, dv_padded, bc, dv_padded,
                           {s.probability_parts, 1});
        } else if (bf16_products && crossed) {
          for (size_t part = 0; part < s.probability_parts; ++part) {
            KeysOverVisibleQueryPairs(s.first + first, s.last + first, rows, key_begin, bc,
                                      s.used_query_pairs + part * s.tile_pair_words, br / 2,
                                      s.grad_out_row_pairs + first / 2 * dv_padded, dv_padded,
                                      dv_padded / lanes, s.grad_v + slot * dv_padded, dv_padded);
          }
        } else if (bf16_products) {
          for (size_t part = 0; part < s.probability_parts; ++part) {
            GemmBF16<true>(bc, dv_padded / lanes, s.used_query_pairs + part * s.tile_pair_words,
                           br / 2, 1, s.grad_out_row_pairs + first / 2 * dv_padded, dv_padded,
                           (rows + 1) / 2, s.grad_v + slot * dv_padded, dv_padded, nullptr);
          }
        } else if (split_tile) {  // the whole tile: P = 0 where a query sees none of the keys
          SplitTilePairs(used, bc * br, s.split_used, s.tile_part_words);
          SplitTileProduct<true>(s, s.split_used, br / 2, s.tile_part_words,
                                 s.split_grad_out_row_pairs + first / 2 * dv_padded, dv_padded,
                                 s.grad_out_row_part_words, br / 2, s.grad_v_rows.row(key0),
                                 s.grad_v_rows.stride, bc, dv_padded, {3, input_parts});
        } else
#endif
        {
          KeysOverQueries(d, crossed, store, s.first + first, s.last + first, rows, key0, bc, used,
                          width, s.grad_out.row(first), s.grad_out.stride, dv_padded / lanes, dv,
                          s.grad_v_rows);
        }
        // dPᵀ = V dOᵀ, then dSᵀ = Pᵀ ⊙ (Zᵀ ⊙ dPᵀ − D) = (P ⊙ Z)ᵀ ⊙ dPᵀ − Pᵀ ⊙ D.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
        if (on_tiles) {
          TileProduct<false>(s, s.value_pairs + slot * dv_pairs, dv_pairs,
                             s.grad_out_pairs + tile * dv_pairs * br, br, dv_pairs, s.grad_scores,
                             br, bc, br);
        } else if (bf16_products) {
          GemmBF16<false>(bc, width / lanes, s.value_pairs + slot * dv_pairs, dv_pairs, 1,
                          s.grad_out_pairs + tile * dv_pairs * br, br, dv_pairs, s.grad_scores, br,
                          nullptr);
        } else if (split_tile) {
          SplitTileProduct<false>(s, s.split_value_pairs + slot * s.split_dv_pairs,
                                  s.split_dv_pairs, s.value_part_words,
                                  s.split_grad_out_pairs + tile * s.split_dv_pairs * br, br,
                                  s.grad_out_part_words, s.split_dv_pairs, s.grad_scores, width, bc,
                                  br, {input_parts, input_parts});
        } else
#endif
            if (rows <= few_queries) {
          FewQueryProducts(bc, rows, width, s.values.row(key0), s.values.stride,
                           s.grad_out.row(first), s.grad_out.stride, dv, 1.0F, s.grad_scores);
        } else {
          Gemm<false>(d, bc, width / lanes, s.values.row(key0), s.values.stride, 1,
                      s.grad_out_transposed + tile * dv * br, width, dv, s.grad_scores, width);
        }
        GradScoresFromGradProbabilities(d, bc, stride, width, s.probabilities, used,
                                        s.delta + first, s.grad_scores);
        // A float mask is added to the final scores: its gradient is dS itself.
        if (grad_mask.data != nullptr) {
          accumulate_mask_gradient(grad_mask, b, h, static_cast<int64_t>(first), rows, key_begin,
                                   bc, stride, s.grad_scores);
        }
        // Through the soft cap: d(c·tanh(s/c))/ds = 1 − tanh².
        if (options.softcap > 0.0F)
          SoftcapBackward(d, bc, stride, width, s.softcap_tanh, s.grad_scores);
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
        if (bf16_products) {  // dK += dSᵀ Q (scaled at the end); dQ += dS K
          GradScorePairs(s.grad_scores, bc, br, width, s);
          if (on_tiles) {
            PartsTileProduct(s, s.grad_score_query_pairs, br / 2, s.tile_pair_words,
                             s.query_row_pairs + first / 2 * d_padded, d_padded, 0, br / 2,
                             s.grad_k + slot * d_padded, d_padded, bc, d_padded,
                             {s.probability_parts, 1});
            // dQᵀ += Kᵀ·dSᵀ: dS's key pairs as they lie (as the fp32 tiles' dQᵀ).
            PartsTileProduct(s, s.key_transposed_pairs + slot / 2 * d_padded, bc / 2, 0,
                             s.grad_score_key_pairs, br, s.key_pair_words, bc / 2,
                             s.grad_q_transposed + first * d_padded, br, d_padded, br,
                             {1, s.probability_parts});
          } else {
            for (size_t part = 0; part < s.probability_parts; ++part) {
              const uint32_t* query_pairs = s.grad_score_query_pairs + part * s.tile_pair_words;
              const uint32_t* key_pairs = s.grad_score_key_pairs + part * s.key_pair_words;
              if (crossed) {
                KeysOverVisibleQueryPairs(s.first + first, s.last + first, rows, key_begin, bc,
                                          query_pairs, br / 2,
                                          s.query_row_pairs + first / 2 * d_padded, d_padded,
                                          d_padded / lanes, s.grad_k + slot * d_padded, d_padded);
                QueriesOverVisibleKeyPairs(s.first + first, s.last + first, rows, key_begin, bc,
                                           key_pairs, br, s.key_row_pairs + slot / 2 * d_padded,
                                           d_padded, d_padded / lanes, s.grad_q + first * d_padded,
                                           d_padded);
              } else {
                GemmBF16<true>(bc, d_padded / lanes, query_pairs, br / 2, 1,
                               s.query_row_pairs + first / 2 * d_padded, d_padded, (rows + 1) / 2,
                               s.grad_k + slot * d_padded, d_padded, nullptr);
                GemmBF16<true>(rows, d_padded / lanes, key_pairs, 1, br,
                               s.key_row_pairs + slot / 2 * d_padded, d_padded, (bc + 1) / 2,
                               s.grad_q + first * d_padded, d_padded, nullptr);
              }
            }
          }
          continue;
        }
#endif
        // dK += dSᵀ Q (scaled at the end); dQ += dS K.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
        if (split_tile) {
          SplitGradScores(s.grad_scores, bc, br, s.split_grad_scores, s.split_grad_score_key_pairs,
                          s.tile_part_words);
          SplitTileProduct<true>(s, s.split_grad_scores, br / 2, s.tile_part_words,
                                 s.split_query_row_pairs + first / 2 * d_padded, d_padded,
                                 s.query_row_part_words, br / 2, s.grad_k_rows.row(key0),
                                 s.grad_k_rows.stride, bc, d_padded, {3, input_parts});
        } else
#endif
        {
          KeysOverQueries(d, crossed, store, s.first + first, s.last + first, rows, key0, bc,
                          s.grad_scores, width, s.queries.row(first), s.queries.stride,
                          d_padded / lanes, depth, s.grad_k_rows);
        }
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
        if (split_tile) {
          // dQᵀ += Kᵀ·dSᵀ (dS's parts: SplitGradScores above, for dK).
          SplitTileProduct<true>(s, s.split_key_transposed + slot / 2 * d_padded, bc / 2,
                                 s.key_row_part_words, s.split_grad_score_key_pairs, br,
                                 s.tile_part_words, bc / 2, s.grad_q_transposed + first * d_padded,
                                 br, d_padded, br, {input_parts, 3});
        } else
#endif
            if (crossed) {
          QueriesOverVisibleKeys(d, s.first + first, s.last + first, rows, key_begin, bc,
                                 s.grad_scores, width, s.keys.row(key0), s.keys.stride,
                                 d_padded / lanes, s.grad_q + first * d_padded, d_padded);
        } else {
          Gemm<true>(d, rows, d_padded / lanes, s.grad_scores, 1, width, s.keys.row(key0),
                     s.keys.stride, bc, s.grad_q + first * d_padded, d_padded);
        }
        // dK's rows are complete: the scale that the copy out of scratch applies otherwise.
        if (store) ScaleRows(s.grad_k_rows, key0, bc, depth, scale);
      }
    }
    if (last_head) key_blocks.Finish(block0, block0 + block_keys);
  }
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (s.amx_products || s.split_products) ReleaseTiles(s);
  if (s.split_products || s.amx_products)
    AddTransposedGradQ(s.grad_q_transposed, tiles, br, d_padded, s.grad_q);
#endif
  for (size_t i = 0; i < n; ++i) {
    if (partial_grad_q != nullptr) {
      std::copy_n(s.grad_q + i * d_padded, depth, partial_grad_q + i * depth);
    } else {
      WriteGradientRow(args, args.grad_q, args.grad_q16, b, h, i, s.grad_q + i * d_padded, depth,
                       scale);
    }
  }
  if (options.sinks == nullptr || chunk.first_tile != 0) return 0.0F;
  // The sink's weight in row i is exp(sink − lse_i); d lse_i / d sink is that weight, and
  // dL/d sink = −Σ_i weight_i · D_i (D_i = dO_i·O_i = Σ_j P_ij dP_ij).
  // (A recomputed log-sum-exp is in base 2, the sink's score there a float times log2 e.)
  double grad_sink = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (head_lse[i] == -std::numeric_limits<float>::infinity()) continue;
    const double weight =
        args.recomputed_log_sum_exp
            ? std::exp2(static_cast<double>(options.sinks[h] * score_unit) - head_lse[i])
            : std::exp(static_cast<double>(options.sinks[h]) - head_lse[i]);
    grad_sink -= weight * s.delta[i];
  }
  return static_cast<float>(grad_sink);
}

// One (batch b, key/value head kv_head, key chunk) task: the query heads that share the key/value
// head in turn, then the chunk's rows of dK and dV written once. Sink gradients go to
// grad_sinks_by_head (B·H values, one per query head) from the first chunk.
// The rows of the chunk's keys that some query of the key/value head's group may see (before the
// attention mask's entries), widened to whole key tiles: the rows the task packs, reads and
// accumulates into. The chunk's other rows get zero gradients: is_causal's top-left diagonal
// with L < S, a window, or short valid lengths leave most keys unread.
KeyRange TaskKeyRows(const BackwardArgs& args, int64_t b, int64_t kv_head, const KeyChunk& chunk) {
  const int64_t m = args.k.rows, group = args.q.heads / args.k.heads;
  const KeyRange tiles =
      keys_read_in_tiles(keys_seen(*args.valid_lens, args.options, b, kv_head * group,
                                   (kv_head + 1) * group, args.q.rows, m),
                         m);
  constexpr size_t kTile = flash_backward_detail::kKeyTile;
  const auto chunk_begin = static_cast<int64_t>(chunk.first_tile * kTile);
  const int64_t chunk_end = std::min(m, static_cast<int64_t>(chunk.last_tile * kTile));
  const KeyRange rows{std::max(tiles.begin, chunk_begin), std::min(tiles.end, chunk_end)};
  return rows.begin < rows.end ? rows : KeyRange{chunk_begin, chunk_begin};
}

void FlashBackwardTask(const BackwardArgs& args, int64_t b, int64_t kv_head, const KeyChunk& chunk,
                       const ScoreMaskGradient& grad_mask, float* grad_sinks_by_head,
                       BackwardScratch& s) {
  const size_t m = static_cast<size_t>(args.k.rows);
  const size_t d_padded = s.d_padded, dv_padded = s.dv_padded;
  const KeyRange read = TaskKeyRows(args, b, kv_head, chunk);
  const auto first_row = static_cast<size_t>(read.begin), end_row = static_cast<size_t>(read.end);
  if (s.rows_in_place) {
    s.keys = {args.k.matrix(b, kv_head), static_cast<size_t>(args.k.row_stride)};
    s.values = {args.v.matrix(b, kv_head), static_cast<size_t>(args.v.row_stride)};
  } else if (s.key_pairs == nullptr) {  // the fp32 products' operands (the bf16 path: pairs)
    s.keys = {s.k_rows, d_padded};
    s.values = {s.v_rows, dv_padded};
  }
  if (s.store_key_value) {
    s.grad_k_rows = {args.grad_k.matrix(b, kv_head), static_cast<size_t>(args.grad_k.row_stride)};
    s.grad_v_rows = {args.grad_v.matrix(b, kv_head), static_cast<size_t>(args.grad_v.row_stride)};
  } else {
    s.grad_k_rows = {s.grad_k, d_padded};
    s.grad_v_rows = {s.grad_v, dv_padded};
  }
  const TaskKeyBlocks key_blocks{args, b, kv_head, first_row, end_row, s};
  const int64_t group = args.q.heads / args.k.heads;
  const auto n = static_cast<size_t>(args.q.rows), depth = static_cast<size_t>(args.q.cols);
  for (int64_t h = kv_head * group; h < (kv_head + 1) * group; ++h) {
    float* partial =
        chunk.partial_grad_q == nullptr
            ? nullptr
            : chunk.partial_grad_q + static_cast<size_t>(h - kv_head * group) * n * depth;
    const float grad_sink =
        FlashBackwardQueryHead(args, b, h, chunk, partial, grad_mask, key_blocks,
                               h == kv_head * group, h + 1 == (kv_head + 1) * group, s);
    if (chunk.first_tile == 0) grad_sinks_by_head[b * args.q.heads + h] = grad_sink;
  }
  // The chunk's rows outside the task's (which its heads wrote block by block): no query sees them.
  const size_t chunk_begin = chunk.first_tile * flash_backward_detail::kKeyTile;
  const size_t rows_end = std::min(m, chunk.last_tile * flash_backward_detail::kKeyTile);
  for (size_t j = chunk_begin; j < rows_end; ++j) {
    if (j >= first_row && j < end_row) continue;
    WriteZeroGradientRow(args, args.grad_k, args.grad_k16, b, kv_head, j);
    WriteZeroGradientRow(args, args.grad_v, args.grad_v16, b, kv_head, j);
  }
}

// Sums the key chunks' partial dQ of every (batch, query head), in chunk order, into the gradient:
// `partial` holds, per (batch, key/value head) and chunk, the group's query heads, n × d each.
void SumPartialGradQ(const BackwardArgs& args, size_t chunks, const std::vector<float>& partial) {
  const int64_t group = args.q.heads / args.k.heads;
  const auto n = static_cast<size_t>(args.q.rows), depth = static_cast<size_t>(args.q.cols);
  const size_t head_size = n * depth, task_size = static_cast<size_t>(group) * head_size;
  const int64_t heads = args.q.batch * args.q.heads;
  // Each thread's sum, allocated here: a std::bad_alloc thrown inside the OpenMP region could not
  // leave it (std::terminate), while here it reaches the caller.
  std::vector<float> buffers(depth * static_cast<size_t>(omp_get_max_threads()));
  core_detail::note_parallel_region(omp_get_max_threads());
#pragma omp parallel
  {
    float* sum = buffers.data() + depth * static_cast<size_t>(omp_get_thread_num());
#pragma omp for schedule(static)
    for (int64_t head = 0; head < heads; ++head) {
      const int64_t b = head / args.q.heads, h = head % args.q.heads;
      const int64_t kv_head = h / group;
      const size_t first = static_cast<size_t>(b * args.k.heads + kv_head) * chunks * task_size +
                           static_cast<size_t>(h - kv_head * group) * head_size;
      for (size_t i = 0; i < n; ++i) {
        std::fill(sum, sum + depth, 0.0F);
        for (size_t chunk = 0; chunk < chunks; ++chunk) {
          const float* part = partial.data() + first + chunk * task_size + i * depth;
          for (size_t t = 0; t < depth; ++t) sum[t] += part[t];
        }
        WriteGradientRow(args, args.grad_q, args.grad_q16, b, h, i, sum, depth, args.options.scale);
      }
    }
    if (args.stream_gradients) hwy::FlushStream();
  }
}

// The largest magnitude of a view's rows (core's scan: NaN and ∞ above every finite value).
float LargestMagnitude(const ConstHeadsView& view) {
  uint32_t bits = 0;
  for (int64_t b = 0; b < view.batch; ++b) {
    for (int64_t h = 0; h < view.heads; ++h) {
      for (int64_t r = 0; r < view.rows; ++r) {
        bits = std::max(bits, core_detail::largest_magnitude_bits(
                                  view.matrix(b, h) + r * view.row_stride, view.cols));
      }
    }
  }
  return std::bit_cast<float>(bits);
}

// Whether fp32 products with these largest magnitudes of q, k, v and grad_out keep fp32's accuracy
// in three bf16 parts on the tiles: each operand as the products take it in split_parts_in_range
// (q times the scale in Sᵀ = K·c·Qᵀ, q itself in dK += dSᵀ·Q: a scale of 1e34 over queries of
// 1e-34 left dK 86% off), and dS, whose scale is grad_out's times v's.
bool SplitPartsInRange(double scale, double query, double key, double value, double grad_out) {
  return split_parts_in_range(scale * query) && split_parts_in_range(query) &&
         split_parts_in_range(key) && split_parts_in_range(value) &&
         split_parts_in_range(grad_out) && split_parts_in_range(value * grad_out);
}

void FlashBackward(const BackwardArgs& call) {
  const hn::ScalableTag<float> d;
  BackwardArgs args = call;
  const int64_t head_tasks = args.q.batch * args.k.heads;
  // Threads as the call's work is worth (useful_threads): B·H·n·m pairs of 6·d + 4·dv flops.
  const auto threads = static_cast<size_t>(useful_threads(
      static_cast<double>(args.q.batch * args.q.heads) * static_cast<double>(args.q.rows) *
          static_cast<double>(args.k.rows) * static_cast<double>(6 * args.q.cols + 4 * args.v.cols),
      kFlopsPerThread));
  // fp32 gradients outgrowing the threads' L2s: streamed where rows are whole aligned vectors.
  const auto elements = [](const HeadsView& view) {
    return static_cast<double>(view.batch * view.heads * view.rows * view.cols);
  };
  args.stream_gradients =
      streams_output((args.half ? 2.0 : 4.0) *
                         (elements(args.grad_q) + elements(args.grad_k) + elements(args.grad_v)),
                     static_cast<int>(threads));
  // Fewer (batch, key/value head) pairs than threads: each pair's keys split into chunks of key
  // tiles (FlashAttention-2's split over keys), so every thread has work. A chunk writes its rows
  // of dK and dV and a partial dQ over its keys, summed in chunk order after the parallel region:
  // results depend on the thread count only through the chunking. Memory for the partial sums:
  // B·H_kv·chunks ≈ threads × (query heads per key/value head) × n × d floats; if it cannot be
  // had, the pairs run whole.
  const size_t key_tiles =
      (static_cast<size_t>(args.k.rows) + flash_backward_detail::kKeyTile - 1) /
      flash_backward_detail::kKeyTile;
  size_t chunks = 1;
  if (static_cast<size_t>(head_tasks) < threads && key_tiles > 1) {
    chunks = std::min(key_tiles, (threads + static_cast<size_t>(head_tasks) - 1) /
                                     static_cast<size_t>(head_tasks));
  }
  std::vector<float> partial_grad_q;
  const size_t task_size = static_cast<size_t>(args.q.heads / args.k.heads) *
                           static_cast<size_t>(args.q.rows) * static_cast<size_t>(args.q.cols);
  if (chunks > 1) {
    try {
      partial_grad_q.resize(static_cast<size_t>(head_tasks) * chunks * task_size);
    } catch (const std::bad_alloc&) {
      chunks = 1;
    }
  }
  const std::vector<size_t> chunk_bounds =
      key_chunk_bounds(*args.valid_lens, args.options, args.q.batch, args.q.heads, args.q.rows,
                       args.k.rows, flash_backward_detail::kKeyTile, chunks);
  const auto tasks = head_tasks * static_cast<int64_t>(chunks);
  // A float mask's gradient that broadcasts over batch elements or key/value heads gets written
  // by several tasks: each thread then sums into a private copy (static schedule, summed in
  // thread order, so reproducible for a fixed thread count).
  MaskGradientAccumulator target(args.grad_mask, args.q.batch, args.q.heads, args.k.heads,
                                 args.q.rows, args.k.rows, threads);
  std::vector<float> grad_sinks_by_head(static_cast<size_t>(args.q.batch * args.q.heads));
  const BackwardProducts products = ChooseBackwardProducts(args);
  const bool float_on_tiles = FloatProductsOnTiles(args, products);
  // P ⊙ Z and dS in two bf16 parts, as the forward's P (bfloat16_probabilities.hpp).
  const bool split_probabilities =
      products != BackwardProducts::kFloat &&
      bf16_probabilities_split(products == BackwardProducts::kAmx ||
                               products == BackwardProducts::kAmxModel);
  // fp32 on tiles in three parts loses the parts of values under 2^-110 (split_parts_range.hpp):
  // a pass whose operands lie outside that range runs on FMAs. The magnitudes are those the pass
  // reads, checked after it (before the sinks' gradient is added); a mask's gradient, added into
  // the caller's as the pass runs, has them scanned first (next to its n·m entries, a small read).
  const double scale = std::fabs(static_cast<double>(args.options.scale));
  const bool check_parts = float_on_tiles && !args.half;
  const auto rerun_on_fmas = [&] {
    BackwardArgs on_fmas = call;
    on_fmas.parts_on_tiles = false;
    FlashBackward(on_fmas);
  };
  if (check_parts && args.grad_mask.data != nullptr &&
      !SplitPartsInRange(scale, LargestMagnitude(args.q), LargestMagnitude(args.k),
                         LargestMagnitude(args.v), LargestMagnitude(args.grad_out))) {
    return rerun_on_fmas();
  }
  std::atomic<uint32_t> split_read_bits[5] = {0U, 0U, 0U, 0U, 0U};
  if (check_parts && args.read_magnitude_bits == nullptr)
    args.read_magnitude_bits = split_read_bits;
  const size_t lanes = hn::Lanes(d);
  const bool rows_in_place = !args.half && DenseRows(args.q, lanes) && DenseRows(args.k, lanes) &&
                             DenseRows(args.v, lanes);
  // (The tiles' products add into dK and dV's scratch rows, 32 columns at a time.)
  const bool store_key_value = !float_on_tiles && KeyValueGradientsStored(args, products, lanes);
  float* grad_sinks = grad_sinks_by_head.data();
  run_parallel_tasks(
      tasks, "flash_attention_backward",
      target.private_copies() ? TaskSchedule::kStatic : TaskSchedule::kDynamic,
      [&] {
        return BackwardScratch(static_cast<size_t>(args.q.rows), static_cast<size_t>(args.k.rows),
                               static_cast<size_t>(args.q.cols), static_cast<size_t>(args.v.cols),
                               lanes, products, float_on_tiles, rows_in_place, store_key_value,
                               args.q.heads == args.k.heads, split_probabilities);
      },
      [&](int64_t task, BackwardScratch& scratch, int thread) {
        const int64_t head_task = task / static_cast<int64_t>(chunks);
        const auto index = static_cast<size_t>(task % static_cast<int64_t>(chunks));
        KeyChunk chunk{chunk_bounds[index], chunk_bounds[index + 1]};
        if (chunks > 1) {
          chunk.partial_grad_q =
              partial_grad_q.data() + (static_cast<size_t>(head_task) * chunks + index) * task_size;
        }
        FlashBackwardTask(args, head_task / args.k.heads, head_task % args.k.heads, chunk,
                          target.for_thread(static_cast<size_t>(thread)), grad_sinks, scratch);
        // The gradient rows' streaming stores, visible before another thread reads them.
        if (args.stream_gradients) hwy::FlushStream();
        if (args.read_magnitude_bits != nullptr) {
          for (size_t i = 0; i < 5; ++i) scratch.read[i].RaiseTo(args.read_magnitude_bits[i]);
        }
      },
      static_cast<int>(threads));
  if (check_parts && args.grad_mask.data == nullptr) {
    const std::atomic<uint32_t>* read = args.read_magnitude_bits;
    if (!SplitPartsInRange(scale, recorded_magnitude(read[0]), recorded_magnitude(read[1]),
                           recorded_magnitude(read[2]), recorded_magnitude(read[4]))) {
      return rerun_on_fmas();
    }
  }
  target.sum_private_copies();
  if (chunks > 1) SumPartialGradQ(args, chunks, partial_grad_q);
  if (args.grad_sinks != nullptr) {
    for (int64_t h = 0; h < args.q.heads; ++h) {
      double sum = 0.0;
      for (int64_t b = 0; b < args.q.batch; ++b)
        sum += grad_sinks_by_head[static_cast<size_t>(b * args.q.heads + h)];
      args.grad_sinks[h] += static_cast<float>(sum);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {

HWY_EXPORT(FlashBackward);

namespace {

// The checks both overloads share, on float views (shapes only, for half-precision data). False
// when nothing flows back: the input gradients are then zero, the mask's and sinks' unchanged.
bool check_backward_arguments(const flash_backward_detail::BackwardArgs& args) {
  const bool work =
      check_attention_arguments(args.q, args.k, args.v, args.out, *args.valid_lens, args.options);
  require_matrices(args.grad_out, "grad_out", args.out.batch, args.out.heads, args.out.rows,
                   args.out.cols, "as out");
  require_matrices(args.grad_q, "grad_q", args.q.batch, args.q.heads, args.q.rows, args.q.cols,
                   "as queries");
  require_matrices(args.grad_k, "grad_k", args.k.batch, args.k.heads, args.k.rows, args.k.cols,
                   "as keys");
  require_matrices(args.grad_v, "grad_v", args.v.batch, args.v.heads, args.v.rows, args.v.cols,
                   "as values");
  require_log_sum_exp(args.log_sum_exp, args.q.batch * args.q.heads * args.q.rows);
  if (args.grad_mask.data != nullptr && args.options.mask.kind != MaskKind::kFloat) {
    throw ValueError(
        "grad_mask: expected a float attention mask to differentiate, got " +
        std::string(args.options.mask.kind == MaskKind::kBool ? "a bool mask" : "none"));
  }
  if (args.grad_sinks != nullptr && args.options.sinks == nullptr) {
    throw ValueError("grad_sinks: expected sinks to differentiate, got none");
  }
  return work && args.k.heads != 0;
}

// The pass on the dispatched target, with the magnitudes of the rows it read in `read` when
// given.
void RunBackward(flash_backward_detail::BackwardArgs& args, BackwardReadMagnitudes* read) {
  std::atomic<uint32_t> read_bits[5] = {0U, 0U, 0U, 0U, 0U};
  if (read != nullptr) args.read_magnitude_bits = read_bits;
  HWY_DYNAMIC_DISPATCH(FlashBackward)(args);
  if (read != nullptr) {
    const auto as_float = [&](size_t i) { return std::bit_cast<float>(read_bits[i].load()); };
    *read = {as_float(0), as_float(1), as_float(2), as_float(3), as_float(4)};
  }
}

}  // namespace

bool flash_attention_bfloat16_backward_native(int64_t depth, [[maybe_unused]] int64_t value_depth) {
  return flash_attention_bfloat16_native(depth);
}

void flash_attention_backward(ConstHeadsView q, ConstHeadsView k, ConstHeadsView v,
                              ConstHeadsView out, ConstHeadsView grad_out, const float* log_sum_exp,
                              const ValidLengths& valid_lens, const FlashAttentionOptions& options,
                              HeadsView grad_q, HeadsView grad_k, HeadsView grad_v,
                              ScoreMaskGradient grad_mask, float* grad_sinks,
                              BackwardReadMagnitudes* read, LogSumExpKind kind) {
  if (read != nullptr) *read = {};
  flash_backward_detail::BackwardArgs args{q,           k,           v,         out,    grad_out,
                                           log_sum_exp, &valid_lens, options,   grad_q, grad_k,
                                           grad_v,      grad_mask,   grad_sinks};
  args.recomputed_log_sum_exp = kind == LogSumExpKind::kRecomputedBaseTwo;
  if (!check_backward_arguments(args)) {
    for (const HeadsView& g : {grad_q, grad_k, grad_v}) fill_heads(g, 0.0F);
    return;
  }
  RunBackward(args, read);
}

void flash_attention_backward(HalfType type, ConstHalfHeadsView q, ConstHalfHeadsView k,
                              ConstHalfHeadsView v, ConstHalfHeadsView out,
                              ConstHalfHeadsView grad_out, const float* log_sum_exp,
                              const ValidLengths& valid_lens, const FlashAttentionOptions& options,
                              HalfHeadsView grad_q, HalfHeadsView grad_k, HalfHeadsView grad_v,
                              ScoreMaskGradient grad_mask, float* grad_sinks,
                              BackwardReadMagnitudes* read, ConstHalfHeadsView out_residual) {
  if (read != nullptr) *read = {};
  if (out_residual.data != nullptr) {
    require_matrices(shape_only(out_residual), "out_residual", out.batch, out.heads, out.rows,
                     out.cols, "as out");
  }
  flash_backward_detail::BackwardArgs args{
      shape_only(q),      shape_only(k), shape_only(v), shape_only(out),    shape_only(grad_out),
      log_sum_exp,        &valid_lens,   options,       shape_only(grad_q), shape_only(grad_k),
      shape_only(grad_v), grad_mask,     grad_sinks};
  if (!check_backward_arguments(args)) {
    for (const HalfHeadsView& g : {grad_q, grad_k, grad_v}) fill_heads(g, uint16_t{0});  // +0
    return;
  }
  args.half = true;
  args.half_type = type;
  args.q16 = q;
  args.k16 = k;
  args.v16 = v;
  args.out16 = out;
  args.grad_out16 = grad_out;
  args.residual16 = out_residual;
  args.grad_q16 = grad_q;
  args.grad_k16 = grad_k;
  args.grad_v16 = grad_v;
  RunBackward(args, read);
}

}  // namespace attn
#endif  // HWY_ONCE
