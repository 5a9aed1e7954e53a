# attn.torch.scaled_dot_product_attention against PyTorch: torch.nn.functional's own function on
# random cases (masks of every broadcast shape and both kinds, causal, grouped heads, scales,
# L ≠ S, fully masked rows), a float64 eager reference for what PyTorch lacks (windows, ALiBi,
# soft-capping, sinks, valid lengths, bottom-right alignment), forward and gradients through
# autograd, and torch.compile(fullgraph=True).
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the scaled_dot_product_attention comparisons need it"
)
F = torch.nn.functional

import attn  # noqa: E402
import attn.torch as attn_torch  # noqa: E402
import torch.utils.flop_counter  # noqa: E402
from torch_reference import reference_sdpa  # noqa: E402

# Outputs: float32 on both sides, sums of at most a few dozen O(1) products; attn's fast exp and
# its tile order round differently from PyTorch's by a few float32 ulps of the largest output.
OUTPUT_RTOL = 1e-5
# Gradients: longer chains (dP, the row sums D, dS = P ⊙ (dP − D), then two more products), each
# rounding in float32, so ten times the output tolerance.
GRADIENT_RTOL = 1e-4

N, H, L, S, E, EV = 2, 4, 5, 7, 8, 6


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(20250611)


def assert_relative(actual, expected, rtol, name):
    """max |actual − expected| ≤ rtol · max |expected| (the issue's "relative to the output's
    max magnitude")."""
    actual, expected = actual.detach().double(), expected.detach().double()
    assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
    assert torch.isfinite(actual).all(), f"{name}: attn gave non-finite values"
    # Floor 1e-2: the gradient of a mask constant along the keys ((…, 1) masks) cancels to
    # exactly 0 (softmax ignores a per-row constant), leaving only float32 round-off of its O(1)
    # summands on both sides; every other expectation here is O(0.1) or larger.
    scale = max(expected.abs().max().item(), 1e-2)
    error = (actual - expected).abs().max().item()
    assert error <= rtol * scale, f"{name}: max error {error:.3g} > {rtol} × {scale:.3g}"


def leaf(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).requires_grad_(True)


def compare(attn_call, reference_call, inputs, names, reference_dtype=None):
    """Runs attn and the reference on the same leaves, backpropagates the same random
    grad_output through both, and compares outputs and every input's gradient. The reference
    runs on copies converted to `reference_dtype` (float64 for the eager reference)."""
    output = attn_call(*inputs)
    grad_output = torch.randn_like(output)
    gradients = torch.autograd.grad(output, inputs, grad_output)
    reference_inputs = [
        t.detach().to(reference_dtype or t.dtype).requires_grad_(True) for t in inputs
    ]
    expected = reference_call(*reference_inputs)
    expected_gradients = torch.autograd.grad(
        expected, reference_inputs, grad_output.to(expected.dtype)
    )
    assert output.dtype == inputs[0].dtype
    assert_relative(output, expected, OUTPUT_RTOL, "output")
    for name, mine, theirs in zip(names, gradients, expected_gradients):
        assert_relative(mine, theirs, GRADIENT_RTOL, f"d {name}")


# --- against torch.nn.functional.scaled_dot_product_attention -----------------------------------

MASK_SHAPES = {
    "L_S": (L, S),
    "1_1_L_S": (1, 1, L, S),
    "N_1_L_S": (N, 1, L, S),
    "N_H_L_S": (N, H, L, S),
    "N_1_1_S": (N, 1, 1, S),
    "1_H_1_S": (1, H, 1, S),
    "H_L_S": (H, L, S),
    "1_S": (1, S),
    "1_H_L_1": (1, H, L, 1),
}


def random_mask(shape, kind):
    if kind == "bool":
        mask = torch.rand(shape) < 0.7
        # Keep key 0 visible everywhere so that no row is empty here (empty rows have their own
        # test); a (…, 1) mask broadcasts one entry over the keys, so keep it all visible.
        mask[..., 0] = True
        return mask
    return leaf(*shape)


def causal_bool(L, S):
    """PyTorch's is_causal as a mask: query i sees keys j ≤ i (top-left)."""
    return torch.ones(L, S, dtype=torch.bool).tril()


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("mask_shape", list(MASK_SHAPES), ids=list(MASK_SHAPES))
def test_masks_match_torch(mask_shape, kind, is_causal):
    q, k, v = leaf(N, H, L, E), leaf(N, H, S, E), leaf(N, H, S, EV)
    mask = random_mask(MASK_SHAPES[mask_shape], kind)
    inputs, names = [q, k, v], ["query", "key", "value"]
    if kind == "float":
        inputs.append(mask)
        names.append("attn_mask")

    def mine(q, k, v, *float_mask):
        m = float_mask[0] if float_mask else mask
        return attn_torch.scaled_dot_product_attention(q, k, v, m, is_causal=is_causal)

    def theirs(q, k, v, *float_mask):
        m = float_mask[0] if float_mask else mask
        if is_causal:  # PyTorch refuses attn_mask with is_causal: fold the causal mask in
            causal = causal_bool(L, S)
            m = m & causal if m.dtype == torch.bool else m.masked_fill(~causal, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, m)

    compare(mine, theirs, inputs, names)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_no_mask_matches_torch(is_causal):
    q, k, v = leaf(N, H, L, E), leaf(N, H, S, E), leaf(N, H, S, EV)
    compare(
        lambda q, k, v: attn_torch.scaled_dot_product_attention(q, k, v, is_causal=is_causal),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal),
        [q, k, v],
        ["query", "key", "value"],
    )


@pytest.mark.parametrize("groups", [1, 2, 4, 8])
@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "padding_mask"])
def test_grouped_query_heads_match_torch(groups, masked):
    heads = 8
    q, k, v = leaf(N, heads, L, E), leaf(N, heads // groups, S, E), leaf(N, heads // groups, S, EV)
    mask = None
    if masked:  # padding: batch element 1 sees its first 4 keys only
        mask = torch.ones(N, 1, 1, S, dtype=torch.bool)
        mask[1, ..., 4:] = False
    compare(
        lambda q, k, v: attn_torch.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True),
        [q, k, v],
        ["query", "key", "value"],
    )


@pytest.mark.parametrize("scale", [None, 0.3, 2.0])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "queries, keys", [(5, 7), (7, 5), (1, 9), (6, 6), (33, 70)], ids=lambda n: str(n)
)
def test_scales_and_lengths_match_torch(queries, keys, scale, is_causal):
    q, k, v = leaf(N, 3, queries, E), leaf(N, 3, keys, E), leaf(N, 3, keys, EV)
    compare(
        lambda q, k, v: attn_torch.scaled_dot_product_attention(
            q, k, v, is_causal=is_causal, scale=scale
        ),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale),
        [q, k, v],
        ["query", "key", "value"],
    )


@pytest.mark.parametrize(
    "shape", [(L, E), (N, L, E), (N, 2, 3, L, E)], ids=["rank2", "rank3", "rank5"]
)
def test_other_ranks_match_torch(shape):
    q = leaf(*shape)
    k = leaf(*shape[:-2], S, E)
    v = leaf(*shape[:-2], S, EV)
    mask = torch.rand(L, S) < 0.7
    mask[:, 0] = True
    compare(
        lambda q, k, v: attn_torch.scaled_dot_product_attention(q, k, v, mask),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, mask),
        [q, k, v],
        ["query", "key", "value"],
    )


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_fully_masked_rows_give_zeros_like_torch(kind):
    q, k, v = leaf(N, H, L, E), leaf(N, H, S, E), leaf(N, H, S, EV)
    visible = torch.rand(N, H, L, S) < 0.7
    visible[..., 0] = True
    visible[0, 1, 2] = False  # one row sees nothing
    visible[1, :, 4] = False  # a row of every head of batch element 1
    if kind == "bool":
        mask, inputs, names = visible, [q, k, v], ["query", "key", "value"]
    else:
        mask = torch.zeros(N, H, L, S).masked_fill(~visible, float("-inf")).requires_grad_(True)
        inputs, names = [q, k, v, mask], ["query", "key", "value", "attn_mask"]

    def mine(q, k, v, *float_mask):
        return attn_torch.scaled_dot_product_attention(q, k, v, *(float_mask or [mask]))

    def theirs(q, k, v, *float_mask):
        return F.scaled_dot_product_attention(q, k, v, *(float_mask or [mask]))

    output = mine(q, k, v, *inputs[3:])
    assert torch.all(output[0, 1, 2] == 0) and torch.all(output[1, :, 4] == 0)
    compare(mine, theirs, inputs, names)


def test_expanded_float_mask_gradient_sums_like_torch():
    # transformers hands masks made by expand(): stride-0 axes; the gradient of the unexpanded
    # leaf is summed over them, as autograd does for PyTorch.
    q, k, v = leaf(N, H, L, E), leaf(N, H, S, E), leaf(N, H, S, EV)
    base = leaf(1, 1, L, S)
    compare(
        lambda q, k, v, m: attn_torch.scaled_dot_product_attention(q, k, v, m.expand(N, H, L, S)),
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m.expand(N, H, L, S)),
        [q, k, v, base],
        ["query", "key", "value", "attn_mask"],
    )


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("mask_shape", [(1, N, L, S), (1, 1, L, S), (1, N, 1, S)])
def test_a_4d_mask_on_3d_inputs_matches_torch(mask_shape, kind):
    # PyTorch reads 3-d inputs (N, L, E) as one batch of N heads for the mask: a 4-d mask whose
    # first axis is 1 is accepted, its gradient in its own shape.
    q, k, v = leaf(N, L, E), leaf(N, S, E), leaf(N, S, EV)
    mask = random_mask(mask_shape, kind)
    inputs, names = [q, k, v], ["query", "key", "value"]
    if kind == "float":
        inputs.append(mask)
        names.append("attn_mask")

    def call(function):
        return lambda q, k, v, *m: function(q, k, v, m[0] if m else mask)

    compare(call(attn_torch.scaled_dot_product_attention), call(F.scaled_dot_product_attention),
            inputs, names)
    with pytest.raises(attn.ShapeError, match=r"got \(1, 1, 1, 5, 7\)"):
        attn_torch.scaled_dot_product_attention(q, k, v, random_mask((1, 1, 1, L, S), kind))


def test_transposed_inputs_as_transformers_passes_them(monkeypatch):
    # (B, L, H, E) projections viewed as (B, H, L, E): read in place by attn (last axis
    # contiguous), with the same results as contiguous copies.
    q = leaf(N, L, H, E)
    k, v = leaf(N, S, H, E), leaf(N, S, H, EV)
    compare(
        lambda q, k, v: attn_torch.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        ),
        lambda q, k, v: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        ),
        [q, k, v],
        ["query", "key", "value"],
    )
    # Every route hands attn the views themselves, whose memory attn reads in place: eager calls
    # with grad pass them to the extension as they are, no copies...
    views = [t.transpose(1, 2) for t in (q, k, v)]
    forward = attn_torch._extension._sdpa_forward
    exported = []

    def record(query, key, value, *args, **kwargs):
        exported.extend((query, key, value))
        return forward(query, key, value, *args, **kwargs)

    monkeypatch.setattr(attn_torch._extension, "_sdpa_forward", record)
    with torch.enable_grad():
        attn_torch.scaled_dot_product_attention(*views, is_causal=True)
    assert len(exported) == 3
    for view, passed in zip(views, exported):
        assert passed is view
    monkeypatch.setattr(attn_torch._extension, "_sdpa_forward", forward)
    # ...plain inference calls pass them to attn's own function (which reads them in place)...
    function = attn_torch._sdpa_function
    assert function is attn_torch._attn.scaled_dot_product_attention
    received = []
    monkeypatch.setattr(
        attn_torch,
        "_sdpa_function",
        lambda *args, **kwargs: received.append(args[:3]) or function(*args, **kwargs),
    )
    with torch.no_grad():
        direct = attn_torch.scaled_dot_product_attention(*views, is_causal=True)
    monkeypatch.setattr(attn_torch, "_sdpa_function", function)
    assert len(received) == 1 and all(a is b for a, b in zip(received[0], views))
    with torch.no_grad():
        torch.testing.assert_close(
            direct, F.scaled_dot_product_attention(*views, is_causal=True), rtol=1e-5, atol=1e-6
        )
    # ...and the operator (torch.compile's route, forced here) passes the tensors.
    seen = []
    forward = attn_torch._extension._sdpa_forward

    def spy(query, key, value, *args, **kwargs):
        seen.extend((t, attn._data_pointer(t, strided=True)) for t in (query, key, value))
        return forward(query, key, value, *args, **kwargs)

    monkeypatch.setattr(attn_torch._extension, "_sdpa_forward", spy)
    monkeypatch.setattr(attn_torch, "_eager", lambda *tensors: None)
    monkeypatch.setattr(attn_torch, "_eager_plain", lambda *tensors: None)
    attn_torch.scaled_dot_product_attention(*views, is_causal=True)
    assert len(seen) == 3
    for view, (passed, address) in zip(views, seen):
        assert passed.data_ptr() == view.data_ptr() and passed.stride() == view.stride()
        assert address == view.data_ptr()


