# float16 and bfloat16 inputs of attn.scaled_dot_product_attention, _sdpa_forward/_sdpa_backward
# and attn.torch.scaled_dot_product_attention: computed by attn's half kernels and returned in the
# inputs' dtype and framework — against attn's own float32 call on the widened inputs (NumPy
# float16: bit-equal once rounded) and torch.nn.functional on float32 copies (within the
# tolerances below); autograd, torch.compile(fullgraph=True), mixed dtypes and NaN refused.
import numpy as np
import pytest

import attn

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the bfloat16 and torch comparisons need it"
)
F = torch.nn.functional

import attn.torch as attn_torch  # noqa: E402

rng = np.random.default_rng(20250611)
N, H, HKV, L, S, E, EV = 2, 4, 2, 19, 33, 16, 12


def normal(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(20250611)


def half_inputs(dtype=np.float16):
    """query, key and value (grouped heads: H over HKV) in float16."""
    q = normal(N, H, L, E, dtype=dtype)
    k = normal(N, HKV, S, E, dtype=dtype)
    v = normal(N, HKV, S, EV, dtype=dtype)
    return q, k, v


# --- NumPy float16: exactly attn's float32 call on the widened inputs, rounded once -------------
# attn's fp16 kernel widens each row to fp32 and computes as the float32 kernel does, then rounds
# the output to nearest even, as numpy's astype(float16) rounds: the bits must agree.


@pytest.mark.parametrize(
    "options",
    [
        dict(enable_gqa=True),
        dict(enable_gqa=True, is_causal=True),
        dict(enable_gqa=True, attn_mask=rng.random((N, 1, L, S)) < 0.7),
        dict(enable_gqa=True, valid_lens=[5, 33], scale=0.3, softcap=4.0),
    ],
    ids=["gqa", "causal", "bool_mask", "lengths_scale_softcap"],
)
def test_numpy_float16_is_the_float32_call_rounded_once(options):
    q, k, v = half_inputs()
    output, weights = attn.scaled_dot_product_attention(q, k, v, need_weights=True, **options)
    assert isinstance(output, np.ndarray) and output.dtype == np.float16
    assert output.shape == (N, H, L, EV)
    wide = [x.astype(np.float32) for x in (q, k, v)]
    expected, expected_weights = attn.scaled_dot_product_attention(
        *wide, need_weights=True, **options
    )
    np.testing.assert_array_equal(
        output.view(np.uint16), expected.astype(np.float16).view(np.uint16)
    )
    # The weights come back in the inputs' dtype, from the same log-sum-exp (bit-equal for fp16).
    assert weights.dtype == np.float16
    np.testing.assert_array_equal(weights, expected_weights.astype(np.float16))


def test_numpy_float16_strided_inputs_are_read_as_their_values():
    # A transposed query (heads inside rows: read in place) and a key with a strided last axis
    # (copied): the same result as contiguous copies.
    q_rows = normal(N, L, H, E, dtype=np.float16)
    k_columns = normal(N, HKV, E, S, dtype=np.float16)
    v = normal(N, HKV, S, EV, dtype=np.float16)
    q, k = q_rows.transpose(0, 2, 1, 3), k_columns.transpose(0, 1, 3, 2)
    output = attn.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    expected = attn.scaled_dot_product_attention(
        np.ascontiguousarray(q), np.ascontiguousarray(k), v, enable_gqa=True
    )
    np.testing.assert_array_equal(output, expected)


def test_numpy_float16_forward_and_backward_operators():
    q, k, v = half_inputs()
    output, log_sum_exp = attn._attn._sdpa_forward(q, k, v, None, 0.0, True, None, True)
    assert output.dtype == np.float16 and log_sum_exp.dtype == np.float32
    assert log_sum_exp.shape == (N, H, L)
    wide = [x.astype(np.float32) for x in (q, k, v)]
    expected, expected_lse = attn._attn._sdpa_forward(*wide, None, 0.0, True, None, True)
    np.testing.assert_array_equal(output, expected.astype(np.float16))
    np.testing.assert_array_equal(log_sum_exp, expected_lse)
    # Backward: the float32 backward on the same numbers (the float16 output widened), each
    # gradient rounded once.
    grad_output = normal(N, H, L, EV, dtype=np.float16)
    options = (None, 0.0, True, None, True)  # attn_mask, dropout_p, is_causal, scale, enable_gqa
    grads = attn._attn._sdpa_backward(q, k, v, output, grad_output, log_sum_exp, *options)
    wide_grads = attn._attn._sdpa_backward(
        *wide, output.astype(np.float32), grad_output.astype(np.float32), log_sum_exp, *options
    )
    for got, want, x in zip(grads[:3], wide_grads[:3], (q, k, v)):
        assert got.dtype == np.float16 and got.shape == x.shape
        np.testing.assert_array_equal(got, want.astype(np.float16))
    assert grads[3] is None and grads[4] is None


def test_numpy_float16_residuals_reach_the_backward():
    # _sdpa_forward(output_residual=True) adds the output's rounding residuals; _sdpa_backward
    # with them is the float32 backward on the output before its rounding, rounded once.
    q, k, v = half_inputs()
    options = (None, 0.0, True, None, True)  # attn_mask, dropout_p, is_causal, scale, enable_gqa
    output, log_sum_exp, residual = attn._attn._sdpa_forward(q, k, v, *options,
                                                             output_residual=True)
    assert residual.dtype == np.float16 and residual.shape == output.shape
    wide = [x.astype(np.float32) for x in (q, k, v)]
    expected, _ = attn._attn._sdpa_forward(*wide, *options)
    np.testing.assert_array_equal(output, expected.astype(np.float16))
    # The residual is (exact − rounded)·2¹¹ rounded to fp16: exact to within 2⁻²² of the output,
    # or, where the scaled residual is subnormal in fp16 (outputs below 2⁻³), 2⁻²⁴/2¹¹ absolute.
    exact = output.astype(np.float32) + residual.astype(np.float32) / 2048
    np.testing.assert_allclose(exact, expected, rtol=2.0**-21, atol=2.0**-35)
    grad_output = normal(N, H, L, EV, dtype=np.float16)
    grads = attn._attn._sdpa_backward(q, k, v, output, grad_output, log_sum_exp, *options,
                                      output_residual=residual)
    wide_grads = attn._attn._sdpa_backward(*wide, exact, grad_output.astype(np.float32),
                                           log_sum_exp, *options)
    for got, want in zip(grads[:3], wide_grads[:3]):
        np.testing.assert_array_equal(got, want.astype(np.float16))
    # float32 calls have no residuals: None back, and a non-empty one refused.
    assert attn._attn._sdpa_forward(*wide, *options, output_residual=True)[2] is None
    with pytest.raises(ValueError, match="output_residual: expected None or an empty tensor"):
        attn._attn._sdpa_backward(*wide, expected, grad_output.astype(np.float32), log_sum_exp,
                                  *options, output_residual=expected)
    with pytest.raises(TypeError, match="output_residual: expected the dtype of query"):
        attn._attn._sdpa_backward(q, k, v, output, grad_output, log_sum_exp, *options,
                                  output_residual=residual.astype(np.float32))


# --- torch bfloat16 and float16 against torch.nn.functional ------------------------------------
def torch_case(dtype, options):
    """Grouped-head q, k, v in `dtype` and the options with their mask made: "bool" a (L, S)
    bool mask, "float" an (N, 1, L, S) float32 one."""
    q = torch.randn(N, H, L, E).to(dtype)
    k = torch.randn(N, HKV, S, E).to(dtype)
    v = torch.randn(N, HKV, S, EV).to(dtype)
    options = dict(options, enable_gqa=True)
    if options.get("attn_mask") == "bool":
        options["attn_mask"] = torch.rand(L, S) < 0.7
    elif options.get("attn_mask") == "float":
        options["attn_mask"] = torch.randn(N, 1, L, S)
    return q, k, v, options


# Reference: PyTorch's float32 attention on the same values upcast, rounded once to the dtype.
# fp16: attn's result is its float32 kernel's rounded once; the two float32 results differ by
# ~1e-5 of the largest output, which can move a rounding by one fp16 ulp: 2⁻¹⁰ of |out|, plus
# 1e-5·max|out|. bf16 on CPUs with bf16 dot products rounds the probabilities to bf16 before P·V
# (as PyTorch's bf16 kernels do): at most 2⁻⁸·Σ_j P_ij|v_j| ≤ 2⁻⁸·max|v| more, plus each side's
# rounding of the output (2⁻⁹ of |out| each) — 2⁻⁷·max|v| covers all of it (|out| ≤ max|v|).
def tolerance(dtype, reference, value):
    if dtype == torch.float16:
        return 2.0**-10 * reference.abs().double() + 1e-5 * float(reference.abs().max())
    return 2.0**-7 * float(value.abs().max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    "options",
    [dict(), dict(is_causal=True), dict(attn_mask="bool"), dict(attn_mask="float")],
    ids=["plain", "causal", "bool_mask", "float_mask"],
)
def test_torch_half_matches_pytorch_in_float32_rounded(dtype, options):
    q, k, v, options = torch_case(dtype, options)
    for call in (attn.scaled_dot_product_attention, attn_torch.scaled_dot_product_attention):
        output = call(q, k, v, **options)
        assert isinstance(output, torch.Tensor) and output.dtype == dtype
        reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **options)
        reference = reference.to(dtype)
        difference = (output.double() - reference.double()).abs()
        assert (difference <= tolerance(dtype, reference, v)).all(), float(difference.max())


