# attn's layers against the committed PyTorch fixtures (outputs, weights, input and parameter
# gradients) and the NumPy reference; modes, dropout, state dicts, gradients and safetensors files.
import copy

import numpy as np
import pytest

import attn
import numpy_reference as ref
from conftest import Case, book_toy_inputs

# float32 against PyTorch's float32 (or a float64 reference) on O(1) inputs: both sides round
# differently at float32 precision (~1e-7 relative) through a handful of operations; 1e-5 leaves
# room for that and nothing more.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def test_layer_matches_pytorch_fixture(case):
    layer = case.make_layer()
    output = layer(case.queries, case.keys, case.values, case.valid_lens)
    np.testing.assert_allclose(output, case.output, **TOLERANCE)
    np.testing.assert_allclose(layer.attention_weights, case.weights, **TOLERANCE)


def test_layer_matches_numpy_reference(case):
    layer = case.make_layer()
    output = layer(case.queries, case.keys, case.values, case.valid_lens)
    kind, p = case.layer_kind, case.params
    if kind == "additive":
        expected, weights = ref.additive_attention(
            case.queries,
            case.keys,
            case.values,
            p["W_q.weight"],
            p["W_k.weight"],
            p["w_v.weight"],
            case.valid_lens,
        )
    elif kind == "dot_product":
        expected, weights = ref.dot_product_attention(
            case.queries, case.keys, case.values, case.valid_lens
        )
    elif kind == "multi_head":
        expected, weights = ref.multi_head_attention(
            case.queries, case.keys, case.values, p, case.config["num_heads"], case.valid_lens
        )
    else:
        expected, weights = ref.gaussian_kernel_pooling(
            case.queries, case.keys, case.values, float(p["w"][0]), case.valid_lens
        )
    np.testing.assert_allclose(output, expected, **TOLERANCE)
    np.testing.assert_allclose(layer.attention_weights, weights, **TOLERANCE)


def test_layer_backward_matches_pytorch_autograd(gradient_case):
    case = gradient_case
    layer = case.make_layer()
    layer(case.queries, case.keys, case.values, case.valid_lens)
    gradients = layer.backward(case.grad_output)
    assert sorted(gradients) == ["keys", "queries", "values"]
    for name in ("queries", "keys", "values"):
        np.testing.assert_allclose(gradients[name], case.grads[name], err_msg=name, **TOLERANCE)
    parameter_grads = layer.grads()
    # Exactly the parameters have gradients, each matching PyTorch's.
    assert sorted(parameter_grads) == sorted(set(case.grads) - {"queries", "keys", "values"})
    for name, grad in parameter_grads.items():
        np.testing.assert_allclose(grad, case.grads[name], err_msg=name, **TOLERANCE)


def test_gradients_accumulate_until_zero_grad():
    case = Case("multi_head_bias_per_query")
    layer = case.make_layer()
    for _ in range(2):
        layer(case.queries, case.keys, case.values, case.valid_lens)
        layer.backward(case.grad_output)
    np.testing.assert_allclose(
        layer.grads()["W_o.weight"], 2 * case.grads["W_o.weight"], **TOLERANCE
    )
    layer.zero_grad()
    assert all(np.all(grad == 0) for grad in layer.grads().values())


def test_book_toy_examples():
    keys, values, valid_lens = book_toy_inputs()
    rng = np.random.default_rng(0)
    additive = attn.AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1).eval()
    dot_product = attn.DotProductAttention(dropout=0.5).eval()
    expected = [[[2, 3, 4, 5]], [[10, 11, 12, 13]]]
    # Uniform weights over the valid keys: means of value rows, exact up to float32 sums.
    out = additive(rng.standard_normal((2, 1, 20)).astype(np.float32), keys, values, valid_lens)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    out = dot_product(rng.standard_normal((2, 1, 2)).astype(np.float32), keys, values, valid_lens)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    np.testing.assert_allclose(dot_product.attention_weights[1, 0, :6], 1 / 6, rtol=1e-6)
    assert np.all(dot_product.attention_weights[1, 0, 6:] == 0)


def test_modes_and_dropout():
    layer = attn.DotProductAttention(0.5, seed=3)
    assert layer.training and layer.attention_weights is None and layer.dropout_mask is None
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((2, 6, 4)).astype(
        np.float32
    )
    v = rng.standard_normal((2, 6, 2)).astype(np.float32)
    trained = layer(q, k, v)
    mask = layer.dropout_mask
    assert mask.shape == (2, 3, 6) and set(np.unique(mask)) <= {0.0, 2.0}
    # The training output is the dropped-out weights times the values.
    np.testing.assert_allclose(trained, (layer.attention_weights * mask) @ v, **TOLERANCE)
    assert layer.eval() is layer and not layer.training
    evaluated = layer(q, k, v)
    assert layer.dropout_mask is None
    np.testing.assert_allclose(evaluated, layer.attention_weights @ v, **TOLERANCE)
    layer.training = True
    assert layer.train() is layer and layer.training
    layer.seed_dropout(11)
    first = layer(q, k, v)
    layer.seed_dropout(11)
    np.testing.assert_array_equal(layer(q, k, v), first)


