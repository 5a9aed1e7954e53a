# attn's functions (masked_softmax, scaled_dot_product_attention, additive_attention,
# gaussian_kernel_pooling) against the NumPy reference, the PyTorch fixtures and the book's toy
# example.
import os

import numpy as np
import pytest

import attn
import numpy_reference as ref
from conftest import Case, book_toy_inputs

# float32 kernels against float64 references on O(1) inputs with m ≤ 10 keys: a few float32 ulps
# of accumulated rounding, far below 1e-5.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)

rng = np.random.default_rng(20250101)


def normal(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(
    "valid_lens",
    [
        None,
        np.array([2, 4]),
        np.array([[1, 4, 2], [4, 3, 1]], dtype=np.int32),
        [3, 1],
        [[1, 2, 3], [4, 4, 4]],
    ],
    ids=["none", "per_batch_int64", "per_query_int32", "list", "nested_list"],
)
def test_masked_softmax_matches_reference(valid_lens):
    scores = normal(2, 3, 4) * 3
    weights = attn.masked_softmax(scores, valid_lens)
    assert (
        isinstance(weights, np.ndarray)
        and weights.dtype == np.float32
        and weights.shape == (2, 3, 4)
    )
    np.testing.assert_allclose(weights, ref.masked_softmax(scores, valid_lens), **TOLERANCE)


def test_masked_softmax_masked_keys_are_exactly_zero_and_length_zero_rows_are_zero():
    weights = attn.masked_softmax(normal(2, 2, 5), np.array([[0, 2], [5, 1]]))
    assert np.all(weights[0, 0] == 0.0)  # valid length 0: all-zero weights, no NaN
    assert np.all(weights[0, 1, 2:] == 0.0) and np.all(weights[1, 1, 1:] == 0.0)
    np.testing.assert_allclose(weights[0, 1].sum(), 1.0, rtol=1e-6)
    assert weights[1, 1, 0] == 1.0


def test_masked_softmax_accepts_float64_with_a_copy():
    scores = rng.standard_normal((1, 2, 3))  # float64
    np.testing.assert_allclose(attn.masked_softmax(scores), ref.masked_softmax(scores), **TOLERANCE)


@pytest.mark.parametrize("scale", [None, 0.25])
@pytest.mark.parametrize("valid_lens", [None, np.array([3, 5]), np.array([[1, 2, 3], [5, 4, 2]])])
def test_scaled_dot_product_attention_matches_reference(scale, valid_lens):
    q, k, v = normal(2, 3, 4), normal(2, 5, 4), normal(2, 5, 6)
    output, weights = attn.scaled_dot_product_attention(
        q, k, v, valid_lens, scale=scale, need_weights=True
    )
    expected_output, expected_weights = ref.dot_product_attention(q, k, v, valid_lens, scale)
    np.testing.assert_allclose(output, expected_output, **TOLERANCE)
    np.testing.assert_allclose(weights, expected_weights, **TOLERANCE)
    alone = attn.scaled_dot_product_attention(q, k, v, valid_lens, scale=scale)
    np.testing.assert_array_equal(alone, output)


def test_scaled_dot_product_attention_causal_is_bottom_right_and_combines_with_lengths():
    q, k, v = normal(2, 3, 4), normal(2, 5, 4), normal(2, 5, 2)
    # n = 3 queries, m = 5 keys: query i sees keys j ≤ i + 2, i.e. 3, 4, 5 keys; then min with
    # the valid lengths 4 (batch 0) and 2 (batch 1).
    expected_lens = np.array([[3, 4, 4], [2, 2, 2]])
    output, weights = attn.scaled_dot_product_attention(
        q, k, v, [4, 2], causal=True, need_weights=True
    )
    expected_output, expected_weights = ref.dot_product_attention(q, k, v, expected_lens)
    np.testing.assert_allclose(weights, expected_weights, **TOLERANCE)
    np.testing.assert_allclose(output, expected_output, **TOLERANCE)


def test_scaled_dot_product_attention_dropout_is_seeded_and_inverted():
    q, k, v = normal(1, 40, 4), normal(1, 50, 4), np.ones((1, 50, 1), np.float32)
    first = attn.scaled_dot_product_attention(q, k, v, dropout=0.5, seed=7)
    again = attn.scaled_dot_product_attention(q, k, v, dropout=0.5, seed=7)
    other = attn.scaled_dot_product_attention(q, k, v, dropout=0.5, seed=8)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    # With values all 1 each output is Σ_j p_j d_j with E[d_j] = 1: the mean over 40 queries of
    # 2000 Bernoulli draws stays within 0.15 of 1 (about 4 standard deviations).
    assert abs(float(first.mean()) - 1.0) < 0.15
    without = attn.scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(without, 1.0, rtol=1e-5)


def test_additive_attention_function_matches_fixture_and_reference():
    case = Case("additive_per_query")
    p = case.params
    output, weights = attn.additive_attention(
        case.queries,
        case.keys,
        case.values,
        p["W_q.weight"],
        p["W_k.weight"],
        p["w_v.weight"],
        case.valid_lens,
        need_weights=True,
    )
    # Against PyTorch's float32 output: both round differently, agreeing to float32 round-off.
    np.testing.assert_allclose(output, case.output, **TOLERANCE)
    np.testing.assert_allclose(weights, case.weights, **TOLERANCE)
    expected, _ = ref.additive_attention(
        case.queries,
        case.keys,
        case.values,
        p["W_q.weight"],
        p["W_k.weight"],
        p["w_v.weight"],
        case.valid_lens,
    )
    np.testing.assert_allclose(output, expected, **TOLERANCE)


@pytest.mark.parametrize("name", ["gaussian_width_1", "gaussian_width_2_5"])
def test_gaussian_kernel_pooling_matches_fixture_and_reference(name):
    case = Case(name)
    width = case.config["width"]
    output, weights = attn.gaussian_kernel_pooling(
        case.queries,
        case.keys,
        case.values,
        width=width,
        valid_lens=case.valid_lens,
        need_weights=True,
    )
    np.testing.assert_allclose(output, case.output, **TOLERANCE)
    np.testing.assert_allclose(weights, case.weights, **TOLERANCE)
    expected, _ = ref.gaussian_kernel_pooling(
        case.queries, case.keys, case.values, width, case.valid_lens
    )
    np.testing.assert_allclose(output, expected, **TOLERANCE)


def test_book_toy_example_functions():
    keys, values, valid_lens = book_toy_inputs()
    queries = normal(2, 1, 2)
    output = attn.scaled_dot_product_attention(queries, keys, values, valid_lens)
    # Identical keys give uniform weights over the valid keys: the means of the first 2 and 6
    # value rows, exact up to float32 rounding of the sums.
    np.testing.assert_allclose(output, [[[2, 3, 4, 5]], [[10, 11, 12, 13]]], rtol=1e-6)


def test_num_threads_setting_is_stored():
    before = attn.get_num_threads()
    assert before >= 1
    try:
        attn.set_num_threads(3)
        assert attn.get_num_threads() == 3
        with pytest.raises(ValueError, match=r"n: expected a thread count in \[1, 1024\], got 0"):
            attn.set_num_threads(0)
        assert attn.get_num_threads() == 3
    finally:
        attn.set_num_threads(before)


def test_freed_outputs_are_kept_for_the_next_call_until_empty_cache():
    # (4, 8, 256, 64) float32: a 2 MiB output, kept when freed (1 MiB or more) and reused by the
    # next call of the same shape, whose values are its own. The kernels' per-thread scratch is
    # kept too, taken and given back by each call: the output's block is what a call leaves taken.
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((4, 8, 256, 64)).astype(np.float32) for _ in range(3))
    output_bytes = 4 * 8 * 256 * 64 * 4
    attn.empty_cache()
    assert attn.cached_bytes() == 0
    first = attn.scaled_dot_product_attention(q, k, v)
    expected = first.copy()
    scratch_bytes = attn.cached_bytes()
    del first
    assert attn.cached_bytes() == scratch_bytes + output_bytes
    second = attn.scaled_dot_product_attention(q, 2 * k, v)
    assert attn.cached_bytes() == scratch_bytes
    assert not np.array_equal(second, expected)
    np.testing.assert_array_equal(attn.scaled_dot_product_attention(q, k, v), expected)
    attn.empty_cache()
    assert attn.cached_bytes() == 0


