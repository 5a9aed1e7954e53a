// The fused kernels' elementwise math, per SIMD target (a Highway "-inl.h" header), cheaper than
// hwy's general Exp and Tanh because each serves only the arguments the kernels give it.
//
// SoftmaxExp: exp(x) for the online softmax's arguments x = score − running max ≤ 0, in about
// half the instructions of hwy::Exp. Cody–Waite reduction x = n·ln 2 + r with n = nearest(x·log2 e)
// and |r| ≤ ln2 / 2, a degree-6 polynomial for e^r (tools/fit_exp.py; within about 1 ulp, measured
// against double exp in tests/kernels/fast_math_test.cpp), then 2^n built in the exponent field.
// Every x below about −87.7 (−∞ included: masked keys) gives exactly 0 (2ⁿ built as +0), above it
// 2ⁿ is a normal number; exp(−87) ≈ 1.6e−38 is far below a float32 weight's resolution next to
// the row's maximum, whose weight is 1. RoundedProbabilityExp: the same with degree 4, for
// probabilities rounded to bf16.

#if defined(ATTN_KERNELS_FAST_MATH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_FAST_MATH_INL_H_
#undef ATTN_KERNELS_FAST_MATH_INL_H_
#else
#define ATTN_KERNELS_FAST_MATH_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// p·2ⁿ by vscalefps, n = floor(n_float) (n itself, or ReducedExp2's y), with the lanes outside
// `normal` zeroed in p first: their result would be subnormal or underflow, which costs Intel's
// cores a microcode assist per vector (ReducedExp says more). The zeroing joins the caller's last
// operation on p ({z} masking).
template <class D>
HWY_INLINE hn::Vec<D> ZeroedOrScaled(D d, hn::Mask<D> normal, hn::Vec<D> p, hn::Vec<D> n_float) {
  p = hn::IfThenElseZero(normal, p);
  if constexpr (hn::MaxLanes(d) == 16) {
    return hn::Vec<D>{_mm512_scalef_ps(p.raw, n_float.raw)};
  } else if constexpr (hn::MaxLanes(d) == 8) {
    return hn::Vec<D>{_mm256_scalef_ps(p.raw, n_float.raw)};
  } else {
    return hn::Vec<D>{_mm_scalef_ps(p.raw, n_float.raw)};
  }
}
#else
// (1 + q)·2ⁿ for n ≥ −127, n's biased exponent n + 127 in n_biased's low bits: moved into the
// exponent field (the shift drops the constant's own bits); n = −127 leaves the field 0, so 2ⁿ
// reads as +0 and so does the result. One multiply-add: 2ⁿ + q·2ⁿ.
template <class D>
HWY_INLINE hn::Vec<D> OnePlusTimesPowerOfTwo(D d, hn::Vec<D> q, hn::Vec<D> n_biased) {
  const hn::RebindToUnsigned<D> du;
  const auto two_to_n = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(du, n_biased)));
  return hn::MulAdd(q, two_to_n, two_to_n);
}
#endif

