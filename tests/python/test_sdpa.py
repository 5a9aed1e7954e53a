# attn.scaled_dot_product_attention with PyTorch's signature, over NumPy arrays (no PyTorch
# needed): shapes of rank 2 to 8, masks, causal alignments, grouped heads, need_weights, strided
# inputs read in place, the book's calls that keep their meaning, and the errors.
import re

import numpy as np
import pytest

import attn
import numpy_reference as ref

# float32 kernels against float64 references on O(1) inputs with S ≤ 9 keys: a few float32 ulps
# of accumulated rounding, far below 1e-5.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)

rng = np.random.default_rng(20250611)


def normal(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def address(array):
    return array.__array_interface__["data"][0]


def qkv(*leading, L=4, S=6, E=8, Ev=5, kv_heads=None):
    """query (*leading, L, E), key (…, S, E), value (…, S, Ev); kv_heads replaces the heads
    axis (leading[-1]) of key and value."""
    kv_leading = leading if kv_heads is None else (*leading[:-1], kv_heads)
    return normal(*leading, L, E), normal(*kv_leading, S, E), normal(*kv_leading, S, Ev)


@pytest.mark.parametrize(
    "leading", [(), (3,), (2, 3), (2, 1, 3), (1, 2, 1, 2, 1, 2)], ids=lambda s: f"rank{len(s) + 2}"
)
def test_every_rank_matches_the_reference(leading):
    q, k, v = qkv(*leading)
    output, weights = attn.scaled_dot_product_attention(q, k, v, need_weights=True)
    expected_output, expected_weights = ref.sdpa(q, k, v)
    assert output.dtype == np.float32 and output.shape == (*leading, 4, 5)
    assert weights.shape == (*leading, 4, 6)
    np.testing.assert_allclose(output, expected_output, **TOLERANCE)
    np.testing.assert_allclose(weights, expected_weights, **TOLERANCE)


MASK_SHAPES = [(4, 6), (1, 1, 4, 6), (2, 1, 4, 6), (2, 3, 4, 6), (2, 1, 1, 6), (1, 3, 1, 6), (6,)]


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("shape", MASK_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_masks_match_the_reference(shape, kind, is_causal):
    q, k, v = qkv(2, 3)
    if kind == "bool":
        mask = rng.random(shape) < 0.7
    else:
        mask = normal(*shape)
    output, weights = attn.scaled_dot_product_attention(
        q, k, v, mask, is_causal=is_causal, need_weights=True
    )
    expected_output, expected_weights = ref.sdpa(q, k, v, mask, is_causal=is_causal)
    np.testing.assert_allclose(output, expected_output, **TOLERANCE)
    np.testing.assert_allclose(weights, expected_weights, **TOLERANCE)


def test_broadcast_and_float64_masks_need_no_copy_of_the_inputs():
    q, k, v = qkv(2, 3)
    mask = rng.random((1, 1, 4, 6)) < 0.6
    expanded = np.broadcast_to(mask, (2, 3, 4, 6))  # stride 0 on the first two axes
    assert expanded.strides[:2] == (0, 0)
    expected = attn.scaled_dot_product_attention(q, k, v, mask)
    np.testing.assert_array_equal(attn.scaled_dot_product_attention(q, k, v, expanded), expected)
    additive = np.where(mask, 0.0, -np.inf)  # float64: copied to float32
    np.testing.assert_allclose(
        attn.scaled_dot_product_attention(q, k, v, additive), expected, **TOLERANCE
    )


@pytest.mark.parametrize("groups", [1, 2, 3, 6])
def test_grouped_query_heads(groups):
    q, k, v = qkv(2, 6, kv_heads=6 // groups)
    mask = rng.random((2, 1, 4, 6)) < 0.7
    output = attn.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True)
    expected, _ = ref.sdpa(q, k, v, mask, enable_gqa=True)
    np.testing.assert_allclose(output, expected, **TOLERANCE)


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
@pytest.mark.parametrize("L, S", [(4, 6), (6, 4), (1, 5)])
def test_causal_alignments(alignment, L, S):
    q, k, v = qkv(2, 3, L=L, S=S)
    output = attn.scaled_dot_product_attention(q, k, v, is_causal=True, alignment=alignment)
    expected, _ = ref.sdpa(q, k, v, is_causal=True, alignment=alignment)
    np.testing.assert_allclose(output, expected, **TOLERANCE)


def test_the_books_causal_beside_an_explicit_top_left_alignment_is_refused():
    # causal=True is the book's causal, aligned bottom-right: beside alignment="top-left" one of
    # the two would be ignored without a word (it was: bottom-right won). "bottom-right" or None
    # beside it agree with it; is_causal=True is the top-left one.
    q, k, v = qkv(2, 3, L=4, S=6)
    with pytest.raises(ValueError, match=r'alignment: causal=True is the book\'s causal, aligned '
                       r'bottom-right, got alignment="top-left" beside it; for a causal mask '
                       r"aligned top-left pass is_causal=True instead"):
        attn.scaled_dot_product_attention(q, k, v, causal=True, alignment="top-left")
    bottom_right, _ = ref.sdpa(q, k, v, is_causal=True, alignment="bottom-right")
    for alignment in (None, "bottom-right"):
        np.testing.assert_allclose(
            attn.scaled_dot_product_attention(q, k, v, causal=True, alignment=alignment),
            bottom_right, **TOLERANCE)
    top_left, _ = ref.sdpa(q, k, v, is_causal=True, alignment="top-left")
    np.testing.assert_allclose(
        attn.scaled_dot_product_attention(q, k, v, is_causal=True, alignment=None), top_left,
        **TOLERANCE)


def test_a_query_that_sees_no_key_gets_zeros():
    q, k, v = qkv(2, 3, L=6, S=4)
    # Bottom-right with L > S: the first two queries see no key.
    output = attn.scaled_dot_product_attention(q, k, v, is_causal=True, alignment="bottom-right")
    assert np.all(output[..., :2, :] == 0) and np.all(np.isfinite(output))
    mask = np.ones((6, 4), bool)
    mask[3] = False
    output, weights = attn.scaled_dot_product_attention(q, k, v, mask, need_weights=True)
    assert np.all(output[..., 3, :] == 0) and np.all(weights[..., 3, :] == 0)


def test_the_books_calls_keep_their_meaning():
    q, k, v = qkv(2)  # (B, L, E): the book's layout, one head per batch element
    lengths = np.array([3, 5])
    expected, expected_weights = ref.sdpa(
        q, k, v, is_causal=True, alignment="bottom-right", valid_lens=lengths
    )
    # causal=True: aligned bottom-right; integers or a list as attn_mask: valid lengths.
    for lens in (lengths, lengths.astype(np.int32), [3, 5]):
        output, weights = attn.scaled_dot_product_attention(
            q, k, v, lens, causal=True, need_weights=True
        )
        np.testing.assert_allclose(output, expected, **TOLERANCE)
        np.testing.assert_allclose(weights, expected_weights, **TOLERANCE)
    keyword = attn.scaled_dot_product_attention(
        q, k, v, valid_lens=lengths, is_causal=True, alignment="bottom-right"
    )
    np.testing.assert_allclose(keyword, expected, **TOLERANCE)
    # dropout= is dropout_p's old name.
    np.testing.assert_array_equal(
        attn.scaled_dot_product_attention(q, k, v, dropout=0.5, seed=3),
        attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=3),
    )


def test_valid_lens_with_heads():
    q, k, v = qkv(2, 3)
    per_query = np.array([[1, 2, 6, 0], [6, 5, 4, 3]])
    output = attn.scaled_dot_product_attention(q, k, v, valid_lens=per_query)
    expected, _ = ref.sdpa(q, k, v, valid_lens=per_query)
    np.testing.assert_allclose(output, expected, **TOLERANCE)


def test_transposed_views_are_read_in_place():
    # (B, L, H, E) viewed as (B, H, L, E), as transformers passes its projections: the last axis
    # is contiguous, so no copy.
    storage = normal(2, 4, 3, 8)
    q = storage.transpose(0, 2, 1, 3)
    assert not q.flags.c_contiguous
    assert attn._data_pointer(q, strided=True) == address(q)
    sliced = normal(2, 3, 9, 8)[:, :, 2:6]  # a slice of a longer sequence: also in place
    assert attn._data_pointer(sliced, strided=True) == address(sliced)
    _, k, v = qkv(2, 3)
    # The same values through the same kernels: identical results, whatever the strides.
    np.testing.assert_array_equal(
        attn.scaled_dot_product_attention(q, k, v),
        attn.scaled_dot_product_attention(np.ascontiguousarray(q), k, v),
    )
    # A strided last axis, negative strides and float64 are copied (same values).
    for copied in (normal(2, 3, 4, 16)[..., ::2], storage.transpose(0, 2, 1, 3)[:, :, ::-1]):
        assert attn._data_pointer(copied, strided=True) != address(copied)
        np.testing.assert_array_equal(
            attn.scaled_dot_product_attention(copied, k, v),
            attn.scaled_dot_product_attention(np.ascontiguousarray(copied), k, v),
        )


def test_strict_inputs_accept_views_and_refuse_copies():
    q, k, v = qkv(2, 3)
    attn.set_strict_inputs(True)
    try:
        transposed = normal(2, 4, 3, 8).transpose(0, 2, 1, 3)
        attn.scaled_dot_product_attention(transposed, k, v)  # in place: fine
        with pytest.raises(TypeError, match=r"query: expected float32 \(strict inputs"):
            attn.scaled_dot_product_attention(q.astype(np.float64), k, v)
        with pytest.raises(ValueError, match=r"key: expected .*contiguous last axis \(strict"):
            attn.scaled_dot_product_attention(q, normal(2, 3, 6, 16)[..., ::2], v)
        with pytest.raises(TypeError, match=r"attn_mask: expected a bool or float32 mask \(strict"):
            attn.scaled_dot_product_attention(q, k, v, np.zeros((4, 6)))
    finally:
        attn.set_strict_inputs(False)


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        (dict(query=np.zeros((2, 3, 4, 8), np.int64)), TypeError, r"query: expected float32"),
        (
            dict(value=np.zeros((2, 3, 6, 5), np.float16)),
            TypeError,
            r"value: expected the dtype of query \(float32\), got float16",
        ),
        (dict(query=normal(4)), ValueError, r"query: expected an array of rank 2 to 8"),
        (dict(key=normal(2, 3, 6, 7)), attn.ShapeError, r"key"),
        (dict(value=normal(2, 3, 5, 5)), attn.ShapeError, r"value"),
        (dict(key=normal(2, 2, 6, 8), value=normal(2, 2, 6, 5)), attn.ShapeError, r"key"),
        (dict(attn_mask=np.zeros((4, 6), np.complex64)), TypeError, r"attn_mask: expected a bool"),
        (dict(attn_mask=normal(4, 5)), attn.ShapeError, r"attn_mask"),
        (dict(attn_mask="mask"), TypeError, r"attn_mask: expected None, a bool or float mask"),
        (dict(attn_mask=[1, 2], valid_lens=[1, 2]), ValueError, r"attn_mask: integer lengths"),
        (dict(window=3), TypeError, r"window: expected None or a pair"),
        (dict(window=(1, -2)), ValueError, r"window: expected right ≥ 0"),
        (dict(window=(1.5, 0)), TypeError, r"window: expected \(left, right\) as ints"),
        (dict(window=(True, 0)), TypeError, r"window: expected \(left, right\) as ints"),
        (dict(alignment="top-right"), ValueError, r"alignment: expected \"top-left\""),
        (dict(alibi_slopes=[0.5, 0.25]), attn.ShapeError, r"alibi_slopes"),
        (dict(sinks=["a", 1, 2]), TypeError, r"sinks\[0\]: expected a number"),
        (dict(softcap=-1.0), ValueError, r"softcap"),
        (dict(dropout_p=1.5), ValueError, r"dropout_p: expected a probability in \[0, 1\]"),
        (dict(dropout_p=0.1, dropout=0.2), ValueError, r"dropout: the book's name of dropout_p"),
        (dict(causal=True, is_causal=True), ValueError, r"causal: .* both given"),
        (dict(valid_lens=[7, 1]), ValueError, r"valid_lens"),
    ],
    ids=[
        "int_query",
        "float16_value",
        "rank1_query",
        "key_width",
        "value_length",
        "heads_without_gqa",
        "float16_mask",
        "mask_shape",
        "str_mask",
        "lengths_twice",
        "window_int",
        "window_negative",
        "window_float",
        "window_bool",
        "alignment",
        "alibi_count",
        "sinks_str",
        "softcap_negative",
        "dropout_range",
        "dropout_twice",
        "causal_twice",
        "valid_lens_range",
    ],
)
def test_bad_arguments_name_themselves(arguments, error, message):
    q, k, v = qkv(2, 3)
    call = dict(query=q, key=k, value=v)
    call.update(arguments)
    with pytest.raises(error, match=message):
        attn.scaled_dot_product_attention(**call)


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("dropout_p", None, "float"),
        ("dropout_p", "0.1", "float"),
        ("is_causal", 1, "bool"),
        ("is_causal", None, "bool"),
        ("is_causal", np.True_, "bool"),
        ("scale", "x", "float or None"),
        ("enable_gqa", 0, "bool"),
        ("softcap", [1.0], "float or None"),
        ("alignment", 3, "str or None"),
        ("need_weights", 1, "bool"),
        ("seed", 1.5, r"an int in \[0, 2\*\*64\) or None"),
        ("causal", None, "bool"),
        ("dropout", "x", "float or None"),
    ],
)
def test_scalar_arguments_of_the_wrong_type_name_themselves(name, value, expected):
    # As PyTorch words it (and attn.torch): the argument, the type it takes and the type given,
    # NumPy's qualified by its module; nanobind's own message would list the whole signature.
    q, k, v = qkv(2, 3)
    given = type(value)
    given = given.__name__ if given.__module__ == "builtins" else f"numpy.{given.__name__}"
    with pytest.raises(TypeError) as raised:
        attn.scaled_dot_product_attention(q, k, v, **{name: value})
    assert re.fullmatch(
        rf"scaled_dot_product_attention\(\): argument '{name}' must be {expected}, not {given}",
        str(raised.value),
    ), str(raised.value)


