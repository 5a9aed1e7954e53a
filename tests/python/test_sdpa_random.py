# attn.torch.scaled_dot_product_attention on random combinations of its arguments at sizes that
# cross the kernels' tiles (64 queries, 64 keys; tails that divide neither), against the float64
# reference (torch_reference.reference_sdpa): forward and gradients in float32 on every SIMD target
# this machine runs, the forward in bfloat16 and float16. Each case draws every argument from its
# own seeded generator, so a failure names a case that reproduces alone.
import math
import random

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the scaled_dot_product_attention comparisons need it"
)

import attn  # noqa: E402
import attn.torch as attn_torch  # noqa: E402
from torch_reference import reference_sdpa, score_rounding  # noqa: E402

# float32 outputs: a few float32 ulps of the largest output (as test_sdpa_torch.py), plus the
# scores' own rounding (torch_reference.score_rounding): the case generator's magnitudes and
# scales reach scores whose float32 sums alone miss 1e-5 (magnitude 3, scale 0.5, d = 128: the
# reference run in float32 on the same inputs erred by up to 1.5e-5 of the largest output over
# seeds 0-1499).
OUTPUT_RTOL = 1e-5
# float32 gradients: ten times that (longer chains of roundings), against the gradient's largest
# entry or, where the exact gradient cancels (a row that sees one key has dS = 0 exactly, and
# attn's is rounding), against the scale such gradients take: 1e−3 of |dO|·|x|²·√(L·group·Ev).
GRADIENT_RTOL = 1e-4
# Half outputs: rounded once to their type (unit roundoff 2⁻⁸ bf16, 2⁻¹¹ fp16, relative) and, for
# bf16, P rounded to bf16 before P·V (2⁻⁸ of Σ P·|v| ≤ max |v|); twice each for the bound, plus the
# float32 part.
HALF_ROUNDING = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
# Half gradients: test_half_precision.py's 2⁻⁶ (the output's and the gradients' roundings, P in
# bf16), against the largest gradient or the float32 gradients' cancellation scale. Over seeds
# 0-399 in both dtypes the error stayed under 0.61 of it.
HALF_GRADIENT_RTOL = 2.0**-6


def random_case(seed):
    """The arguments of one call: shapes, dtype, layout and attn's options, all from `seed`."""
    rng = random.Random(seed)
    groups = rng.choice([1, 2, 4])
    kv_heads = rng.choice([1, 2])
    case = {
        "batch": rng.choice([1, 2]),
        "kv_heads": kv_heads,
        "heads": kv_heads * groups,
        "queries": rng.choice([63, 64, 65, 130, 257]),
        "keys": rng.choice([64, 65, 129, 200, 300]),
        "depth": rng.choice([16, 17, 64, 80, 128]),
        "value_depth": rng.choice([None, 24, 96]),
        "transposed": rng.random() < 0.5,  # (B, L, H, E) seen as (B, H, L, E), as transformers
        "magnitude": rng.choice([0.5, 1.0, 3.0]),
        "options": {"enable_gqa": groups > 1},
    }
    options = case["options"]
    if rng.random() < 0.3:
        options["is_causal"] = True
    if rng.random() < 0.3:
        options["window"] = (rng.choice([None, 0, 5, 40]), rng.choice([None, 0, 30]))
    if rng.random() < 0.3:
        options["alibi_slopes"] = rng.choice([0.05, 0.3])
    if rng.random() < 0.3:
        options["softcap"] = rng.choice([5.0, 30.0])
    if rng.random() < 0.3:
        options["sinks"] = rng.choice([-1.0, 2.0])
    if rng.random() < 0.3:
        options["valid_lens"] = rng.choice(["batch", "rows"])
    if not options.get("is_causal") and rng.random() < 0.4:
        options["attn_mask"] = rng.choice(["bool", "float", "float-inf"])
    if "is_causal" in options or "window" in options or "alibi_slopes" in options:
        options["alignment"] = rng.choice(["top-left", "bottom-right"])
    if rng.random() < 0.3:
        options["scale"] = rng.choice([0.05, 0.5])
    return case