@pytest.mark.parametrize(
    "shapes",
    [((2, 4, 64, 32), (2, 4, 48, 32), (2, 4, 48, 32)), ((3, 64, 32),) * 3,
     ((2, 8, 5, 16), (2, 2, 40, 16), (2, 2, 40, 16))],
    ids=["4d", "3d", "gqa"],
)
def test_flop_counter_counts_as_for_torch(shapes):
    # FlopCounterMode (what MFU reports and transformers' flop estimates read) counted 0 for
    # attn's operators: now PyTorch's own count, forward and backward, causal not subtracted.
    # (Value sizes equal to the queries': PyTorch's flash kernel then runs and counts its
    # backward's recomputed scores, as attn's does; its math path, taken otherwise, counts none.)
    counts = []
    for function in (F.scaled_dot_product_attention, attn_torch.scaled_dot_product_attention):
        q, k, v = (torch.randn(shape, requires_grad=True) for shape in shapes)
        with torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
            function(q, k, v, is_causal=True, enable_gqa=q.shape[-3] != k.shape[-3]).sum().backward()
        counts.append(counter.get_total_flops())
    assert counts[1] == counts[0] > 0


class _UserTensor(torch.Tensor):
    """A subclass of torch.Tensor defined outside torch (a user's, or a library's)."""


def test_subclasses_of_tensor_are_tensors():
    # A subclass defined outside torch was taken for a NumPy array by its module's name: attn's
    # function returned an ndarray, attn.torch's failed "Unable to cast [[...]] to Tensor" (the
    # whole output printed), and under autograd refused it as no tensor. PyTorch returns the
    # subclass.
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    sub = [x.as_subclass(_UserTensor) for x in (q, k, v)]
    output = attn.scaled_dot_product_attention(*sub)
    assert isinstance(output, torch.Tensor)
    torch.testing.assert_close(torch.as_tensor(output), expected, rtol=1e-5, atol=1e-6)
    output = attn_torch.scaled_dot_product_attention(*sub)
    assert isinstance(output, _UserTensor)
    torch.testing.assert_close(output.as_subclass(torch.Tensor), expected, rtol=1e-5, atol=1e-6)
    query = q.clone().as_subclass(_UserTensor).requires_grad_()
    attn_torch.scaled_dot_product_attention(query, k, v).sum().backward()
    reference = q.clone().requires_grad_()
    torch.nn.functional.scaled_dot_product_attention(reference, k, v).sum().backward()
    torch.testing.assert_close(query.grad.as_subclass(torch.Tensor), reference.grad, rtol=1e-5,
                               atol=1e-6)


def test_a_complex_mask_is_named_as_a_mask():
    # attn.torch read a complex mask as integer valid lengths: the error named valid_lens and a
    # warning called its entries a tokenizer's attention_mask.
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match="attn_mask: expected a bool mask.* got complex64"):
            attn_torch.scaled_dot_product_attention(q, k, v, torch.zeros(5, 7, dtype=torch.complex64))


def test_sparse_and_nested_tensors_are_named_by_their_layout():
    # They were "expected a NumPy array or a tensor supporting DLPack, got torch.Tensor of dtype
    # torch.float32" (a jagged one reached the operator: NotImplementedError attn.sdpa.default).
    q = torch.randn(2, 2, 4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's prototype warning for strided nested tensors
        cases = [
            (q.to_sparse(), r"got one of layout torch.sparse_coo \(convert it with .to_dense\(\)\)"),
            (torch.nested.nested_tensor([q[0], q[0]]), "got a nested one"),
            (torch.nested.nested_tensor([q[0], q[0]], layout=torch.jagged), "got a nested one"),
        ]
    for x, message in cases:
        for function in (attn.scaled_dot_product_attention,
                         attn_torch.scaled_dot_product_attention):
            with pytest.raises(TypeError, match=r"^query: expected a strided tensor, " + message):
                function(x, q, q)


def test_float64_inputs_give_float64_results():
    q, k, v = (leaf(N, H, L, E, dtype=torch.float64) for _ in range(3))
    output = attn_torch.scaled_dot_product_attention(q, k, v)
    assert output.dtype == torch.float64
    output.sum().backward()
    assert q.grad.dtype == torch.float64
    assert_relative(output, F.scaled_dot_product_attention(q, k, v), OUTPUT_RTOL, "output")


@pytest.mark.parametrize("queries", [5, 70], ids=["decode_kernel", "prefill_kernels"])
@pytest.mark.parametrize("far", [-1e4, -1e9, torch.finfo(torch.float32).min],
                         ids=["-1e4", "-1e9", "finfo.min"])
def test_a_row_a_float_mask_hides_wholly_matches_torchs_math(far, queries):
    # transformers fills hidden entries with finfo.min; a row hidden wholly (a left-padded query)
    # then has equal float32 scores, and PyTorch averages the values. attn gave zeros there on
    # its base-2 paths and, for every such row, gradients off by the row's lost log-sum-exp
    # (PyTorch's own CPU flash backward too: the math backend is the reference here).
    # The row's query is zero, so its scores are the mask's exactly on both sides (−1e4 + q·k
    # rounds to 2^−10 in float32, differently in attn's base-2 scores than in PyTorch's).
    q = torch.randn(N, H, queries, E)
    q[:, :, 2] = 0.0
    q.requires_grad_(True)
    k, v = leaf(N, H, S, E), leaf(N, H, S, EV)
    mask = torch.randn(queries, S)
    mask[2] = far
    output = attn_torch.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    grad_output = torch.randn_like(output)
    grads = torch.autograd.grad(output, (q, k, v), grad_output)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad_output)
    assert_relative(output, expected, OUTPUT_RTOL, "output")
    for name, mine, theirs in zip("qkv", grads, expected_grads):
        assert_relative(mine, theirs, GRADIENT_RTOL, f"d{name}")


@pytest.mark.parametrize("queries", [1, 4, 16])
def test_few_queries_at_large_scores_give_gradients_as_accurate_as_torchs(queries):
    # Scores reaching ±80: the forward of a few queries (the decode kernel; the prefill's tiles
    # beside the backward's dot products for up to 4) summed each score in another order than the
    # backward, whose P from the forward's log-sum-exp then left dV 1.4e-5 off float64 where
    # PyTorch's float32 is 2.4e-6 off (tools/gradient_error_by_magnitude.py). The backward takes
    # such rows from its own scores (docs/kernels.md): dV within 6e-6 of float64 relative to its
    # largest (4e-6 measured), over 300 keys.
    torch.manual_seed(7)
    q = (torch.randn(2, 4, queries, 64) * 2.0).requires_grad_(True)
    k, v = leaf(2, 4, 300, 64), leaf(2, 4, 300, 32)
    output = attn_torch.scaled_dot_product_attention(q, k, v, scale=1.0)
    grad_output = torch.randn_like(output)
    grads = torch.autograd.grad(output, (q, k, v), grad_output)
    wide = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*wide, scale=1.0)
    expected_grads = torch.autograd.grad(expected, wide, grad_output.double())
    assert_relative(grads[2], expected_grads[2], 6e-6, "dv")
    for name, mine, theirs in zip("qk", grads[:2], expected_grads[:2]):
        assert_relative(mine, theirs, 3e-5, f"d{name}")


@pytest.mark.parametrize("mask_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"]
)
@pytest.mark.parametrize("queries", [1, 70], ids=["decode_kernel", "prefill_kernels"])
def test_a_half_float_mask_gives_the_results_of_its_float32_values(queries, dtype, mask_dtype):
    # PyTorch's float masks come in the inputs' dtype; attn reads a half one in place and widens
    # each entry exactly, so the call gives the bits of the same call with mask.float(): output,
    # every gradient, and the mask's own gradient (in the mask's dtype, as autograd returns it).
    q = torch.randn(N, H, queries, E).to(dtype)
    k, v = torch.randn(N, H, S, E).to(dtype), torch.randn(N, H, S, EV).to(dtype)
    mask = (3 * torch.randn(queries, S)).to(mask_dtype)
    mask[:, 1] = float("-inf")
    half_leaves = [t.clone().requires_grad_(True) for t in (q, k, v, mask)]
    float_leaves = [t.clone().requires_grad_(True) for t in (q, k, v, mask.float())]
    output = attn_torch.scaled_dot_product_attention(*half_leaves[:3], attn_mask=half_leaves[3])
    expected = attn_torch.scaled_dot_product_attention(*float_leaves[:3], attn_mask=float_leaves[3])
    assert output.dtype == dtype
    assert torch.equal(output, expected)
    grad_output = torch.randn_like(output)
    grads = torch.autograd.grad(output, half_leaves, grad_output)
    expected_grads = torch.autograd.grad(expected, float_leaves, grad_output)
    for name, grad, want in zip(("query", "key", "value"), grads, expected_grads):
        assert torch.equal(grad, want), name
    assert grads[3].dtype == mask_dtype
    assert torch.equal(grads[3], expected_grads[3].to(mask_dtype))
    # Inference (the plain call), and NumPy's float16 through attn's own function.
    with torch.no_grad():
        assert torch.equal(attn_torch.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                           attn_torch.scaled_dot_product_attention(q, k, v, attn_mask=mask.float()))
    if dtype == torch.float32 and mask_dtype == torch.float16:
        arrays = [t.numpy() for t in (q, k, v)]
        np.testing.assert_array_equal(
            attn.scaled_dot_product_attention(*arrays, attn_mask=mask.numpy()),
            attn.scaled_dot_product_attention(*arrays, attn_mask=mask.float().numpy()))


@pytest.mark.parametrize("mask_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_a_half_float_mask_with_nan_or_inf_is_refused(mask_dtype):
    q = torch.randn(N, H, L, E).to(mask_dtype)
    for bad, named in ((float("nan"), "NaN"), (float("inf"), "inf")):
        mask = torch.zeros(L, S, dtype=mask_dtype)
        mask[1, 3] = bad
        with pytest.raises(ValueError, match=f"attn_mask: expected finite values or -inf, got "
                                             f"{named} at flat index {S + 3}"):
            attn_torch.scaled_dot_product_attention(q, q[:, :, :1].expand(N, H, S, E), q[:, :, :1]
                                                    .expand(N, H, S, E), attn_mask=mask)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("queries", [5, 70], ids=["decode_kernel", "prefill_kernels"])
@pytest.mark.parametrize("far", [-1e9, torch.finfo(torch.float32).min], ids=["-1e9", "finfo.min"])
def test_a_row_a_float_mask_hides_wholly_in_half_precision(far, queries, dtype):
    # As above on half inputs, against the float64 math on the same rounded inputs: the half
    # backward's dQ and dV of such a row were off by O(1) (the row's P carried a factor of 7).
    # Tolerance: the half path rounds P and dS to the input's precision (2^-8 for bf16) in its
    # products and each gradient once; 2^-6 of the largest magnitude, as test_half_precision.py.
    q = torch.randn(N, H, queries, E).to(dtype)
    q[:, :, 2] = 0.0
    k, v = torch.randn(N, H, S, E).to(dtype), torch.randn(N, H, S, EV).to(dtype)
    mask = torch.randn(queries, S)
    mask[2] = far
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    output = attn_torch.scaled_dot_product_attention(*leaves, attn_mask=mask)
    assert output.dtype == dtype
    grad_output = torch.randn_like(output)
    grads = torch.autograd.grad(output, leaves, grad_output)
    wide = [t.detach().double().requires_grad_(True) for t in leaves]
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(*wide, attn_mask=mask.double())
    expected_grads = torch.autograd.grad(expected, wide, grad_output.double())
    assert_relative(output, expected, 2.0**-6, "output")
    for name, mine, theirs in zip("qkv", grads, expected_grads):
        assert_relative(mine, theirs, 2.0**-6, f"d{name}")


@pytest.mark.parametrize("odd", ["key", "value"])
def test_float32_and_float64_mixed_are_refused_as_torch_refuses_them(odd):
    # Computed in float32, a float64 key or value beside a float32 query would lose its precision
    # silently; PyTorch raises, and so does its drop-in.
    tensors = {"query": torch.randn(N, H, L, E), "key": torch.randn(N, H, S, E),
               "value": torch.randn(N, H, S, EV)}
    tensors[odd] = tensors[odd].double()
    with pytest.raises(RuntimeError, match="same dtype"):
        F.scaled_dot_product_attention(**tensors)
    message = rf"{odd}: expected the dtype of query \(torch.float32\), got torch.float64"
    with pytest.raises(TypeError, match=message):
        attn_torch.scaled_dot_product_attention(**tensors)


# Scalar arguments of the wrong type: PyTorch's TypeError, word for word, on every route (the plain
# call, the general one that attn's extra arguments take, a KVCache's decode call); what PyTorch
# takes (ints, NumPy reals and 0-dim tensors as floats) runs as there.
WRONG_SCALARS = [
    ("is_causal", 1),
    ("is_causal", np.True_),
    ("is_causal", None),
    ("enable_gqa", None),
    ("enable_gqa", torch.tensor(True)),
    ("scale", "0.5"),
    ("scale", [0.5]),
    ("dropout_p", None),
    ("dropout_p", "0"),
]
TAKEN_SCALARS = [("scale", 1), ("scale", np.float32(0.5)), ("scale", torch.tensor(0.5)),
                 ("dropout_p", 0), ("dropout_p", np.float64(0.0))]


def torchs_type_error(name, value):
    query = torch.randn(1, 2, 3, 8)
    with pytest.raises(TypeError) as error:
        F.scaled_dot_product_attention(query, query, query, **{name: value})
    return str(error.value)


@pytest.mark.parametrize("name, value", WRONG_SCALARS)
@pytest.mark.parametrize("route", ["plain", "general", "cache"])
def test_scalar_arguments_of_the_wrong_type_are_torchs_type_errors(name, value, route):
    expected = torchs_type_error(name, value)
    assert f"argument '{name}'" in expected  # PyTorch names it: the comparison below means that
    query = torch.randn(1, 2, 3, 8)
    key = value_tensor = query
    extras = {"sinks": torch.zeros(2)} if route == "general" else {}
    if route == "cache":
        key = attn.KVCache(1, 2, 8, 4)
        key.append(query, query)
        value_tensor = None
    with pytest.raises(TypeError) as error:
        with torch.no_grad():
            attn_torch.scaled_dot_product_attention(query, key, value_tensor, **extras,
                                                    **{name: value})
    assert str(error.value) == expected


@pytest.mark.parametrize("name, value", TAKEN_SCALARS)
def test_scalar_arguments_torch_converts_run_as_there(name, value):
    query, key, values = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 4)
    expected = F.scaled_dot_product_attention(query, key, values, **{name: value})
    for extras in ({}, {"sinks": torch.full((2,), -1e4)}):  # plain route, general route
        output = attn_torch.scaled_dot_product_attention(query, key, values, **extras,
                                                         **{name: value})
        assert_relative(output, expected, OUTPUT_RTOL, f"{name}={value!r} {extras}")