def test_an_int_out_of_its_range_is_named_with_its_value():
    q, k, v = qkv(2, 3)
    with pytest.raises(TypeError) as raised:
        attn.scaled_dot_product_attention(q, k, v, seed=-1)
    assert str(raised.value) == (
        "scaled_dot_product_attention(): argument 'seed' must be an int in [0, 2**64) or None, "
        "got -1")


def test_scalar_arguments_take_what_converts():
    # NumPy scalars, 0-dim arrays and ints where a float goes, an int seed: what nanobind's typed
    # arguments took before the scalars were converted by hand.
    q, k, v = qkv(2, 3)
    plain = attn.scaled_dot_product_attention(q, k, v, scale=0.5)
    for scale in (np.float32(0.5), np.float64(0.5), np.array(0.5)):
        converted = attn.scaled_dot_product_attention(q, k, v, scale=scale)
        np.testing.assert_array_equal(converted, plain)
    np.testing.assert_array_equal(
        attn.scaled_dot_product_attention(q, k, v, dropout_p=0, scale=0.5, seed=3, softcap=None),
        plain,
    )
    dropped = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=np.uint64(7))
    np.testing.assert_array_equal(
        attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=7), dropped
    )


def test_alibi_softcap_and_sinks_change_the_result_as_documented():
    # The exact values are checked against PyTorch in test_sdpa_torch.py; here, that each option
    # reaches the kernels: sinks only shrink the weights' row sums below 1, a large softcap is
    # the identity, ALiBi with zero slopes too.
    q, k, v = qkv(2, 3)
    plain, weights = attn.scaled_dot_product_attention(q, k, v, need_weights=True)
    _, sunk = attn.scaled_dot_product_attention(q, k, v, sinks=[0.0, 1.0, 2.0], need_weights=True)
    sums = sunk.sum(-1)
    assert np.all(sums < 1) and np.all(sums[:, 2] < sums[:, 0])
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)  # six float32 terms summed
    np.testing.assert_allclose(
        attn.scaled_dot_product_attention(q, k, v, softcap=1e4), plain, **TOLERANCE
    )
    np.testing.assert_allclose(
        attn.scaled_dot_product_attention(q, k, v, alibi_slopes=np.zeros(3)), plain, **TOLERANCE
    )