def make_tensors(case, seed, dtype):
    """q, k, v in `dtype` and attn's other tensor arguments, from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    b, h, g = case["batch"], case["heads"], case["kv_heads"]
    n, m, e = case["queries"], case["keys"], case["depth"]
    ev = case["value_depth"] or e

    def tensor(heads, rows, cols):
        shape = (b, rows, heads, cols) if case["transposed"] else (b, heads, rows, cols)
        x = torch.randn(shape, generator=generator) * case["magnitude"]
        x = x.to(dtype)
        return x.transpose(1, 2) if case["transposed"] else x

    q, k, v = tensor(h, n, e), tensor(g, m, e), tensor(g, m, ev)
    kwargs = dict(case["options"])
    if "alibi_slopes" in kwargs:
        kwargs["alibi_slopes"] = torch.rand(h, generator=generator) * kwargs["alibi_slopes"]
    if "sinks" in kwargs:
        kwargs["sinks"] = torch.randn(h, generator=generator) + kwargs["sinks"]
    if "valid_lens" in kwargs:
        shape = (b,) if kwargs["valid_lens"] == "batch" else (b, n)
        kwargs["valid_lens"] = torch.randint(0, m + 1, shape, generator=generator)
    if "attn_mask" in kwargs:
        kind = kwargs.pop("attn_mask")
        if kind == "bool":
            kwargs["attn_mask"] = torch.rand((b, 1, n, m), generator=generator) < 0.7
        else:
            mask = torch.randn((n, m), generator=generator)
            if kind == "float-inf":
                hidden = torch.rand((n, m), generator=generator) < 0.3
                mask = mask.masked_fill(hidden, -math.inf)
            kwargs["attn_mask"] = mask
    return q, k, v, kwargs


def reference(q, k, v, kwargs):
    """reference_sdpa in float64 on the same (rounded) inputs; float tensors of kwargs widened."""
    widened = {
        name: value.double() if torch.is_tensor(value) and value.is_floating_point() else value
        for name, value in kwargs.items()
    }
    return reference_sdpa(q.double(), k.double(), v.double(), **widened)


def relative_error(actual, expected, floor=0.0):
    scale = max(expected.abs().max().item(), floor)
    return (actual.double() - expected).abs().max().item() / scale if scale > 0 else 0.0


@pytest.fixture(params=attn.available_simd_targets())
def simd_target(request):
    """The kernels capped at one target for the test (attn.limit_simd_target), then uncapped."""
    attn.limit_simd_target(request.param)
    yield request.param
    attn.limit_simd_target("best")


@pytest.mark.parametrize("seed", range(8))
def test_float32_forward_and_gradients_match_the_reference(seed, simd_target):
    case = random_case(seed)
    q, k, v, kwargs = make_tensors(case, seed, torch.float32)
    inputs = [x.detach().requires_grad_() for x in (q, k, v)]
    out = attn_torch.scaled_dot_product_attention(*inputs, **kwargs)
    references = [x.detach().double().requires_grad_() for x in (q, k, v)]
    expected = reference(*references, kwargs)
    error = (out.detach().double() - expected).abs().max().item()
    bound = OUTPUT_RTOL * expected.abs().max().item() + score_rounding(q, k, v, kwargs)
    assert error <= bound, (error, bound, simd_target, case)

    grad_output = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1000))
    check_gradients(case, inputs, out, references, expected, grad_output, GRADIENT_RTOL)


def check_gradients(case, inputs, out, references, expected, grad_output, rtol):
    """attn's gradients of `out` against the reference's of `expected`, within `rtol` of the
    largest gradient or of the cancellation scale (GRADIENT_RTOL's comment)."""
    grads = torch.autograd.grad(out, inputs, grad_output)
    expected_grads = torch.autograd.grad(expected, references, grad_output.double())
    group = case["heads"] // case["kv_heads"]
    floor = (
        1e-3
        * math.sqrt(case["queries"] * group * (case["value_depth"] or case["depth"]))
        * grad_output.abs().max().item()
        * max(x.abs().max().item() for x in inputs) ** 2
    )
    for name, x, grad, expected_grad in zip("qkv", inputs, grads, expected_grads):
        assert grad.dtype == x.dtype, name
        error = relative_error(grad, expected_grad, floor)
        assert error <= rtol, (name, error, attn.simd_target(), case)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("seed", range(100, 106))
def test_half_forward_matches_the_reference_on_the_rounded_inputs(seed, dtype):
    case = random_case(seed)
    q, k, v, kwargs = make_tensors(case, seed, dtype)
    out = attn_torch.scaled_dot_product_attention(q, k, v, **kwargs)
    assert out.dtype == dtype
    expected = reference(q, k, v, kwargs)
    magnitude = expected.abs().max().item()
    bound = (OUTPUT_RTOL + 2 * HALF_ROUNDING[dtype]) * magnitude + score_rounding(q, k, v, kwargs)
    if dtype == torch.bfloat16:
        bound += 2 * HALF_ROUNDING[dtype] * v.double().abs().max().item()
    error = (out.double() - expected).abs().max().item()
    assert error <= bound, (error, bound, case)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("seed", range(100, 104))
def test_half_gradients_match_the_reference_on_the_rounded_inputs(seed, dtype):
    case = random_case(seed)
    q, k, v, kwargs = make_tensors(case, seed, dtype)
    inputs = [x.detach().requires_grad_() for x in (q, k, v)]
    out = attn_torch.scaled_dot_product_attention(*inputs, **kwargs)
    references = [x.detach().double().requires_grad_() for x in (q, k, v)]
    expected = reference(*references, kwargs)
    grad_output = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1000))
    check_gradients(
        case, inputs, out, references, expected, grad_output.to(dtype), HALF_GRADIENT_RTOL
    )