def test_amx_status_says_whether_bf16_runs_on_tiles():
    status = attn.amx_status()
    assert status == "no AMX" or status.startswith("AMX-BF16"), status
    # The tiles are used wherever the CPU and Linux offer them, unless ATTN_AMX=0.
    if os.environ.get("ATTN_AMX") == "0" or status == "no AMX":
        assert "in use" not in status
    else:
        assert status.startswith("AMX-BF16 in use"), status


def test_bf16_probabilities_status_follows_the_environment():
    status = attn.bf16_probabilities_status()
    setting = os.environ.get("ATTN_BF16_P")
    on_tiles = attn.amx_status().startswith("AMX-BF16 in use")
    if not on_tiles and attn.bf16_dot_status().startswith(("bf16 widened", "no AVX512-BF16")):
        assert status.endswith("bf16 widened to fp32: P in fp32 for P·V"), status
        return
    split = setting == "split" or (setting != "rounded" and on_tiles)
    form = "P in two bf16 parts" if split else "P rounded to bf16"
    where = "AMX tiles" if on_tiles else "vdpbf16ps"
    assert status.endswith(f"bf16 {form} for P·V on {where}"), status


def test_bf16_dot_status_says_whether_bf16_widens():
    status = attn.bf16_dot_status()
    setting = os.environ.get("ATTN_BF16_DOT")
    if status.startswith("no AVX512-BF16"):
        return  # widened on every setting
    if setting == "0":
        assert status.startswith("bf16 widened to fp32 (vdpbf16ps turned off"), status
    elif setting == "1":
        assert status == "bf16 products on vdpbf16ps", status
    else:  # by default vdpbf16ps only on AMD's cores, where it outpaces fp32 FMAs
        with open("/proc/cpuinfo") as cpuinfo:
            amd = "AuthenticAMD" in cpuinfo.read()
        expected = "bf16 products on vdpbf16ps" if amd else "bf16 widened to fp32 (vdpbf16ps slower"
        assert status.startswith(expected), status