@pytest.mark.parametrize(
    "name, value, expected",
    [("softcap", "30", "float"), ("causal", 1, "bool"), ("dropout", "0.1", "float"),
     ("alignment", 3, "str or None")],
)
def test_attns_own_scalar_arguments_are_named_alike(name, value, expected):
    query = torch.randn(1, 2, 3, 8)
    message = (rf"scaled_dot_product_attention\(\): argument '{name}' must be {expected}, not "
               rf"{type(value).__name__}")
    with pytest.raises(TypeError, match=message):
        attn_torch.scaled_dot_product_attention(query, query, query, **{name: value})


# --- the variants PyTorch lacks, against the float64 eager reference ---------------------------

HQ, HKV = 4, 2
VARIANTS = {
    "window_top_left": dict(window=(2, 1)),
    "window_bottom_right": dict(window=(2, 1), alignment="bottom-right"),
    "window_left_only_causal": dict(window=(3, None), is_causal=True),
    "window_right_only": dict(window=(-1, 0), alignment="bottom-right"),
    "alibi_top_left": dict(alibi_slopes=[0.5, 0.25, 0.125, 0.0625]),
    "alibi_bottom_right_causal": dict(
        alibi_slopes=[0.5, 0.25, 0.125, 0.0625], alignment="bottom-right", is_causal=True
    ),
    "softcap": dict(softcap=2.0, scale=1.5),
    "sinks": dict(sinks=True),
    "sinks_causal_bottom_right": dict(sinks=True, is_causal=True, alignment="bottom-right"),
    "valid_lens_per_batch": dict(valid_lens=[3, 6]),
    "valid_lens_per_query": dict(valid_lens=[[1, 2, 0, 4, 7], [7, 7, 3, 3, 5]]),
    "bottom_right_causal": dict(is_causal=True, alignment="bottom-right"),
    "everything": dict(
        window=(4, 0),
        alignment="bottom-right",
        alibi_slopes=[0.3, 0.2, 0.1, 0.05],
        softcap=3.0,
        sinks=True,
        valid_lens=[5, 6],
        float_mask=True,
        enable_gqa=True,
    ),
}


@pytest.mark.parametrize("queries, keys", [(5, 7), (7, 5)], ids=["L<S", "L>S"])
@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
def test_variants_match_the_reference(variant, queries, keys):
    options = dict(VARIANTS[variant])
    if "valid_lens" in options and queries != 5:
        per_query = torch.as_tensor(options["valid_lens"])
        if per_query.dim() == 2:  # one length per query: L rows
            options["valid_lens"] = per_query[:, :1].expand(-1, queries).clamp(max=keys)
        else:
            options["valid_lens"] = per_query.clamp(max=keys)
    elif "valid_lens" in options:
        options["valid_lens"] = torch.as_tensor(options["valid_lens"]).clamp(max=keys)
    gqa = options.get("enable_gqa", False)
    q = leaf(N, HQ, queries, E)
    k, v = leaf(N, HKV if gqa else HQ, keys, E), leaf(N, HKV if gqa else HQ, keys, EV)
    inputs, names = [q, k, v], ["query", "key", "value"]
    if options.pop("sinks", False):
        inputs.append(leaf(HQ))
        names.append("sinks")
    if options.pop("float_mask", False):
        inputs.append(leaf(N, 1, queries, keys))
        names.append("attn_mask")

    def split(extra):
        named = dict(zip(names[3:], extra))
        return named.get("sinks"), named.get("attn_mask")

    def mine(q, k, v, *extra):
        sinks, mask = split(extra)
        return attn_torch.scaled_dot_product_attention(q, k, v, mask, sinks=sinks, **options)

    def theirs(q, k, v, *extra):
        sinks, mask = split(extra)
        return reference_sdpa(q, k, v, mask, sinks=sinks, **options)

    compare(mine, theirs, inputs, names, reference_dtype=torch.float64)


def test_the_books_calls_keep_their_meaning():
    # causal=True is bottom-right; an integer tensor or list as attn_mask is valid_lens; dropout=
    # is dropout_p.
    q, k, v = leaf(N, 3, E), leaf(N, 5, E), leaf(N, 5, EV)
    lengths = torch.tensor([2, 4])
    expected = reference_sdpa(
        q.double(),
        k.double(),
        v.double(),
        is_causal=True,
        alignment="bottom-right",
        valid_lens=lengths,
    )
    for call in (
        lambda: attn_torch.scaled_dot_product_attention(q, k, v, lengths, causal=True),
        lambda: attn_torch.scaled_dot_product_attention(q, k, v, [2, 4], causal=True, dropout=0.0),
        lambda: attn_torch.scaled_dot_product_attention(
            q, k, v, valid_lens=lengths, is_causal=True, alignment="bottom-right"
        ),
    ):
        assert_relative(call(), expected, OUTPUT_RTOL, "output")
    with pytest.raises(ValueError, match="causal"):
        attn_torch.scaled_dot_product_attention(q, k, v, causal=True, is_causal=True)
    with pytest.raises(ValueError, match="valid_lens"):
        attn_torch.scaled_dot_product_attention(q, k, v, lengths, valid_lens=lengths)
    with pytest.raises(TypeError, match="query"):
        attn_torch.scaled_dot_product_attention(q.detach().long(), k, v)


def test_lengths_given_as_attn_mask_are_named_so_in_errors():
    """An integer attn_mask is read as valid_lens (the book's call); where those lengths do not
    fit, the error names attn_mask as the caller gave it (a PyTorch user's integer (L, S) mask
    was reported as a bad valid_lens, an argument they never passed), in attn.torch's call,
    attn's own and the KV-cache call alike; lengths given as valid_lens keep their name."""
    leaves = leaf(N, H, L, E), leaf(N, H, S, E), leaf(N, H, S, EV)
    given = r"^attn_mask \(integers, read as valid_lens\): "
    # attn's own function refuses tensors that require grad (it runs outside autograd).
    for function, (q, k, v) in (
        (attn_torch.scaled_dot_product_attention, leaves),
        (attn.scaled_dot_product_attention, [x.detach() for x in leaves]),
    ):
        with pytest.raises(attn.ShapeError, match=given + "valid_lens: expected shape"):
            function(q, k, v, attn_mask=torch.full((L, S), 2, dtype=torch.int32))
        with pytest.raises(ValueError, match=given + ".*shape \\(B,\\) or \\(B, n\\)"):
            function(q, k, v, attn_mask=torch.ones(N, 1, L, S, dtype=torch.int64))
        with pytest.raises(ValueError, match=given + r"valid_lens\[0\]: expected a valid length"):
            function(q, k, v, [S + 1, 2])
        with pytest.raises(ValueError, match=r"^valid_lens\[0\]: expected a valid length"):
            function(q, k, v, valid_lens=[S + 1, 2])
    q, k, v = leaves
    with pytest.raises(TypeError, match=given + "expected a tensor, an array or a"):
        attn_torch.scaled_dot_product_attention(q, k, v, [1, [2]])
    cache = attn.KVCache(N, H, E, S, value_dim=EV)
    cache.append(k.detach(), v.detach())
    with pytest.raises(ValueError, match=given + "valid_lens: not taken with a KV cache"):
        attn.scaled_dot_product_attention(q.detach()[:, :, :1], cache, None, [3, 3])


def test_a_tokenizers_attention_mask_as_attn_mask_warns():
    """A tokenizer's attention_mask, (B, S) of 0s and 1s, passed as attn_mask would be read as
    per-query valid lengths (each query seeing at most its first key) where PyTorch refuses it: a
    warning says so, in both calls, and lengths that are not all 0 or 1 give none."""
    q, k, v = (torch.randn(N, H, L, E) for _ in range(3))  # self-attention: S = L
    tokens = torch.ones(N, L, dtype=torch.int64)
    tokens[1, 3:] = 0
    for function, mask in (
        (attn_torch.scaled_dot_product_attention, tokens),
        (attn.scaled_dot_product_attention, tokens.numpy()),
    ):
        with pytest.warns(UserWarning, match="as a tokenizer's attention_mask is"):
            function(q, k, v, mask)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            function(q, k, v, mask * 2)  # lengths 2 and 0: the book's call, no warning
            function(q, k, v, [1, 0])  # per batch element, not per query


def test_dropout_follows_torch_manual_seed_and_backward_replays_it():
    q, k = leaf(N, H, 16, E), leaf(N, H, 20, E)
    v = leaf(N, H, 20, EV)
    torch.manual_seed(3)
    first = attn_torch.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    torch.manual_seed(3)
    again = attn_torch.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    other = attn_torch.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    assert torch.equal(first, again) and not torch.equal(first, other)
    # The output is linear in the values for fixed dropout multipliers, so with the same seed
    # <out(v + δ) − out(v), g> = <δ, dL/dv> up to float32 rounding: the backward pass applied the
    # forward pass's multipliers.
    grad_output = torch.randn_like(first)
    (grad_v,) = torch.autograd.grad(first, [v], grad_output)
    delta = torch.randn_like(v)
    torch.manual_seed(3)
    shifted = attn_torch.scaled_dot_product_attention(q, k, v + delta, dropout_p=0.4)
    change = ((shifted - first) * grad_output).sum().item()
    # rtol: both sides sum ~2000 float32 products of O(1) and the left one is a difference of two
    # outputs, which loses about three digits of float32's seven.
    np.testing.assert_allclose(change, (delta * grad_v).sum().item(), rtol=1e-4)


# --- torch.compile ---------------------------------------------------------------------------


