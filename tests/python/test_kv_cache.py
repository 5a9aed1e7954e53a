# attn.KVCache and scaled_dot_product_attention(query, cache, None): the stored entries against
# NumPy's and PyTorch's own roundings; attention against PyTorch's scaled_dot_product_attention
# (enable_gqa) on the widened cache with the equivalent masks (query i of sequence b at position
# lengths[b] − n + i) for every dtype, ragged lengths, n = 1 and 4 (decode kernel) and n = 20
# (prefill kernel); soft-capping and sinks against the float64 eager reference; the errors.
import threading

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the KV-cache comparisons need it"
)
F = torch.nn.functional

import attn  # noqa: E402
import attn.torch as attn_torch  # noqa: E402
from torch_reference import reference_sdpa  # noqa: E402

DTYPES = ["float32", "float16", "bfloat16", "int8"]
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}

# attn against PyTorch on the same float32 keys and values (the widened cache): both accumulate
# at most ~60 O(1) products in float32, in different orders and with attn's cheaper exp, so they
# differ by a few float32 ulps of the largest output — 1e-5 of it, as test_sdpa_torch.py.
OUTPUT_RTOL = 1e-5

B, HQ, HKV, D = 3, 8, 2, 32  # 4 query heads per key/value head, as the 32 over 8


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(20250613)


def assert_relative(actual, expected, rtol, name):
    """max |actual − expected| ≤ rtol · max |expected|."""
    actual = torch.as_tensor(actual).double()
    expected = torch.as_tensor(expected).double()
    assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
    assert torch.isfinite(actual).all(), f"{name}: attn gave non-finite values"
    scale = expected.abs().max().item()
    error = (actual - expected).abs().max().item()
    assert error <= rtol * scale, f"{name}: max error {error:.3g} > {rtol} × {scale:.3g}"


def visible_mask(lengths, n, longest, causal=False, window=None):
    """(B, 1, n, longest) bool: what query i of sequence b, at position lengths[b] − n + i, sees."""
    mask = torch.zeros(len(lengths), 1, n, longest, dtype=torch.bool)
    keys = torch.arange(longest)
    for b, length in enumerate(lengths):
        for i in range(n):
            position = int(length) - n + i
            seen = keys < int(length)
            if causal:
                seen &= keys <= position
            if window is not None:
                left, right = window
                if left is not None and left >= 0:
                    seen &= keys >= position - left
                if right is not None and right >= 0:
                    seen &= keys <= position + right
            mask[b, 0, i] = seen
    return mask


def filled_cache(dtype, first=(37, 5, 20), n=1, d=D, value_dim=None, capacity=8):
    """A cache holding a ragged first chunk (sequence b takes first[b] of 37 tokens), then n more
    tokens for every sequence; also returns the float32 keys and values appended, per sequence.
    The small capacity makes both appends grow the storage."""
    dv = value_dim or d
    cache = attn.KVCache(B, HKV, d, capacity, dtype=dtype, value_dim=value_dim)
    chunk = max(first)
    k0, v0 = torch.randn(B, HKV, chunk, d), torch.randn(B, HKV, chunk, dv)
    cache.append(k0, v0, counts=list(first))
    k1, v1 = torch.randn(B, HKV, n, d), torch.randn(B, HKV, n, dv)
    cache.append(k1, v1)
    keys = [torch.cat([k0[b, :, : first[b]], k1[b]], dim=1) for b in range(B)]
    values = [torch.cat([v0[b, :, : first[b]], v1[b]], dim=1) for b in range(B)]
    return cache, keys, values


# --- the stored entries ----------------------------------------------------------------------


def rounded(x, dtype):
    """What the cache should hold for float32 x: the same rounding as NumPy's and PyTorch's
    (round to nearest even) for float16 and bfloat16, x itself for float32."""
    if dtype == "float16":
        return x.numpy().astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return x.to(torch.bfloat16).float().numpy()
    return x.numpy()


