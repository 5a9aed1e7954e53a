// The fused kernels' dropout on vectors, per SIMD target (a Highway "-inl.h" header): the keep/drop
// bits of dropout_hash.hpp computed lane-wise over a tile's queries, and the multiplier they give.

#if defined(ATTN_KERNELS_DROPOUT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_DROPOUT_INL_H_
#undef ATTN_KERNELS_DROPOUT_INL_H_
#else
#define ATTN_KERNELS_DROPOUT_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

#include "kernels/dropout_hash.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// dropout_hash::bits for one key and the queries in the lanes of `row_keys` (see dropout_hash.hpp).
template <class DU>
HWY_INLINE hn::Vec<DU> DropoutBits(DU du, hn::Vec<DU> row_keys, uint32_t key) {
  auto x = hn::Add(row_keys, hn::Set(du, key * 0x9e3779b9U));
  x = hn::Xor(x, hn::ShiftRight<16>(x));
  x = hn::Mul(x, hn::Set(du, 0x7feb352dU));
  x = hn::Xor(x, hn::ShiftRight<15>(x));
  x = hn::Mul(x, hn::Set(du, 0x846ca68bU));
  x = hn::Xor(x, hn::ShiftRight<16>(x));
  return hn::ShiftRight<8>(x);
}

// The kernels' dropout, lane-wise over queries: Apply keeps a weight with probability 1 − p,
// scaled by 1/(1 − p), from the same hash bits as dropout_hash::bits, so forward and backward
// agree.
template <class D>
class DropoutApplier {
 public:
  DropoutApplier(D d, float p)
      // Kept when bits ≥ threshold, i.e. bits > threshold − 1 (integer ≥ is not on every target).
      : keep_above_(
            hn::Set(hn::RebindToSigned<D>(), static_cast<int32_t>(dropout_hash::threshold(p)) - 1)),
        keep_scale_(hn::Set(d, p > 0.0F ? 1.0F / (1.0F - p) : 1.0F)) {}

  hn::Vec<D> Apply(D d, hn::Vec<hn::RebindToUnsigned<D>> row_keys, uint32_t key,
                   hn::Vec<D> weights) const {
    const hn::RebindToSigned<D> di;
    const auto bits = hn::BitCast(di, DropoutBits(hn::RebindToUnsigned<D>(), row_keys, key));
    return hn::IfThenElseZero(hn::RebindMask(d, hn::Lt(keep_above_, bits)),
                              hn::Mul(weights, keep_scale_));
  }

 private:
  hn::Vec<hn::RebindToSigned<D>> keep_above_;
  hn::Vec<D> keep_scale_;
};

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_DROPOUT_INL_H_