def test_torch_half_inputs_are_read_in_place_by_the_operator():
    # attn.torch hands half tensors to the extension unconverted: a transposed bf16 query (heads
    # inside rows) gives the result of its contiguous copy, bit for bit. 40 queries of depth 80:
    # the kernel's 16 x 16 blocks of query pairs (rows H * 80 elements apart) and their tails.
    q = torch.randn(N, 40, H, 80, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(N, HKV, S, 80, dtype=torch.bfloat16)
    v = torch.randn(N, HKV, S, EV, dtype=torch.bfloat16)
    output = attn_torch.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    expected = attn.scaled_dot_product_attention(q.contiguous(), k, v, enable_gqa=True)
    assert torch.equal(output, expected)


# Gradients: the half backward is attn's float32 backward on the half inputs, the half output and
# the half grad_output, rounded once. Against float32 autograd on the same (upcast) leaves the
# differences are the output's rounding to bf16 entering D = rowsum(dO ⊙ O) (2⁻⁹ relative), the
# native kernel's probabilities in the forward (2⁻⁸), and the gradients' own rounding (2⁻⁹
# relative): together under 4·2⁻⁸ = 2⁻⁶ of the largest gradient (measured: about 2⁻⁸). That holds
# for rows whose softmax is not peaked (the inputs here): where one key dominates a row, dP − D
# cancels and D's rounding stands beside a tiny dS, so dQ and dK reach 2.6e-2 of their largest in
# fp16 at inputs ×30 (docs/reliability.md, "Not handled"), as PyTorch's flash backward in bf16.
GRADIENT_TOLERANCE = 2.0**-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autograd_gives_half_gradients_close_to_float32(dtype):
    q32 = torch.randn(N, H, L, E)
    k32 = torch.randn(N, HKV, S, E)
    v32 = torch.randn(N, HKV, S, EV)
    grad_output = torch.randn(N, H, L, EV).to(dtype)
    leaves = [x.to(dtype).requires_grad_(True) for x in (q32, k32, v32)]
    sinks = torch.randn(H, requires_grad=True)
    output = attn_torch.scaled_dot_product_attention(
        *leaves, is_causal=True, enable_gqa=True, sinks=sinks
    )
    assert output.dtype == dtype
    output.backward(grad_output)
    wide = [x.detach().float().requires_grad_(True) for x in leaves]
    wide_sinks = sinks.detach().clone().requires_grad_(True)
    attn_torch.scaled_dot_product_attention(
        *wide, is_causal=True, enable_gqa=True, sinks=wide_sinks
    ).backward(grad_output.float())
    for name, leaf, reference in zip("qkv", leaves, wide):
        assert leaf.grad.dtype == dtype, name
        scale = float(reference.grad.abs().max())
        difference = float((leaf.grad.double() - reference.grad.double()).abs().max())
        assert difference <= GRADIENT_TOLERANCE * scale, (name, difference, scale)
    assert sinks.grad.dtype == torch.float32
    # A head's sink gradient is a sum of terms of both signs (−Σ_i weight_i·D_i), so its error
    # follows the terms' size, not the sum's: relative to the largest head's, as for q, k and v
    # (elementwise, a head whose terms nearly cancel failed on AVX2: 0.0078 off -0.142, 2⁻⁸·³ of
    # the largest).
    sink_scale = float(wide_sinks.grad.abs().max())
    sink_difference = float((sinks.grad - wide_sinks.grad).abs().max())
    assert sink_difference <= GRADIENT_TOLERANCE * sink_scale, (sink_difference, sink_scale)


def test_torch_compile_fullgraph_on_bfloat16():
    q = torch.randn(N, H, L, E, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(N, HKV, S, E, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(N, HKV, S, EV, dtype=torch.bfloat16, requires_grad=True)

    def attend(q, k, v):
        return attn_torch.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    output = compiled(q, k, v)
    assert output.dtype == torch.bfloat16
    assert torch.equal(output, attend(q, k, v))
    output.sum().backward()
    assert q.grad.dtype == torch.bfloat16 and v.grad.dtype == torch.bfloat16


# --- torch.autocast("cpu"): the casts PyTorch's function gets -----------------------------------
# Under autocast PyTorch casts float32, float16 and bfloat16 query, key, value and a float mask to
# the autocast dtype (scaled_dot_product_attention is one of its lower-precision operators on the
# CPU) and leaves float64 and bool alone; attn.torch does the same, so both compute on the same
# rounded values: checked against PyTorch's float32 function on those values, rounded once, within
# `tolerance` above.


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("inputs", [torch.float32, torch.float16], ids=["from_fp32", "from_fp16"])
@pytest.mark.parametrize(
    "options",
    [dict(), dict(is_causal=True), dict(attn_mask="bool"), dict(attn_mask="float")],
    ids=["plain", "causal", "bool_mask", "float_mask"],
)
def test_autocast_casts_as_it_casts_pytorchs_function(dtype, inputs, options):
    q, k, v, options = torch_case(inputs, options)
    with torch.autocast("cpu", dtype=dtype):
        output = attn_torch.scaled_dot_product_attention(q, k, v, **options)
        expected_dtype = F.scaled_dot_product_attention(q, k, v, **options).dtype
    assert output.dtype == expected_dtype == dtype
    mask = options.get("attn_mask")
    if mask is not None and mask.is_floating_point():
        options["attn_mask"] = mask.to(dtype).float()
    reference = F.scaled_dot_product_attention(
        *(x.to(dtype).float() for x in (q, k, v)), **options
    ).to(dtype)
    difference = (output.double() - reference.double()).abs()
    assert (difference <= tolerance(dtype, reference, v.to(dtype))).all(), float(difference.max())


def test_autocast_gradients_reach_float32_leaves_as_pytorchs_do():
    leaves = [torch.randn(N, H, L, E), torch.randn(N, HKV, S, E), torch.randn(N, HKV, S, EV)]
    grad_output = torch.randn(N, H, L, EV)
    gradients = {}
    for name, call in (
        ("attn", attn_torch.scaled_dot_product_attention),
        ("torch", F.scaled_dot_product_attention),
    ):
        inputs = [x.clone().requires_grad_(True) for x in leaves]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = call(*inputs, is_causal=True, enable_gqa=True)
        assert output.dtype == torch.bfloat16, name
        output.backward(grad_output.to(torch.bfloat16))
        gradients[name] = [x.grad for x in inputs]
    # Both sides' gradients are bf16 results (GRADIENT_TOLERANCE's terms on each) cast to float32.
    for index, (mine, theirs) in enumerate(zip(gradients["attn"], gradients["torch"])):
        assert mine.dtype == theirs.dtype == torch.float32, index
        scale = float(theirs.abs().max())
        assert float((mine - theirs).abs().max()) <= 2 * GRADIENT_TOLERANCE * scale, index


def test_autocast_leaves_float64_and_compiles():
    q = torch.randn(N, H, L, E, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = attn_torch.scaled_dot_product_attention(q, q, q)
        assert output.dtype == F.scaled_dot_product_attention(q, q, q).dtype == torch.float64

    def attend(q, k, v):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return attn_torch.scaled_dot_product_attention(q, k, v, is_causal=True)

    x = torch.randn(N, H, L, E)
    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")(x, x, x)
    assert compiled.dtype == torch.bfloat16
    assert torch.equal(compiled, attend(x, x, x))


def test_mixed_dtypes_are_refused():
    q, k, v = half_inputs()
    message = r"key: expected the dtype of query \(float16\), got float32"
    with pytest.raises(TypeError, match=message):
        attn.scaled_dot_product_attention(q, k.astype(np.float32), v)
    message = r"value: expected the dtype of query \(float32\), got float16"
    with pytest.raises(TypeError, match=message):
        attn.scaled_dot_product_attention(q.astype(np.float32), k.astype(np.float32), v)
    tq = torch.randn(N, H, L, E, dtype=torch.bfloat16)
    tk = torch.randn(N, HKV, S, E)
    tv = torch.randn(N, HKV, S, EV, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"key: expected the dtype of query \(bfloat16\)"):
        attn.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)
    with pytest.raises(TypeError, match=r"key: expected the dtype of query \(torch.bfloat16\)"):
        attn_torch.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)
    with pytest.raises(TypeError, match=r"value: expected the dtype of query \(torch.bfloat16\)"):
        attn_torch.scaled_dot_product_attention(tq, tk.bfloat16(), tv.half(), enable_gqa=True)


def test_nan_in_a_bfloat16_key_is_a_value_error():
    q = torch.randn(N, H, L, E, dtype=torch.bfloat16)
    k = torch.randn(N, HKV, S, E, dtype=torch.bfloat16)
    v = torch.randn(N, HKV, S, EV, dtype=torch.bfloat16)
    k[1, 0, 2, 3] = float("nan")
    flat = ((1 * HKV + 0) * S + 2) * E + 3
    message = f"key: expected finite values, got NaN at flat index {flat}"
    with pytest.raises(ValueError, match=message):
        attn.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    with pytest.raises(ValueError, match=message):
        attn_torch.scaled_dot_product_attention(q, k, v, enable_gqa=True)


# --- Peaked rows: D = rowsum(dO ∘ O) from the output before its rounding ------------------------
# Where one key dominates each row (q and k ×10: scores in the hundreds), dS = P ⊙ (dP − D) is a
# small difference, and D from the rounded output alone (as PyTorch's half backward takes it)
# moves dQ and dK past the float32 kernels' bound against float64 on the same rounded inputs: 1e-5
# of the largest gradient times the scores' magnitude², plus the element's own rounding. Every
# route of attn.torch's autograd keeps the forward's residuals for its backward and stays within
# it; without them (the extension called with none) hundreds of elements are past it.
PEAKED_MAGNITUDE = 10.0
# bf16 on bf16 products with P rounded to bf16 in the forward's P·V (vdpbf16ps by default, as
# PyTorch's bf16 kernels do) has an output before rounding that is not the exact one, so the bound
# here holds where P reaches P·V in two parts (AMX tiles by default) or bf16 widens to fp32.
BF16_PRODUCTS = ("bf16 runs on bf16 products here with P rounded to bf16 before P·V "
                 "(ATTN_BF16_P=split keeps it in two parts)")


def bf16_probabilities_exact():
    """Whether bf16's P reaches P·V within fp32's accuracy here: widened to fp32, or on bf16
    products with P in two parts (attn.bf16_probabilities_status())."""
    status = attn.bf16_probabilities_status()
    return "P in two bf16 parts" in status or "widened to fp32" in status


def peaked_case(dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, 1, 64, 128, generator=generator) * PEAKED_MAGNITUDE for _ in range(2))
    v, grad_output = (torch.randn(1, 1, 64, 128, generator=generator) for _ in range(2))
    return [t.to(dtype) for t in (q, k, v, grad_output)]


def elements_past_the_bound(dtype, gradients, q, k, v, grad_output):
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*leaves).backward(grad_output.double())
    rounding = 2.0**-11 if dtype == torch.float16 else 2.0**-8
    past = 0
    for got, leaf in zip(gradients, leaves):
        want = leaf.grad
        largest = max(1.0, float(want.abs().max()))
        bound = 1e-5 * PEAKED_MAGNITUDE**2 * largest + rounding * want.abs()
        past += int(((got.double() - want).abs() > bound).sum())
    return past