@pytest.mark.parametrize("dtype", DTYPES)
def test_stored_entries_are_the_inputs_rounded_and_zero_past_each_length(dtype):
    cache, keys, values = filled_cache(dtype, n=3)
    lengths = [37 + 3, 5 + 3, 20 + 3]
    assert cache.lengths.tolist() == lengths and cache.lengths.dtype == np.int64
    widened_keys, widened_values = cache.keys(), cache.values()
    assert widened_keys.dtype == np.float32 and widened_keys.shape == (B, HKV, 40, D)
    for b, length in enumerate(lengths):
        for stored, given in ((widened_keys[b], keys[b]), (widened_values[b], values[b])):
            assert not stored[:, length:].any()
            if dtype == "int8":
                # One scale per row, max|x| / 127, and entries rounded to the nearest step: each
                # entry within half a step (the 1e-5 covers the scale's own float32 rounding).
                step = given.abs().amax(dim=-1, keepdim=True).numpy() / 127
                assert np.all(np.abs(stored[:, :length] - given.numpy()) <= 0.5 * step * (1 + 1e-5))
            else:
                np.testing.assert_array_equal(stored[:, :length], rounded(given, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sizes_dtype_and_bytes_per_token(dtype):
    cache = attn.KVCache(2, 4, 16, 10, dtype=dtype, value_dim=8)
    assert (cache.batch, cache.kv_heads, cache.head_dim, cache.value_dim) == (2, 4, 16, 8)
    assert cache.capacity == 10 and cache.dtype == dtype
    scales = 2 * 4 if dtype == "int8" else 0  # one float32 scale per key row and value row
    assert cache.bytes_per_token == 4 * ((16 + 8) * ELEMENT_BYTES[dtype] + scales)
    assert cache.lengths.tolist() == [0, 0]
    assert cache.keys().shape == (2, 4, 0, 16)
    assert f"dtype='{dtype}'" in repr(cache)


def test_growth_reserve_and_clear():
    cache = attn.KVCache(1, 1, 4, 4)
    k = np.random.default_rng(1).standard_normal((1, 1, 10, 4)).astype(np.float32)
    cache.append(k[:, :, :3], k[:, :, :3])
    cache.append(k[:, :, 3:], k[:, :, 3:])  # past the capacity: the storage grows
    assert cache.capacity >= 10 and cache.lengths.tolist() == [10]
    np.testing.assert_array_equal(cache.keys(), k)
    cache.reserve(100)
    assert cache.capacity == 100
    cache.reserve(5)  # never shrinks
    assert cache.capacity == 100
    np.testing.assert_array_equal(cache.values(), k)
    cache.clear()
    assert cache.lengths.tolist() == [0] and cache.capacity == 100


def test_strided_and_float64_inputs():
    """Keys laid out (B, T, H_kv, d) and seen through transpose(1, 2), as a projection writes
    them, and float64 arrays (copied to float32) store the same entries."""
    rng = np.random.default_rng(2)
    k = rng.standard_normal((B, 6, HKV, D)).astype(np.float32)
    v = rng.standard_normal((B, 6, HKV, D))
    cache = attn.KVCache(B, HKV, D, 6)
    cache.append(k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(cache.keys(), k.transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(cache.values(), v.transpose(0, 2, 1, 3).astype(np.float32))


# --- attention against PyTorch ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 4, 20], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_matches_torch_on_the_widened_cache(dtype, n, causal):
    """n = 1 and 4 run the decode kernel (4 query heads × n ≤ 64 rows), n = 20 the prefill
    kernel on float32 copies; both must equal PyTorch's SDPA on what the cache holds."""
    cache, _, _ = filled_cache(dtype, n=n)
    lengths = cache.lengths.tolist()
    query = torch.randn(B, HQ, n, D)
    output = attn.scaled_dot_product_attention(
        query, cache, None, is_causal=causal, enable_gqa=True
    )
    assert isinstance(output, torch.Tensor) and output.shape == (B, HQ, n, D)
    keys, values = torch.from_numpy(cache.keys()), torch.from_numpy(cache.values())
    mask = visible_mask(lengths, n, keys.shape[2], causal)
    expected = F.scaled_dot_product_attention(query, keys, values, mask, enable_gqa=True)
    assert_relative(output, expected, OUTPUT_RTOL, f"{dtype} n={n}")


@pytest.mark.parametrize("n", [1, 4, 16], ids=lambda n: f"n{n}")
def test_bfloat16_queries_on_a_bfloat16_cache(n):
    """Queries that are bf16 values against a bf16 cache, 4 query heads per key/value head: 4,
    16 and 64 rows, which on CPUs with AVX512-BF16 score on vdpbf16ps. A bf16 call takes P·V
    there too, P rounded to bf16 as PyTorch's CPU kernels and attn's prefill round it: against
    float64 on the same values, 1e-5 of the largest output plus, per element, the weights'
    rounding, 2⁻⁸·Σ_j P_ij·|v_j|, and the output's own, 2⁻⁸ of it. The same queries as float32
    (an upcast bf16 model's) keep P in fp32: 1e-5 of the largest output (P rounded there left
    2.6e-4)."""
    cache, _, _ = filled_cache("bfloat16", n=n)
    query = torch.randn(B, HQ, n, D).bfloat16()
    keys, values = (torch.from_numpy(x).double() for x in (cache.keys(), cache.values()))
    mask = visible_mask(cache.lengths.tolist(), n, keys.shape[2], causal=True)
    keys, values = (x.repeat_interleave(HQ // HKV, dim=1) for x in (keys, values))
    scores = (query.double() @ keys.transpose(-1, -2)) / D**0.5
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    expected = weights @ values
    for given in (query, query.float()):
        output = attn.scaled_dot_product_attention(
            given, cache, None, is_causal=True, enable_gqa=True
        )
        assert output.dtype == given.dtype
        bound = 1e-5 * expected.abs().max()
        if given.dtype == torch.bfloat16:
            bound = bound + 2**-8 * (weights @ values.abs()) + 2**-8 * expected.abs()
        error = (torch.as_tensor(output).double() - expected).abs()
        assert torch.all(error <= bound), (
            f"n={n} {given.dtype}: largest error / bound {(error / bound).max():.3g}"
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 20], ids=lambda n: f"n{n}")
def test_window_scale_and_value_dim(dtype, n):
    """A causal window of 6 keys back, an explicit scale, values narrower than keys, NumPy in
    and out."""
    cache, _, _ = filled_cache(dtype, n=n, d=24, value_dim=12)
    lengths = cache.lengths.tolist()
    query = torch.randn(B, HQ, n, 24)
    output = attn.scaled_dot_product_attention(
        query.numpy(), cache, cache, is_causal=True, scale=0.3, enable_gqa=True, window=(6, 0)
    )
    assert isinstance(output, np.ndarray) and output.shape == (B, HQ, n, 12)
    keys, values = torch.from_numpy(cache.keys()), torch.from_numpy(cache.values())
    mask = visible_mask(lengths, n, keys.shape[2], causal=True, window=(6, 0))
    expected = F.scaled_dot_product_attention(query, keys, values, mask, scale=0.3, enable_gqa=True)
    assert_relative(output, expected, OUTPUT_RTOL, f"{dtype} n={n}")


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("n", [1, 20], ids=lambda n: f"n{n}")
def test_softcap_and_sinks_match_the_reference(dtype, n):
    """PyTorch's SDPA has neither, so the float64 eager reference (tests/python/
    torch_reference.py) on the widened cache, with the same mask as a bool attn_mask."""
    cache, _, _ = filled_cache(dtype, n=n)
    lengths = cache.lengths.tolist()
    query = torch.randn(B, HQ, n, D)
    sinks = torch.randn(HQ)
    output = attn.scaled_dot_product_attention(
        query, cache, None, is_causal=True, enable_gqa=True, softcap=2.5, sinks=sinks
    )
    keys, values = torch.from_numpy(cache.keys()), torch.from_numpy(cache.values())
    mask = visible_mask(lengths, n, keys.shape[2], causal=True)
    expected = reference_sdpa(
        query.double(),
        keys.double(),
        values.double(),
        attn_mask=mask,
        enable_gqa=True,
        softcap=2.5,
        sinks=sinks.double(),
    )
    assert_relative(output, expected, OUTPUT_RTOL, f"{dtype} n={n}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n", [1, 20], ids=lambda n: f"n{n}")
def test_alibi_counts_from_each_querys_position(dtype, n):
    """ALiBi's −slope·|position − j| with each query at its sequence's position lengths[b] − n + i:
    the float64 reference per sequence, aligned bottom-right on its own keys (n = 1 runs the
    decode kernel, n = 20 × 4 heads per group its prefill path)."""
    cache, _, _ = filled_cache(dtype, n=n)
    query = torch.randn(B, HQ, n, D)
    slopes = [2.0 ** -(h + 1) for h in range(HQ)]
    output = attn.scaled_dot_product_attention(
        query, cache, None, is_causal=True, enable_gqa=True, alibi_slopes=slopes
    )
    keys, values = torch.from_numpy(cache.keys()), torch.from_numpy(cache.values())
    for b, length in enumerate(cache.lengths.tolist()):
        expected = reference_sdpa(
            query[b : b + 1].double(),
            keys[b : b + 1, :, :length].double(),
            values[b : b + 1, :, :length].double(),
            is_causal=True,
            enable_gqa=True,
            alibi_slopes=torch.tensor(slopes, dtype=torch.float64),
            alignment="bottom-right",
        )
        assert_relative(output[b : b + 1], expected, OUTPUT_RTOL, f"{dtype} n={n} b={b}")


@pytest.mark.parametrize("cache_dtype", DTYPES)
@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_models_append_and_attend_in_their_dtype(cache_dtype, half):
    """A half model's keys, values and queries go in as they are: appended keys are stored as
    their float32 widening would be (a bfloat16 cache keeps bfloat16 keys bit for bit), and a
    half query's output is the float32 query's output rounded once to its dtype, in that dtype,
    through attn's call (torch and NumPy float16 alike) and attn.torch's. (A bfloat16 call on a
    bfloat16 cache where P·V runs on vdpbf16ps rounds P to bf16 first, which the float32 call
    does not: within 2⁻⁸ of the weighted values' magnitude more.)"""
    keys, values = torch.randn(B, HKV, 9, D).to(half), torch.randn(B, HKV, 9, D).to(half)
    halves = attn.KVCache(B, HKV, D, 4, dtype=cache_dtype)
    widened = attn.KVCache(B, HKV, D, 4, dtype=cache_dtype)
    halves.append(keys, values, counts=[9, 4, 0])
    widened.append(keys.float(), values.float(), counts=[9, 4, 0])
    np.testing.assert_array_equal(halves.keys(), widened.keys())
    np.testing.assert_array_equal(halves.values(), widened.values())
    if cache_dtype == "bfloat16" and half == torch.bfloat16:
        np.testing.assert_array_equal(halves.keys()[0], keys[0].float().numpy())
    query = torch.randn(B, HQ, 2, D).to(half)
    expected = attn.scaled_dot_product_attention(query.float(), halves, None, enable_gqa=True)
    rounds_weights = cache_dtype == "bfloat16" and half == torch.bfloat16
    for call in (attn.scaled_dot_product_attention, attn_torch.scaled_dot_product_attention):
        output = call(query, halves, None, enable_gqa=True)
        assert output.dtype == half
        if rounds_weights and not torch.equal(output, expected.to(half)):
            bound = 2**-8 * (expected.abs() + values.float().abs().max())
            assert torch.all((output.float() - expected).abs() <= bound)
        else:
            assert torch.equal(output, expected.to(half))
    if half == torch.float16:
        output = attn.scaled_dot_product_attention(query.numpy(), halves, None, enable_gqa=True)
        assert output.dtype == np.float16
        np.testing.assert_array_equal(output, expected.to(half).numpy())


def test_a_query_that_sees_no_key_gets_zeros():
    """An empty sequence (and, causal, a query before its sequence's first token) attends to
    nothing: a zero output, as attn's other calls give, where PyTorch would give NaN."""
    cache = attn.KVCache(2, 1, 8, 4)
    cache.append(torch.randn(2, 1, 3, 8), torch.randn(2, 1, 3, 8), counts=[3, 0])
    output = attn.scaled_dot_product_attention(torch.randn(2, 1, 1, 8), cache, None)
    assert torch.all(output[1] == 0) and torch.all(output[0] != 0)
    # Sequence 0 holds 3 tokens but gets 5 queries: the first two sit at positions −2 and −1.
    output = attn.scaled_dot_product_attention(torch.randn(2, 1, 5, 8), cache, None, is_causal=True)
    assert torch.all(output[0, :, :2] == 0) and torch.all(output[0, :, 2:] != 0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8"])
def test_narrow_caches_stay_close_to_float32(dtype):
    """The same tokens in a narrow cache give nearly the float32 cache's output: each entry is
    off by at most half a step of the format (2⁻¹¹ relative for float16, 2⁻⁸ for bfloat16,
    max|row|/254 for int8), and the output, a weighted mean of values with weights from scores of
    ~√d · that error, moves by a few steps: 3e-3 for float16, 3e-2 for bfloat16 and int8, relative
    to the output's largest entry."""
    tolerance = {"float16": 3e-3, "bfloat16": 3e-2, "int8": 3e-2}[dtype]
    torch.manual_seed(5)
    narrow, _, _ = filled_cache(dtype, n=1)
    torch.manual_seed(5)
    wide, _, _ = filled_cache("float32", n=1)
    query = torch.randn(B, HQ, 1, D)
    expected = attn.scaled_dot_product_attention(query, wide, None, enable_gqa=True)
    output = attn.scaled_dot_product_attention(query, narrow, None, enable_gqa=True)
    assert_relative(output, expected, tolerance, dtype)


def test_attn_torch_takes_a_cache_for_inference():
    cache, _, _ = filled_cache("float16", n=2)
    query = torch.randn(B, HQ, 2, D, dtype=torch.float64)
    output = attn_torch.scaled_dot_product_attention(
        query, cache, None, is_causal=True, enable_gqa=True
    )
    expected = attn.scaled_dot_product_attention(
        query.float(), cache, None, is_causal=True, enable_gqa=True
    )
    assert output.dtype == torch.float64
    torch.testing.assert_close(output, expected.double(), rtol=0, atol=0)
    # attn's own options go through as well (the plain call above passes none of them).
    options = dict(window=(3, 0), softcap=2.5, sinks=torch.randn(HQ), alibi_slopes=torch.rand(HQ))
    output = attn_torch.scaled_dot_product_attention(
        query.float(), cache, None, causal=True, enable_gqa=True, **options
    )
    expected = attn.scaled_dot_product_attention(
        query.float(), cache, None, is_causal=True, enable_gqa=True, **options
    )
    torch.testing.assert_close(output, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="valid_lens: not taken with a KV cache"):
        attn_torch.scaled_dot_product_attention(
            query, cache, None, enable_gqa=True, valid_lens=[1, 1, 1]
        )
    leaf = query.requires_grad_(True)
    with pytest.raises(ValueError, match="no backward pass"):
        attn_torch.scaled_dot_product_attention(leaf, cache, None, enable_gqa=True)
    with torch.no_grad():
        attn_torch.scaled_dot_product_attention(leaf, cache, None, enable_gqa=True)
    # A model's sinks and slopes are parameters: named as the query is (attn's own function's
    # message sent the user to attn.torch's, the very function called).
    for name in ("sinks", "alibi_slopes"):
        parameter = torch.nn.Parameter(torch.rand(HQ))
        with pytest.raises(ValueError, match=f"^{name}: requires grad, but attention against a "
                                             "KVCache has no backward pass"):
            attn_torch.scaled_dot_product_attention(
                query.detach(), cache, None, enable_gqa=True, **{name: parameter})


def test_threads_share_a_cache():
    """Calls release the GIL and only read the cache: eight threads at once give the result of
    one call, bit for bit."""
    cache, _, _ = filled_cache("bfloat16", n=4)
    query = torch.randn(B, HQ, 4, D)
    expected = attn.scaled_dot_product_attention(query, cache, None, enable_gqa=True)
    results = [None] * 8

    def work(index):
        results[index] = attn.scaled_dot_product_attention(query, cache, None, enable_gqa=True)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        assert torch.equal(result, expected)


# --- errors ------------------------------------------------------------------------------------


def test_constructor_errors():
    with pytest.raises(ValueError, match='dtype: expected "float32"'):
        attn.KVCache(1, 1, 8, 4, dtype="float8")
    with pytest.raises(ValueError, match="batch"):
        attn.KVCache(0, 1, 8, 4)
    with pytest.raises(ValueError, match="capacity"):
        attn.KVCache(1, 1, 8, -1)
    with pytest.raises(ValueError, match="value_dim"):
        attn.KVCache(1, 1, 8, 4, value_dim=0)
    # Storage past any address space: its byte count wrapped around to 0 before, and the first
    # append wrote past the end (a segmentation fault).
    with pytest.raises(ValueError, match="capacity: expected a number of tokens whose storage"):
        attn.KVCache(1, 1, 8, 2**62)
    with pytest.raises(ValueError, match="batch, kv_heads, head_dim, value_dim: expected sizes"):
        attn.KVCache(2**40, 2**40, 8, 1)
    cache = attn.KVCache(1, 1, 8, 2)
    with pytest.raises(ValueError, match="capacity"):
        cache.reserve(2**62)
    assert cache.capacity == 2
    # A wrong type is named as the constructor names it (it got nanobind's whole signature).
    for wrong, kind in ((5.5, "float"), (None, "NoneType")):
        with pytest.raises(TypeError, match=rf"^KVCache.reserve\(\): argument 'capacity' must be "
                                            rf"int, not {kind}$"):
            cache.reserve(wrong)


def test_append_errors_leave_the_cache_unchanged():
    cache = attn.KVCache(2, 2, 8, 4)
    cache.append(np.ones((2, 2, 1, 8), np.float32), np.ones((2, 2, 1, 8), np.float32))
    good = np.ones((2, 2, 3, 8), np.float32)
    with pytest.raises(attn.ShapeError, match=r"keys: expected shape \(2, 2, T, 8\)"):
        cache.append(np.ones((2, 3, 3, 8), np.float32), good)
    with pytest.raises(attn.ShapeError, match="values: expected 3 tokens"):
        cache.append(good, np.ones((2, 2, 2, 8), np.float32))
    with pytest.raises(attn.ShapeError, match="counts: expected one count per sequence"):
        cache.append(good, good, counts=[1, 2, 3])
    with pytest.raises(ValueError, match=r"counts\[1\]: expected a number of tokens in \[0, 3\]"):
        cache.append(good, good, counts=np.array([1, 4]))
    with pytest.raises(ValueError, match="counts: expected one count per sequence"):
        cache.append(good, good, counts=[[1], [2]])
    bad = good.copy()
    bad[1, 0, 2, 5] = np.nan
    with pytest.raises(ValueError, match="values"):
        cache.append(good, bad)
    with pytest.raises(TypeError, match="keys: expected float32"):
        cache.append(good.astype(np.int32), good)
    with pytest.raises(ValueError, match="keys: expected a 4-d array"):
        cache.append(good[0], good)
    # An expanded view of 2⁵⁵ tokens (stride 0: no memory behind it) asks for 2⁶² bytes, which no
    # address space maps: refused before any entry is read (a scan of its 2⁶⁰ entries came first,
    # hours).
    endless = torch.ones(2, 2, 1, 8).expand(2, 2, 2**55, 8)
    with pytest.raises(MemoryError, match="capacity: could not allocate"):
        cache.append(endless, endless)
    assert cache.lengths.tolist() == [1, 1]
    np.testing.assert_array_equal(cache.keys(), np.ones((2, 2, 1, 8), np.float32))


def test_attention_errors_name_the_argument():
    cache, _, _ = filled_cache("float32", n=1)
    query = torch.randn(B, HQ, 1, D)
    refused = {
        "attn_mask": dict(attn_mask=torch.ones(B, 1, 1, 41, dtype=torch.bool)),
        "valid_lens": dict(valid_lens=[1, 2, 3]),
        "dropout_p": dict(dropout_p=0.1),  # named as given (it read "dropout:")
        "dropout": dict(dropout=0.1),
    }
    for name, arguments in refused.items():
        with pytest.raises(ValueError, match=f"^{name}: not taken with a KV cache"):
            attn.scaled_dot_product_attention(query, cache, None, enable_gqa=True, **arguments)
    with pytest.raises(ValueError, match="need_weights: not available with a KVCache"):
        attn.scaled_dot_product_attention(query, cache, None, enable_gqa=True, need_weights=True)
    with pytest.raises(TypeError, match="value: expected None or the KVCache given as key"):
        attn.scaled_dot_product_attention(query, cache, torch.randn(B, HKV, 41, D), enable_gqa=True)
    other, _, _ = filled_cache("float32", n=1)
    with pytest.raises(TypeError, match="value: expected None or the KVCache given as key"):
        attn.scaled_dot_product_attention(query, cache, other, enable_gqa=True)
    with pytest.raises(TypeError, match="value: got a KVCache; pass the cache as key"):
        attn.scaled_dot_product_attention(query, torch.randn(B, HKV, 41, D), cache)
    with pytest.raises(attn.ShapeError, match="set enable_gqa"):
        attn.scaled_dot_product_attention(query, cache, None)
    with pytest.raises(attn.ShapeError, match="divide"):
        attn.scaled_dot_product_attention(torch.randn(B, 3, 1, D), cache, None, enable_gqa=True)
    with pytest.raises(attn.ShapeError, match="query: expected shape"):
        attn.scaled_dot_product_attention(
            torch.randn(B, HQ, 1, D + 1), cache, None, enable_gqa=True
        )
    with pytest.raises(ValueError, match="query: expected a 4-d array"):
        attn.scaled_dot_product_attention(torch.randn(HQ, 1, D), cache, None, enable_gqa=True)
    with pytest.raises(ValueError, match="softcap"):
        attn.scaled_dot_product_attention(query, cache, None, enable_gqa=True, softcap=-1.0)
    with pytest.raises(attn.ShapeError, match="sinks: expected one value per query head"):
        attn.scaled_dot_product_attention(query, cache, None, enable_gqa=True, sinks=[0.0])


def test_append_reads_negative_views_with_their_sign():
    # z.conj().imag has the negative bit set (a lazily negated view), which PyTorch's DLPack
    # export drops: the cache stores the values, and a query with the bit attends as its values.
    keys = torch.randn(B, HKV, 3, D, dtype=torch.complex64).conj().imag
    values = torch.randn(B, HKV, 3, D, dtype=torch.complex64).conj().imag
    query = torch.randn(B, HQ, 1, D, dtype=torch.complex64).conj().imag
    assert keys.is_neg() and values.is_neg() and query.is_neg()
    cache = attn.KVCache(B, HKV, D, 4)
    cache.append(keys, values)
    np.testing.assert_array_equal(cache.keys()[:, :, :3], keys.resolve_neg().numpy())
    np.testing.assert_array_equal(cache.values()[:, :, :3], values.resolve_neg().numpy())
    output = attn.scaled_dot_product_attention(query, cache, None, enable_gqa=True)
    expected = F.scaled_dot_product_attention(query.resolve_neg(), keys.resolve_neg(),
                                              values.resolve_neg(), enable_gqa=True)
    assert_relative(output, expected, OUTPUT_RTOL, "attention of a negated query")
    assert torch.equal(attn_torch.scaled_dot_product_attention(query, cache, None, enable_gqa=True),
                       output)


def test_append_refuses_tensors_that_record_autograd():
    # Keys a projection computed under grad mode: the cache stores their values, and no gradient
    # could flow back through it; refused as tensor.numpy() refuses them (they were taken, the
    # graph cut without a word), taken detached or under no_grad.
    cache = attn.KVCache(B, HKV, D, 4)
    keys = torch.randn(B, HKV, 1, D, requires_grad=True)
    values = torch.randn(B, HKV, 1, D)
    for first, second, name in ((keys, values, "keys"), (values, keys, "values")):
        with pytest.raises(ValueError, match=(
            rf"^{name}: expected a tensor that does not require grad \(attn.KVCache.append stores "
            rf"it outside autograd: no gradient flows back through it\), got one that requires "
            rf"grad while grad mode is on; pass {name}.detach\(\), or call under "
            r"torch.no_grad\(\)$")):
            cache.append(first, second)
    assert list(cache.lengths) == [0] * B
    cache.append(keys.detach(), values)
    with torch.no_grad():
        cache.append(keys, values)
    assert list(cache.lengths) == [2] * B
    np.testing.assert_array_equal(cache.keys()[:, :, 1:2], keys.detach().numpy())


def test_a_cache_of_capacity_zero_gives_zero_outputs():
    # Nothing appended, no storage: every row sees no key (it raised a ShapeError whose "got"
    # read as its "expected").
    cache = attn.KVCache(B, HKV, D, 0)
    query = torch.randn(B, HQ, 1, D)
    output = attn.scaled_dot_product_attention(query, cache, None, enable_gqa=True)
    assert torch.equal(torch.as_tensor(output), torch.zeros(B, HQ, 1, D))


def test_more_queries_than_a_sequence_holds_align_bottom_right():
    # n queries are the last n tokens: with fewer cached (a ragged append, left padding) the
    # first sit at negative positions, as FlashAttention aligns more queries than keys
    # bottom-right. Causal, they see no key and get zeros; not causal, every query sees all
    # cached keys. Both as attn's own call on the cached keys with alignment="bottom-right".
    cache = attn.KVCache(1, 1, 8, 4)
    keys, values = torch.randn(1, 1, 2, 8), torch.randn(1, 1, 2, 8)
    cache.append(keys, values)
    query = torch.randn(1, 1, 5, 8)
    for causal in (True, False):
        output = attn.scaled_dot_product_attention(query, cache, None, is_causal=causal)
        expected = attn.scaled_dot_product_attention(query, keys, values, is_causal=causal,
                                                     alignment="bottom-right")
        assert_relative(output, expected, OUTPUT_RTOL, f"causal={causal}")
        reference = reference_sdpa(query.double(), keys.double(), values.double(),
                                   is_causal=causal, alignment="bottom-right")
        assert_relative(output, reference, OUTPUT_RTOL, f"causal={causal} reference")
    causal = attn.scaled_dot_product_attention(query, cache, None, is_causal=True)
    assert torch.all(causal[0, 0, :3] == 0) and torch.all(causal[0, 0, 3:] != 0)


def test_dropout_of_every_weight_is_refused_with_a_cache():
    # A cache call takes no dropout; p = 1, which the arrays' call now computes (zeros), is no
    # exception.
    cache, _, _ = filled_cache("float32", n=1)
    query = torch.randn(B, HQ, 1, D)
    for call in (attn.scaled_dot_product_attention, attn_torch.scaled_dot_product_attention):
        with pytest.raises(ValueError, match="^dropout_p: not taken with a KV cache"):
            call(query, cache, None, dropout_p=1.0, enable_gqa=True)
