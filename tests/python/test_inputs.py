# How attn's Python module takes arrays: zero-copy float32 C-contiguous inputs, checked copies of
# the rest, strict mode, valid lengths in every accepted form, and the errors for bad inputs.
import numpy as np
import pytest

import attn

rng = np.random.default_rng(7)


def normal(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def address(array):
    return array.__array_interface__["data"][0]


def test_float32_c_contiguous_numpy_is_not_copied():
    x = normal(2, 3, 4)
    assert attn._data_pointer(x) == address(x)
    view = normal(4, 3, 4)[1:3]  # a contiguous slice: still no copy
    assert attn._data_pointer(view) == address(view)
    readonly = normal(2, 3, 4)
    readonly.flags.writeable = False
    assert attn._data_pointer(readonly) == address(readonly)


def test_float64_and_non_contiguous_inputs_are_copied_and_give_the_same_results():
    x = normal(2, 3, 4)
    transposed = np.ascontiguousarray(x.transpose(0, 2, 1)).transpose(
        0, 2, 1
    )  # same values, F-order
    assert not transposed.flags.c_contiguous
    assert attn._data_pointer(transposed) != address(transposed)
    np.testing.assert_array_equal(attn.masked_softmax(transposed), attn.masked_softmax(x))
    reversed_rows = x[:, ::-1, :]  # negative strides
    np.testing.assert_array_equal(
        attn.masked_softmax(reversed_rows), attn.masked_softmax(x)[:, ::-1, :]
    )
    as_double = x.astype(np.float64)
    np.testing.assert_array_equal(attn.masked_softmax(as_double), attn.masked_softmax(x))


def test_strict_inputs_refuse_copies():
    assert not attn.get_strict_inputs()
    attn.set_strict_inputs(True)
    try:
        x = normal(2, 3, 4)
        attn.masked_softmax(x)  # float32 C-contiguous: fine
        with pytest.raises(
            TypeError, match=r"X: expected float32 \(strict inputs: no copies\), got float64"
        ):
            attn.masked_softmax(x.astype(np.float64))
        with pytest.raises(
            ValueError, match=r"X: expected a C-contiguous, aligned array \(strict inputs"
        ):
            attn.masked_softmax(x[:, :, ::2])
        # An unaligned array (float32 data one byte into a buffer) is named as such: its strides
        # are a C-contiguous array's, so a message about strides would not say what is wrong.
        buffer = np.zeros(4 * 24 + 1, np.uint8)
        unaligned = buffer[1:].view(np.float32).reshape(2, 3, 4)
        assert unaligned.flags.c_contiguous and not unaligned.flags.aligned
        with pytest.raises(
            ValueError, match=r"X: expected float32 data aligned to 4 bytes .* got an unaligned "
            r"array \(data address ≡ 1 mod 4\)"
        ):
            attn.masked_softmax(unaligned)
    finally:
        attn.set_strict_inputs(False)


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (
            np.zeros((2, 3, 4), np.int64),
            TypeError,
            r"queries: expected float32 \(or float64, copied to float32\), got int64",
        ),
        (np.zeros((2, 3, 4), np.float16), TypeError, "queries: expected float32 .* got float16"),
        (
            np.zeros((2, 3, 4), np.complex64),
            TypeError,
            "queries: expected float32 .* got complex64",
        ),
        (np.zeros((2, 3, 4), bool), TypeError, "queries: expected float32 .* got bool"),
        (
            np.zeros((3, 4), np.float32),
            ValueError,
            r"queries: expected a 3-d array, got shape \(3, 4\)",
        ),
        (
            [[[1.0]]],
            TypeError,
            "queries: expected a NumPy array or a tensor supporting DLPack, got list",
        ),
        (None, TypeError, "queries: expected an array, got None"),
        (
            "abc",
            TypeError,
            "queries: expected a NumPy array or a tensor supporting DLPack, got str",
        ),
    ],
    ids=["int64", "float16", "complex", "bool", "rank", "list", "none", "str"],
)
def test_bad_queries_name_the_argument(bad, error, message):
    layer = attn.DotProductAttention()
    with pytest.raises(error, match=message):
        layer(bad, normal(2, 5, 4), normal(2, 5, 2))


def test_mismatched_shapes_are_shape_errors():
    layer = attn.DotProductAttention()
    with pytest.raises(attn.ShapeError, match="keys") as error:
        layer(normal(2, 3, 4), normal(3, 5, 4), normal(2, 5, 2))
    assert isinstance(error.value, ValueError)
    with pytest.raises(ValueError, match="values"):
        layer(normal(2, 3, 4), normal(2, 5, 4), normal(2, 4, 2))
    with pytest.raises(ValueError, match="queries"):
        attn.AdditiveAttention(2, 3, 4)(normal(1, 1, 4), normal(1, 2, 2), normal(1, 2, 1))