def test_python_threads_can_call_it_at_once():
    # The GIL is released while attn computes: calls from several threads run side by side and
    # give what one thread gives.
    from concurrent.futures import ThreadPoolExecutor

    q, k, v = qkv(2, 3, L=64, S=64)
    expected = attn.scaled_dot_product_attention(q, k, v, is_causal=True)
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(lambda _: attn.scaled_dot_product_attention(q, k, v, is_causal=True), range(8))
        )
    for result in results:
        np.testing.assert_array_equal(result, expected)


def test_a_float16_mask_gives_the_results_of_its_float32_values():
    # Read in place (contiguous) or copied first (a negative stride): either way each entry is
    # widened exactly, so the output is that of the float32 mask of the same values, bit for bit.
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal(shape).astype(np.float32)
               for shape in ((2, 3, 5, 8), (2, 3, 9, 8), (2, 3, 9, 4)))
    mask = (3 * rng.standard_normal((5, 9))).astype(np.float16)
    mask[:, 2] = -np.inf
    for view in (mask, mask[::-1], mask[:, ::-1]):
        np.testing.assert_array_equal(
            attn.scaled_dot_product_attention(q, k, v, attn_mask=view),
            attn.scaled_dot_product_attention(q, k, v, attn_mask=view.astype(np.float32)))


