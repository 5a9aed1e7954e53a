# attn.GeneralAttention (Luong's general score (W q)·k, the book's exercise) against the NumPy
# reference, with finite-difference gradients in float64, state dicts and files; attn.torch's
# module trained side by side with the same model written in PyTorch.
import numpy as np
import pytest

import attn
import numpy_reference as ref

# float32 against a float64 reference through one projection, a softmax and two products on O(1)
# inputs: a few float32 roundings each (~1e-7 relative); 1e-5 leaves room for that only.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def general_reference(queries, keys, values, W, valid_lens=None):
    projected = np.asarray(queries, dtype=np.float64) @ np.asarray(W, dtype=np.float64).T
    return ref.dot_product_attention(projected, keys, values, valid_lens, scale=1.0)


def inputs(rng, batch=2, n=5, m=7, query_size=3, key_size=4, value_size=2):
    return (
        rng.standard_normal((batch, n, query_size)).astype(np.float32),
        rng.standard_normal((batch, m, key_size)).astype(np.float32),
        rng.standard_normal((batch, m, value_size)).astype(np.float32),
    )


@pytest.mark.parametrize("valid_lens", [None, np.array([7, 0]), np.array([[1, 2, 3, 4, 5]] * 2)])
def test_forward_and_weights_match_the_reference(valid_lens):
    q, k, v = inputs(np.random.default_rng(0))
    layer = attn.GeneralAttention(query_size=3, key_size=4, seed=3).eval()
    output = layer(q, k, v, valid_lens)
    expected, weights = general_reference(q, k, v, layer.state_dict()["W.weight"], valid_lens)
    np.testing.assert_allclose(output, expected, **TOLERANCE)
    np.testing.assert_allclose(layer.attention_weights, weights, **TOLERANCE)


def test_backward_matches_finite_differences():
    rng = np.random.default_rng(1)
    q, k, v = inputs(rng)
    g = rng.standard_normal((2, 5, 2))
    valid_lens = np.array([6, 3])
    layer = attn.GeneralAttention(3, 4, seed=5).eval()
    W = layer.state_dict()["W.weight"].astype(np.float64)
    layer(q, k, v, valid_lens)
    gradients = layer.backward(g.astype(np.float32))

    def loss(q_, k_, v_, W_):
        return float(np.sum(general_reference(q_, k_, v_, W_, valid_lens)[0] * g))

    arguments = [q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), W]
    step = 1e-6
    numerical = []
    for index, argument in enumerate(arguments):
        gradient = np.zeros_like(argument)
        for flat in range(argument.size):
            saved = argument.flat[flat]
            argument.flat[flat] = saved + step
            up = loss(*arguments)
            argument.flat[flat] = saved - step
            down = loss(*arguments)
            argument.flat[flat] = saved
            gradient.flat[flat] = (up - down) / (2 * step)
        numerical.append(gradient)
    # float32 backward pass against float64 central differences (truncation ~1e-12): 1e-4 as the
    # other layers' gradient checks.
    for name, expected in zip(("queries", "keys", "values"), numerical):
        np.testing.assert_allclose(gradients[name], expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(layer.grads()["W.weight"], numerical[3], rtol=1e-4, atol=1e-4)


def test_state_dict_file_and_errors(tmp_path):
    layer = attn.GeneralAttention(3, 4, dropout=0.25, seed=2)
    assert (layer.query_size, layer.key_size, layer.dropout) == (3, 4, 0.25)
    assert list(layer.state_dict()) == ["W.weight"]
    assert layer.state_dict()["W.weight"].shape == (4, 3)
    path = tmp_path / "general.safetensors"
    layer.save(path)
    loaded = attn.load(path)
    assert isinstance(loaded, attn.GeneralAttention)
    np.testing.assert_array_equal(loaded.state_dict()["W.weight"], layer.state_dict()["W.weight"])
    q, k, v = inputs(np.random.default_rng(2))
    with pytest.raises(ValueError, match="keys: expected the last dimension to be 4"):
        layer(q, k[..., :3], v)
    with pytest.raises(ValueError, match="key_size: expected a positive size"):
        attn.GeneralAttention(3, 0)


def test_torch_module_trains_like_the_same_model_in_pytorch():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import attn.torch as attn_torch

    torch.manual_seed(0)
    module = attn_torch.GeneralAttention(query_size=3, key_size=4)
    W = torch.nn.Linear(3, 4, bias=False)
    with torch.no_grad():
        W.weight.copy_(module.get_parameter("W.weight"))
    q, k, v = (torch.from_numpy(a) for a in inputs(np.random.default_rng(3)))
    valid_lens = torch.tensor([7, 4])
    target = torch.randn(2, 5, 2)
    ours = torch.optim.SGD(module.parameters(), lr=0.1)
    theirs = torch.optim.SGD(W.parameters(), lr=0.1)
    for _ in range(3):
        ours.zero_grad()
        theirs.zero_grad()
        loss_ours = ((module(q, k, v, valid_lens) - target) ** 2).mean()
        scores = torch.bmm(W(q), k.transpose(1, 2))
        mask = torch.arange(7)[None, None, :] < valid_lens[:, None, None]
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        loss_theirs = ((torch.bmm(weights, v) - target) ** 2).mean()
        loss_ours.backward()
        loss_theirs.backward()
        ours.step()
        theirs.step()
        assert abs(loss_ours.item() - loss_theirs.item()) <= 1e-5 * max(1.0, loss_theirs.item())
    torch.testing.assert_close(module.get_parameter("W.weight"), W.weight, rtol=1e-5, atol=1e-5)
