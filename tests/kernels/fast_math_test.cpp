// The fused kernels' exponentials and tanh (src/kernels/fast_math-inl.h) against double precision,
// on every SIMD target this machine runs: relative error over dense sweeps, exact values at 0, far
// below −87 and at −∞.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/kernels/fast_math_test.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers must follow foreach_target.h.
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include "kernels/fast_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// out[i] = SoftmaxExp(in[i]) for count values, a multiple of the widest vector (16 floats).
void EvaluateSoftmaxExp(const float* in, float* out, size_t count) {
  const hn::ScalableTag<float> d;
  for (size_t i = 0; i < count; i += hn::Lanes(d))
    hn::StoreU(SoftmaxExp(d, hn::LoadU(d, in + i)), d, out + i);
}

// The same for SoftmaxExp2.
void EvaluateSoftmaxExp2(const float* in, float* out, size_t count) {
  const hn::ScalableTag<float> d;
  for (size_t i = 0; i < count; i += hn::Lanes(d))
    hn::StoreU(SoftmaxExp2(d, hn::LoadU(d, in + i)), d, out + i);
}

// out[i] = SoftmaxShiftedExp2(in[i]) with the shift folded, for count values: on the exponent-field
// targets (true); AVX-512's have no such function (false, out untouched).
bool EvaluateSoftmaxShiftedExp2(const float* in, float shift, float* out, size_t count) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)in, (void)shift, (void)out, (void)count;
  return false;
#else
  const hn::ScalableTag<float> d;
  const FoldedShift<hn::ScalableTag<float>> folded = FoldShift(d, hn::Set(d, shift));
  for (size_t i = 0; i < count; i += hn::Lanes(d))
    hn::StoreU(SoftmaxShiftedExp2(d, hn::LoadU(d, in + i), folded), d, out + i);
  return true;
#endif
}

// The same for ProbabilityExp2.
void EvaluateProbabilityExp2(const float* in, float* out, size_t count) {
  const hn::ScalableTag<float> d;
  for (size_t i = 0; i < count; i += hn::Lanes(d))
    hn::StoreU(ProbabilityExp2(d, hn::LoadU(d, in + i)), d, out + i);
}

// The same for RoundedProbabilityExp2.
void EvaluateRoundedProbabilityExp2(const float* in, float* out, size_t count) {
  const hn::ScalableTag<float> d;
  for (size_t i = 0; i < count; i += hn::Lanes(d))
    hn::StoreU(RoundedProbabilityExp2(d, hn::LoadU(d, in + i)), d, out + i);
}

// The same for RoundedProbabilityExp.
void EvaluateRoundedProbabilityExp(const float* in, float* out, size_t count) {
  const hn::ScalableTag<float> d;
  for (size_t i = 0; i < count; i += hn::Lanes(d))
    hn::StoreU(RoundedProbabilityExp(d, hn::LoadU(d, in + i)), d, out + i);
}