def test_seeded_initialisation_is_reproducible_and_differs_between_seeds():
    a = attn.MultiHeadAttention(3, 4, 5, 8, 2, 0.0, bias=True, seed=5).state_dict()
    b = attn.MultiHeadAttention(3, 4, 5, 8, 2, 0.0, bias=True, seed=5).state_dict()
    c = attn.MultiHeadAttention(3, 4, 5, 8, 2, 0.0, bias=True, seed=6).state_dict()
    assert sorted(a) == sorted(
        [
            "W_q.weight",
            "W_q.bias",
            "W_k.weight",
            "W_k.bias",
            "W_v.weight",
            "W_v.bias",
            "W_o.weight",
            "W_o.bias",
        ]
    )
    assert a["W_q.weight"].shape == (8, 4) and a["W_o.bias"].shape == (8,)
    assert all(np.array_equal(a[name], b[name]) for name in a)
    assert not np.array_equal(a["W_q.weight"], c["W_q.weight"])
    # nn.Linear's default initialisation: uniform in ±1/√fan_in.
    assert np.abs(a["W_q.weight"]).max() <= 1 / np.sqrt(4)


def test_state_dict_round_trip_between_layers(case):
    source = case.make_layer()
    state = source.state_dict()
    assert sorted(state) == sorted(case.params)
    target = copy.deepcopy(source)
    target.load_state_dict(state)
    for name, value in target.state_dict().items():
        np.testing.assert_array_equal(value, case.params[name])
    np.testing.assert_array_equal(
        target(case.queries, case.keys, case.values, case.valid_lens),
        source(case.queries, case.keys, case.values, case.valid_lens),
    )


def test_state_dict_is_a_copy():
    layer = attn.AdditiveAttention(2, 3, 4, 0.0)
    state = layer.state_dict()
    state["W_q.weight"][:] = 42
    assert not np.any(layer.state_dict()["W_q.weight"] == 42)


def test_load_state_dict_is_strict_and_names_the_tensor():
    layer = attn.AdditiveAttention(2, 3, 4, 0.0)
    state = layer.state_dict()
    before = layer.state_dict()
    with pytest.raises(attn.ShapeError, match="W_q.weight") as error:
        layer.load_state_dict({**state, "W_q.weight": np.zeros((4, 5), np.float32)})
    assert isinstance(error.value, ValueError)
    with pytest.raises(ValueError, match="missing tensor 'w_v.weight'"):
        layer.load_state_dict({k: v for k, v in state.items() if k != "w_v.weight"})
    with pytest.raises(ValueError, match="unexpected"):
        layer.load_state_dict({**state, "W_o.weight": np.zeros((4, 4), np.float32)})
    with pytest.raises(ValueError, match="unexpected"):
        attn.DotProductAttention().load_state_dict({"w": np.ones(1, np.float32)})
    with pytest.raises(TypeError, match="state_dict: expected str keys, got int"):
        layer.load_state_dict({1: np.zeros(1)})
    with pytest.raises(TypeError, match=r"state_dict\['W_q.weight'\]: expected float32"):
        layer.load_state_dict({**state, "W_q.weight": np.zeros((4, 3), np.int64)})
    # Nothing changed on failure.
    assert all(np.array_equal(before[name], value) for name, value in layer.state_dict().items())
    attn.DotProductAttention().load_state_dict({})


def test_save_and_load_safetensors(tmp_path, case):
    layer = case.make_layer()
    path = tmp_path / f"{case.name}.safetensors"
    layer.save(path)
    restored = attn.load(path)
    assert type(restored) is type(layer) and repr(restored) == repr(layer)
    restored.eval()
    np.testing.assert_array_equal(
        restored(case.queries, case.keys, case.values, case.valid_lens),
        layer(case.queries, case.keys, case.values, case.valid_lens),
    )
    # PyTorch-written files load into a constructed layer.
    if case.params_path is not None:
        fresh = case.make_layer()
        fresh.load(case.params_path)
        for name, value in fresh.state_dict().items():
            np.testing.assert_array_equal(value, case.params[name])
        with pytest.raises(attn.FileError, match="expected a layer saved by attn"):
            attn.load(case.params_path)