// exp(x) by Cody–Waite reduction x = n·ln 2 + r (|r| ≤ ln2 / 2), a polynomial of degree kDegree
// for e^r (tools/fit_exp.py --degree kDegree; 6 or 4), then 2ⁿ: on AVX-512 by vscalefps, which
// needs no exponent-field arithmetic, the lanes whose e^x is below float's normal range zeroed
// first (exactly 0 below about −87.33, −∞ included); elsewhere through the exponent field, exactly
// 0 below about −87.7. Accurate for x ≤ 88; +∞ or NaN give an unspecified value but never
// undefined behaviour.
template <int kDegree, class D>
HWY_INLINE hn::Vec<D> ReducedExp(D d, hn::Vec<D> x) {
  static_assert(kDegree == 6 || kDegree == 4, "fitted degrees: 6 and 4");
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // e^x below float's smallest normal number, 2⁻¹²⁶ = e^−87.336, is given as exactly 0 (those lanes
  // of p are zeroed before vscalefps): a subnormal result, or one that underflows, costs a
  // microcode assist of some hundred cycles on Intel's cores (a causal bf16 forward, whose masked
  // keys give e^−∞, ran 1.7x slower on Sapphire Rapids for it; AMD's cores take none). Their r
  // may be NaN (x = −∞), and so are NaN's lanes, zeroed too.
  const auto normal = hn::Ge(x, hn::Set(d, -87.33F));
  // n = nearest(x·log2 e) by adding 1.5·2²³ (the sum's float has unit steps) and subtracting it
  // back: exact for |x·log2 e| < 2²², and two instructions that any vector port runs where
  // vrndscaleps takes two micro-ops of port 0 on Intel's cores, beside vscalefps's one.
  const auto magic = hn::Set(d, 12582912.0F);  // 1.5·2²³
  const auto n_float = hn::Sub(hn::MulAdd(x, hn::Set(d, 1.44269504088896341F), magic), magic);
#else
  // n = nearest(x·log2 e) by adding 1.5·2²³ + 127: the sum's float has unit steps, so rounding it
  // rounds n, its low bits hold n + 127 (2ⁿ's biased exponent, shifted into place below) and
  // subtracting the constant back gives n exactly — two instructions fewer than converting.
  // x clamped at −88 gives n = −127, whose biased exponent 0 builds 2ⁿ as +0: every x below
  // about −87.7 (−∞ included) gives exactly 0 with no compare and mask (the constant first: x86's
  // max returns its second operand when one is NaN, so a NaN stays NaN).
  x = hn::Max(hn::Set(d, -88.0F), x);
  const auto magic = hn::Set(d, 12583039.0F);  // 1.5·2²³ + 127
  const auto n_biased = hn::MulAdd(x, hn::Set(d, 1.44269504088896341F), magic);
  const auto n_float = hn::Sub(n_biased, magic);
#endif
  // ln 2 in two parts, the first exact in few bits, so n·ln2_high is exact.
  auto r = hn::NegMulAdd(n_float, hn::Set(d, 0.693359375F), x);
  r = hn::NegMulAdd(n_float, hn::Set(d, -2.12194440e-4F), r);
  // q = e^r − 1 (the exponent-field path's 2ⁿ·(1 + q) then costs one multiply-add, one rounding,
  // instead of an add and a multiply), or e^r itself for vscalefps where that saves an add.
  hn::Vec<D> q;
  constexpr bool kScale = HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL;
  if constexpr (kDegree == 6) {
    // e^r ≈ 1 + r + r²·C(r), C of degree 4: as accurate in float32 as Cephes's degree-7
    // polynomial (7.6e−8 relative on [−87, 0]) with one multiply-add fewer. C by Estrin's scheme
    // (c0 + c1·r) + r²·((c2 + c3·r) + r²·c4): the multiply-adds of Horner's, 3 deep instead of 4,
    // so more exponentials overlap in the out-of-order window.
    const auto r2 = hn::Mul(r, r);
    const auto low = hn::MulAdd(hn::Set(d, 1.6666521132e-01F), r, hn::Set(d, 4.9999994040e-01F));
    const auto middle = hn::MulAdd(hn::Set(d, 8.3687072620e-03F), r, hn::Set(d, 4.1668388993e-02F));
    const auto high = hn::MulAdd(hn::Set(d, 1.3814597623e-03F), r2, middle);
    q = hn::MulAdd(hn::MulAdd(high, r2, low), r2, r);
  } else {
    // e^r ≈ 1 + r·(1 + r·(c2 + r·(c3 + r·c4))): 5.4e−6 relative, four multiply-adds.
    q = hn::MulAdd(hn::Set(d, 4.1277617216e-02F), r, hn::Set(d, 1.6753490269e-01F));
    q = hn::MulAdd(q, r, hn::Set(d, 5.0005114079e-01F));
    q = hn::MulAdd(q, r, hn::Set(d, 1.0F));
    q = kScale ? hn::MulAdd(q, r, hn::Set(d, 1.0F)) : hn::Mul(q, r);
  }
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  return ZeroedOrScaled(d, normal, kDegree == 6 ? hn::Add(q, hn::Set(d, 1.0F)) : q, n_float);
#else
  return OnePlusTimesPowerOfTwo(d, q, n_biased);
#endif
}

