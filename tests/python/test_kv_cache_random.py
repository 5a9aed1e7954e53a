# attn.scaled_dot_product_attention(query, cache, None) on random combinations of a KV cache and
# the call's arguments: cache dtypes, grouped-query heads of 1-8 queries per key/value head, 1-33
# query rows (the decode kernel's one-row, few-row and many-row paths, and the prefill kernel past
# them), ragged and empty sequences, lengths that cross 64-key tiles, caches filled in one append or
# two, keys, values and queries in float32 or a half model's dtype, causal masks, windows, ALiBi,
# soft-capping, sinks and scales; against the float64 reference
# (torch_reference.reference_sdpa) per sequence on what the cache holds, on every SIMD target this
# machine runs. Each case draws every argument from its own seeded generator, so a failure names a
# case that reproduces alone.
import math
import random

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the KV-cache comparisons need it"
)

import attn  # noqa: E402
from torch_reference import reference_sdpa, score_rounding  # noqa: E402

# As test_sdpa_random.py: 1e-5 of the largest output plus the scores' float32 rounding. A bf16
# cache read by bfloat16 queries may take vdpbf16ps for P·V as well, P rounded to bf16 first
# (test_kv_cache.py's test_bfloat16_queries_on_a_bfloat16_cache): 2⁻⁸·Σ_j P_ij·|v_j| more, at
# most 2⁻⁸·max |v|; float32 queries that are bf16 values score on it, and keep P in fp32. Over seeds 0-999 on the AVX-512, AVX2, SSE4 and scalar targets, attn's
# error stayed under 0.23 of this bound.
OUTPUT_RTOL = 1e-5
BFLOAT16_PROBABILITIES = 2.0**-8
# A half query's output is rounded once to its dtype: its unit roundoff, relative.
OUTPUT_ROUNDING = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def random_case(seed):
    """Shapes, the cache's dtype and contents' layout, and the call's options, all from `seed`."""
    rng = random.Random(seed)
    kv_heads = rng.choice([1, 2, 3])
    case = {
        "batch": rng.choice([1, 2, 3]),
        "kv_heads": kv_heads,
        "heads": kv_heads * rng.choice([1, 2, 4, 8]),
        "queries": rng.choice([1, 1, 2, 3, 4, 5, 7, 8, 12, 16, 20, 33]),
        "depth": rng.choice([8, 16, 24, 64, 80, 128]),
        "value_dim": rng.choice([None, None, 8, 40]),
        "dtype": rng.choice(["float32", "float16", "bfloat16", "int8"]),
        "bfloat16_queries": rng.random() < 0.3,  # a bf16 model's queries: bf16 values
        # The tensors' own dtype: a half model passes its keys, values and queries as they are.
        "input_dtype": rng.choice(["float32", "float32", "bfloat16", "float16"]),
        "magnitude": rng.choice([0.5, 1.0, 2.0]),
        "appends": rng.choice([1, 2]),  # the second appends each sequence's last n tokens
        "options": {},
    }
    case["lengths"] = [rng.choice([0, 1, 5, 63, 64, 65, 200, 517]) for _ in range(case["batch"])]
    options = case["options"]
    if rng.random() < 0.5:
        options["is_causal"] = True
    if rng.random() < 0.3:
        options["window"] = (rng.choice([None, 0, 3, 50]), rng.choice([None, 0, 7]))
    if rng.random() < 0.3:
        options["alibi_slopes"] = rng.choice([0.05, 0.3])
    if rng.random() < 0.3:
        options["softcap"] = rng.choice([2.5, 30.0])
    if rng.random() < 0.3:
        options["sinks"] = rng.choice([-1.0, 2.0])
    if rng.random() < 0.3:
        options["scale"] = rng.choice([0.05, 0.3])
    return case


def filled_cache(case, generator):
    """The case's cache, each sequence b holding lengths[b] tokens of N(0, magnitude²) entries."""
    b, heads, d = case["batch"], case["kv_heads"], case["depth"]
    dv = case["value_dim"] or d
    cache = attn.KVCache(b, heads, d, 4, dtype=case["dtype"], value_dim=case["value_dim"])
    lengths = case["lengths"]
    last = case["queries"] if case["appends"] == 2 else 0
    counts = [max(0, length - last) for length in lengths]
    for chunk in (counts, [length - count for length, count in zip(lengths, counts)]):
        if not any(chunk):
            continue
        rows = max(chunk)
        keys = torch.randn(b, heads, rows, d, generator=generator) * case["magnitude"]
        values = torch.randn(b, heads, rows, dv, generator=generator) * case["magnitude"]
        dtype = getattr(torch, case["input_dtype"])
        cache.append(keys.to(dtype), values.to(dtype), counts=chunk)
    assert cache.lengths.tolist() == lengths
    return cache


@pytest.fixture(params=attn.available_simd_targets())
def simd_target(request):
    """The kernels capped at one target for the test (attn.limit_simd_target), then uncapped."""
    attn.limit_simd_target(request.param)
    yield request.param
    attn.limit_simd_target("best")


@pytest.mark.parametrize("seed", range(16))
def test_cached_attention_matches_the_reference(seed, simd_target):
    case = random_case(seed)
    generator = torch.Generator().manual_seed(seed)
    cache = filled_cache(case, generator)
    shape = (case["batch"], case["heads"], case["queries"], case["depth"])
    query = torch.randn(shape, generator=generator) * case["magnitude"]
    if case["bfloat16_queries"]:
        query = query.bfloat16().float()
    query = query.to(getattr(torch, case["input_dtype"]))
    kwargs = dict(case["options"])
    if "alibi_slopes" in kwargs:
        slopes = torch.rand(case["heads"], generator=generator)
        kwargs["alibi_slopes"] = slopes * kwargs["alibi_slopes"]
    if "sinks" in kwargs:
        kwargs["sinks"] = torch.randn(case["heads"], generator=generator) + kwargs["sinks"]
    output = attn.scaled_dot_product_attention(query, cache, None, enable_gqa=True, **kwargs)
    assert output.dtype == query.dtype
    output = torch.as_tensor(output).double()
    assert output.shape == shape[:3] + (case["value_dim"] or case["depth"],)
    keys, values = (torch.from_numpy(x).double() for x in (cache.keys(), cache.values()))
    widened = {name: x.double() if torch.is_tensor(x) else x for name, x in kwargs.items()}
    for b, length in enumerate(case["lengths"]):
        got = output[b : b + 1]
        if length == 0:  # a sequence with no token: zeros, as attn's other calls give
            assert torch.all(got == 0), (b, case)
            continue
        # Query i of sequence b sits at position length − n + i: the bottom-right alignment.
        q = query[b : b + 1].double()
        k, v = keys[b : b + 1, :, :length], values[b : b + 1, :, :length]
        expected = reference_sdpa(q, k, v, enable_gqa=True, alignment="bottom-right", **widened)
        bound = OUTPUT_RTOL * expected.abs().max().item() + score_rounding(q, k, v, kwargs)
        # (float32 queries keep P in fp32, even those bf16 holds: the fp32 bound.)
        if case["dtype"] == "bfloat16" and query.dtype == torch.bfloat16:
            bound += BFLOAT16_PROBABILITIES * v.abs().max().item()
        bound += OUTPUT_ROUNDING.get(query.dtype, 0.0) * expected.abs().max().item()
        error = (got - expected).abs().max().item()
        assert error <= bound, (b, error, bound, simd_target, case)