def test_simd_target_can_be_capped_and_restored():
    available = attn.available_simd_targets()
    assert available and attn.simd_target() == available[0]
    q = np.random.default_rng(0).standard_normal((1, 2, 37, 16)).astype(np.float32)
    best = attn.scaled_dot_product_attention(q, q, q)
    try:
        for name in available:
            attn.limit_simd_target(name.lower())
            assert attn.simd_target() == name
            # Every target computes the same attention within float32 rounding.
            np.testing.assert_allclose(attn.scaled_dot_product_attention(q, q, q), best,
                                       rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match=r"simd target name: expected one of .*got 'avx9'"):
            attn.limit_simd_target("avx9")
    finally:
        attn.limit_simd_target("best")
    assert attn.simd_target() == available[0]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda q: attn.additive_attention(q, q, q, np.eye(3, dtype=np.float32),
                                           np.eye(3, dtype=np.float32),
                                           np.ones((1, 3), np.float32), need_weights="yes"),
         "additive_attention(): argument 'need_weights' must be bool, not str"),
        (lambda q: attn.gaussian_kernel_pooling(q, q, q, width="1"),
         "gaussian_kernel_pooling(): argument 'width' must be float, not str"),
        (lambda q: attn.gaussian_kernel_pooling(q, q, q, need_weights=np.bool_(True)),
         "gaussian_kernel_pooling(): argument 'need_weights' must be bool, not numpy.bool"),
        (lambda q: attn.set_num_threads(1, 2),
         "set_num_threads() takes at most 1 positional arguments (2 given)"),
        (lambda q: attn.set_strict_inputs(flag=True),
         "set_strict_inputs() got an unexpected keyword argument 'flag'"),
        (lambda q: attn.limit_simd_target(),
         "limit_simd_target() missing required argument 'name'"),
        (lambda q: attn.load_safetensors(path=None),
         "load_safetensors(): argument 'path' must be str | os.PathLike, not NoneType"),
        (lambda q: attn.set_num_threads("2"),
         "set_num_threads(): argument 'n' must be int, not str"),
        (lambda q: attn.set_num_threads(2**64),
         f"set_num_threads(): argument 'n' must be int in [-2**63, 2**64), got {2**64}"),
        (lambda q: attn.set_strict_inputs(1),
         "set_strict_inputs(): argument 'strict' must be bool, not int"),
        (lambda q: attn.limit_simd_target(3),
         "limit_simd_target(): argument 'name' must be str, not int"),
        (lambda q: attn.save_safetensors(3, {}),
         "save_safetensors(): argument 'path' must be str | os.PathLike, not int"),
        # Metadata: nanobind's caster refused a value other than str with the signature alone.
        (lambda q: attn.save_safetensors("unwritten.safetensors", {"q": q}, {"epoch": 3}),
         "save_safetensors(): argument 'metadata' must be a mapping of str to str "
         "(collections.abc.Mapping[str, str]); its value for key 'epoch' is int (convert it "
         "with str())"),
        (lambda q: attn.save_safetensors("unwritten.safetensors", {"q": q}, metadata={1: "a"}),
         "save_safetensors(): argument 'metadata' must be a mapping of str to str "
         "(collections.abc.Mapping[str, str]); its key 1 is int"),
        (lambda q: attn.save_safetensors("unwritten.safetensors", {"q": q}, [("a", "b")]),
         "save_safetensors(): argument 'metadata' must be a mapping of str to str "
         "(collections.abc.Mapping[str, str]), not list"),
    ],
)
def test_function_arguments_of_the_wrong_type_name_themselves(call, message):
    q = np.ones((2, 3, 3), np.float32)
    with pytest.raises(TypeError) as raised:
        call(q)
    assert str(raised.value) == message