// exp(x) for x ≤ 0 or −∞: callers subtract the row's maximum (or log-sum-exp) first. It stays as
// accurate above 0 up to 88 (the backward passes' recomputed scores can exceed the forward pass's
// maximum by an ulp; additive scores' exponential form takes e^{2x} for |x| ≤ 21). Within about
// 1 ulp; vscalefps saves four instructions in the softmax's hottest loop on AVX-512.
template <class D>
HWY_INLINE hn::Vec<D> SoftmaxExp(D d, hn::Vec<D> x) {
  return ReducedExp<6>(d, x);
}

// exp(x) for probabilities that are rounded to bf16 next (the bf16 forward's P, 8 significant
// bits): degree 4, within 5.4e−6 relative — far below P's rounding (2⁻⁹), and the row sums and
// log-sum-exp built from it stay within 1e−5 — three instructions fewer than SoftmaxExp in the
// bf16 softmax's hottest loop (5–9% of the bf16 forward, Zen 5). A cubic (1.2e−4) saved one more
// but put that error into the log-sum-exp.
template <class D>
HWY_INLINE hn::Vec<D> RoundedProbabilityExp(D d, hn::Vec<D> x) {
  return ReducedExp<4>(d, x);
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// The AVX-512 targets reduce y = floor(y) + r with r ∈ [0, 1) in one instruction (vreduceps) and
// leave floor(y) to vscalefps, which takes it itself; the others round to nearest through the
// exponent field's constant, |r| ≤ 1/2. The polynomials below are fitted for each range.
constexpr bool kFloorReduction = true;

// y − floor(y) ∈ [0, 1), exact: vreduceps with no fraction bits kept, rounding down, and the
// precision exception suppressed (imm8 0x09).
template <class D>
HWY_INLINE hn::Vec<D> FractionAboveFloor(D d, hn::Vec<D> y) {
  if constexpr (hn::MaxLanes(d) == 16) {
    return hn::Vec<D>{_mm512_reduce_ps(y.raw, 0x09)};
  } else if constexpr (hn::MaxLanes(d) == 8) {
    return hn::Vec<D>{_mm256_reduce_ps(y.raw, 0x09)};
  } else {
    return hn::Vec<D>{_mm_reduce_ps(y.raw, 0x09)};
  }
}
#else
constexpr bool kFloorReduction = false;
#endif

// 2^r − 1 = r·P(r), P of degree kDegree − 1 fitted for the relative error of 2^r on the reduced
// range (kFloorReduction: r ∈ [0, 1), tools/fit_exp.py --base 2 --floor --degree kDegree;
// otherwise |r| ≤ 1/2, tools/fit_exp.py --base 2 --degree kDegree), by Horner: P(r), to be
// multiplied by r. The errors are of the whole 2^y evaluated in float32 on [−126, 0].
template <int kDegree, class D>
HWY_INLINE hn::Vec<D> TwoToReducedPolynomial(D d, hn::Vec<D> r) {
  static_assert(kDegree == 6 || kDegree == 5 || kDegree == 4, "fitted degrees: 6, 5 and 4");
  constexpr float kCoefficients[2][3][6] = {
      // |r| ≤ 1/2, lowest power first: degree 4 (2.9e−6 relative; RoundedProbabilityExp's 5.4e−6
      // carried the reduction's error), 5 (1.6e−7), 6 (7.7e−8, as SoftmaxExp)
      {{6.9312417507e-01F, 2.4024099112e-01F, 5.5906366557e-02F, 9.5828166232e-03F},
       {6.9314700365e-01F, 2.4022242427e-01F, 5.5507339537e-02F, 9.6715083346e-03F,
        1.3264698209e-03F},
       {6.9314718246e-01F, 2.4022647738e-01F, 5.5503323674e-02F, 9.6184378490e-03F,
        1.3398872688e-03F, 1.5353341587e-04F}},
      // r ∈ [0, 1): degree 4 (3.0e−6), 5 (1.4e−7), 6 (7.6e−8)
      {{6.9304484129e-01F, 2.4128006399e-01F, 5.2242763340e-02F, 1.3426504098e-02F},
       {6.9315129519e-01F, 2.4016445875e-01F, 5.5799894035e-02F, 9.0170586482e-03F,
        1.8671167782e-03F},
       {6.9314706326e-01F, 2.4022930861e-01F, 5.5485282093e-02F, 9.6754496917e-03F,
        1.2467865599e-03F, 2.1612839191e-04F}}};
  const float* c = kCoefficients[kFloorReduction ? 1 : 0][kDegree - 4];
  hn::Vec<D> p = hn::Set(d, c[kDegree - 1]);
  for (int power = kDegree - 2; power >= 0; --power) p = hn::MulAdd(p, r, hn::Set(d, c[power]));
  return p;
}

// 2^y for the forward's online softmax in base 2: its scores carry log2 e in their scale, so
// y = (score − running max) is the natural argument times log2 e and 2^y = e^x. The reduction
// y = n + r is exact where e^x's Cody–Waite needs two multiply-adds: on AVX-512 n = floor(y) and
// r ∈ [0, 1) in one vreduceps (n is vscalefps's business), elsewhere n = nearest(y) through the
// exponent field's constant (an add and a subtract) and r = y − n, |r| ≤ 1/2. 2^r = 1 + r·P(r)
// (TwoToReducedPolynomial). 2ⁿ as in ReducedExp: vscalefps on AVX-512 with the lanes below 2⁻¹²⁶
// zeroed first (no subnormal results, −∞ gives 0; a NaN stays NaN, vscalefps's result for a NaN
// power), elsewhere the exponent field, exactly 0 below −127.
template <int kDegree, class D>
HWY_INLINE hn::Vec<D> ReducedExp2(D d, hn::Vec<D> y) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // r = y − floor(y) in one operation where rounding through 1.5·2²³ and subtracting took three;
  // vscalefps multiplies by 2^floor(y) from y itself.
  const auto normal = hn::Ge(y, hn::Set(d, -126.0F));
  const auto r = FractionAboveFloor(d, y);
  const auto p = TwoToReducedPolynomial<kDegree>(d, r);
  return ZeroedOrScaled(d, normal, hn::MulAdd(p, r, hn::Set(d, 1.0F)), y);
#else
  y = hn::Max(hn::Set(d, -127.0F), y);         // the constant first: a NaN stays NaN
  const auto magic = hn::Set(d, 12583039.0F);  // 1.5·2²³ + 127: n's biased exponent in the low bits
  const auto n_biased = hn::Add(y, magic);
  const auto r = hn::Sub(y, hn::Sub(n_biased, magic));  // exact: |r| ≤ 1/2
  const auto p = TwoToReducedPolynomial<kDegree>(d, r);
  return OnePlusTimesPowerOfTwo(d, hn::Mul(p, r), n_biased);  // q = 2^r − 1
#endif
}

