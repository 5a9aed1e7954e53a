#!/usr/bin/env python3
# Derives the polynomial of SoftmaxExp (src/kernels/fast_math-inl.h): e^r ≈ 1 + r + r²·C(r) on
# |r| ≤ ln2/2, the range left after the Cody–Waite reduction x = n·ln2 + r, with C of degree
# DEGREE − 2 fitted for the smallest maximum relative error by iteratively reweighted least
# squares, then checked in float32 Horner arithmetic, reduction included, as the kernel evaluates
# it.
# --degree 4 gives RoundedProbabilityExp's quartic (the bf16 forward's P, rounded to bf16 next).
# --base 2 fits SoftmaxExp2 instead: 2^r ≈ 1 + r·P(r) on |r| ≤ 1/2 (the exact reduction y = n + r),
# P of degree DEGREE − 1, checked in float32 Horner arithmetic as that kernel evaluates it; with
# --floor on r ∈ [0, 1) (y = floor(y) + r: the AVX-512 targets' vreduceps and vscalefps).
"""Fit and check the fused kernels' exponential polynomials. Needs numpy."""
import argparse

import numpy as np

DEGREE = 6  # degree 7 (Cephes's expf) is no more accurate in float32; 5 is 2.3x less accurate
HALF_LN2 = np.log(2.0) / 2


def fit(degree=DEGREE):
    r = np.linspace(-HALF_LN2, HALF_LN2, 20001)
    f = np.exp(r)
    powers = r[:, None] ** 2 * r[:, None] ** np.arange(degree - 1)
    weights = np.ones_like(r)
    for _ in range(80):
        c, *_ = np.linalg.lstsq(powers * (weights / f)[:, None], (f - 1 - r) * weights / f,
                                rcond=None)
        relative = np.abs(1 + r + powers @ c - f) / f
        weights = weights * (1 + 20 * relative / relative.max())  # push down the worst points
    return c.astype(np.float32), relative.max()


def float32_exp(c, x):
    """SoftmaxExp's arithmetic in float32: reduction by ln2 in two parts, Horner, 2^n exact."""
    x = x.astype(np.float32)
    n = np.rint(x * np.float32(1.44269504088896341)).astype(np.float32)
    r = np.float32(x - n * np.float32(0.693359375))
    r = np.float32(r - n * np.float32(-2.12194440e-4))
    p = c[-1]
    for coefficient in c[-2::-1]:
        p = np.float32(p * r + coefficient)
    p = np.float32(np.float32(p * np.float32(r * r) + r) + np.float32(1.0))
    return p.astype(np.float64) * np.exp2(n.astype(np.float64))


def fit_base_two(degree=DEGREE, low=-0.5):
    """2^r − 1 ≈ r·P(r) on [low, low + 1] (|r| ≤ 1/2 by default), P's coefficients lowest first,
    for the smallest maximum relative error of 2^r (reweighted least squares, as fit)."""
    r = np.linspace(low, low + 1.0, 20001)
    f = np.exp2(r)
    powers = r[:, None] ** np.arange(1, degree + 1)
    weights = np.ones_like(r)
    for _ in range(100):
        c, *_ = np.linalg.lstsq(powers * (weights / f)[:, None], (f - 1) * weights / f, rcond=None)
        relative = np.abs(1 + powers @ c - f) / f
        weights = weights * (1 + 20 * relative / relative.max())
    return c.astype(np.float32), relative.max()


def float32_two_to(c, n, r):
    """2^(n + r) as the kernels finish it: 1 + r·P(r) by Horner with one rounding per multiply-add
    (computed in double, rounded to float32), times 2^n exactly."""
    p = np.full_like(r, c[-1])
    for coefficient in c[-2::-1]:
        p = (p.astype(np.float64) * r + np.float64(coefficient)).astype(np.float32)
    p = (p.astype(np.float64) * r + 1.0).astype(np.float32)
    return p.astype(np.float64) * np.exp2(n.astype(np.float64))


def float32_exp2(c, y):
    """SoftmaxExp2's arithmetic off AVX-512: n = nearest(y) through 1.5·2²³, r = y − n exact."""
    y = y.astype(np.float32)
    magic = np.float32(12582912.0)
    n = ((y + magic).astype(np.float32) - magic).astype(np.float32)
    return float32_two_to(c, n, (y - n).astype(np.float32))


def float32_exp2_floor(c, y):
    """The AVX-512 targets' arithmetic: r = y − floor(y) ∈ [0, 1) exact (vreduceps), 2^floor(y)
    by vscalefps."""
    y = y.astype(np.float32)
    n = np.floor(y).astype(np.float32)
    return float32_two_to(c, n, (y - n).astype(np.float32))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--degree", type=int, default=DEGREE, help="degree of the polynomial")
    parser.add_argument("--base", type=int, choices=(2,), help="fit 2^r (SoftmaxExp2) instead")
    parser.add_argument("--floor", action="store_true",
                        help="with --base 2: r = y − floor(y) in [0, 1), the AVX-512 reduction")
    arguments = parser.parse_args()
    DEGREE = arguments.degree
    if arguments.base == 2:  # the range of its arguments, their function, the fit, its evaluation
        low, function, (coefficients, fitted), evaluate = (
            -126.0, np.exp2, fit_base_two(DEGREE, 0.0 if arguments.floor else -0.5),
            float32_exp2_floor if arguments.floor else float32_exp2)
        name, first = f"base 2{', r in [0, 1)' if arguments.floor else ''}, degree {DEGREE}", "r"
    else:
        low, function, (coefficients, fitted), evaluate = -87.0, np.exp, fit(DEGREE), float32_exp
        name, first = f"degree {DEGREE}", "r^2"
    x = np.arange(low, 0.0, 0.000731).astype(np.float32)
    truth = function(x.astype(np.float64))
    worst = np.max(np.abs(evaluate(coefficients, x) - truth) / truth)
    print(f"{name}: fitted max relative error {fitted:.3g}, "
          f"float32 evaluation on [{low:g}, 0] {worst:.3g}")
    print(f"coefficients of {first} ... r^{DEGREE}:",
          ", ".join(f"{v:.10e}F" for v in coefficients))