def test_torch_compile_fullgraph_forward_and_backward_match_eager():
    torch._dynamo.reset()

    def block(q, k, v, mask, sinks):
        out = attn_torch.scaled_dot_product_attention(
            q * 1.5, k, v, mask, enable_gqa=True, sinks=sinks, window=(3, 0)
        )
        return torch.tanh(out).sum(dim=-1)

    compiled = torch.compile(block, fullgraph=True)
    q, k, v = leaf(N, HQ, L, E), leaf(N, HKV, S, E), leaf(N, HKV, S, EV)
    mask, sinks = leaf(N, 1, L, S), leaf(HQ)
    inputs = [q, k, v, mask, sinks]
    eager = block(*inputs)
    compiled(*inputs)  # the first call after compiling runs under a dispatch mode of PyTorch's
    result = compiled(*inputs)
    with torch.no_grad():  # inference: the operator's Autograd kernel at every call
        inference = [compiled(*inputs) for _ in range(2)]
    for x in inference:  # another graph: Inductor may fuse the element-wise ops differently
        assert_relative(x, result, OUTPUT_RTOL, "inference output")
    grad_output = torch.randn_like(eager)
    eager_grads = torch.autograd.grad(eager, inputs, grad_output)
    compiled_grads = torch.autograd.grad(result, inputs, grad_output)
    # Same attn operators on both sides; only the surrounding element-wise ops may be fused and
    # rounded differently by Inductor.
    assert_relative(result, eager, OUTPUT_RTOL, "output")
    for name, mine, theirs in zip(["q", "k", "v", "mask", "sinks"], compiled_grads, eager_grads):
        assert_relative(mine, theirs, OUTPUT_RTOL, f"d {name}")



def test_torch_export_with_dynamic_lengths_saves_loads_and_matches_torch(tmp_path):
    # Inference engines take models through torch.export (ExecuTorch, AOTInductor): the graph
    # must hold attn's operator, accept other query lengths than the traced one, and survive
    # torch.export.save / load in a process that imports attn.torch.
    class Block(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return attn_torch.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v = torch.randn(N, H, L, E), torch.randn(N, H, S, E), torch.randn(N, H, S, EV)
    mask = torch.rand(L, S) > 0.3
    queries = torch.export.Dim("queries", min=2, max=4096)
    exported = torch.export.export(
        Block(), (q, k, v, mask),
        dynamic_shapes={"q": {2: queries}, "k": None, "v": None, "mask": {0: queries}},
    )
    assert "torch.ops.attn.sdpa" in exported.graph_module.code
    path = tmp_path / "block.pt2"
    torch.export.save(exported, str(path))
    loaded = torch.export.load(str(path))
    for length in (L, 33):  # the traced length and another
        q, mask = torch.randn(N, H, length, E), torch.rand(length, S) > 0.3
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        for program in (exported, loaded):
            assert_relative(program.module()(q, k, v, mask), expected, OUTPUT_RTOL, "exported")

def test_operators_pass_opcheck():
    # torch.library's own checks of the custom operators: schema, fake (meta) implementation,
    # autograd registration.
    q, k, v = leaf(N, HQ, L, E), leaf(N, HKV, S, E), leaf(N, HKV, S, EV)
    mask, sinks = leaf(N, 1, L, S), leaf(HQ)
    arguments = (
        q,
        k,
        v,
        mask,
        None,
        None,
        sinks,
        None,
        0.0,
        True,
        None,
        True,
        2,
        0,
        5.0,
        "top-left",
        False,
    )
    torch.library.opcheck(torch.ops.attn.sdpa.default, arguments)
    # bf16 inputs with the output's rounding residuals (the autograd kernels ask for them).
    half = tuple(t.detach().bfloat16().requires_grad_() for t in (q, k, v))
    torch.library.opcheck(torch.ops.attn.sdpa.default, (*half, *arguments[3:-1], True))


def test_the_operators_autograd_kernel_skips_the_redispatch_only_where_nothing_lies_below():
    # attn::sdpa's Autograd kernel calls the CPU kernel itself where nothing but it lies below
    # (a compiled graph's calls): the same result bit for bit as the redispatch, which must still
    # run under a dispatch mode (the mode sees the operator) and FakeTensorMode (a fake result).
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    q, k, v = torch.randn(N, HQ, L, E), torch.randn(N, HKV, S, E), torch.randn(N, HKV, S, EV)
    options = (None, None, None, None, None, 0.0, True, None, True, 2, 0, 5.0, "top-left", False)
    body = attn_torch._forward_operator(q, k, v, *options)
    for grad_mode in (True, False):
        with torch.set_grad_enabled(grad_mode):
            direct = torch.ops.attn.sdpa.default(q, k, v, *options)
            with Recording():
                recorded = torch.ops.attn.sdpa.default(q, k, v, *options)
        for name, got in (("direct", direct), ("under a mode", recorded)):
            assert all(torch.equal(a, b) for a, b in zip(got, body)), (name, grad_mode)
    assert seen == [torch.ops.attn.sdpa.default] * 2
    with FakeTensorMode() as fake_mode:
        fake = torch.ops.attn.sdpa.default(*(fake_mode.from_tensor(x) for x in (q, k, v)),
                                           *options)
    assert [tuple(x.shape) for x in fake] == [(N, HQ, L, EV), (N, HQ, L), (0,)]
    assert all(type(x).__name__ == "FakeTensor" for x in fake)


def test_the_operators_refuse_a_second_derivative():
    # Through the operators (as torch.compile and dispatch modes take them), a gradient made with
    # create_graph=True can't be differentiated again: a clear error, not a silent zero.
    q, k, v = leaf(N, H, L, E), leaf(N, H, S, E), leaf(N, H, S, EV)
    output = torch.ops.attn.sdpa.default(
        q, k, v, None, None, None, None, None, 0.0, False, None, False, -1, -1, None, "top-left",
        False
    )[0]
    expected = attn_torch.scaled_dot_product_attention(q, k, v)
    (d_query,) = torch.autograd.grad(output.square().sum(), q, create_graph=True)
    (expected_d_query,) = torch.autograd.grad(expected.square().sum(), q)
    assert torch.equal(d_query, expected_d_query)
    with pytest.raises(RuntimeError, match="no second derivative"):
        d_query.sum().backward()


SECOND_DERIVATIVE_CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "window": dict(window=(2, 0)),
    "softcap": dict(softcap=20.0),
    "valid_lens": dict(valid_lens=torch.tensor([3, 7])),
    "float_mask": dict(attn_mask="float"),
    "sinks": dict(sinks="sinks"),
    "bfloat16": dict(dtype=torch.bfloat16),
}


@pytest.mark.parametrize("case", sorted(SECOND_DERIVATIVE_CASES))
@pytest.mark.parametrize("wrt", ["q", "k", "v"])
def test_a_second_derivative_is_refused_even_where_grad_output_needs_none(case, wrt):
    # output.sum()'s grad_output requires no grad, where once_differentiable attached no error:
    # the gradient came back with no grad_fn and its (nonzero) second derivative silently zero.
    # Now the first derivative is the usual one and differentiating it again raises.
    options = dict(SECOND_DERIVATIVE_CASES[case])
    dtype = options.pop("dtype", torch.float32)
    q, k, v = (torch.randn(N, H, n, e, dtype=dtype) for n, e in ((L, E), (S, E), (S, EV)))
    if options.get("attn_mask") == "float":
        options["attn_mask"] = torch.randn(N, H, L, S)
    if options.get("sinks") == "sinks":
        options["sinks"] = torch.randn(H)
    target = dict(q=q, k=k, v=v)[wrt].requires_grad_(True)
    output = attn_torch.scaled_dot_product_attention(q, k, v, **options)
    (expected,) = torch.autograd.grad(output.sum(), target)
    output = attn_torch.scaled_dot_product_attention(q, k, v, **options)
    (gradient,) = torch.autograd.grad(output.sum(), target, create_graph=True)
    assert gradient.dtype == dtype and torch.equal(gradient, expected)
    assert gradient.requires_grad
    with pytest.raises(RuntimeError, match="attn: double backward is not supported"):
        torch.autograd.grad(gradient.square().sum(), target)


def test_first_order_training_compiles_after_the_second_derivative_fix():
    # The refusal runs only where the backward records a graph: a compiled training step gives
    # the eager gradients.
    q, k, v = leaf(N, H, L, E), leaf(N, H, S, E), leaf(N, H, S, EV)
    call = lambda q, k, v: attn_torch.scaled_dot_product_attention(  # noqa: E731
        q, k, v, window=(2, 0))
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    eager_gradients = torch.autograd.grad(call(q, k, v).square().sum(), (q, k, v))
    compiled_gradients = torch.autograd.grad(compiled(q, k, v).square().sum(), (q, k, v))
    for name, mine, theirs in zip("qkv", compiled_gradients, eager_gradients):
        assert_relative(mine, theirs, GRADIENT_RTOL, f"compiled d {name}")


# --- torch.func transforms ------------------------------------------------------------------------
# The operators' autograd kernels apply Functions without setup_context, which
# torch.func refuses; under a transform attn runs its operators through Functions that have one.


def func_case():
    """Grouped-head q (N, H, L, E), k and v (N, 2, S, E), and the two calls (attn's, PyTorch's)
    with a bool mask in which every query sees a key, as functions of (q, k, v)."""
    q = torch.randn(N, H, L, E)
    k, v = torch.randn(N, 2, S, E), torch.randn(N, 2, S, E)
    mask = torch.rand(L, S) < 0.7
    mask[:, 0] = True

    def call(function):
        return lambda x, k, v: function(x, k, v, attn_mask=mask, enable_gqa=True)

    return (q, k, v), call(attn_torch.scaled_dot_product_attention), call(
        F.scaled_dot_product_attention
    )


@pytest.mark.parametrize("transform", ["grad", "vjp", "jacrev", "vmap", "per_sample_grad"])
def test_torch_func_transforms_match_pytorchs(transform):
    (q, k, v), mine, theirs = func_case()

    def apply(function):
        def loss(x, k, v):
            return (function(x, k, v) ** 2).sum()

        if transform == "grad":
            return torch.func.grad(loss, argnums=(0, 1, 2))(q, k, v)
        if transform == "vjp":
            output, pullback = torch.func.vjp(function, q, k, v)
            return pullback(torch.ones_like(output))
        if transform == "jacrev":
            return (torch.func.jacrev(lambda x: function(x, k, v)[0, 1, 2])(q),)
        if transform == "vmap":  # each batch element (H, L, E) against its own keys and values
            return (torch.func.vmap(function)(q, k, v),)
        return torch.func.vmap(torch.func.grad(loss, argnums=(0, 1, 2)))(q, k, v)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # vmap's per-sample fallback for attn's operators
        for index, (got, expected) in enumerate(zip(apply(mine), apply(theirs))):
            assert_relative(got, expected, GRADIENT_RTOL, f"{transform} {index}")


@pytest.mark.parametrize(
    "case",
    ["whole", "shared_keys", "batched_mask", "batch_mask", "valid_lens", "mask_gradient", "rank_5"],
)
def test_vmap_matches_a_loop_over_samples(case, monkeypatch):
    # attn's vmap rules make one call for the batch where every tensor is batched alike and
    # per-sample calls otherwise; either way the result is each sample's call, here against a
    # loop (PyTorch's function, or attn's for valid lengths, which PyTorch lacks). Gradients too
    # (vmap of grad), and no warning: vmap's own fallback warns.
    calls = []
    real_forward = attn_torch._extension._sdpa_forward
    monkeypatch.setattr(attn_torch._extension, "_sdpa_forward",
                        lambda *a, **k: calls.append(1) or real_forward(*a, **k))
    q = torch.randn(3, N, H, L, E, requires_grad=True)
    k, v = torch.randn(3, N, 2, S, E), torch.randn(3, N, 2, S, E)
    mask = torch.randn(L, S)
    extra, in_dims, function = {}, (0, 0, 0, None), F.scaled_dot_product_attention
    if case == "shared_keys":
        k, v, in_dims = k[0], v[0], (0, None, None, None)
    elif case == "batched_mask":
        mask, in_dims = torch.randn(3, L, S), (0, 0, 0, 0)
    elif case == "batch_mask":  # a mask per batch element: the samples' batches cannot merge
        mask = torch.randn(N, 1, L, S)
    elif case == "valid_lens":
        extra = {"valid_lens": torch.tensor([3, 7])}
        function = attn_torch.scaled_dot_product_attention
    elif case == "mask_gradient":
        mask = mask.requires_grad_(True)
    elif case == "rank_5":
        q, k, v = (x.unsqueeze(1).expand(3, 2, *x.shape[1:]).contiguous() for x in (q, k, v))
        q = q.detach().requires_grad_(True)

    def attend(call):
        return lambda x, k, v, m: call(x, k, v, attn_mask=m, enable_gqa=True, **extra)

    def loss(call):
        return lambda x, k, v, m: (attend(call)(x, k, v, m) ** 2).sum()

    def sample(x, i, dim):
        return x if dim is None else x[i]

    arguments = (q, k, v, mask)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = torch.func.vmap(attend(attn_torch.scaled_dot_product_attention), in_dims)(*arguments)
        assert len(calls) == (1 if case in ("whole", "mask_gradient") else 3), "whole or per sample"
        got_grads = torch.func.vmap(
            torch.func.grad(loss(attn_torch.scaled_dot_product_attention), argnums=(0, 3)),
            in_dims,
        )(*arguments)
    expected = torch.stack([
        attend(function)(*(sample(x, i, d) for x, d in zip(arguments, in_dims))) for i in range(3)
    ])
    assert_relative(got, expected, OUTPUT_RTOL, "output")
    for i in range(3):
        parts = [sample(x, i, d).detach().requires_grad_(True) for x, d in zip(arguments, in_dims)]
        grads = torch.autograd.grad(loss(function)(*parts), (parts[0], parts[3]), allow_unused=True)
        assert_relative(got_grads[0][i], grads[0], GRADIENT_RTOL, f"query grad {i}")
        if case == "mask_gradient":
            assert_relative(got_grads[1][i], grads[1], GRADIENT_RTOL, f"mask grad {i}")