#if !(HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
// The largest integer shift whose subtraction ShiftedExp2 folds into its constants: 1.5·2²³ + 127
// − shift and shift − 127 must be floats with unit steps, integers below 2²⁴ in magnitude, which
// holds for shifts from about −4.19e6 up; 2²¹ keeps a margin on both sides.
constexpr float kMaxFoldedShift = 2097152.0F;  // 2²¹

// What ShiftedExp2 needs of a shift: the floor below which 2^(x − shift) is 0, and the rounding
// constant with the shift subtracted.
template <class D>
struct FoldedShift {
  hn::Vec<D> lowest;  // shift − 127
  hn::Vec<D> magic;   // 1.5·2²³ + 127 − shift
};

template <class D>
HWY_INLINE FoldedShift<D> FoldShift(D d, hn::Vec<D> shift) {
  return {hn::Sub(shift, hn::Set(d, 127.0F)), hn::Sub(hn::Set(d, 12583039.0F), shift)};
}

// 2^(x − shift) for an integer shift with |shift| ≤ kMaxFoldedShift (FoldShift), as
// ReducedExp2(x − shift) computes it without the subtraction: n_biased = x + (magic − shift) rounds
// to c + nearest(x) for the integer c = magic − shift, so its low bits hold the biased exponent of
// 2^(nearest(x) − shift), and r = x − nearest(x) is exact. One operation fewer per score on the
// exponent-field targets (AVX2 and below), where every operation of the softmax counts (Zen 1: a
// 256-bit operation is two 128-bit ones). x is clamped at shift − 127 (n = −127: exactly 0, −∞
// included); a NaN stays NaN.
template <int kDegree, class D>
HWY_INLINE hn::Vec<D> ShiftedExp2(D d, hn::Vec<D> x, const FoldedShift<D>& shift) {
  x = hn::Max(shift.lowest, x);
  const auto n_biased = hn::Add(x, shift.magic);
  const auto r = hn::Sub(x, hn::Sub(n_biased, shift.magic));  // exact: |r| ≤ 1/2
  return OnePlusTimesPowerOfTwo(d, hn::Mul(TwoToReducedPolynomial<kDegree>(d, r), r), n_biased);
}