@pytest.mark.parametrize("argument", ["dropout_p", "dropout"])
def test_dropout_of_every_weight_gives_zeros(argument):
    # p = 1 drops every weight, as PyTorch's function and nn.Dropout(1.0) do: a zero output (and
    # attn.torch's), where attn refused it as outside [0, 1). The weights are those before
    # dropout, as for any p; above 1 is still refused, naming the argument as given.
    q, k, v = qkv(2, 3, L=4, S=6)
    output, weights = attn.scaled_dot_product_attention(
        q, k, v, is_causal=True, need_weights=True, **{argument: 1.0})
    assert output.dtype == np.float32 and output.shape == (2, 3, 4, 5)
    np.testing.assert_array_equal(output, np.zeros((2, 3, 4, 5), np.float32))
    _, expected_weights = attn.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                            need_weights=True)
    np.testing.assert_array_equal(weights, expected_weights)
    with pytest.raises(ValueError, match=rf"{argument}: expected a probability in \[0, 1\], "
                                         r"got 1.5"):
        attn.scaled_dot_product_attention(q, k, v, **{argument: 1.5})
    # Shapes are still checked: the pass runs without dropout before its output is zeroed.
    with pytest.raises(attn.ShapeError, match="key"):
        attn.scaled_dot_product_attention(q, k[..., :3], v, **{argument: 1.0})