def test_load_checks_the_metadatas_sizes_against_the_tensors_first(tmp_path):
    # A file of metadata alone, sizes 40000: attn.load built the layer (25 GB of parameters, or a
    # MemoryError) before looking at its tensors. Now a FileError, the layer never built; a
    # file whose tensors hold what its sizes ask still loads.
    path = tmp_path / "sizes.safetensors"
    sizes = {"key_size": 40000, "query_size": 40000, "value_size": 40000, "num_hiddens": 40000}
    attn.save_safetensors(path, {"w": np.ones(4, np.float32)},
                          {"layer": "MultiHeadAttention", "num_heads": "1", "dropout": "0.0",
                           "bias": "False", **{k: str(v) for k, v in sizes.items()}})
    with pytest.raises(attn.FileError, match=r"ask for a MultiHeadAttention of 6400000000 "
                                             r"parameters, but the file holds 4 values"):
        attn.load(path)
    for layer in (attn.MultiHeadAttention(3, 4, 5, 8, 2, bias=True), attn.AdditiveAttention(3, 4, 6),
                  attn.GeneralAttention(4, 3)):
        layer.save(tmp_path / "layer.safetensors")
        assert repr(attn.load(tmp_path / "layer.safetensors")) == repr(layer)


def test_safetensors_functions_round_trip(tmp_path):
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(1)}
    attn.save_safetensors(tmp_path / "t.safetensors", tensors, {"note": "hi"})
    loaded = attn.load_safetensors(str(tmp_path / "t.safetensors"))
    assert sorted(loaded) == ["a", "b"] and loaded["a"].dtype == np.float32
    np.testing.assert_array_equal(loaded["a"], tensors["a"])
    np.testing.assert_array_equal(loaded["b"], [1.0])
    # Names are kept whole: one holding a NUL was cut there, so "a\0b" overwrote "a" (a tensor lost
    # without a word, in saving and in loading alike); a name UTF-8 cannot encode is named.
    tensors = {"a": np.ones(2, np.float32), "a\0b": np.full(3, 5.0, np.float32)}
    attn.save_safetensors(tmp_path / "nul.safetensors", tensors)
    loaded = attn.load_safetensors(tmp_path / "nul.safetensors")
    assert sorted(loaded) == ["a", "a\0b"]
    np.testing.assert_array_equal(loaded["a\0b"], tensors["a\0b"])
    with pytest.raises(ValueError, match="tensors: expected names UTF-8 can encode"):
        attn.save_safetensors(tmp_path / "bad.safetensors", {"a\udc80": np.ones(2, np.float32)})


def test_file_errors_are_oserrors_with_the_path(tmp_path):
    missing = tmp_path / "missing.safetensors"
    with pytest.raises(attn.FileError, match="missing.safetensors") as error:
        attn.load_safetensors(missing)
    assert isinstance(error.value, OSError)
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\xff" * 7)
    with pytest.raises(OSError, match="corrupt.safetensors"):
        attn.AdditiveAttention(2, 3, 4).load(corrupt)
    with pytest.raises(OSError, match="corrupt.safetensors"):
        attn.load(corrupt)


def test_layer_properties_and_repr():
    layer = attn.MultiHeadAttention(3, 4, 5, 8, 2, 0.25, bias=True)
    assert (layer.key_size, layer.query_size, layer.value_size) == (3, 4, 5)
    assert (layer.num_hiddens, layer.num_heads, layer.bias) == (8, 2, True)
    assert repr(layer) == (
        "MultiHeadAttention(key_size=3, query_size=4, value_size=5, num_hiddens=8, num_heads=2, dropout=0.25, bias=True)"
    )
    assert (
        repr(attn.DotProductAttention(0.5, scale=0.125))
        == "DotProductAttention(dropout=0.5, scale=0.125)"
    )
    assert attn.GaussianKernelPooling(2.5).width == 2.5
    additive = attn.AdditiveAttention(2, 20, 8, 0.1)
    assert (additive.key_size, additive.query_size, additive.num_hiddens) == (2, 20, 8)
    assert additive.dropout == pytest.approx(0.1)


def test_constructor_errors_are_value_errors():
    with pytest.raises(
        ValueError, match="num_heads: expected a positive divisor of num_hiddens = 8, got 3"
    ):
        attn.MultiHeadAttention(3, 4, 5, 8, 3, 0.0)
    with pytest.raises(ValueError, match="dropout"):
        attn.DotProductAttention(1.5)
    with pytest.raises(
        ValueError, match="key_size: expected a positive size, got 0"
    ):
        attn.AdditiveAttention(0, 3, 4, 0.0)


def test_backward_before_forward_is_an_error():
    with pytest.raises(ValueError, match="forward"):
        attn.AdditiveAttention(2, 3, 4).backward(np.zeros((1, 1, 1), np.float32))