def test_vmap_refuses_dropout_unless_told_its_randomness():
    q = torch.randn(3, N, H, L, E)
    attend = lambda x: attn_torch.scaled_dot_product_attention(x, x, x, dropout_p=0.5)  # noqa: E731
    with pytest.raises(RuntimeError, match="random operation"):
        torch.func.vmap(attend)(q)
    different = torch.func.vmap(attend, randomness="different")(q)
    same = torch.func.vmap(attend, randomness="same")(q[:1].expand(3, *q.shape[1:]))
    assert not torch.equal(different[0], different[1]) and torch.equal(same[0], same[1])


def test_torch_func_refuses_a_second_derivative():
    (q, k, v), mine, _ = func_case()
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.func.grad(lambda x: torch.func.grad(lambda y: mine(y, k, v).sum())(x).sum())(q)


# --- inference without the operator's dispatch -------------------------------------------------


def test_the_plain_calls_route_test_agrees_with_the_general_one():
    # _eager_plain is _eager for three plain tensors, written for its cost: the same answer with
    # grad on and off, inputs requiring grad or not, under a user's dispatch mode, FakeTensorMode
    # (entered: its infra slot, not the user's stack), a torch.func transform and jit tracing.
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    plain = [torch.randn(N, H, L, E), torch.randn(N, H, S, E), torch.randn(N, H, S, EV)]
    leaves = [t.clone().requires_grad_() for t in plain]
    answers = []

    def both(tensors):
        answers.append((attn_torch._eager_plain(*tensors), attn_torch._eager(*tensors)))

    for tensors in (plain, leaves, [plain[0], leaves[1], plain[2]]):
        both(tensors)
        with torch.no_grad():
            both(tensors)
        with Passthrough():
            both(tensors)
        with FakeTensorMode():
            both(tensors)
    torch.vmap(lambda q: both([q, plain[1][0], plain[2][0]]) or q)(plain[0])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`torch.jit.trace` is deprecated", FutureWarning)
        torch.jit.trace(lambda q: both([q, plain[1], plain[2]]) or q * 2, (plain[0],),
                        check_trace=False)
    assert all(fast == general for fast, general in answers), answers
    # Per input set: grad on, no_grad, the user's mode, FakeTensorMode; then vmap and tracing.
    assert [fast for fast, _ in answers] == (
        ["inference", "inference", None, None] + ["training", "inference", None, None] * 2
        + [None, None]
    )


def test_inference_calls_skip_the_operator_and_match_it(monkeypatch):
    # Where autograd records nothing and nothing traces, attn.torch calls the operator's
    # implementation directly (its dispatch cost a decode step ~12 µs a layer): the same result,
    # bit for bit, in every such case; the operator itself runs whenever autograd, a dispatch mode
    # (FakeTensor here) or torch.compile is involved.
    q, k, v = (torch.randn(N, HQ, L, E), torch.randn(N, HKV, S, E), torch.randn(N, HKV, S, EV))
    mask, sinks = torch.randn(N, 1, L, S), torch.randn(HQ)
    options = dict(enable_gqa=True, sinks=sinks, window=(3, 0), softcap=4.0)
    through_operator = torch.ops.attn.sdpa.default(
        q, k, v, mask, None, None, sinks, None, 0.0, False, None, True, 3, 0, 4.0, "top-left",
        False
    )[0]
    calls = []
    original = attn_torch._sdpa
    monkeypatch.setattr(attn_torch, "_sdpa", lambda *a: calls.append(1) or original(*a))
    with torch.no_grad():
        assert torch.equal(attn_torch.scaled_dot_product_attention(q, k, v, mask, **options),
                           through_operator)
    assert torch.equal(attn_torch.scaled_dot_product_attention(q, k, v, mask, **options),
                       through_operator)  # grad mode on, nothing requires grad
    assert calls == [], "inference went through the operator"

    # Every dtype the call takes (bf16 comes back from attn as a tensor, fp16 and fp32 as NumPy
    # arrays), and inputs transposed as transformers passes them: the operator's result exactly.
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        args = (q.to(dtype), k.to(dtype), v.to(dtype))
        with torch.no_grad():
            fast = attn_torch.scaled_dot_product_attention(*args, enable_gqa=True)
        computed = [a.float() if dtype == torch.float64 else a for a in args]
        slow = torch.ops.attn.sdpa.default(
            *computed, None, None, None, None, None, 0.0, False, None, True, -1, -1, None,
            "top-left", False
        )[0].to(dtype)
        assert fast.dtype == dtype and torch.equal(fast, slow), dtype
    transposed = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]
    with torch.no_grad():
        assert torch.equal(
            attn_torch.scaled_dot_product_attention(*transposed, mask, **options), through_operator
        )
    assert calls == []

    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = attn_torch.scaled_dot_product_attention(
            mode.from_tensor(q), mode.from_tensor(k), mode.from_tensor(v), enable_gqa=True
        )
    assert calls == [1] and fake.shape == (N, HQ, L, EV)
    # A torch.func transform: the operator (the direct call cannot export vmap's batched
    # tensors), at vmap's level and then once more, on the whole batch, inside its vmap rule.
    with torch.no_grad():
        mapped = torch.vmap(lambda q, k, v: attn_torch.scaled_dot_product_attention(
            q, k, v, enable_gqa=True))(q, k, v)
    assert calls == [1, 1, 1]
    expected = attn_torch.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert_relative(mapped, expected, OUTPUT_RTOL, "vmap output")


def test_eager_autograd_skips_the_operators_and_matches_them(monkeypatch):
    # Where autograd records and nothing traces, attn.torch runs _EagerSdpa (the operators'
    # bodies without their dispatch, whose autograd cost ~100 µs a pass): the output and every
    # gradient (query, key, value, a float mask, sinks) are the operators', bit for bit, with
    # grouped heads, window, soft cap, dropout and half-precision inputs.
    calls = []
    for name in ("_sdpa", "_sdpa_backward"):
        original = getattr(attn_torch, name)
        monkeypatch.setattr(attn_torch, name,
                            lambda *a, _op=original, _name=name: calls.append(_name) or _op(*a))
    eager = attn_torch._eager

    def run(dtype, dropout_p, through_operator):
        monkeypatch.setattr(attn_torch, "_eager",
                            (lambda *tensors: None) if through_operator else eager)
        torch.manual_seed(7)
        q, k, v = leaf(N, HQ, L, E), leaf(N, HKV, S, E), leaf(N, HKV, S, EV)
        mask, sinks = leaf(N, 1, L, S), leaf(HQ)
        inputs = [q, k, v, mask, sinks]
        output = attn_torch.scaled_dot_product_attention(
            q.to(dtype), k.to(dtype), v.to(dtype), mask, dropout_p, enable_gqa=True, sinks=sinks,
            window=(3, 0), softcap=4.0)
        gradients = torch.autograd.grad(output, inputs, torch.randn_like(output))
        return output, gradients

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for dropout_p in (0.0, 0.3):
            calls.clear()
            output, gradients = run(dtype, dropout_p, through_operator=False)
            assert calls == [], f"{dtype}, dropout {dropout_p}: the eager call used {calls}"
            expected, expected_gradients = run(dtype, dropout_p, through_operator=True)
            assert calls == ["_sdpa", "_sdpa_backward"]
            assert output.dtype == dtype and torch.equal(output, expected), (dtype, dropout_p)
            for name, mine, theirs in zip(["q", "k", "v", "mask", "sinks"], gradients,
                                          expected_gradients):
                assert mine.dtype == theirs.dtype and torch.equal(mine, theirs), (
                    f"d {name}, {dtype}, dropout {dropout_p}")


def test_plain_inference_calls_with_a_mask_take_attns_function_and_match_the_operator(
    monkeypatch,
):
    # transformers' padding and static-cache masks (bool) and causal float masks (float32, or
    # the model's float16 or bfloat16) reach attn's own function directly in inference, with the
    # operator's result bit for bit; a float64 mask, or one that requires grad, takes the
    # general path.
    q, k, v = torch.randn(N, HQ, L, E), torch.randn(N, HKV, S, E), torch.randn(N, HKV, S, EV)
    padding = torch.ones(N, 1, 1, S, dtype=torch.bool)
    padding[1, ..., :2] = False
    causal = torch.zeros(L, S).masked_fill(
        ~torch.ones(L, S, dtype=torch.bool).tril(S - L), float("-inf"))
    function, direct = attn_torch._sdpa_function, []
    monkeypatch.setattr(attn_torch, "_sdpa_function",
                        lambda *a: direct.append(1) or function(*a))
    for mask, taken in ((padding, True), (causal, True), (causal.bfloat16(), True),
                        (causal.half(), True), (causal.double(), False),
                        (causal.clone().requires_grad_(), False)):
        direct.clear()
        with torch.no_grad():
            output = attn_torch.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True)
            expected = torch.ops.attn.sdpa.default(
                q, k, v, mask.float() if mask.is_floating_point() else mask, None, None, None,
                None, 0.0, False, None, True, -1, -1, None, "top-left", False)[0]
        assert direct == ([1] if taken else []), (mask.dtype, mask.requires_grad)
        assert torch.equal(output, expected), mask.dtype


def test_the_books_causal_beside_an_explicit_top_left_alignment_is_refused():
    # As attn.scaled_dot_product_attention: causal=True is aligned bottom-right, so an explicit
    # alignment="top-left" beside it is refused rather than ignored; None or "bottom-right" agree.
    q, k, v = torch.randn(N, HQ, L, E), torch.randn(N, HKV, S, E), torch.randn(N, HKV, S, EV)
    with pytest.raises(ValueError, match=r'alignment: causal=True is the book\'s causal, aligned '
                       r'bottom-right, got alignment="top-left" beside it'):
        attn_torch.scaled_dot_product_attention(q, k, v, enable_gqa=True, causal=True,
                                                alignment="top-left")
    expected = attn_torch.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True,
                                                       alignment="bottom-right")
    for alignment in (None, "bottom-right"):
        assert torch.equal(attn_torch.scaled_dot_product_attention(
            q, k, v, enable_gqa=True, causal=True, alignment=alignment), expected)
    assert torch.equal(
        attn_torch.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True,
                                                alignment=None),
        attn_torch.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True))


def test_bottom_right_alignment_takes_attns_function_where_nothing_is_causal(monkeypatch):
    # Decoding code that passes alignment="bottom-right" for every step: a step that is not causal
    # (one new query) computes the same for either alignment and reaches attn's own function, with
    # the operator's result bit for bit; a causal one keeps the general path and its bottom-right
    # diagonal (L = 5 queries before S = 7 keys: not the top-left one), and an alignment attn does
    # not know is refused.
    q, k, v = torch.randn(N, HQ, L, E), torch.randn(N, HKV, S, E), torch.randn(N, HKV, S, EV)
    function, direct = attn_torch._sdpa_function, []
    monkeypatch.setattr(attn_torch, "_sdpa_function",
                        lambda *a: direct.append(1) or function(*a))
    for dtype in (torch.float32, torch.bfloat16):
        for is_causal, taken in ((False, True), (True, False)):
            direct.clear()
            qt, kt, vt = (x.to(dtype) for x in (q, k, v))
            with torch.no_grad():
                output = attn_torch.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=is_causal, enable_gqa=True, alignment="bottom-right")
                expected = torch.ops.attn.sdpa.default(
                    qt, kt, vt, None, None, None, None, None, 0.0, is_causal, None, True, -1, -1,
                    None, "bottom-right", False)[0]
            assert direct == ([1] if taken else []), (dtype, is_causal)
            assert torch.equal(output, expected), (dtype, is_causal)
    with torch.no_grad():
        top_left = attn_torch.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                           enable_gqa=True)
        bottom_right = attn_torch.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True, alignment="bottom-right")
    assert not torch.allclose(top_left, bottom_right)
    with pytest.raises(ValueError, match="alignment"):
        attn_torch.scaled_dot_product_attention(q, k, v, enable_gqa=True, alignment="bottom")