def test_lists_of_numpy_integers_are_valid_lens():
    # list(np.array([...])) holds NumPy integer scalars, not ints: they were refused with
    # "expected an integer length, got int64". Anything with __index__ is an integer length.
    queries, keys, values = normal(2, 3, 4), normal(2, 5, 4), normal(2, 5, 2)
    expected = attn.scaled_dot_product_attention(queries, keys, values, valid_lens=[2, 4])
    for lengths in (list(np.array([2, 4])), [np.int32(2), np.uint8(4)], [2, np.int64(4)]):
        actual = attn.scaled_dot_product_attention(queries, keys, values, valid_lens=lengths)
        np.testing.assert_array_equal(actual, expected)
    scores = normal(2, 3, 5)
    np.testing.assert_array_equal(
        attn.masked_softmax(scores, [[np.int16(1), 2, 3], list(np.array([5, 4, 3]))]),
        attn.masked_softmax(scores, [[1, 2, 3], [5, 4, 3]]),
    )


@pytest.mark.parametrize(
    "valid_lens, error, message",
    [
        (
            np.array([1.0, 2.0]),
            TypeError,
            r"valid_lens: expected integer lengths \(int32 or int64\), got float64",
        ),
        (np.array([True, False]), TypeError, "valid_lens: expected integer lengths .* got bool"),
        (
            np.zeros((2, 3, 1), np.int64),
            ValueError,
            r"valid_lens: expected shape \(B,\) or \(B, n\), got shape \(2, 3, 1\)",
        ),
        (np.array([2, 6]), ValueError, "valid_lens"),  # 6 > m = 5
        (np.array([2, -1]), ValueError, "valid_lens"),
        (np.array([1, 2, 3]), ValueError, "valid_lens"),  # B = 3, not 2
        ([1, [2]], ValueError, "valid_lens: expected a list of ints .* got a mix of both"),
        (
            [[1, 2, 3], [1, 2]],
            ValueError,
            r"valid_lens\[1\]: expected 3 lengths \(as in row 0\), got 2",
        ),
        ([1, 2.5], TypeError, r"valid_lens\[1\]: expected an integer length, got float"),
        ([True, 2], TypeError, r"valid_lens\[0\]: expected an integer length, got bool$"),
        ([np.float32(2), 2], TypeError, r"valid_lens\[0\]: expected an integer length, got"),
        (
            [2**70, 1],
            TypeError,
            r"valid_lens\[0\]: expected an integer length, got 1180591620717411303424, out of the "
            "int64 range",
        ),
        (
            np.array([2**64 - 1, 1], np.uint64),
            ValueError,
            "valid_lens: expected lengths that fit int64",
        ),
        ("2", TypeError, "valid_lens: expected None, a list of ints, or an int32/int64 array"),
    ],
    ids=[
        "float",
        "bool",
        "rank3",
        "too_long",
        "negative",
        "batch",
        "mixed",
        "ragged",
        "float_item",
        "bool_item",
        "numpy_float_item",
        "huge_int",
        "huge_uint",
        "str",
    ],
)
def test_bad_valid_lens_name_the_argument(valid_lens, error, message):
    # By keyword: the fourth positional argument is attn_mask now, where float and bool arrays
    # are masks (integer arrays and lists there still mean valid lengths: see test_sdpa.py).
    with pytest.raises(error, match=message):
        attn.scaled_dot_product_attention(
            normal(2, 3, 4), normal(2, 5, 4), normal(2, 5, 2), valid_lens=valid_lens
        )
    layer = attn.DotProductAttention()
    with pytest.raises(error, match=message):
        layer(normal(2, 3, 4), normal(2, 5, 4), normal(2, 5, 2), valid_lens)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32])
def test_valid_lens_of_any_integer_type(dtype):
    q, k, v = normal(2, 3, 4), normal(2, 5, 4), normal(2, 5, 2)
    expected = attn.scaled_dot_product_attention(q, k, v, [2, 4])
    np.testing.assert_array_equal(
        attn.scaled_dot_product_attention(q, k, v, np.array([2, 4], dtype)), expected
    )
    per_query = np.array([[2, 2, 2], [4, 4, 4]], dtype)[:, ::-1]  # non-contiguous too
    np.testing.assert_array_equal(attn.scaled_dot_product_attention(q, k, v, per_query), expected)


def test_additive_attention_function_checks_weight_shapes():
    q, k, v = normal(2, 1, 3), normal(2, 4, 2), normal(2, 4, 2)
    W_q, W_k, w_v = normal(5, 3), normal(5, 2), normal(1, 5)
    attn.additive_attention(q, k, v, W_q, W_k, w_v)
    with pytest.raises(
        ValueError,
        match=r"W_k: expected shape \(num_hiddens, key_size\) with num_hiddens 5 as in W_q, got \(4, 2\)",
    ):
        attn.additive_attention(q, k, v, W_q, normal(4, 2), w_v)
    with pytest.raises(
        ValueError, match=r"w_v: expected shape \(1, num_hiddens\) = \(1, 5\), got \(5, 1\)"
    ):
        attn.additive_attention(q, k, v, W_q, W_k, normal(5, 1))
    with pytest.raises(ValueError, match="W_q: expected a 2-d array"):
        attn.additive_attention(q, k, v, normal(5), W_k, w_v)
    with pytest.raises(ValueError, match="queries"):
        attn.additive_attention(normal(2, 1, 4), k, v, W_q, W_k, w_v)