// The fp32 forward's P = 2^(S − shift) on these targets: degree 5, 1.6e−7 relative (about 1.4 ulp;
// tools/fit_exp.py --base 2 --degree 5), one multiply-add fewer than SoftmaxExp2's degree 6
// (7.7e−8) and far inside the forward's 1e−5.
template <class D>
HWY_INLINE hn::Vec<D> SoftmaxShiftedExp2(D d, hn::Vec<D> x, const FoldedShift<D>& shift) {
  return ShiftedExp2<5>(d, x, shift);
}
#endif

// SoftmaxExp in base 2, within about 1 ulp: the fp32 forward's rescale factors 2^(old − new max).
template <class D>
HWY_INLINE hn::Vec<D> SoftmaxExp2(D d, hn::Vec<D> y) {
  return ReducedExp2<6>(d, y);
}

// The fp32 P in base 2: the forward's P = 2^(S − max) on the AVX-512 targets (the exponent-field
// targets take ShiftedExp2<5>, the same polynomial) and the backward's recomputed P = 2^(S − lse):
// degree 5, 1.6e−7 relative, an exact reduction in place of SoftmaxExp's Cody–Waite multiply-adds
// and one polynomial term fewer than SoftmaxExp2 (the forward's softmax samples against its
// products' 0.153 → 0.137, Emerald Rapids, 2026-12-02). Its argument may exceed 0 by some ulps
// (recomputed scores against the forward's log-sum-exp): accurate there too.
template <class D>
HWY_INLINE hn::Vec<D> ProbabilityExp2(D d, hn::Vec<D> y) {
  return ReducedExp2<5>(d, y);
}

// RoundedProbabilityExp in base 2 (the bf16 forward's P, rounded to bf16 next).
template <class D>
HWY_INLINE hn::Vec<D> RoundedProbabilityExp2(D d, hn::Vec<D> y) {
  return ReducedExp2<4>(d, y);
}

// tanh(x) for additive attention's features, about twice as fast as hwy::Tanh (an expm1 and a
// division): x·P(x²)/Q(x²) with P, Q of degree 4 fitted on [0, 9] by tools/fit_tanh.py, within
// 3.5e−7 relative of tanh in float32 (tests/kernels/fast_math_test.cpp); beyond ±9 the value at
// ±9, within 3e−7 of ±1. Q ≥ 1, so its reciprocal comes from the hardware estimate and one Newton
// step. Finite inputs only (the kernels check theirs).
template <class D>
HWY_INLINE hn::Vec<D> AdditiveTanh(D d, hn::Vec<D> x) {
  const auto limit = hn::Set(d, 9.0F);
  x = hn::Min(hn::Max(x, hn::Neg(limit)), limit);
  const auto z = hn::Mul(x, x);
  auto p = hn::Set(d, 1.335422084e-08F);
  p = hn::MulAdd(p, z, hn::Set(d, 2.060861152e-05F));
  p = hn::MulAdd(p, z, hn::Set(d, 3.495553043e-03F));
  p = hn::MulAdd(p, z, hn::Set(d, 1.338099390e-01F));
  p = hn::MulAdd(p, z, hn::Set(d, 1.0F));
  auto q = hn::Set(d, 7.776332609e-07F);
  q = hn::MulAdd(q, z, hn::Set(d, 3.285582061e-04F));
  q = hn::MulAdd(q, z, hn::Set(d, 2.587684244e-02F));
  q = hn::MulAdd(q, z, hn::Set(d, 4.671430886e-01F));
  q = hn::MulAdd(q, z, hn::Set(d, 1.0F));
  auto reciprocal = hn::ApproximateReciprocal(q);
  reciprocal = hn::Mul(reciprocal, hn::NegMulAdd(q, reciprocal, hn::Set(d, 2.0F)));
  return hn::Mul(hn::Mul(x, p), reciprocal);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_FAST_MATH_INL_H_