def test_plain_training_calls_take_the_lean_function_and_match_the_operators(monkeypatch):
    # The plain call under autograd (query, key and value of one dtype attn computes as it is;
    # only a bool, float32 or half mask that needs no gradient, is_causal, scale and enable_gqa)
    # runs _PlainSdpa, whose output and gradients are the operators', bit for bit, for float32,
    # bfloat16 and float16, causal, a scale, masks (padding as bools, a causal pattern with a bias
    # as float32 and in the inputs' dtype) and grouped heads, on inputs transposed as
    # transformers passes them too; a second-order gradient is refused, not silently wrong.
    padding = torch.ones(N, 1, 1, S, dtype=torch.bool)
    padding[0, ..., S - 3:] = False
    biased = torch.randn(N, HQ, L, S).masked_fill(
        ~torch.ones(L, S, dtype=torch.bool).tril(S - L), float("-inf"))
    applied = []
    original_apply = attn_torch._PlainSdpa.apply
    monkeypatch.setattr(attn_torch._PlainSdpa, "apply",
                        lambda *a: applied.append(1) or original_apply(*a))
    eager, eager_plain = attn_torch._eager, attn_torch._eager_plain

    def run(dtype, options, transposed, through_operator):
        monkeypatch.setattr(attn_torch, "_eager",
                            (lambda *tensors: None) if through_operator else eager)
        monkeypatch.setattr(attn_torch, "_eager_plain",
                            (lambda *tensors: None) if through_operator else eager_plain)
        torch.manual_seed(11)
        if transposed:
            leaves = [leaf(N, L, HQ, E), leaf(N, S, HKV, E), leaf(N, S, HKV, EV)]
            q, k, v = (x.to(dtype).transpose(1, 2) for x in leaves)
        else:
            leaves = [leaf(N, HQ, L, E), leaf(N, HKV, S, E), leaf(N, HKV, S, EV)]
            q, k, v = (x.to(dtype) for x in leaves)
        output = attn_torch.scaled_dot_product_attention(q, k, v, enable_gqa=True, **options)
        return output, torch.autograd.grad(output, leaves, torch.randn_like(output))

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for options in ({}, {"is_causal": True}, {"scale": 0.3, "is_causal": True},
                        {"attn_mask": padding}, {"attn_mask": biased, "scale": 0.3},
                        {"attn_mask": biased.to(dtype)}):
            for transposed in (False, True):
                applied.clear()
                output, gradients = run(dtype, options, transposed, through_operator=False)
                assert applied == [1], (dtype, options)
                expected, expected_gradients = run(dtype, options, transposed,
                                                   through_operator=True)
                assert applied == [1], "the operator route took the lean function"
                assert output.dtype == dtype and torch.equal(output, expected), (dtype, options)
                for name, mine, theirs in zip("qkv", gradients, expected_gradients):
                    assert mine.dtype == theirs.dtype and torch.equal(mine, theirs), (
                        f"d {name}, {dtype}, {options}")

    monkeypatch.setattr(attn_torch, "_eager", eager)
    monkeypatch.setattr(attn_torch, "_eager_plain", eager_plain)
    applied.clear()
    q, k, v = leaf(N, H, L, E), leaf(N, H, S, E), leaf(N, H, S, EV)
    output = attn_torch.scaled_dot_product_attention(q, k, v)
    assert applied == [1]
    (d_query,) = torch.autograd.grad(output.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        d_query.sum().backward()


FOLLOWS_TORCH_THREADS = r"""
import torch
import attn
import attn.torch as attn_torch

def leaf(*shape):
    return torch.randn(*shape).requires_grad_()

q, k, v = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4)
cache = attn.KVCache(1, 2, 4, 8)
cache.append(k.numpy(), v.numpy())

def forward_then_backward(call):
    inputs = [leaf(1, 2, 8, 4) for _ in range(3)]
    output = call(*inputs)
    return lambda: output.sum().backward()

layer = attn_torch.DotProductAttention(0.0)
inference = {
    "plain inference": lambda: attn_torch.scaled_dot_product_attention(q, k, v),
    "general inference": lambda: attn_torch.scaled_dot_product_attention(q, k, v, window=(2, 0)),
    "cache": lambda: attn_torch.scaled_dot_product_attention(q, cache, None),
}
training = {
    "plain training": attn_torch.scaled_dot_product_attention,
    "general training": lambda *t: attn_torch.scaled_dot_product_attention(*t, window=(2, 0)),
    "layer": lambda *t: layer(*(x.flatten(0, 1) for x in t)),
}
# Each call after a count other than the one attn has: 3 -> 1 -> 2 (inference), 3 -> 1 -> 3
# (a forward, then its backward).
for name, call in inference.items():
    torch.set_num_threads(3)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with torch.no_grad():
            call()
        print(name, "forward", attn.get_num_threads())
for name, call in training.items():
    torch.set_num_threads(1)
    backward = forward_then_backward(call)
    print(name, "forward", attn.get_num_threads())
    torch.set_num_threads(3)
    backward()
    print(name, "backward", attn.get_num_threads())
attn.set_num_threads(2)
torch.set_num_threads(1)
attn_torch.scaled_dot_product_attention(q, k, v)
print("chosen", "forward", attn.get_num_threads())
"""


def test_calls_use_torchs_thread_count_until_attn_sets_its_own():
    # A fresh interpreter: set_num_threads's choice holds for the rest of a process, and other
    # tests make it. Each route (plain and general, inference and autograd, the cache's decode
    # call, a layer) takes the count torch.set_num_threads gave just before it, a backward the
    # count at its own time; after attn.set_num_threads(2) torch's count no longer moves attn's.
    result = subprocess.run([sys.executable, "-c", FOLLOWS_TORCH_THREADS], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    expected = []
    for name in ("plain inference", "general inference", "cache"):
        expected += [f"{name} forward 1", f"{name} forward 2"]
    for name in ("plain training", "general training", "layer"):
        expected += [f"{name} forward 1", f"{name} backward 3"]
    expected.append("chosen forward 2")
    assert lines == expected


LEAVES_TORCHS_THREADS = r"""
import numpy as np
import torch
import attn
import attn.torch as attn_torch

attn.set_num_threads(2)
torch.set_num_threads(1)
q = torch.randn(1, 2, 8, 4)
grads = [torch.randn(1, 2, 8, 4).requires_grad_() for _ in range(3)]
cache = attn.KVCache(1, 2, 4, 8)
cache.append(q.numpy(), q.numpy())
layer = attn_torch.DotProductAttention(0.0)
calls = {
    "numpy function": lambda: attn.scaled_dot_product_attention(q.numpy(), q.numpy(), q.numpy()),
    "masked_softmax": lambda: attn.masked_softmax(np.ones((2, 3, 4), np.float32), [2, 3]),
    "plain": lambda: attn_torch.scaled_dot_product_attention(q, q, q),
    "general": lambda: attn_torch.scaled_dot_product_attention(q, q, q, window=(2, 0)),
    "cache": lambda: attn_torch.scaled_dot_product_attention(q, cache, None),
    "autograd": lambda: attn_torch.scaled_dot_product_attention(*grads).sum().backward(),
    "layer": lambda: layer(*(g.flatten(0, 1) for g in grads)).sum().backward(),
}
for name, call in calls.items():
    call()
    print(name, torch.get_num_threads(), attn.get_num_threads())
"""


def test_calls_leave_torchs_thread_count_as_it_was():
    # PyTorch and attn share one OpenMP runtime (one libgomp, whichever loaded first), and
    # torch.get_num_threads() reads the runtime's per-thread count: attn applies its own count for
    # each computation only, so torch keeps its 1 where attn runs on 2 (it kept attn's 2 before).
    result = subprocess.run([sys.executable, "-c", LEAVES_TORCHS_THREADS], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    names = ("numpy function", "masked_softmax", "plain", "general", "cache", "autograd", "layer")
    assert result.stdout.splitlines() == [f"{name} 1 2" for name in names]


@pytest.mark.parametrize("where", ["query", "key"])
def test_meta_tensors_are_refused_naming_the_device(where):
    # A meta tensor has no data to export: the error names the argument and the device instead
    # of "expected a tensor supporting DLPack, got torch.Tensor".
    tensors = {name: torch.randn(1, 2, 8, 4) for name in ("query", "key", "value")}
    tensors[where] = torch.empty(1, 2, 8, 4, device="meta")
    message = (rf"{where}: expected a tensor in CPU memory \(attn computes on the CPU\), "
               "got one on meta")
    for call in (attn_torch.scaled_dot_product_attention, attn.scaled_dot_product_attention):
        with pytest.raises(ValueError, match=message):
            call(tensors["query"], tensors["key"], tensors["value"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_meta_tensors_give_pytorchs_shapes(dtype):
    # A model on the meta device (shape inference, FlopCounterMode's counts without data): with
    # query, key and value all there, PyTorch's function gives a meta output and gradients; attn's
    # refused them as tensors outside CPU memory. Shapes that disagree are refused on meta as on
    # the CPU, naming the argument.
    def meta(*shape, grad=False):
        return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=grad)

    query, key, value = meta(2, 6, 5, 8, grad=True), meta(2, 3, 7, 8), meta(2, 3, 7, 4)
    mask = torch.empty(5, 7, device="meta", dtype=torch.bool)
    for arguments in ({}, {"attn_mask": mask}, {"window": (2, 0), "softcap": 3.0}):
        output = attn_torch.scaled_dot_product_attention(query, key, value, enable_gqa=True,
                                                         **arguments)
        assert (output.device.type, output.shape, output.dtype) == ("meta", (2, 6, 5, 4), dtype)
        output.sum().backward()
        assert (query.grad.device.type, query.grad.shape) == ("meta", query.shape)
        query.grad = None
    with torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
        attn_torch.scaled_dot_product_attention(query, key, value, enable_gqa=True)
    assert counter.get_total_flops() == 2 * (2 * 6 * 5 * 7) * (8 + 4)
    refusals = [
        ((query, key, value), "key: expected 6 heads"),
        ((query, key[..., :3], value), r"key: expected the last axis 8 \(that of query\)"),
        ((query, key, value[:, :, :6]),
         r"value: expected the shape of key \(2, 3, 7\) up to the last axis, got \(2, 3, 6\)"),
    ]
    for tensors, message in refusals:
        with pytest.raises(ValueError, match=message):
            attn_torch.scaled_dot_product_attention(*tensors)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "query_shape, keys",
    [((0, 2, 3, 4), 5), ((0, 2, 100, 4), 120), ((1, 0, 3, 4), 5), ((1, 2, 0, 4), 5),
     ((1, 2, 0, 4), 100), ((0, 2, 3, 4), 0)],
    ids=["empty_batch_decode", "empty_batch_prefill", "no_heads", "no_queries", "no_queries_long",
         "empty_batch_no_keys"],
)
def test_empty_shapes_match_torch_forward_and_backward(dtype, query_shape, keys):
    # An empty batch (a filtered batch in a server), no heads or no queries: PyTorch returns the
    # empty output and zero key/value gradients; attn did the same only on some paths (the decode
    # route refused an empty batch's cache, the backward a null log-sum-exp).
    batch, heads, _, depth = query_shape
    q = torch.randn(*query_shape).to(dtype)
    k = torch.randn(batch, heads, keys, depth).to(dtype)
    results = []
    for call in (attn_torch.scaled_dot_product_attention, F.scaled_dot_product_attention):
        leaves = [x.clone().requires_grad_() for x in (q, k, k)]
        output = call(*leaves)
        output.sum().backward()
        results.append((output.shape, output.dtype, *(leaf.grad for leaf in leaves)))
    (shape, out_dtype, *grads), (torch_shape, torch_dtype, *torch_grads) = results
    assert shape == torch_shape and out_dtype == torch_dtype
    for mine, theirs in zip(grads, torch_grads):
        assert mine.shape == theirs.shape and mine.dtype == theirs.dtype
        assert torch.equal(mine, torch.zeros_like(mine))
    with torch.no_grad():
        assert attn_torch.scaled_dot_product_attention(q, k, k).shape == torch_shape


@pytest.mark.parametrize(
    "query_shape, key_shape, value_shape, options",
    [
        ((3, 2, 5, 4), (1, 2, 7, 4), (1, 2, 7, 4), {}),  # one key/value batch for all queries
        ((1, 2, 5, 4), (3, 2, 7, 4), (3, 2, 7, 4), {}),  # one query batch
        ((3, 2, 5, 4), (3, 1, 7, 4), (3, 1, 7, 4), {}),  # one key/value head, without enable_gqa
        ((3, 2, 5, 4), (1, 2, 7, 4), (3, 2, 7, 4), {}),  # key alone broadcast
        ((2, 3, 2, 5, 4), (1, 3, 2, 7, 4), (1, 3, 2, 7, 4), {}),  # an extra leading axis
        ((3, 5, 4), (1, 7, 4), (1, 7, 4), {}),  # no heads axis
        ((3, 4, 5, 4), (1, 2, 7, 4), (1, 2, 7, 4), dict(enable_gqa=True)),
        ((3, 2, 5, 4), (1, 2, 7, 4), (1, 2, 7, 4), dict(is_causal=True)),
        ((3, 2, 5, 4), (1, 2, 7, 4), (1, 2, 7, 4), dict(sinks=True)),  # the general path
    ],
    ids=["kv_batch", "q_batch", "kv_heads", "k_only", "five_d", "three_d", "gqa", "causal",
         "general_path"],
)
def test_leading_axes_broadcast_as_torch(query_shape, key_shape, value_shape, options):
    # PyTorch's function broadcasts the axes before (L, E) as its matmuls do (with enable_gqa, the
    # batch axes before the heads); attn.torch expands them (no copies) where attn refuses them:
    # outputs and gradients as PyTorch's within float32 rounding, in eager inference, eager
    # autograd and under torch.compile(fullgraph=True). Sinks (absent from PyTorch) compare with
    # the explicitly expanded call instead.
    leaves = [torch.randn(*shape, requires_grad=True)
              for shape in (query_shape, key_shape, value_shape)]
    options = dict(options)
    if options.pop("sinks", False):
        options["sinks"] = torch.zeros(query_shape[-3])
        shape = torch.broadcast_shapes(query_shape[:-2], key_shape[:-2])

        def reference_call(q, k, v, **kw):
            return attn_torch.scaled_dot_product_attention(
                q.expand(*shape, *q.shape[-2:]), k.expand(*shape, *k.shape[-2:]),
                v.expand(*shape, *v.shape[-2:]), **kw)
    else:
        reference_call = F.scaled_dot_product_attention
    reference = reference_call(*leaves, **options)
    reference.backward(torch.ones_like(reference))
    expected_grads = [leaf.grad for leaf in leaves]
    torch._dynamo.reset()  # each case compiles the same function: keep under the recompile limit
    for call in (attn_torch.scaled_dot_product_attention,
                 torch.compile(attn_torch.scaled_dot_product_attention, fullgraph=True,
                               backend="aot_eager")):
        inputs = [leaf.detach().clone().requires_grad_() for leaf in leaves]
        output = call(*inputs, **options)
        assert output.shape == reference.shape
        torch.testing.assert_close(output, reference.detach(), rtol=1e-5, atol=1e-6)
        output.backward(torch.ones_like(output))
        for name, mine, theirs in zip("qkv", inputs, expected_grads):
            assert mine.grad.shape == theirs.shape, name
            torch.testing.assert_close(mine.grad, theirs, rtol=1e-5, atol=1e-5, msg=name)
    with torch.no_grad():
        output = attn_torch.scaled_dot_product_attention(*leaves, **options)
    torch.testing.assert_close(output, reference.detach(), rtol=1e-5, atol=1e-6)


def test_axes_that_do_not_broadcast_keep_attns_error():
    q, k = torch.randn(3, 2, 5, 4), torch.randn(2, 2, 7, 4)
    with pytest.raises(attn.ShapeError, match="key: expected the leading axes of query"):
        attn_torch.scaled_dot_product_attention(q, k, k)
    with pytest.raises(attn.ShapeError, match="key: expected the leading axes of query"):
        attn_torch.scaled_dot_product_attention(q, k, k, window=(2, 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_dropout_of_every_weight_gives_zeros_as_torch(dtype):
    # dropout_p = 1 drops every weight in PyTorch: zero output and zero gradients (attn's kernels
    # take p < 1; attn.torch gives PyTorch's result); above 1 both refuse.
    leaves = [torch.randn(2, 3, 5, 4, dtype=dtype, requires_grad=True) for _ in range(3)]
    output = attn_torch.scaled_dot_product_attention(*leaves, dropout_p=1.0, is_causal=True)
    expected = F.scaled_dot_product_attention(*leaves, dropout_p=1.0, is_causal=True)
    assert output.dtype == expected.dtype and torch.equal(output, expected)
    assert torch.equal(output, torch.zeros_like(output))
    output.sum().backward()
    for leaf in leaves:
        assert torch.equal(leaf.grad, torch.zeros_like(leaf))
    with pytest.raises(ValueError, match="dropout"):
        attn_torch.scaled_dot_product_attention(*leaves, dropout_p=1.5)


# --- attn.torch.override_sdpa: PyTorch's function replaced by attn's -----------------------------


@pytest.fixture
def attn_calls(monkeypatch):
    """Counts the calls that reach attn.torch.scaled_dot_product_attention."""
    calls = []
    real = attn_torch.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(attn_torch, "scaled_dot_product_attention", counted)
    return calls


def encoder_step(layer, x, mask):
    """A training step's output and input gradient through torch.nn.TransformerEncoderLayer,
    whose self-attention (in training) calls F.scaled_dot_product_attention."""
    x = x.clone().requires_grad_(True)
    output = layer(x, src_mask=mask)
    output.backward(torch.ones_like(output))
    return output.detach(), x.grad, [p.grad.clone() for p in layer.parameters()]


def test_override_sdpa_runs_pytorchs_modules_on_attn(attn_calls):
    original = F.scaled_dot_product_attention
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    x, mask = torch.randn(2, 9, 16), torch.rand(9, 9) < 0.8
    mask[:, 0] = True  # every query sees a key: PyTorch's modules give NaN rows otherwise
    expected = encoder_step(layer, x, ~mask)  # the modules' bool masks mark what is hidden
    layer.zero_grad()
    with attn_torch.override_sdpa():
        assert F.scaled_dot_product_attention is not original
        got = encoder_step(layer, x, ~mask)
    assert F.scaled_dot_product_attention is original
    assert len(attn_calls) == 1, "the layer's attention ran through attn"
    for name, mine, theirs in zip(("output", "input grad"), got, expected):
        assert_relative(mine, theirs, GRADIENT_RTOL, name)
    for index, (mine, theirs) in enumerate(zip(got[2], expected[2])):
        assert_relative(mine, theirs, GRADIENT_RTOL, f"parameter {index}")
    encoder_step(layer, x, ~mask)
    assert len(attn_calls) == 1, "restored: PyTorch's function again"


def test_override_sdpa_leaves_what_attn_does_not_compute_to_pytorch(attn_calls):
    q = torch.randn(N, H, L, E)
    with attn_torch.override_sdpa():
        meta = F.scaled_dot_product_attention(q.to("meta"), q.to("meta"), q.to("meta"))
        assert meta.device.type == "meta" and meta.shape == (N, H, L, E)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nested tensors' prototype warning
            nested = torch.nested.nested_tensor([q[0], q[1, :, :3]])  # strided layout: a Tensor
        assert F.scaled_dot_product_attention(nested, nested, nested).is_nested
        wide = q.double().requires_grad_(True)  # float64 in float64, as gradcheck needs
        assert torch.autograd.gradcheck(
            lambda x: F.scaled_dot_product_attention(x, x, x, is_causal=True), (wide,)
        )
        # torch.func.grad, which attn's custom operator does not support, gets PyTorch's.
        gradient = torch.func.grad(lambda x: F.scaled_dot_product_attention(x, x, x).sum())(q)
        with pytest.raises(RuntimeError) as attn_error:
            F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(L, L, dtype=torch.int64))
    assert not attn_calls
    torch_gradient = torch.func.grad(lambda x: F.scaled_dot_product_attention(x, x, x).sum())(q)
    assert torch.equal(gradient, torch_gradient)
    with pytest.raises(RuntimeError) as torch_error:
        F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(L, L, dtype=torch.int64))
    assert str(attn_error.value) == str(torch_error.value)


def test_override_sdpa_gives_pytorchs_errors_where_attn_would_compute(attn_calls):
    """Calls PyTorch refuses and attn's own function takes — a mask with is_causal, a mask of one
    axis, a floating mask neither float32 nor of the query's dtype — raise PyTorch's error word
    for word under the override; float32 masks with half queries, which PyTorch takes, stay
    attn's."""
    q = torch.randn(N, H, L, E)
    calls = [
        dict(attn_mask=torch.zeros(L, L), is_causal=True),
        dict(attn_mask=torch.zeros(L)),
        dict(attn_mask=torch.zeros(L, L, dtype=torch.float64)),
        dict(attn_mask=torch.zeros(L, L, dtype=torch.bfloat16)),
    ]
    errors = []
    with attn_torch.override_sdpa():
        for call in calls:
            with pytest.raises((RuntimeError, IndexError)) as error:
                F.scaled_dot_product_attention(q, q, q, **call)
            errors.append((type(error.value), str(error.value)))
        half = q.bfloat16()
        out = F.scaled_dot_product_attention(half, half, half, attn_mask=torch.zeros(L, L))
    assert len(attn_calls) == 1, "the float32 mask with bf16 queries ran through attn"
    expected = F.scaled_dot_product_attention(half, half, half, attn_mask=torch.zeros(L, L))
    assert_relative(out.float(), expected.float(), 1e-2, "bf16 output")
    for call, (kind, message) in zip(calls, errors):
        with pytest.raises((RuntimeError, IndexError)) as torch_error:
            F.scaled_dot_product_attention(q, q, q, **call)
        assert (kind, message) == (type(torch_error.value), str(torch_error.value))


def test_override_sdpa_gives_pytorchs_result_for_inputs_that_are_not_finite():
    # attn refuses NaN and infinite inputs; a model written for PyTorch's function (an fp16
    # overflow upstream, a scale of inf) gets PyTorch's NaN-carrying result under the override,
    # as its docstring promises for calls attn does not compute as PyTorch would.
    q = torch.randn(N, H, L, E)
    nan_query = q.clone()
    nan_query[0, 0, 1, 2] = float("nan")
    infinite_key = q.clone()
    infinite_key[1, 0, 3, 0] = float("inf")
    # And magnitudes attn's float32 base-2 scores do not hold, which PyTorch computes: a mask
    # entry of 2e38 (attn refuses entries past 2^127), a float64 value past float32.
    big_mask = torch.zeros(L, L)
    big_mask[0, 1] = 2e38
    calls = [((nan_query, q, q), {}), ((q, infinite_key, q), {"is_causal": True}),
             ((q, q, q), {"scale": float("inf")}), ((q, q, q), {"attn_mask": big_mask})]
    with attn_torch.override_sdpa():
        got = [F.scaled_dot_product_attention(*tensors, **options) for tensors, options in calls]
    for (tensors, options), output in zip(calls, got):
        expected = F.scaled_dot_product_attention(*tensors, **options)
        assert torch.equal(output.isnan(), expected.isnan())
        torch.testing.assert_close(output, expected, equal_nan=True)
    with pytest.raises(ValueError, match="query: expected finite values, got NaN"):
        attn_torch.scaled_dot_product_attention(nan_query, q, q)  # attn's own function refuses


def test_override_sdpa_compiles_to_attns_operator():
    q = torch.randn(N, H, L, E)
    graphs = []

    def recording_backend(graph_module, example_inputs):
        graphs.append(graph_module.code)
        return graph_module.forward

    def attend(q):
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)

    with attn_torch.override_sdpa():
        torch._dynamo.reset()
        compiled = torch.compile(attend, fullgraph=True, backend=recording_backend)(q)
        assert torch.equal(compiled, attend(q))
    torch._dynamo.reset()
    assert len(graphs) == 1 and "attn.sdpa" in graphs[0], graphs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_override_sdpa_reaches_compiled_multihead_attention(dtype):
    # Dynamo keeps F.multi_head_attention_forward (nn.MultiheadAttention, nn.Transformer*) whole
    # and AOTAutograd runs it on fake and functional tensors: the override takes those too, so
    # the compiled layer's graphs hold attn's operators (they held PyTorch's flash attention), and
    # its output and gradients are the eager layer's under the override.
    from torch._dynamo.backends.common import aot_autograd

    torch.manual_seed(3)
    graphs = []

    def record(graph_module, example_inputs):
        graphs.append(graph_module.code)
        return graph_module.forward

    layer = torch.nn.MultiheadAttention(32, 4, batch_first=True).to(dtype)
    x = torch.randn(2, 10, 32, dtype=dtype)
    with attn_torch.override_sdpa():
        eager = layer(x, x, x, need_weights=False)[0]
        (eager_grad,) = torch.autograd.grad(eager.float().square().sum(), layer.in_proj_weight)
        torch._dynamo.reset()
        compiled_layer = torch.compile(lambda x: layer(x, x, x, need_weights=False)[0],
                                       backend=aot_autograd(fw_compiler=record,
                                                            bw_compiler=record))
        compiled = compiled_layer(x)
        (compiled_grad,) = torch.autograd.grad(compiled.float().square().sum(),
                                               layer.in_proj_weight)
    torch._dynamo.reset()
    assert len(graphs) == 2, graphs
    assert "attn.sdpa.default" in graphs[0] and "attn.sdpa_backward.default" in graphs[1]
    assert not any("_scaled_dot_product" in graph for graph in graphs)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6) if dtype == torch.float32 \
        else torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(compiled_grad, eager_grad,
                               **({} if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)))