// The same for AdditiveTanh.
void EvaluateAdditiveTanh(const float* in, float* out, size_t count) {
  const hn::ScalableTag<float> d;
  for (size_t i = 0; i < count; i += hn::Lanes(d))
    hn::StoreU(AdditiveTanh(d, hn::LoadU(d, in + i)), d, out + i);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include "every_simd_target.hpp"

#include <cmath>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

namespace attn {
HWY_EXPORT(EvaluateSoftmaxExp);
HWY_EXPORT(EvaluateAdditiveTanh);
HWY_EXPORT(EvaluateRoundedProbabilityExp);
HWY_EXPORT(EvaluateSoftmaxExp2);
HWY_EXPORT(EvaluateRoundedProbabilityExp2);
HWY_EXPORT(EvaluateSoftmaxShiftedExp2);
HWY_EXPORT(EvaluateProbabilityExp2);
namespace {

std::vector<float> softmax_exp(std::vector<float> inputs) {
  inputs.resize((inputs.size() + 15) / 16 * 16, 0.0F);
  std::vector<float> outputs(inputs.size());
  HWY_DYNAMIC_DISPATCH(EvaluateSoftmaxExp)(inputs.data(), outputs.data(), inputs.size());
  return outputs;
}

std::vector<float> softmax_exp2(std::vector<float> inputs) {
  inputs.resize((inputs.size() + 15) / 16 * 16, 0.0F);
  std::vector<float> outputs(inputs.size());
  HWY_DYNAMIC_DISPATCH(EvaluateSoftmaxExp2)(inputs.data(), outputs.data(), inputs.size());
  return outputs;
}

// SoftmaxShiftedExp2(inputs − shift), or nothing on a target without it.
std::optional<std::vector<float>> softmax_shifted_exp2(std::vector<float> inputs, float shift) {
  inputs.resize((inputs.size() + 15) / 16 * 16, 0.0F);
  std::vector<float> outputs(inputs.size());
  if (!HWY_DYNAMIC_DISPATCH(EvaluateSoftmaxShiftedExp2)(inputs.data(), shift, outputs.data(),
                                                        inputs.size()))
    return std::nullopt;
  return outputs;
}

std::vector<float> probability_exp2(std::vector<float> inputs) {
  inputs.resize((inputs.size() + 15) / 16 * 16, 0.0F);
  std::vector<float> outputs(inputs.size());
  HWY_DYNAMIC_DISPATCH(EvaluateProbabilityExp2)
  (inputs.data(), outputs.data(), inputs.size());
  return outputs;
}

std::vector<float> rounded_probability_exp2(std::vector<float> inputs) {
  inputs.resize((inputs.size() + 15) / 16 * 16, 0.0F);
  std::vector<float> outputs(inputs.size());
  HWY_DYNAMIC_DISPATCH(EvaluateRoundedProbabilityExp2)
  (inputs.data(), outputs.data(), inputs.size());
  return outputs;
}

std::vector<float> rounded_probability_exp(std::vector<float> inputs) {
  inputs.resize((inputs.size() + 15) / 16 * 16, 0.0F);
  std::vector<float> outputs(inputs.size());
  HWY_DYNAMIC_DISPATCH(EvaluateRoundedProbabilityExp)(inputs.data(), outputs.data(), inputs.size());
  return outputs;
}

// The largest relative error of `exponential` (one of the functions above) against `truth`, in
// double, over `inputs`.
double worst_relative_error(std::vector<float> (*exponential)(std::vector<float>),
                            double (*truth)(double), const std::vector<float>& inputs) {
  const std::vector<float> outputs = exponential(inputs);
  double worst = 0.0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const double expected = truth(static_cast<double>(inputs[i]));
    worst = std::max(worst, std::abs(outputs[i] - expected) / expected);
  }
  return worst;
}

// The same against double 2^y for a base-2 exponential, over y from −126 to 8 in steps of about
// 0.001 and tiny negative arguments.
double worst_relative_to_exp2(std::vector<float> (*exponential)(std::vector<float>)) {
  std::vector<float> inputs;
  for (double y = -126.0; y <= 8.0; y += 0.000917) inputs.push_back(static_cast<float>(y));
  for (float y = -1e-3F; y < 0.0F; y *= 0.5F) inputs.push_back(y);
  return worst_relative_error(
      exponential, [](double y) { return std::exp2(y); }, inputs);
}

std::vector<float> additive_tanh(std::vector<float> inputs) {
  inputs.resize((inputs.size() + 15) / 16 * 16, 0.0F);
  std::vector<float> outputs(inputs.size());
  HWY_DYNAMIC_DISPATCH(EvaluateAdditiveTanh)(inputs.data(), outputs.data(), inputs.size());
  return outputs;
}

class FastMath : public testing::EverySimdTarget {};

// The largest relative error of SoftmaxExp against double exp over `inputs`.
double worst_exp_error(const std::vector<float>& inputs) {
  return worst_relative_error(
      softmax_exp, [](double x) { return std::exp(x); }, inputs);
}

// The fitted polynomial after a two-part ln 2 reduction is within about 1 ulp (2^−24 ≈ 6e−8
// relative) of the true value on normal results; 2e−7 allows the few ulps that the reduction and
// the final product add, and fails for a wrong coefficient or constant by orders of magnitude.
TEST_P(FastMath, SoftmaxExpWithinAFewUlpsOfDoubleExpDownToMinus87) {
  std::vector<float> inputs;
  for (double x = -87.0; x <= 0.0; x += 0.000731) inputs.push_back(static_cast<float>(x));
  for (float x = -1e-3F; x < 0.0F; x *= 0.5F) inputs.push_back(x);  // tiny arguments
  inputs.push_back(1e-6F);  // the backward passes' recomputed scores may exceed the max by an ulp
  EXPECT_LT(worst_exp_error(inputs), 2e-7) << "target " << hwy::TargetName(GetParam());
}

// Additive scores' exponential form takes e^{2x} for |x| ≤ 10.5 (kAdditiveExponentialLimit; 21
// before two terms shared a reciprocal): the same accuracy on (0, 42], where 2ⁿ grows to 2⁶¹.
TEST_P(FastMath, SoftmaxExpWithinAFewUlpsOfDoubleExpUpTo42) {
  std::vector<float> inputs;
  for (double x = 0.0; x <= 42.0; x += 0.000371) inputs.push_back(static_cast<float>(x));
  EXPECT_LT(worst_exp_error(inputs), 2e-7) << "target " << hwy::TargetName(GetParam());
}

// Below −87.3 the result leaves float's normal range: at most e^x's own value plus a subnormal
// step between −87.33 and −87.7 (the exponent field's 2ⁿ is still normal there), and exactly 0
// from −88 on and at −∞ on every target, so a masked key never contributes — and never as a
// subnormal, whose making costs Intel's cores a microcode assist per vector (AVX-512's vscalefps
// rounded e^x to a subnormal down to −104 before its lanes were zeroed).
TEST_P(FastMath, SoftmaxExpExactAtZeroAndZeroFarBelowAndAtMinusInfinity) {
  const float infinity = std::numeric_limits<float>::infinity();
  const std::vector<float> outputs = softmax_exp(
      {0.0F, -0.0F, -87.5F, -88.0F, -90.0F, -100.0F, -104.0F, -150.0F, -1e30F, -infinity});
  EXPECT_EQ(outputs[0], 1.0F);
  EXPECT_EQ(outputs[1], 1.0F);
  const float subnormal_step = std::numeric_limits<float>::denorm_min();
  EXPECT_LE(outputs[2], std::exp(-87.5F) + subnormal_step);
  EXPECT_GE(outputs[2], 0.0F);
  for (size_t i = 3; i < 10; ++i) EXPECT_EQ(outputs[i], 0.0F) << i;
}

// tools/fit_exp.py --base 2: the reduction is exact, so the float32 Horner evaluation alone, 7.9e−8
// relative on [−126, 0] (about 1 ulp; 7.6e−8 for AVX-512's r ∈ [0, 1), --floor); 2e−7 as for
// SoftmaxExp. Up to 8 above 0 as well (the forward's arguments never exceed 0; the same accuracy
// holds there).
TEST_P(FastMath, SoftmaxExp2WithinAFewUlpsOfDoubleExp2DownToMinus126) {
  EXPECT_LT(worst_relative_to_exp2(softmax_exp2), 2e-7) << "target " << hwy::TargetName(GetParam());
}

// The forward's 2^(x − shift) on the exponent-field targets, the integer shift folded into the
// reduction's constants: tools/fit_exp.py --base 2 --degree 5 gives 1.64e−7 relative in float32
// (the folded reduction is exact, so it adds nothing); 2.5e−7 fails a wrong coefficient or a
// rounding constant off by one by far. Shifts up to the largest folded (2²¹), as the kernel's
// running maxima; exactly 1 at the shift, 0 from 127 below it and at −∞; NaN stays NaN on x86.
TEST_P(FastMath, SoftmaxShiftedExp2WithinAFewUlpsOfDoubleExp2ForEveryFoldedShift) {
  const float infinity = std::numeric_limits<float>::infinity();
  for (const float shift :
       {0.0F, 1.0F, -3.0F, 17.0F, -1000.0F, 65536.0F, 2097152.0F, -2097152.0F}) {
    std::vector<float> inputs;
    for (double y = -126.0; y <= 0.0; y += 0.000917)
      inputs.push_back(static_cast<float>(shift + y));
    const auto outputs = softmax_shifted_exp2(inputs, shift);
    if (!outputs) GTEST_SKIP() << "AVX-512 targets use SoftmaxExp2 (vscalefps), no folded shift";
    double worst = 0.0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const double truth = std::exp2(static_cast<double>(inputs[i]) - shift);
      if (truth < 0x1p-126) continue;  // the exponent field's subnormal step, as SoftmaxExp2
      worst = std::max(worst, std::abs((*outputs)[i] - truth) / truth);
    }
    EXPECT_LT(worst, 2.5e-7) << "shift " << shift << ", target " << hwy::TargetName(GetParam());
    const std::vector<float> exact =
        *softmax_shifted_exp2({shift, shift - 127.0F, shift - 400.0F, -1e30F, -infinity,
                               std::numeric_limits<float>::quiet_NaN()},
                              shift);
    EXPECT_EQ(exact[0], 1.0F) << shift;
    for (size_t i = 1; i < 5; ++i) EXPECT_EQ(exact[i], 0.0F) << "shift " << shift << ", " << i;
    // x86's max returns its second operand when one is NaN (SCALAR's emulation has no such rule).
    if (GetParam() != HWY_SCALAR) {
      EXPECT_TRUE(std::isnan(exact[5])) << shift;
    }
  }
}

// The fp32 backward's P = 2^(S − lse): tools/fit_exp.py --base 2 --degree 5 gives 1.64e−7 relative
// in float32 (1.43e−7 with AVX-512's --floor; the reduction is exact); 2.5e−7 fails a wrong
// coefficient by far (degree 4 in its place reads 2.9e−6). Up to 8 above 0: recomputed scores may
// pass the forward's log-sum-exp by some ulps, and a row's lone key gives 2⁰ = 1 exactly; 0 from
// −127 on and at −∞ (masked keys); a NaN stays NaN: x86's max keeps it on the exponent-field
// targets, and on AVX-512 vscalefps returns NaN for a NaN power though the lane was zeroed first
// (an expectation of 0 there, written without an AVX-512 machine, failed on Zen 4).
TEST_P(FastMath, ProbabilityExp2WithinAFewUlpsOfDoubleExp2) {
  EXPECT_LT(worst_relative_to_exp2(probability_exp2), 2.5e-7)
      << "target " << hwy::TargetName(GetParam());
  const float infinity = std::numeric_limits<float>::infinity();
  const std::vector<float> exact = probability_exp2(
      {0.0F, -0.0F, -127.0F, -150.0F, -1e30F, -infinity, std::numeric_limits<float>::quiet_NaN()});
  EXPECT_EQ(exact[0], 1.0F);
  EXPECT_EQ(exact[1], 1.0F);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(exact[i], 0.0F) << i;
  if (GetParam() != HWY_SCALAR) {
    EXPECT_TRUE(std::isnan(exact[6]));
  }
}

// tools/fit_exp.py --base 2 --degree 4: 2.87e−6 relative in float32, 2.97e−6 with AVX-512's --floor
// (the reduction adds nothing); 3.5e−6 fails a wrong coefficient by far. Arguments up to 8: the
// bf16 path's lazy step.
TEST_P(FastMath, RoundedProbabilityExp2WithinThreeAndAHalfMillionths) {
  EXPECT_LT(worst_relative_to_exp2(rounded_probability_exp2), 3.5e-6)
      << "target " << hwy::TargetName(GetParam());
  const float infinity = std::numeric_limits<float>::infinity();
  const std::vector<float> exact = rounded_probability_exp2({0.0F, -0.0F, -150.0F, -infinity});
  EXPECT_EQ(exact[0], 1.0F);
  EXPECT_EQ(exact[1], 1.0F);
  EXPECT_EQ(exact[2], 0.0F);
  EXPECT_EQ(exact[3], 0.0F);
}

// 1 at 0; below 2⁻¹²⁶ at most 2^y plus a subnormal step (the exponent field's 2ⁿ, between −127 and
// −126 off AVX-512) and exactly 0 from −127 on and at −∞, as SoftmaxExp.
TEST_P(FastMath, SoftmaxExp2ExactAtZeroAndZeroFarBelowAndAtMinusInfinity) {
  const float infinity = std::numeric_limits<float>::infinity();
  const std::vector<float> outputs =
      softmax_exp2({0.0F, -0.0F, -126.5F, -127.0F, -130.0F, -150.0F, -1e30F, -infinity});
  EXPECT_EQ(outputs[0], 1.0F);
  EXPECT_EQ(outputs[1], 1.0F);
  EXPECT_LE(outputs[2], std::exp2(-126.5F) + std::numeric_limits<float>::denorm_min());
  EXPECT_GE(outputs[2], 0.0F);
  for (size_t i = 3; i < 8; ++i) EXPECT_EQ(outputs[i], 0.0F) << i;
}

// Neither exponential makes a subnormal number on AVX-512 (its lanes below e^−87.33 are zeroed
// before vscalefps), and elsewhere only between −87.7 and −87.33, where the exponent field's 2ⁿ is
// still normal: making a subnormal costs Intel's cores a microcode assist per vector, and a causal
// tile's masked keys (e^−∞ after the mask, x far below −87 for keys far below the maximum) made
// them by the thousand.
TEST_P(FastMath, ExponentialsMakeNoSubnormals) {
  std::vector<float> inputs;
  for (double x = -110.0; x <= -80.0; x += 0.00037) inputs.push_back(static_cast<float>(x));
  const bool avx512 = GetParam() == HWY_AVX3 || GetParam() == HWY_AVX3_DL;
  const auto check = [&](const std::vector<float>& outputs, const char* name) {
    size_t subnormals = 0, first = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!avx512 && inputs[i] > -87.71F && inputs[i] < -87.33F) continue;
      if (outputs[i] != 0.0F && outputs[i] < std::numeric_limits<float>::min()) {
        if (subnormals++ == 0) first = i;
      }
    }
    EXPECT_EQ(subnormals, 0U) << name << "(" << inputs[first] << ") = " << outputs[first]
                              << " among others, target " << hwy::TargetName(GetParam());
  };
  check(softmax_exp(inputs), "SoftmaxExp");
  check(rounded_probability_exp(inputs), "RoundedProbabilityExp");
  // SoftmaxExp2 the same over its base-2 arguments, −127 to −126 where e^x had −87.71 to −87.33.
  std::vector<float> base_two;
  for (double y = -160.0; y <= -115.0; y += 0.00053) base_two.push_back(static_cast<float>(y));
  for (const auto& [name, outputs] :
       {std::pair{"SoftmaxExp2", softmax_exp2(base_two)},
        std::pair{"ProbabilityExp2", probability_exp2(base_two)},
        std::pair{"RoundedProbabilityExp2", rounded_probability_exp2(base_two)}}) {
    size_t subnormals = 0;
    for (size_t i = 0; i < base_two.size(); ++i) {
      if (!avx512 && base_two[i] > -127.01F && base_two[i] < -125.99F) continue;
      if (outputs[i] != 0.0F && outputs[i] < std::numeric_limits<float>::min()) ++subnormals;
    }
    EXPECT_EQ(subnormals, 0U) << name << ", target " << hwy::TargetName(GetParam());
  }
}