def autograd_routes():
    """Each route of attn.torch's autograd, as a function of (q, k, v, grad_output) → gradients."""

    def plain(q, k, v, grad_output):  # _PlainSdpa
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        attn_torch.scaled_dot_product_attention(*leaves).backward(grad_output)
        return [t.grad for t in leaves]

    def general(q, k, v, grad_output):  # _EagerSdpa (valid lengths take the general path)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        lengths = torch.tensor([64])
        attn_torch.scaled_dot_product_attention(*leaves, valid_lens=lengths).backward(grad_output)
        return [t.grad for t in leaves]

    def compiled(q, k, v, grad_output):  # the operators, traced by AOTAutograd
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        function = torch.compile(attn_torch.scaled_dot_product_attention, fullgraph=True,
                                 backend="aot_eager")
        function(*leaves).backward(grad_output)
        return [t.grad for t in leaves]

    def transformed(q, k, v, grad_output):  # _TransformedSdpa under torch.func.vjp
        _, vjp = torch.func.vjp(attn_torch.scaled_dot_product_attention, q, k, v)
        return list(vjp(grad_output))

    return {"plain": plain, "general": general, "compiled": compiled, "transformed": transformed}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("route", list(autograd_routes()))
def test_peaked_rows_keep_their_gradients_on_every_autograd_route(dtype, route):
    if dtype == torch.bfloat16 and not bf16_probabilities_exact():
        pytest.skip(BF16_PRODUCTS)
    function = autograd_routes()[route]
    for seed in range(3):
        q, k, v, grad_output = peaked_case(dtype, seed)
        assert elements_past_the_bound(dtype, function(q, k, v, grad_output), q, k, v,
                                       grad_output) == 0, seed


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_peaked_rows_lose_their_gradients_without_the_residuals(dtype):
    if dtype == torch.bfloat16 and not bf16_probabilities_exact():
        pytest.skip(BF16_PRODUCTS)
    past = 0
    for seed in range(3):
        q, k, v, grad_output = peaked_case(dtype, seed)
        output, log_sum_exp = attn._attn._sdpa_forward(q, k, v)
        gradients = attn._attn._sdpa_backward(q, k, v, output, grad_output, log_sum_exp)[:3]
        past += elements_past_the_bound(dtype, gradients, q, k, v, grad_output)
    assert past > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_one_query_against_many_keys_keeps_its_gradients(dtype):
    # One query of two heads against 4096 keys: the decode kernel splits the keys over tasks and
    # merges them after, where the output's rounding residuals were left unwritten and the
    # backward read the buffer's garbage (bf16 dQ 3e36 off, fp16 8e-3 of its largest). Bound:
    # twice the gradient's rounding (2^-8 bf16, 2^-11 fp16) of the largest, the rest far below.
    rounding = 2.0**-11 if dtype == torch.float16 else 2.0**-8
    q, k, v = (torch.randn(1, 2, rows, 64).to(dtype) for rows in (1, 4096, 4096))
    grad_output = torch.randn(1, 2, 1, 64).to(dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    attn_torch.scaled_dot_product_attention(*leaves).backward(grad_output)
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*exact).backward(grad_output.double())
    for name, got, want in zip("qkv", leaves, exact):
        error = float((got.grad.double() - want.grad).abs().max() / want.grad.abs().max())
        assert error <= 2 * rounding, (name, error)