def test_window_sides_may_be_numpy_integers():
    # Sizes computed with NumPy (np.int64) were refused ("got left of type numpy.int64").
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import attn.torch as attn_torch

    q, k, v = (torch.randn(1, 2, 9, 4) for _ in range(3))
    for call in (attn.scaled_dot_product_attention, attn_torch.scaled_dot_product_attention):
        expected = call(q, k, v, window=(3, 0))
        for window in ((np.int64(3), np.int32(0)), (np.int64(3), None), [np.uint8(3), 0]):
            right = window[1]
            want = expected if right is not None else call(q, k, v, window=(3, None))
            np.testing.assert_array_equal(np.asarray(call(q, k, v, window=window)), np.asarray(want))
        with pytest.raises(TypeError, match=r"window: expected \(left, right\) as ints or None, "
                                            r"got right of type float64"):
            call(q, k, v, window=(3, np.float64(0)))
        # An int past int64 reaches past any tensor's keys, as None (it read "got left of type
        # int"); one below int64 is a negative side like -5.
        np.testing.assert_array_equal(np.asarray(call(q, k, v, window=(2**63, 0))),
                                      np.asarray(call(q, k, v, window=(None, 0))))
        with pytest.raises(ValueError, match="window: expected left ≥ 0.* got -" + str(2**70)):
            call(q, k, v, window=(-2**70, 0))