// tools/fit_exp.py --degree 4: within 5.38e−6 relative in float32; 6e−6 leaves room for the
// reduction's rounding only (a wrong coefficient fails by far). Arguments up to 8: the bf16 path's
// lazy step exponentiates scores up to kLazyMaxMargin above the running maximum.
TEST_P(FastMath, RoundedProbabilityExpWithinSixMillionths) {
  std::vector<float> inputs;
  for (double x = -87.0; x <= 8.0; x += 0.000731) inputs.push_back(static_cast<float>(x));
  for (float x = -1e-3F; x < 0.0F; x *= 0.5F) inputs.push_back(x);
  EXPECT_LT(worst_relative_error(
                rounded_probability_exp, [](double x) { return std::exp(x); }, inputs),
            6e-6)
      << "target " << hwy::TargetName(GetParam());
}

// 1 at 0 (the row's maximum), and masked keys (−∞, far below) give exactly 0.
TEST_P(FastMath, RoundedProbabilityExpExactAtZeroAndMinusInfinity) {
  const float infinity = std::numeric_limits<float>::infinity();
  const std::vector<float> outputs = rounded_probability_exp({0.0F, -0.0F, -150.0F, -infinity});
  EXPECT_EQ(outputs[0], 1.0F);
  EXPECT_EQ(outputs[1], 1.0F);
  EXPECT_EQ(outputs[2], 0.0F);
  EXPECT_EQ(outputs[3], 0.0F);
}