def test_non_finite_scores_are_value_errors():
    scores = normal(1, 1, 3)
    scores[0, 0, 1] = np.nan
    # Named as the Python signature names it (the C++ kernel's argument is "scores"), with the entry.
    with pytest.raises(ValueError, match=r"^X\[0, 0, 1\]: expected a finite score, got NaN"):
        attn.masked_softmax(scores)


def test_backward_checks_grad_output():
    layer = attn.DotProductAttention().eval()
    layer(normal(2, 3, 4), normal(2, 5, 4), normal(2, 5, 2))
    with pytest.raises(ValueError, match="grad_output"):
        layer.backward(normal(2, 3, 3))
    with pytest.raises(TypeError, match="grad_output: expected float32"):
        layer.backward(np.zeros((2, 3, 2), np.int32))


def test_float64_beyond_float32_is_named_not_turned_into_infinity(tmp_path):
    # attn computes in float32: a finite float64 past ±3.4e38 became ±inf in the copy, which a
    # saved state dict kept silently and the functions reported as "got inf".
    huge = np.array([[1.0, -1e300]])
    with pytest.raises(ValueError, match=r"tensors\['x'\]: expected values float32 holds .* "
                                         r"got -1e\+300 at flat index 1"):
        attn.save_safetensors(tmp_path / "x.safetensors", {"x": huge})
    assert not (tmp_path / "x.safetensors").exists()
    query = normal(1, 2, 4).astype(np.float64)
    query[0, 1, 3] = 5e38
    with pytest.raises(ValueError, match="query: expected values float32 holds .* flat index 7"):
        attn.scaled_dot_product_attention(query, normal(1, 3, 4), normal(1, 3, 4))
    # Lists of numbers are narrowed element by element: the same words name the element.
    for argument in ("sinks", "alibi_slopes"):
        with pytest.raises(ValueError, match=rf"{argument}\[1\]: expected a number float32 "
                                             r"holds .* got 1e\+300"):
            attn.scaled_dot_product_attention(normal(1, 2, 2, 4), normal(1, 2, 3, 4),
                                              normal(1, 2, 3, 4), **{argument: [0.5, 1e300]})
    # So are scalars: scale=1e300 read "scale: expected a finite number, got inf".
    for argument in ("scale", "softcap"):
        with pytest.raises(ValueError, match=rf"{argument}: expected a number float32 holds .* "
                                             r"got 1e\+300"):
            attn.scaled_dot_product_attention(normal(1, 2, 2, 4), normal(1, 2, 3, 4),
                                              normal(1, 2, 3, 4), **{argument: 1e300})
    # A float64 mask's −1e300 hides a key as float's lowest does: a row of them ties and is
    # averaged (PyTorch's math in float64 gives the same), where −∞ hid the row wholly.
    mask = np.zeros((2, 3))
    mask[0] = -1e300
    values = normal(1, 3, 4)
    out = attn.scaled_dot_product_attention(normal(1, 2, 4), normal(1, 3, 4), values,
                                            attn_mask=mask)
    np.testing.assert_allclose(out[0, 0], values[0].mean(axis=0), rtol=1e-6, atol=1e-6)


def test_an_array_of_a_dtype_without_dlpack_names_the_dtype():
    with pytest.raises(TypeError, match="X: expected a NumPy array .* got ndarray of dtype object"):
        attn.masked_softmax(np.ones((2, 3, 4), dtype=object))


def test_additive_attention_function_names_the_inputs_shapes_as_passed():
    # They were found on the projections: "key: expected the leading axes of query (2, 3, 7)",
    # shapes of num_hiddens the caller never passed.
    q, W_q, W_k, w_v = normal(2, 3, 5), normal(7, 5), normal(7, 4), normal(1, 7)
    with pytest.raises(ValueError, match=r"keys: expected the axes before \(S, key size\) to be "
                                         r"those of queries \(2,\), got shape \(3, 6, 4\)"):
        attn.additive_attention(q, normal(3, 6, 4), normal(3, 6, 3), W_q, W_k, w_v)
    with pytest.raises(ValueError, match=r"values: expected the shape of keys \(2, 6\) up to the "
                                         r"last axis, got shape \(2, 9, 3\)"):
        attn.additive_attention(q, normal(2, 6, 4), normal(2, 9, 3), W_q, W_k, w_v)