@pytest.mark.parametrize(
    "shapes, options",
    [
        (((2, 4), (1, 4), (1, 4)), {}),  # a key/value batch of one
        (((2, 4), (4,), (4,)), {}),  # key and value of lower rank
        (((2, 1), (1, 3), (1, 3)), {}),  # each side broadcast
        (((3, 4), (1, 2), (1, 2)), {"enable_gqa": True}),  # batch broadcast, heads grouped
    ],
    ids=["batch_of_one", "lower_rank", "both_sides", "grouped"],
)
def test_leading_axes_broadcast_as_pytorchs(shapes, options):
    # PyTorch's function (and attn.torch's) broadcasts the axes before (L, E) / (S, E): a
    # key/value batch of one was a ShapeError here. Stride-0 views, compared with the inputs
    # broadcast by NumPy first.
    (q_lead, k_lead, v_lead) = shapes
    q, k, v = normal(*q_lead, 5, 8), normal(*k_lead, 7, 8), normal(*v_lead, 7, 6)
    output, weights = attn.scaled_dot_product_attention(q, k, v, need_weights=True, **options)
    grouped = options.get("enable_gqa", False)
    kept = 3 if grouped else 2
    leading = np.broadcast_shapes(q.shape[:-kept], k.shape[:-kept], v.shape[:-kept])
    expand = lambda x: np.broadcast_to(x, (*leading, *x.shape[-kept:]))  # noqa: E731
    q_full, k_full, v_full = expand(q), expand(k), expand(v)
    if grouped:
        groups = q_full.shape[-3] // k_full.shape[-3]
        k_full, v_full = np.repeat(k_full, groups, axis=-3), np.repeat(v_full, groups, axis=-3)
    expected_output, expected_weights = ref.sdpa(q_full, k_full, v_full)
    assert output.shape == expected_output.shape
    np.testing.assert_allclose(output, expected_output, **TOLERANCE)
    np.testing.assert_allclose(weights, expected_weights, **TOLERANCE)
    half = attn.scaled_dot_product_attention(
        q.astype(np.float16), k.astype(np.float16), v.astype(np.float16), **options)
    assert half.dtype == np.float16 and half.shape == output.shape
    # Axes that do not broadcast are still named.
    with pytest.raises(ValueError, match="key: expected the leading axes of query"):
        attn.scaled_dot_product_attention(normal(2, 5, 8), normal(3, 7, 8), normal(3, 7, 6))


def test_mask_entries_past_two_to_the_127_are_refused():
    # 3e38 overflowed the base-2 scores of the weights and the backward: NaN weights, no error.
    q, k, v = qkv(1, 1, L=3, S=5)
    mask = np.zeros((3, 5), np.float32)
    mask[0, 1] = 2.0**127
    attn.scaled_dot_product_attention(q, k, v, attn_mask=mask, need_weights=True)
    mask[2, 3] = 3e38
    with pytest.raises(ValueError, match=r"attn_mask: expected entries of at most 2\^127 .* got "
                                         r"3e\+38 at flat index 13"):
        attn.scaled_dot_product_attention(q, k, v, attn_mask=mask, need_weights=True)