// tools/fit_tanh.py's fit is within 3.5e−7 relative in float32 Horner arithmetic; the reciprocal
// estimate after one Newton step adds at most an ulp or two (12-bit estimates on SSE and AVX2), so
// 6e−7 holds on every target and fails for any wrong coefficient.
TEST_P(FastMath, AdditiveTanhWithinSixTenthsOfAMillionthOfDoubleTanh) {
  std::vector<float> inputs;
  for (double x = -20.0; x <= 20.0; x += 0.000377) inputs.push_back(static_cast<float>(x));
  for (float x = 1e-3F; x > 1e-30F; x *= 0.5F) inputs.push_back(x);  // tanh(x) ≈ x
  const std::vector<float> outputs = additive_tanh(inputs);
  double worst = 0.0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] == 0.0F) continue;
    const double truth = std::tanh(static_cast<double>(inputs[i]));
    worst = std::max(worst, std::abs(outputs[i] - truth) / std::abs(truth));
  }
  EXPECT_LT(worst, 6e-7) << "target " << hwy::TargetName(GetParam());
}

TEST_P(FastMath, AdditiveTanhIsOddAndExactAtZero) {
  const std::vector<float> outputs = additive_tanh({0.0F, 0.3F, -0.3F, 5.0F, -5.0F, 1e6F, -1e6F});
  EXPECT_EQ(outputs[0], 0.0F);
  EXPECT_EQ(outputs[1], -outputs[2]);
  EXPECT_EQ(outputs[3], -outputs[4]);
  EXPECT_NEAR(outputs[5], 1.0, 4e-7);
  EXPECT_EQ(outputs[5], -outputs[6]);
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(FastMath);

}  // namespace
}  // namespace attn
#endif  // HWY_ONCE