def test_override_sdpa_nests_and_restores_in_any_order():
    original = F.scaled_dot_product_attention
    outer = attn_torch.override_sdpa()  # a plain call: in place until restored
    inner = attn_torch.override_sdpa()
    assert F.scaled_dot_product_attention is not original
    outer.restore()  # out of order: the inner one stays in place
    assert F.scaled_dot_product_attention._attn_override is inner
    inner.restore()  # and takes the ended outer one with it
    assert F.scaled_dot_product_attention is original
    with attn_torch.override_sdpa() as override:
        with attn_torch.override_sdpa():
            pass
        assert F.scaled_dot_product_attention._attn_override is override
    assert F.scaled_dot_product_attention is original


# --- tensors with the negative bit ----------------------------------------------------------------


def negative_leaf(*shape):
    """A leaf whose values are those of a lazily negated view (z.conj().imag: the negative bit
    set, which PyTorch's DLPack export drops), and the same values materialised."""
    view = torch.randn(*shape, dtype=torch.complex64).conj().imag.detach().requires_grad_(True)
    assert view.is_neg()
    return view, view.detach().resolve_neg().requires_grad_(True)


@pytest.mark.parametrize("options", [{}, {"window": (3, 0)}, {"dropout_p": 0.0, "softcap": 9.0}],
                         ids=["plain", "window", "softcap"])