def test_concurrent_calls_on_one_layer_stay_correct():
    from concurrent.futures import ThreadPoolExecutor

    case = Case("multi_head_n_ne_m")
    layer = case.make_layer()

    def run(_):
        return layer(case.queries, case.keys, case.values, case.valid_lens)

    with ThreadPoolExecutor(4) as pool:
        outputs = list(pool.map(run, range(32)))
    for output in outputs:
        np.testing.assert_allclose(output, case.output, **TOLERANCE)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: attn.MultiHeadAttention("8", 8, 8, 8, 2),
         "MultiHeadAttention(): argument 'key_size' must be int, not str"),
        (lambda: attn.MultiHeadAttention(8, 8, 8, 8, 2.5),
         "MultiHeadAttention(): argument 'num_heads' must be int, not float"),
        (lambda: attn.MultiHeadAttention(8, 8, 8, 8, 2, dropout="0.1"),
         "MultiHeadAttention(): argument 'dropout' must be float, not str"),
        (lambda: attn.MultiHeadAttention(8, 8, 8, 8, 2, bias=np.bool_(True)),
         "MultiHeadAttention(): argument 'bias' must be bool, not numpy.bool"),
        (lambda: attn.MultiHeadAttention(2**70, 8, 8, 8, 2),
         "MultiHeadAttention(): argument 'key_size' must be int in [-2**63, 2**63), got "
         f"{2**70}"),
        (lambda: attn.MultiHeadAttention(8, 8, 8, 8, 2, seed=-1),
         "MultiHeadAttention(): argument 'seed' must be an int in [0, 2**64), got -1"),
        (lambda: attn.AdditiveAttention(2, 3, [4]),
         "AdditiveAttention(): argument 'num_hiddens' must be int, not list"),
        (lambda: attn.DotProductAttention(dropout=None),
         "DotProductAttention(): argument 'dropout' must be float, not NoneType"),
        (lambda: attn.DotProductAttention(scale="x"),
         "DotProductAttention(): argument 'scale' must be float or None, not str"),
        (lambda: attn.GeneralAttention(2, 3, seed=1.5),
         "GeneralAttention(): argument 'seed' must be an int in [0, 2**64), not float"),
        (lambda: attn.GaussianKernelPooling("w"),
         "GaussianKernelPooling(): argument 'width' must be float, not str"),
        (lambda: attn.KVCache("1", 1, 8, 4),
         "KVCache(): argument 'batch' must be int, not str"),
        (lambda: attn.KVCache(1, 1, 8, 4, dtype=16),
         "KVCache(): argument 'dtype' must be str, not int"),
        (lambda: attn.KVCache(1, 1, 8, 4, value_dim="8"),
         "KVCache(): argument 'value_dim' must be int or None, not str"),
    ],
)
def test_constructor_arguments_of_the_wrong_type_name_themselves(make, message):
    # PyTorch's words (as attn.scaled_dot_product_attention's), not nanobind's signature list.
    with pytest.raises(TypeError) as raised:
        make()
    assert str(raised.value) == message


def test_constructor_arguments_take_what_converts():
    # What nanobind's typed parameters took before the constructors converted by hand: NumPy
    # integers and 0-dim arrays for ints, ints and NumPy floats for floats, None for an optional.
    layer = attn.MultiHeadAttention(np.int64(8), np.array(8), 8, 8, 2, dropout=0, bias=True,
                                    seed=np.uint64(3))
    assert (layer.key_size, layer.query_size, layer.num_heads, layer.bias) == (8, 8, 2, True)
    assert attn.DotProductAttention(np.float32(0.25), scale=None).dropout == 0.25
    assert attn.GaussianKernelPooling(2).width == 2.0
    assert attn.KVCache(1, 2, 8, 4, "bfloat16", value_dim=None).capacity == 4
    # The signature help() shows is the typed one.
    assert attn.MultiHeadAttention.__init__.__doc__.startswith(
        "__init__(self, key_size: int, query_size: int, value_size: int, num_hiddens: int, "
        "num_heads: int, dropout: float = 0.0, bias: bool = False, *, seed: int = 0) -> None")


def test_float64_safetensors_values_past_float32_are_refused(tmp_path):
    # 1e300 in an F64 tensor became inf without a word (load_state_dict refuses the same values):
    # both readers name the file and the tensor.
    import json
    import struct

    path = tmp_path / "f64.safetensors"
    header = json.dumps(
        {"W.weight": {"dtype": "F64", "shape": [2, 2], "data_offsets": [0, 32]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header
                     + np.array([[1e300, 1], [1, 1]]).tobytes())
    message = r"tensor 'W.weight': expected F64 values float32 holds .* got 1e\+300 at flat index 0"
    with pytest.raises(attn.FileError, match=message):
        attn.load_safetensors(path)
    with pytest.raises(attn.FileError, match=message):
        attn.GeneralAttention(2, 2).load(path)
