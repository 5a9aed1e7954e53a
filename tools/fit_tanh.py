#!/usr/bin/env python3
# Derives the constants of src/kernels/additive_tanh-inl.h: a rational approximation
# tanh(x) ≈ x·P(x²)/Q(x²) with P and Q of degree 4 on [0, 9], fitted for the smallest maximum
# relative error by iteratively reweighted linear least squares (Loeb's linearisation), then
# checked in float32 Horner arithmetic as the kernel evaluates it.
"""Fit and check the fused additive kernels' tanh approximation. Needs numpy."""
import numpy as np

LIMIT = 9.0  # tanh(9) = 1 − 3e−8: beyond it float32 tanh is 1 within half an ulp
DEGREE = 4


def fit():
    x = np.concatenate([np.linspace(1e-6, 1.0, 4000), np.linspace(1.0, LIMIT, 6000)])
    f = np.tanh(x)
    z = x * x
    weights = 1.0 / f
    q_values = np.ones_like(x)
    for _ in range(60):
        # x·P(z) − f·(Q(z) − 1) = f, with Q's constant term fixed at 1.
        a = np.concatenate([x[:, None] * z[:, None] ** np.arange(DEGREE + 1),
                            -f[:, None] * z[:, None] ** np.arange(1, DEGREE + 1)], axis=1)
        row_weights = weights / q_values
        coefficients, *_ = np.linalg.lstsq(a * row_weights[:, None], f * row_weights, rcond=None)
        p = coefficients[:DEGREE + 1]
        q = np.concatenate([[1.0], coefficients[DEGREE + 1:]])
        q_values = np.polyval(q[::-1], z)
        relative = np.abs(x * np.polyval(p[::-1], z) / q_values - f) / f
        weights = weights * (1 + 50 * relative / relative.max())  # push down the worst points
    return p.astype(np.float32), q.astype(np.float32)


def check(p, q):
    x = np.linspace(1e-7, LIMIT, 2_000_001).astype(np.float32)
    z = x * x
    numerator = np.zeros_like(x)
    denominator = np.zeros_like(x)
    for c in p[::-1]:
        numerator = numerator * z + c
    for c in q[::-1]:
        denominator = denominator * z + c
    approximation = x * numerator / denominator
    truth = np.tanh(x.astype(np.float64))
    return np.max(np.abs(approximation - truth) / truth)


def main():
    p, q = fit()
    assert np.all(q > 0), "Q must have no real root (all coefficients positive)"
    print("P:", ", ".join(f"{c:.9e}F" for c in p))
    print("Q:", ", ".join(f"{c:.9e}F" for c in q))
    print(f"max relative error in float32 on (0, {LIMIT}]: {check(p, q):.3g}")


if __name__ == "__main__":
    main()