def test_negative_views_compute_as_their_values(options):
    # Outputs and gradients (of query, key, value and a float mask, with a negated grad_output
    # too) as for the materialised tensors, bit for bit, and as PyTorch's within tolerance.
    pairs = [negative_leaf(N, H, L, E), negative_leaf(N, H, S, E), negative_leaf(N, H, S, EV),
             negative_leaf(L, S)]
    negative, plain = [p[0] for p in pairs], [p[1] for p in pairs]
    grad_output = torch.randn(N, H, L, EV, dtype=torch.complex64).conj().imag
    assert grad_output.is_neg()
    results = []
    for q, k, v, mask in (negative, plain):
        output = attn_torch.scaled_dot_product_attention(q, k, v, mask, **options)
        results.append((output, torch.autograd.grad(output, (q, k, v, mask), grad_output)))
    (output, gradients), (expected, expected_gradients) = results
    assert torch.equal(output, expected)
    for name, mine, theirs in zip(("q", "k", "v", "mask"), gradients, expected_gradients):
        assert torch.equal(mine, theirs), f"d {name}"
    if not options:
        reference = F.scaled_dot_product_attention(*plain)
        assert_relative(output, reference, OUTPUT_RTOL, "output against PyTorch")
        reference_gradients = torch.autograd.grad(reference, plain, grad_output.resolve_neg())
        for name, mine, theirs in zip(("q", "k", "v", "mask"), gradients, reference_gradients):
            assert_relative(mine, theirs, GRADIENT_RTOL, f"d {name} against PyTorch")


def test_negative_views_in_inference_match_pytorch():
    q, k, v = (torch.randn(N, H, n, e, dtype=torch.complex64).conj().imag
               for n, e in ((L, E), (S, E), (S, EV)))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_relative(attn_torch.scaled_dot_product_attention(q, k, v, is_causal=True), expected,
                    OUTPUT_RTOL, "plain")
    assert_relative(attn_torch.scaled_dot_product_attention(q, k, v, is_causal=True, softcap=1e4),
                    expected, OUTPUT_RTOL, "general")


@pytest.mark.parametrize("queries", [4, 67])
@pytest.mark.parametrize("factor", [1e3, 1e4, 3e4, 1e5])
def test_scores_of_large_magnitude_give_torchs_gradients(queries, factor):
    """q and k scaled far up (scores of 1e6 to 1e10, each row's largest ahead by far): P is
    one-hot, and dV = Pᵀ dO exact, as PyTorch's float32 pass gives it. attn's backward used to
    rebuild P from the forward's float log-sum-exp, off by 2^δ for δ a few ulps of such scores:
    dV 7e9 off at 1e4, NaN at 3e4. dQ and dK are the float64 reference's 0 within float32's
    round-off of dP − D (times |k| or |q|), as PyTorch's own."""
    generator = torch.Generator().manual_seed(int(factor) + queries)
    q = (torch.randn(1, 2, queries, 8, generator=generator) * factor).requires_grad_()
    k = (torch.randn(1, 2, 80, 8, generator=generator) * factor).requires_grad_()
    v = torch.randn(1, 2, 80, 3, generator=generator).requires_grad_()
    grad_out = torch.randn(1, 2, queries, 3, generator=generator)
    out = attn_torch.scaled_dot_product_attention(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    wide = [t.detach().double().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*wide)
    expected_grads = torch.autograd.grad(expected, wide, grad_out.double())
    assert_relative(out, expected, OUTPUT_RTOL, "output")
    assert_relative(grads[2], expected_grads[2], GRADIENT_RTOL, "grad value")
    # dS of the one key: dP − D, two float dot products of 3 terms, within 12 ulps of Σ|dO||V|.
    ds = 12 * 2.0**-24 * 3 * grad_out.abs().max().item() * v.abs().max().item()
    for name, gradient, other in (("grad query", grads[0], k), ("grad key", grads[1], q)):
        bound = ds / 8**0.5 * other.abs().max().item() * (queries if name == "grad key" else 1)
        error = (gradient.double() - expected_grads[0 if name == "grad query" else 1]).abs().max()
        assert error.item() <= bound, f"{name}: max error {error.item():.3g} > {bound:.3g}"


# --- grad_output that is not finite: PyTorch's answer (GradScaler counts on it) ------------------
def _gradients_of(call, inputs, grad_output):
    leaves = [tensor.detach().clone().requires_grad_(True) for tensor in inputs]
    call(*leaves).backward(grad_output)
    return [leaf.grad for leaf in leaves]


@pytest.mark.parametrize(
    "case", ["plain", "causal", "grouped", "float_mask", "float16", "two_dimensional"])
def test_a_grad_output_that_is_not_finite_gives_pytorchs_gradients(case):
    # PyTorch carries ∞ or NaN in grad_output into every key of its head, its row of dQ and its
    # columns of dV; attn gives NaN at exactly those entries and PyTorch's value everywhere else.
    kv_heads = 2 if case == "grouped" else H
    dtype = torch.float16 if case == "float16" else torch.float32
    shape = (L, E) if case == "two_dimensional" else (N, H, L, E)
    kv_shape = (S,) if case == "two_dimensional" else (N, kv_heads, S)
    inputs = [torch.randn(*shape), torch.randn(*kv_shape, E), torch.randn(*kv_shape, EV)]
    options = {"is_causal": case == "causal", "enable_gqa": case == "grouped"}
    if case == "float_mask":
        inputs.append(torch.randn(L, S))  # broadcast over batch and heads: its gradient sums them
    inputs = [tensor.to(dtype) for tensor in inputs]
    grad_output = torch.randn(*shape[:-1], EV).to(dtype)
    if case == "two_dimensional":
        grad_output[1, 2] = float("inf")
    else:
        grad_output[0, 1, 2, 3] = float("inf")  # in a head of the first key/value group
        grad_output[1, 3, 0, 0] = float("nan")
        grad_output[1, 3, 4, 5] = -float("inf")

    def attn_call(q, k, v, *mask):
        return attn_torch.scaled_dot_product_attention(
            q, k, v, attn_mask=mask[0] if mask else None, **options)

    def torch_call(q, k, v, *mask):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask[0] if mask else None, **options)

    got = _gradients_of(attn_call, inputs, grad_output)
    expected = _gradients_of(torch_call, [tensor.double() for tensor in inputs],
                             grad_output.double())
    # float16: gradients rounded to float16 (2⁻¹¹ relative) on attn's side, float64 on PyTorch's.
    rtol = 4e-3 if dtype == torch.float16 else GRADIENT_RTOL
    for name, actual, wanted in zip(("query", "key", "value", "attn_mask"), got, expected):
        assert actual.dtype == dtype, name
        reached = ~wanted.isfinite()
        assert reached.any() and not reached.all() or name == "key", name
        assert torch.equal(actual.isnan(), reached), name
        if not reached.all():
            assert_relative(actual[~reached], wanted[~reached], rtol, name)


def test_a_grad_output_that_is_not_finite_reaches_the_sinks_of_its_heads():
    q, k, v = torch.randn(N, H, L, E), torch.randn(N, H, S, E), torch.randn(N, H, S, EV)
    sinks = torch.randn(H, requires_grad=True)
    grad_output = torch.randn(N, H, L, EV)
    grad_output[1, 2, 3, 0] = float("inf")
    attn_torch.scaled_dot_product_attention(q, k, v, sinks=sinks).backward(grad_output)
    assert torch.equal(sinks.grad.isnan(), torch.arange(H) == 2)
    # the other heads' sinks as with a finite grad_output
    finite = sinks.detach().clone().requires_grad_(True)
    attn_torch.scaled_dot_product_attention(q, k, v, sinks=finite).backward(
        grad_output.nan_to_num(posinf=0.0))
    assert torch.equal(sinks.grad[:2], finite.grad[:2])
    assert torch.equal(sinks.grad[3:], finite.grad[3:])


@pytest.mark.parametrize("override", [False, True])
def test_float16_training_under_a_gradscaler_skips_the_steps_that_overflow(override):
    # The GradScaler's scale (2¹⁷ here) overflows float16's grad_output (max 65504) on the
    # first step: PyTorch's SDPA gives gradients that are not finite, so the scaler skips the
    # optimizer's step and halves its scale until the gradients fit, then steps. attn's function,
    # called directly or through the override, must let the same happen.
    weights = torch.nn.Linear(E, 3 * E)
    optimizer = torch.optim.SGD(weights.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**17, growth_interval=1000)
    x = torch.randn(N, L, E)
    before = weights.weight.detach().clone()
    scales = []
    for _ in range(6):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            q, k, v = weights(x).chunk(3, dim=-1)
            if override:
                with attn_torch.override_sdpa():
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                out = attn_torch.scaled_dot_product_attention(q, k, v, is_causal=True)
            assert out.dtype == torch.float16
            loss = out.float().pow(2).sum()  # grad_output 2¹⁸·out: float16 overflows past |out| = 0.25
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
    assert scales[0] == 2.0**16, scales  # the first step overflowed and was skipped
    assert scales[-1] == scales[-2], scales  # then the gradients fit
    assert weights.weight.isfinite().all()
    assert not torch.equal(weights.weight.detach(), before)  # a later step did update


def test_float64_options_beyond_float32_are_named_as_given():
    # float64 sinks, slopes or mask entries past float32's range became ∞ in the conversion and
    # were refused as "expected finite values, got inf", naming a value the user never gave; a
    # float64 model's masks of float64's lowest still hide their keys.
    q, k, v = (torch.randn(1, 2, 3, 8) for _ in range(3))
    huge = torch.tensor([1e300, 0.0], dtype=torch.float64)
    for name in ("sinks", "alibi_slopes"):
        with pytest.raises(ValueError, match=f"^{name}: expected values float32 holds .* got "
                                             r"1e\+300 at flat index 0"):
            attn.torch.scaled_dot_product_attention(q, k, v, **{name: huge})
    with pytest.raises(ValueError, match=r"^attn_mask: expected values float32 holds .* got 1e\+300"):
        attn.torch.scaled_dot_product_attention(q, k, v, torch.full((3, 3), 1e300, dtype=torch.float64))
    # Scalars alike: scale or softcap of 1e300 read "expected a ... finite number, got inf".
    for name in ("scale", "softcap"):
        with pytest.raises(ValueError, match=f"^{name}: expected a number float32 holds .* got "
                                             r"1e\+300"):
            attn.torch.scaled_dot_product_attention(q, k, v, **{name: 1e300})
    mask = torch.zeros(3, 3, dtype=torch.float64)
    mask[0, 1:] = torch.finfo(torch.float64).min
    output = attn.torch.scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(output[:, :, 0], v[:, :, 0], rtol=0, atol=0)
