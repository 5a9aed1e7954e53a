# attn side by side with the book's PyTorch code on random inputs (outputs, weights, gradients),
# PyTorch tensors in and out without copies, and attn.torch's modules training inside PyTorch.
import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the side-by-side tests need it"
)

import attn  # noqa: E402
import attn.torch as attn_torch  # noqa: E402
import book_torch as book  # noqa: E402
from torch_reference import reference_sdpa  # noqa: E402

# float32 on both sides, O(1) random inputs, at most a few dozen operations per output: the two
# implementations round differently by a few float32 ulps; the issue asks for agreement to 1e-5.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)

VALID_LENS = {
    "none": lambda batch, n, m: None,
    "per_batch": lambda batch, n, m: torch.randint(1, m + 1, (batch,)),
    "per_query": lambda batch, n, m: torch.randint(1, m + 1, (batch, n)),
}


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(1234)


def assert_close(actual, expected, name=""):
    np.testing.assert_allclose(
        np.asarray(actual.detach() if isinstance(actual, torch.Tensor) else actual),
        expected.detach().numpy(),
        err_msg=name,
        **TOLERANCE,
    )


def make_pair(kind, bias=False):
    """A book module and attn's, with the same state dict, both in evaluation mode."""
    if kind == "additive":
        sizes = dict(key_size=3, query_size=5, num_hiddens=7, dropout=0.2)
        reference, layer = book.AdditiveAttention(**sizes), attn.AdditiveAttention(**sizes)
        shapes = dict(query_size=5, key_size=3, value_size=4)
    elif kind == "multi_head":
        sizes = dict(
            key_size=3, query_size=5, value_size=4, num_hiddens=8, num_heads=2, dropout=0.2
        )
        reference = book.MultiHeadAttention(**sizes, bias=bias)
        layer = attn.MultiHeadAttention(**sizes, bias=bias)
        shapes = dict(query_size=5, key_size=3, value_size=4)
    elif kind == "dot_product":
        reference, layer = book.DotProductAttention(0.2), attn.DotProductAttention(0.2)
        shapes = dict(query_size=6, key_size=6, value_size=3)
    else:
        reference, layer = book.GaussianKernelPooling(1.7), attn.GaussianKernelPooling(1.0)
        shapes = dict(query_size=2, key_size=2, value_size=3)
    layer.load_state_dict(reference.state_dict())
    return reference.eval(), layer.eval(), shapes


@pytest.mark.parametrize("lens", ["none", "per_batch", "per_query"])
@pytest.mark.parametrize(
    "kind, bias",
    [
        ("additive", False),
        ("dot_product", False),
        ("multi_head", False),
        ("multi_head", True),
        ("gaussian", False),
    ],
    ids=["additive", "dot_product", "multi_head", "multi_head_bias", "gaussian"],
)
def test_attn_agrees_with_the_book(kind, bias, lens):
    reference, layer, shapes = make_pair(kind, bias)
    batch, n, m = 3, 4, 6
    queries = torch.randn(batch, n, shapes["query_size"], requires_grad=True)
    keys = torch.randn(batch, m, shapes["key_size"], requires_grad=True)
    values = torch.randn(batch, m, shapes["value_size"], requires_grad=True)
    valid_lens = VALID_LENS[lens](batch, n, m)

    expected = reference(queries, keys, values, valid_lens)
    grad_output = torch.randn_like(expected)
    (expected * grad_output).sum().backward()

    output = layer(queries, keys, values, valid_lens)
    assert isinstance(output, torch.Tensor) and output.dtype == torch.float32
    assert_close(output, expected, "output")
    book_weights = (
        reference.attention.attention_weights
        if kind == "multi_head"
        else reference.attention_weights
    )
    assert isinstance(layer.attention_weights, torch.Tensor)
    assert_close(layer.attention_weights, book_weights, "weights")

    gradients = layer.backward(grad_output)
    for name, tensor in (("queries", queries), ("keys", keys), ("values", values)):
        assert isinstance(gradients[name], torch.Tensor)
        assert_close(gradients[name], tensor.grad, name)
    parameter_grads = layer.grads()
    assert sorted(parameter_grads) == sorted(name for name, _ in reference.named_parameters())
    for name, parameter in reference.named_parameters():
        assert_close(parameter_grads[name], parameter.grad, name)


def test_torch_tensors_are_not_copied():
    x = torch.randn(2, 3, 4)
    assert attn._data_pointer(x) == x.data_ptr()
    parameter = torch.nn.Parameter(torch.randn(2, 3, 4))  # requires grad: detached, same storage
    assert attn._data_pointer(parameter) == parameter.data_ptr()
    transposed = torch.randn(2, 4, 3).transpose(1, 2)
    assert attn._data_pointer(transposed) != transposed.data_ptr()
    np.testing.assert_array_equal(
        attn.masked_softmax(transposed).numpy(),
        attn.masked_softmax(transposed.contiguous()).numpy(),
    )
    # A view that starts inside its storage (torch tensors arrive as torch._C._to_dlpack capsules).
    offset = torch.randn(3, 3, 4)[1:]
    assert attn._data_pointer(offset) == offset.data_ptr()
    np.testing.assert_array_equal(
        attn.masked_softmax(offset).numpy(), attn.masked_softmax(offset.clone()).numpy()
    )


def test_results_follow_the_input_framework():
    q, k, v = torch.randn(1, 2, 3), torch.randn(1, 4, 3), torch.randn(1, 4, 2)
    assert isinstance(attn.scaled_dot_product_attention(q, k, v, torch.tensor([3])), torch.Tensor)
    assert isinstance(attn.scaled_dot_product_attention(q.numpy(), k, v), np.ndarray)
    layer = attn.DotProductAttention()
    layer(q.numpy(), k.numpy(), v.numpy())
    assert isinstance(layer.attention_weights, np.ndarray)
    layer(q, k, v)
    assert isinstance(layer.attention_weights, torch.Tensor)


def test_torch_input_errors():
    with pytest.raises(TypeError, match="query: expected float32 .* got int64"):
        attn.scaled_dot_product_attention(
            torch.zeros(1, 2, 3, dtype=torch.int64), torch.zeros(1, 2, 3), torch.zeros(1, 2, 3)
        )
    with pytest.raises(TypeError, match="valid_lens: expected integer lengths .* got float32"):
        attn.masked_softmax(torch.zeros(1, 2, 3), torch.tensor([1.0]))
    with pytest.raises(TypeError, match="X: expected float32 .* got bfloat16"):
        attn.masked_softmax(torch.zeros(1, 2, 3, dtype=torch.bfloat16))


def test_load_state_dict_from_the_book_module_and_back():
    reference = book.MultiHeadAttention(3, 5, 4, 8, 2, 0.0, bias=True)
    layer = attn.MultiHeadAttention(3, 5, 4, 8, 2, 0.0, bias=True)
    layer.load_state_dict(reference.state_dict())  # torch tensors, some requiring grad
    other = book.MultiHeadAttention(3, 5, 4, 8, 2, 0.0, bias=True)
    other.load_state_dict(
        {name: torch.from_numpy(value) for name, value in layer.state_dict().items()}
    )
    for name, tensor in reference.state_dict().items():
        assert torch.equal(other.state_dict()[name], tensor)


MODULE_PAIRS = {
    "additive": (
        lambda: book.AdditiveAttention(3, 5, 7, 0.0),
        lambda: attn_torch.AdditiveAttention(3, 5, 7, 0.0),
        (5, 3, 4),
    ),
    "multi_head": (
        lambda: book.MultiHeadAttention(3, 5, 4, 8, 2, 0.0, bias=True),
        lambda: attn_torch.MultiHeadAttention(3, 5, 4, 8, 2, 0.0, bias=True),
        (5, 3, 4),
    ),
    "dot_product": (
        lambda: book.DotProductAttention(0.0),
        lambda: attn_torch.DotProductAttention(0.0),
        (6, 6, 3),
    ),
    "gaussian": (
        lambda: book.GaussianKernelPooling(1.3),
        lambda: attn_torch.GaussianKernelPooling(),
        (2, 2, 3),
    ),
}


@pytest.mark.parametrize("kind", sorted(MODULE_PAIRS))
def test_attn_torch_modules_train_like_the_book(kind):
    make_reference, make_module, (query_size, key_size, value_size) = MODULE_PAIRS[kind]
    reference, module = make_reference(), make_module()
    module.load_state_dict(reference.state_dict())
    assert sorted(module.state_dict()) == sorted(reference.state_dict())

    # A small model around the attention: a linear read-out, trained by SGD for a few steps on
    # the same data; the two must stay together step by step.
    def model_pair(attention):
        readout = torch.nn.Linear(value_size if kind != "multi_head" else 8, 1)
        torch.nn.init.constant_(readout.weight, 0.1)
        torch.nn.init.zeros_(readout.bias)
        return attention, readout

    pairs = [model_pair(reference), model_pair(module)]
    optimizers = [torch.optim.SGD([*a.parameters(), *r.parameters()], lr=0.1) for a, r in pairs]
    queries, keys = torch.randn(3, 4, query_size), torch.randn(3, 6, key_size)
    values, target = torch.randn(3, 6, value_size), torch.randn(3, 4, 1)
    valid_lens = torch.tensor([[2, 6, 3, 1], [6, 6, 5, 4], [1, 2, 3, 4]])
    for step in range(3):
        losses = []
        for (attention, readout), optimizer in zip(pairs, optimizers):
            optimizer.zero_grad()
            q = queries.clone().requires_grad_(True)
            loss = ((readout(attention(q, keys, values, valid_lens)) - target) ** 2).mean()
            loss.backward()
            optimizer.step()
            losses.append((loss.detach(), q.grad))
        assert_close(losses[1][0], losses[0][0], f"loss at step {step}")
        assert_close(losses[1][1], losses[0][1], f"queries.grad at step {step}")
    for name, tensor in reference.state_dict().items():
        assert_close(module.state_dict()[name], tensor, name)
    assert module.attention_weights.shape[1:] == (4, 6)


@pytest.mark.parametrize("kind", sorted(MODULE_PAIRS))
def test_attn_torch_modules_in_a_float64_model_give_float64(kind):
    # A .double() model: the output and every gradient in float64, as the book's modules give
    # them (attn's were float32, which the model's next float64 layer refused), within float32
    # round-off of the book's float64 (attn computes the attention in float32).
    make_reference, make_module, (query_size, key_size, value_size) = MODULE_PAIRS[kind]
    reference, module = make_reference(), make_module()
    module.load_state_dict(reference.state_dict())
    reference.double()
    module.double()
    inputs = [torch.randn(3, 4, query_size), torch.randn(3, 6, key_size), torch.randn(3, 6, value_size)]
    results = []
    for attention in (reference, module):
        q, k, v = (x.double().requires_grad_(True) for x in inputs)
        output = attention(q, k, v, torch.tensor([2, 6, 3]))
        output.pow(2).sum().backward()
        grads = {name: p.grad for name, p in attention.named_parameters()}
        results.append((output, q.grad, k.grad, v.grad, grads))
    (expected, *expected_grads, expected_params), (output, *grads, params) = results
    assert output.dtype == torch.float64
    assert_close(output, expected, "output")
    for name, grad, want in zip(("queries", "keys", "values"), grads, expected_grads):
        assert grad.dtype == torch.float64, name
        assert_close(grad, want, name)
    for name, grad in params.items():
        assert grad.dtype == torch.float64, name
        assert_close(grad, expected_params[name], name)
    assert module.attention_weights.dtype == torch.float64


@pytest.mark.parametrize("setting", ["float64", "autocast", "compile"])
@pytest.mark.parametrize("kind", sorted(MODULE_PAIRS))
def test_attention_weights_are_the_calls_after_its_inputs_change(kind, setting):
    # The composed modules compute a call's weights when they are read: they read the caller's
    # queries, keys and valid_lens then, so a caller reusing its buffers in place changed the
    # weights of a call made before (uniform weights after queries.zero_(), a length of 3 read
    # for one of 1). The book's modules keep the call's weights; attn's must equal them.
    make_reference, make_module, (query_size, key_size, value_size) = MODULE_PAIRS[kind]
    reference, module = make_reference(), make_module()
    module.load_state_dict(reference.state_dict())
    dtype = torch.float64 if setting == "float64" else torch.float32
    reference.to(dtype)
    module.to(dtype)
    inputs = [torch.randn(2, 4, query_size), torch.randn(2, 6, key_size),
              torch.randn(2, 6, value_size)]
    call = torch.compile(module) if setting == "compile" else module
    weights = []
    for attention in (reference, call):
        q, k, v = (x.to(dtype, copy=True) for x in inputs)
        lengths = torch.tensor([1, 5])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=setting == "autocast"):
            attention(q, k, v, lengths)
        q.zero_()
        k.mul_(3.0)
        lengths.fill_(6)
        read = module.attention_weights if attention is call else (
            reference.attention.attention_weights if kind == "multi_head"
            else reference.attention_weights
        )
        weights.append(read.detach().float())
    expected, actual = weights
    # bf16 autocast: both compute from the same bf16-rounded inputs, weights within bf16's
    # rounding of the output (2^-8); otherwise float32 round-off.
    tolerance = 2.0**-7 if setting == "autocast" else 1e-5
    np.testing.assert_allclose(actual.numpy(), expected.numpy(), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kind", sorted(MODULE_PAIRS))
def test_attn_torch_modules_in_a_half_model_give_its_dtype(kind, dtype):
    # A .bfloat16() or .half() model outside autocast (its inputs refused before, the message
    # naming a state dict the user never passed): the output in its dtype, within a few roundings
    # of the book's float64 module on the same rounded parameters and inputs — 8 u of the
    # output's largest entry (u the dtype's unit roundoff: the projections and the attention each
    # round once in the composed modules, their sums in fp32).
    make_reference, make_module, (query_size, key_size, value_size) = MODULE_PAIRS[kind]
    reference, module = make_reference(), make_module()
    module.load_state_dict(reference.state_dict())
    module.to(dtype)
    reference.load_state_dict({n: p.double() for n, p in module.state_dict().items()})
    reference.double()
    inputs = [
        torch.randn(3, 4, query_size).to(dtype).requires_grad_(True),
        torch.randn(3, 6, key_size).to(dtype).requires_grad_(True),
        torch.randn(3, 6, value_size).to(dtype).requires_grad_(True),
    ]
    lens = torch.tensor([2, 6, 3])
    output = module(*inputs, lens)
    assert output.dtype == dtype
    with torch.no_grad():
        expected = reference(*(x.double() for x in inputs), lens)
    bound = 8 * ROUNDOFF[dtype] * float(expected.abs().max())
    assert float((output.detach().double() - expected).abs().max()) <= bound
    output.float().sum().backward()
    for name, p in [*module.named_parameters(), *zip(("q", "k", "v"), inputs)]:
        assert p.grad.dtype == dtype, name


@pytest.mark.parametrize("kind", [*sorted(MODULE_PAIRS), "general"])
def test_attn_torch_modules_pickle_and_save_whole(kind, tmp_path):
    # torch.save(model), pickle and spawned processes need the modules to pickle (attn's layer
    # objects refused): the copy computes what the module computes, in its mode, and trains.
    if kind == "general":
        module, (query_size, key_size, value_size) = COMPOSED["general"][0](), (6, 5, 3)
    else:
        module = MODULE_PAIRS[kind][1]()
        query_size, key_size, value_size = MODULE_PAIRS[kind][2]
    queries, keys = torch.randn(2, 3, query_size), torch.randn(2, 5, key_size)
    values, lens = torch.randn(2, 5, value_size), torch.tensor([3, 5])
    module.eval()
    expected = module(queries, keys, values, lens)
    torch.save(module, tmp_path / "module.pt")
    for copy in (pickle.loads(pickle.dumps(module)),
                 torch.load(tmp_path / "module.pt", weights_only=False)):
        assert type(copy) is type(module) and not copy.training
        assert torch.equal(copy.attention_weights, module.attention_weights)
        assert torch.equal(copy(queries, keys, values, lens), expected)
        q = queries.clone().requires_grad_(True)
        copy.train()(q, keys, values, lens).sum().backward()
        assert q.grad is not None


@pytest.mark.parametrize("kind", sorted(MODULE_PAIRS))
def test_attn_torch_modules_reuse_layers_no_graph_holds(kind, monkeypatch):
    # A module runs an earlier call's attn layer again once no autograd graph holds it, instead of
    # copying its template (0.3-1 ms at 256 hidden units), and computes attention_weights only
    # when read. Calls within one graph (a decoder's steps) must each keep their own layer; calls
    # without a graph must each give their own result; the weights are always the last call's.
    make_reference, make_module, (query_size, key_size, value_size) = MODULE_PAIRS[kind]
    reference, module = make_reference(), make_module()
    module.load_state_dict(reference.state_dict())
    copies = []
    real_copy = attn_torch._copy.copy
    monkeypatch.setattr(attn_torch._copy, "copy", lambda x: copies.append(1) or real_copy(x))
    steps = [(torch.randn(2, 3, query_size), torch.randn(2, 5, key_size),
              torch.randn(2, 5, value_size)) for _ in range(3)]
    lens = torch.tensor([3, 5])
    for _ in range(2):  # the second pass's calls reuse the first pass's layers
        module.zero_grad()
        reference.zero_grad()
        grads = []
        for attention in (module, reference):
            queries = [q.clone().requires_grad_(True) for q, _, _ in steps]
            loss = sum((i + 1) * attention(q, k, v, lens).sum()
                       for i, (q, (_, k, v)) in enumerate(zip(queries, steps)))
            loss.backward()
            named = dict(attention.named_parameters())
            grads.append([q.grad for q in queries] + [named[name].grad for name in sorted(named)])
        for index, (mine, theirs) in enumerate(zip(*grads)):
            assert_close(mine, theirs, f"gradient {index}")
    assert len(copies) == 3, "three calls in one graph need three layers, then reuse them"
    with torch.no_grad():
        for q, k, v in steps:
            assert_close(module(q, k, v, lens), reference(q, k, v, lens), "output")
        assert len(copies) == 3, "calls without a graph reuse a layer"
        holder = reference.attention if kind == "multi_head" else reference
        assert_close(module.attention_weights, holder.attention_weights, "last call's weights")


@pytest.mark.parametrize("kind", sorted(MODULE_PAIRS))
def test_attn_torch_modules_backward_again_through_a_retained_graph(kind):
    # retain_graph=True (and gradcheck, autograd.grad twice) runs a node's backward again: the
    # gradients accumulate as the book's module gives them, a call made between the two passes
    # takes another layer, and a pass after the graph is freed gets PyTorch's own error.
    make_reference, make_module, (query_size, key_size, value_size) = MODULE_PAIRS[kind]
    reference, module = make_reference(), make_module()
    module.load_state_dict(reference.state_dict())
    q, k = torch.randn(2, 3, query_size), torch.randn(2, 5, key_size)
    v, lens = torch.randn(2, 5, value_size), torch.tensor([3, 5])
    grads = []
    for attention in (module, reference):
        queries = q.clone().requires_grad_(True)
        loss = attention(queries, k, v, lens).square().sum()
        loss.backward(retain_graph=True)
        with torch.no_grad():
            attention(torch.randn_like(q), k, v, lens)  # between the passes
        loss.backward()
        grads.append(queries.grad)
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            loss.backward()
    assert_close(grads[0], grads[1], "queries.grad after two passes")


@pytest.mark.parametrize("kind", sorted(MODULE_PAIRS))
def test_attn_torch_modules_refuse_a_second_derivative(kind):
    # A gradient made with create_graph=True (of the inputs and of the parameters) equals the
    # first-order one, and differentiating it again raises instead of silently giving zero.
    _, make_module, (query_size, key_size, value_size) = MODULE_PAIRS[kind]
    module = make_module()
    q, k = torch.randn(2, 3, query_size), torch.randn(2, 5, key_size)
    v = torch.randn(2, 5, value_size)
    queries = q.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(module(queries, k, v).sum(), queries)
    (gradient,) = torch.autograd.grad(module(queries, k, v).sum(), queries, create_graph=True)
    assert_close(gradient, expected, "queries' gradient under create_graph=True")
    with pytest.raises(RuntimeError, match="attn: double backward is not supported"):
        gradient.square().sum().backward()
    parameters = list(module.parameters())
    if parameters:
        gradients = torch.autograd.grad(module(q, k, v).sum(), parameters, create_graph=True)
        with pytest.raises(RuntimeError, match="attn: double backward is not supported"):
            gradients[0].square().sum().backward()


def test_attn_torch_dropout_follows_torch_manual_seed():
    module = attn_torch.DotProductAttention(0.5)
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 2)
    torch.manual_seed(5)
    first = module(q, k, v)
    second = module(q, k, v)
    torch.manual_seed(5)
    assert torch.equal(module(q, k, v), first)
    assert not torch.equal(first, second)
    module.eval()
    assert torch.equal(module(q, k, v), module(q, k, v))


def test_attn_torch_gradcheck_in_float64_inputs():
    # attn computes in float32, so the float64 finite differences of gradcheck would not match;
    # instead compare with the book's function on the same inputs.
    q = torch.randn(2, 3, 4, requires_grad=True)
    k = torch.randn(2, 5, 4, requires_grad=True)
    v = torch.randn(2, 5, 2, requires_grad=True)
    out = attn_torch.scaled_dot_product_attention(q, k, v, torch.tensor([2, 5]))
    out.sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    book.DotProductAttention(0.0)(q, k, v, torch.tensor([2, 5])).sum().backward()
    for mine, theirs in zip(grads, (q.grad, k.grad, v.grad)):
        assert_close(mine, theirs)


# --- The modules under torch.autocast("cpu") ------------------------------------------------------
# The book's modules under autocast compute their linear layers and products in the autocast dtype
# and return it. attn.torch's DotProductAttention, MultiHeadAttention and GeneralAttention do the
# same (projections by PyTorch's linear, the attention by attn's half kernels); AdditiveAttention
# and GaussianKernelPooling compute in float32 and return the output cast.

F = torch.nn.functional
AUTOCAST_DTYPES = pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"]
)
# Unit roundoff of each dtype (8 and 11 significant bits).
ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
COMPOSED = {
    "multi_head": (lambda: attn_torch.MultiHeadAttention(5, 6, 4, 8, 2, bias=True), (6, 5, 4)),
    "dot_product": (lambda: attn_torch.DotProductAttention(), (6, 6, 3)),
    "general": (lambda: attn_torch.GeneralAttention(6, 5), (6, 5, 3)),
}


def composed_inputs(sizes, lens):
    """Queries (3, 4, ·), keys and values (3, 7, ·) and valid lengths (None, (3,) or (3, 4))."""
    query_size, key_size, value_size = sizes
    queries, keys = torch.randn(3, 4, query_size), torch.randn(3, 7, key_size)
    return queries, keys, torch.randn(3, 7, value_size), VALID_LENS[lens](3, 4, 7)


def composed_reference(kind, module, queries, keys, values, dtype):
    """The module's steps under autocast up to its attention: the projected (B, H, rows, ·)
    tensors in `dtype` (PyTorch's own linear, as the module calls it), the scale, and the final
    step, as functions of the attention's (B, H, n, ·) output."""
    p = dict(module.named_parameters())
    with torch.autocast("cpu", dtype=dtype):
        if kind == "multi_head":

            def linear(x, name):
                return F.linear(x, p[name + ".weight"], p[name + ".bias"])

            def split(x):
                return x.unflatten(-1, (2, -1)).transpose(1, 2)

            q, k, v = (
                split(linear(x, name))
                for x, name in zip((queries, keys, values), ("W_q", "W_k", "W_v"))
            )

            def finish(output):
                with torch.autocast("cpu", dtype=dtype):
                    return linear(output.transpose(1, 2).flatten(2), "W_o")

            return q, k, v, None, finish
        q = F.linear(queries, p["W.weight"]) if kind == "general" else queries.to(dtype)
        scale = 1.0 if kind == "general" else None
        return (q.unsqueeze(1), keys.to(dtype).unsqueeze(1), values.to(dtype).unsqueeze(1), scale,
                lambda output: output.squeeze(1))


@AUTOCAST_DTYPES
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lens", ["none", "per_batch", "per_query"])
@pytest.mark.parametrize("kind", sorted(COMPOSED))
def test_composed_modules_under_autocast_compute_in_its_dtype(kind, lens, causal, dtype):
    # Against the same steps with the attention in float64 on the rounded projections, rounded
    # once: attn's half attention is within 1e-5 of it, plus (bf16) P rounded to bf16 before P V,
    # ≤ u·max|v| (test_half_precision.py), and each side's rounding of the attention output, u of
    # |out| each: 2u·max|v| + 2u·|o| bounds the attention's difference Δo. MultiHeadAttention's
    # W_o then takes Δo to at most Σ_j |W_o[i, j]|·Δo, and each side rounds once more.
    module = COMPOSED[kind][0]()
    queries, keys, values, valid_lens = composed_inputs(COMPOSED[kind][1], lens)
    with torch.autocast("cpu", dtype=dtype):
        output = module(queries, keys, values, valid_lens, causal=causal)
    assert output.dtype == dtype
    u = ROUNDOFF[dtype]
    with torch.no_grad():
        q, k, v, scale, finish = composed_reference(kind, module, queries, keys, values, dtype)
        attention = reference_sdpa(
            q.double(), k.double(), v.double(), scale=scale, valid_lens=valid_lens,
            is_causal=causal, alignment="bottom-right",
        )
        attention_bound = 2 * u * float(v.abs().max()) + 2 * u * attention.abs() + 1e-5
        expected = finish(attention.to(dtype))
        if kind == "multi_head":
            w_o = module.get_parameter("W_o.weight").double()
            bound = float(attention_bound.max()) * w_o.abs().sum(1) + 2 * u * expected.abs()
        else:
            bound = attention_bound.squeeze(1)
    difference = (output.double() - expected.double()).abs()
    assert (difference <= bound).all(), float((difference - bound).max())


@AUTOCAST_DTYPES
@pytest.mark.parametrize("kind", sorted(COMPOSED))
def test_composed_modules_under_autocast_give_the_weights_of_the_rounded_projections(kind, dtype):
    # Weights in the call's dtype, as the book's modules keep them under autocast: attn's float32
    # softmax of the rounded projections' scores, rounded once (u of each weight), against the
    # float64 softmax (reference_sdpa with identity values) of the same projections.
    module = COMPOSED[kind][0]()
    queries, keys, values, valid_lens = composed_inputs(COMPOSED[kind][1], "per_query")
    with torch.autocast("cpu", dtype=dtype):
        module(queries, keys, values, valid_lens, causal=True)
    weights = module.attention_weights
    assert weights.dtype == dtype
    q, k, _, scale, _ = composed_reference(kind, module, queries, keys, values, dtype)
    identity = torch.eye(7, dtype=torch.float64).expand(*k.shape[:2], 7, 7)
    expected = reference_sdpa(
        q.double(), k.double(), identity, scale=scale, valid_lens=valid_lens, is_causal=True,
        alignment="bottom-right",
    ).reshape(weights.shape)
    difference = (weights.double() - expected).abs()
    assert (difference <= ROUNDOFF[dtype] * expected + 1e-6).all(), float(difference.max())


@AUTOCAST_DTYPES
@pytest.mark.parametrize("kind", ["additive", "gaussian"])
def test_other_modules_under_autocast_return_their_float32_output_cast(kind, dtype):
    make_reference, make_module, (query_size, key_size, value_size) = MODULE_PAIRS[kind]
    module = make_module()
    module.load_state_dict(make_reference().state_dict())
    queries, keys = torch.randn(3, 4, query_size).to(dtype), torch.randn(3, 7, key_size)
    values, lens = torch.randn(3, 7, value_size), torch.tensor([2, 7, 5])
    with torch.autocast("cpu", dtype=dtype):
        output = module(queries, keys, values, lens)
    weights = module.attention_weights
    assert torch.equal(output, module(queries.float(), keys, values, lens).to(dtype))
    assert torch.equal(weights, module.attention_weights.to(dtype))  # as the book's, in dtype
    assert module.attention_weights.dtype == torch.float32  # a float32 call's weights


def assert_float32_within(mine, theirs, relative):
    """Two {name: tensor} of the same names, all float32, each of `mine` within `relative` of the
    largest entry of the same tensor of `theirs` — W_k's bias at the scale of W_k's weight: it
    shifts all of a query's scores alike, so its exact gradient is 0 and both sides' are
    rounding."""
    assert sorted(mine) == sorted(theirs)
    for name in mine:
        assert mine[name].dtype == theirs[name].dtype == torch.float32, name
        scale = float(theirs["W_k.weight" if name == "W_k.bias" else name].abs().max())
        assert float((mine[name] - theirs[name]).abs().max()) <= relative * scale, name


@pytest.mark.parametrize("kind", sorted(COMPOSED))
def test_composed_modules_under_autocast_train_as_in_float32(kind):
    # Gradients reach the inputs and the float32 parameters; against the float32 module's: the
    # bf16 chain rounds inputs and weights, the projections, the attention's output and its
    # backward's operands, and the projections' backward, each by at most 2⁻⁸ of what it rounds:
    # 2⁻⁴ of the largest gradient bounds six such roundings twice over. W_k's bias shifts all of
    # a query's scores alike, which the softmax ignores: its exact gradient is 0 and both sides'
    # are rounding, held to the scale of W_k's weight gradient (Σ_j dK_j k_j against Σ_j dK_j).
    module = COMPOSED[kind][0]()
    queries, keys, values, valid_lens = composed_inputs(COMPOSED[kind][1], "per_batch")
    grad_output = torch.randn(3, 4, 8 if kind == "multi_head" else 3)
    gradients = []
    for autocast in (True, False):
        module.zero_grad()
        leaves = [x.clone().requires_grad_(True) for x in (queries, keys, values)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            output = module(*leaves, valid_lens)
        assert output.dtype == (torch.bfloat16 if autocast else torch.float32)
        output.backward(grad_output.to(output.dtype))
        gradients.append(
            {name: x.grad for name, x in zip(("queries", "keys", "values"), leaves)}
            | {name: p.grad for name, p in module.named_parameters()}
        )
    assert_float32_within(*gradients, 2.0**-4)


def test_composed_modules_under_autocast_drop_weights_by_torch_manual_seed():
    module = attn_torch.MultiHeadAttention(5, 6, 4, 8, 2, 0.5)
    queries, keys, values, _ = composed_inputs((6, 5, 4), "none")
    outputs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        with torch.autocast("cpu"):
            outputs.append(module(queries, keys, values))
    assert torch.equal(outputs[0], outputs[1]) and not torch.equal(outputs[0], outputs[2])
    with torch.autocast("cpu"):
        evaluated = module.eval()(queries, keys, values)
    assert not torch.equal(outputs[0], evaluated)


@pytest.mark.parametrize(
    "kind, shapes",
    [
        ("multi_head", [(3, 4, 7), (3, 7, 5), (3, 7, 4)]),  # the queries' size
        ("multi_head", [(3, 4, 6), (3, 7, 4), (3, 7, 4)]),  # the keys' size
        ("multi_head", [(3, 4, 6), (2, 7, 5), (2, 7, 4)]),  # the batch
        ("dot_product", [(3, 4, 6), (3, 7, 5), (3, 7, 3)]),  # keys against queries
        ("dot_product", [(3, 4, 6), (3, 7, 6), (3, 8, 3)]),  # as many values as keys
        ("general", [(3, 4, 6), (3, 7, 6), (3, 7, 3)]),  # the key size
        ("general", [(4, 6), (3, 7, 5), (3, 7, 3)]),  # 3-d
    ],
)
def test_composed_modules_under_autocast_refuse_what_their_layers_refuse(kind, shapes):
    module = COMPOSED[kind][0]()
    inputs = [torch.randn(*shape) for shape in shapes]
    with pytest.raises((ValueError, attn.ShapeError)) as outside:
        module(*inputs)
    with pytest.raises(type(outside.value)) as inside:
        with torch.autocast("cpu"):
            module(*inputs)
    assert str(inside.value) == str(outside.value)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kind", sorted(COMPOSED))
def test_composed_modules_compile_whole_in_float32(kind, causal):
    # A float32 call traced by torch.compile runs the composition (PyTorch's linear, attn's
    # function) where eager runs attn's layer object, which Dynamo cannot trace: fullgraph=True
    # holds. Output, gradients of the inputs and parameters, and the weights read after the call
    # agree with the eager layer's within float32 rounding of different summation orders (the
    # projections' GEMMs): 1e-5 of each tensor's largest entry.
    module = COMPOSED[kind][0]()
    queries, keys, values, valid_lens = composed_inputs(COMPOSED[kind][1], "per_query")
    grad_output = torch.randn(3, 4, 8 if kind == "multi_head" else 3)

    def call(queries, keys, values):
        return module(queries, keys, values, valid_lens, causal=causal)

    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    results = []
    for run in (compiled, call):
        module.zero_grad()
        leaves = [x.clone().requires_grad_(True) for x in (queries, keys, values)]
        output = run(*leaves)
        weights = module.attention_weights
        output.backward(grad_output)
        results.append(
            {"output": output.detach(), "weights": weights}
            | {name: x.grad for name, x in zip(("queries", "keys", "values"), leaves)}
            | {name: p.grad for name, p in module.named_parameters()}
        )
    assert_float32_within(*results, 1e-5)


@pytest.mark.parametrize("kind", sorted(COMPOSED))
def test_composed_modules_under_autocast_compile_whole(kind):
    # Under autocast the composed modules are PyTorch's operators and attn's custom ones only, so
    # torch.compile(fullgraph=True) traces them; the compiled call gives the eager result.
    module = COMPOSED[kind][0]().eval()
    queries, keys, values, valid_lens = composed_inputs(COMPOSED[kind][1], "per_batch")

    def call(queries, keys, values):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return module(queries, keys, values, valid_lens, causal=True)

    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")(queries, keys, values)
    assert torch.equal(compiled, call(queries, keys, values))


# --- tensors with the negative bit ----------------------------------------------------------------
# z.conj().imag (and torch._neg_view) is a lazily negated view: the storage holds −values, and
# PyTorch's DLPack export hands over that storage without the sign. attn resolves the bit
# (resolve_neg, a copy) wherever a tensor enters it, so these read as their values.


def negative_view(*shape, dtype=torch.float32):
    """A tensor of `shape` with the negative bit set, and the same values materialised."""
    if dtype == torch.float32:
        view = torch.randn(*shape, dtype=torch.complex64).conj().imag
    else:
        view = torch._neg_view(torch.randn(*shape).to(dtype))
    assert view.is_neg()
    plain = view.resolve_neg()
    assert not plain.is_neg() and torch.equal(view, plain)
    return view, plain


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_top_level_functions_read_negative_views_with_their_sign(dtype):
    q, q_plain = negative_view(2, 3, 4, 8, dtype=dtype)
    k, k_plain = negative_view(2, 3, 6, 8, dtype=dtype)
    v, v_plain = negative_view(2, 3, 6, 5, dtype=dtype)
    mask, mask_plain = negative_view(4, 6)
    expected = attn.scaled_dot_product_attention(q_plain, k_plain, v_plain, mask_plain)
    assert not torch.equal(expected, attn.scaled_dot_product_attention(
        q_plain.neg(), k_plain, v_plain, mask_plain)), "the sign of the query matters here"
    got = attn.scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(got, expected)
    reference = F.scaled_dot_product_attention(q_plain.float(), k_plain.float(), v_plain.float(),
                                               mask_plain)
    assert torch.allclose(got.float(), reference, rtol=1e-2 if dtype != torch.float32 else 1e-5,
                          atol=1e-2 if dtype != torch.float32 else 1e-5)
    scores, scores_plain = negative_view(2, 4, 6)
    softmax = attn.masked_softmax(scores, torch.tensor([3, 6]))
    assert torch.equal(softmax, attn.masked_softmax(scores_plain, torch.tensor([3, 6])))
    assert_close(softmax[1], torch.softmax(scores_plain[1], dim=-1), "masked_softmax")


def test_the_layers_read_negative_views_with_their_sign():
    layer = attn.MultiHeadAttention(8, 8, 8, 8, 2, 0.0)
    x, x_plain = negative_view(2, 3, 8)
    assert torch.equal(layer(x, x, x), layer(x_plain, x_plain, x_plain))


# --- torch tensors that require grad, refused by the functions outside autograd -------------------


def test_top_level_functions_refuse_tensors_that_record_autograd():
    # Their result never requires grad: a tensor that does, in grad mode, would lose its gradient
    # without a word (as tensor.numpy() refuses it, attn refuses it, naming it and
    # attn.torch's function).
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 5)
    expected = attn.scaled_dot_product_attention(q, k, v)
    for name in ("query", "key", "value"):
        inputs = {"query": q, "key": k, "value": v}
        inputs[name] = inputs[name].clone().requires_grad_(True)
        with pytest.raises(ValueError, match=rf"^{name}: expected a tensor that does not require "
                                             r"grad .*attn.torch.scaled_dot_product_attention"):
            attn.scaled_dot_product_attention(**inputs)
        with torch.no_grad():
            assert torch.equal(attn.scaled_dot_product_attention(**inputs), expected)
        detached = {key: value.detach() for key, value in inputs.items()}
        assert torch.equal(attn.scaled_dot_product_attention(**detached), expected)
    for name, extra in (("attn_mask", torch.zeros(4, 6)), ("sinks", torch.zeros(3)),
                        ("alibi_slopes", torch.zeros(3))):
        with pytest.raises(ValueError, match=rf"^{name}: expected a tensor that does not require"):
            attn.scaled_dot_product_attention(q, k, v, **{name: extra.requires_grad_(True)})
    attn_torch_output = attn_torch.scaled_dot_product_attention(q.requires_grad_(True), k, v)
    assert attn_torch_output.requires_grad and torch.equal(attn_torch_output.detach(), expected)
    scores = torch.randn(2, 4, 6, requires_grad=True)
    with pytest.raises(ValueError, match=r"^X: expected a tensor that does not require grad"):
        attn.masked_softmax(scores)
    with torch.inference_mode():
        assert torch.equal(attn.masked_softmax(scores), attn.masked_softmax(scores.detach()))
    weights = [torch.randn(7, 8), torch.randn(7, 8), torch.randn(1, 7, requires_grad=True)]
    with pytest.raises(ValueError, match=r"^w_v: .*attn.torch.AdditiveAttention"):
        attn.additive_attention(torch.randn(2, 4, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 5),
                                *weights)
    with pytest.raises(ValueError, match=r"^keys: .*attn.torch.GaussianKernelPooling"):
        attn.gaussian_kernel_pooling(torch.randn(2, 4, 2), torch.randn(2, 6, 2, requires_grad=True),
                                     torch.randn(2, 6, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", sorted(MODULE_PAIRS))
def test_a_grad_output_that_is_not_finite_gives_the_books_gradients(kind, dtype):
    # A GradScaler's overflow reaches the attention as ∞ in grad_output: the book's modules carry
    # it into gradients that are not finite (the scaler then skips the step), where attn's layer
    # refused it. attn's gradients must be not finite at exactly the book's entries (attn's own
    # write NaN where the book has ±∞ or NaN) and equal to the book's elsewhere. float32 runs attn's
    # layers, float64 its composition of PyTorch's linear and attn's function where it has one.
    make_reference, make_module, (query_size, key_size, value_size) = MODULE_PAIRS[kind]
    reference, module = make_reference(), make_module()
    module.load_state_dict(reference.state_dict())
    reference.to(dtype)
    module.to(dtype)
    inputs = [torch.randn(3, 4, query_size), torch.randn(3, 6, key_size),
              torch.randn(3, 6, value_size)]
    results = []
    for attention in (reference, module):
        q, k, v = (x.to(dtype).requires_grad_(True) for x in inputs)
        output = attention(q, k, v, torch.tensor([2, 6, 3]))
        grad_output = torch.randn(output.shape, generator=torch.Generator().manual_seed(5))
        grad_output[1, 2, 0] = float("inf")
        grad_output[2, 0, 1] = float("nan")
        output.backward(grad_output.to(dtype))
        grads = {name: p.grad for name, p in attention.named_parameters()}
        results.append({"queries": q.grad, "keys": k.grad, "values": v.grad, **grads})
    assert sorted(results[0]) == sorted(results[1])
    for name, expected in results[0].items():
        actual = results[1][name]
        reached = ~expected.isfinite()
        assert torch.equal(~actual.isfinite(), reached), name
        assert reached.any(), name
        if not reached.all():
            assert_close(actual[~reached].float(), expected[~reached].float(), name)


@pytest.mark.parametrize("options", [{}, {"bias": False}, {"kdim": 24, "vdim": 40}])
def test_multi_head_attention_from_torchs_layer_computes_its_output(options):
    # PyTorch's nn.MultiheadAttention keeps W_q, W_k, W_v in one in_proj_weight (or q_, k_,
    # v_proj_weight where kdim or vdim differ) and W_o as out_proj: from_torch maps them, so a
    # model's trained layer runs on attn; padding masks are valid lengths, a causal mask causal.
    torch.manual_seed(0)
    layer = torch.nn.MultiheadAttention(32, 4, batch_first=True, **options).eval()
    module = attn.torch.MultiHeadAttention.from_torch(layer)
    queries = torch.randn(2, 7, 32)
    keys = torch.randn(2, 9, options.get("kdim", 32))
    values = torch.randn(2, 9, options.get("vdim", 32))
    expected, _ = layer(queries, keys, values, need_weights=False)
    torch.testing.assert_close(module(queries, keys, values), expected, rtol=1e-5, atol=1e-6)
    padding = torch.arange(9)[None, :] >= torch.tensor([5, 9])[:, None]
    expected, _ = layer(queries, keys, values, key_padding_mask=padding, need_weights=False)
    torch.testing.assert_close(module(queries, keys, values, torch.tensor([5, 9])), expected,
                               rtol=1e-5, atol=1e-6)
    # Gradients reach the inputs as through PyTorch's layer.
    x = torch.randn(2, 9, 32, requires_grad=True)
    if "kdim" not in options:
        causal_mask = torch.nn.Transformer.generate_square_subsequent_mask(9)
        expected, _ = layer(x, x, x, attn_mask=causal_mask, is_causal=True, need_weights=False)
        (expected_grad,) = torch.autograd.grad(expected.pow(2).sum(), x)
        output = module(x, x, x, causal=True)
        torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-6)
        (grad,) = torch.autograd.grad(output.pow(2).sum(), x)
        torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)


def test_multi_head_attention_from_torch_refuses_what_the_books_layer_lacks():
    with pytest.raises(ValueError, match="add_bias_kv"):
        attn.torch.MultiHeadAttention.from_torch(
            torch.nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(TypeError, match="expected a torch.nn.MultiheadAttention, got Linear"):
        attn.torch.MultiHeadAttention.from_torch(torch.nn.Linear(2, 2))
    double = torch.nn.MultiheadAttention(16, 2, batch_first=True).double().eval()
    module = attn.torch.MultiHeadAttention.from_torch(double)
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    assert module(x, x, x).dtype == torch.float64


def test_modules_hold_their_parameters_as_the_books_do():
    # The book's modules hold nn.Linear projections in their constructor's order. attn's held bare
    # modules in sorted order: an optimizer's state resumed by position from a book model moved
    # each matrix's moments onto another (Adam: 0.09-0.14 off after one step, no error), and the book's
    # init_seq2seq (`type(m) == nn.Linear`) left them at PyTorch's default.
    torch.manual_seed(3)
    pairs = [
        (book.MultiHeadAttention(5, 6, 7, 8, 2, 0.0, bias=True),
         attn.torch.MultiHeadAttention(5, 6, 7, 8, 2, 0.0, bias=True)),
        (book.AdditiveAttention(5, 6, 8, 0.0), attn.torch.AdditiveAttention(5, 6, 8, 0.0)),
    ]
    queries, keys, values = torch.randn(2, 3, 6), torch.randn(2, 4, 5), torch.randn(2, 4, 7)
    for theirs, mine in pairs:
        theirs_names = [name for name, _ in theirs.named_parameters()]
        assert [name for name, _ in mine.named_parameters()] == theirs_names
        for name, module in theirs.named_children():
            if type(module) is torch.nn.Linear:
                assert type(getattr(mine, name)) is torch.nn.Linear, name
        # The book's Xavier initialisation reaches attn's projections alike (the biases copied).
        mine.load_state_dict(theirs.state_dict())
        for model in (theirs, mine):
            torch.manual_seed(11)
            model.apply(lambda m: type(m) is torch.nn.Linear and torch.nn.init.xavier_uniform_(m.weight))
        for (name, mine_p), (_, theirs_p) in zip(mine.named_parameters(), theirs.named_parameters()):
            torch.testing.assert_close(mine_p, theirs_p, rtol=0, atol=0, msg=name)
        torch.testing.assert_close(mine(queries, keys, values), theirs(queries, keys, values),
                                   rtol=1e-5, atol=1e-6)
        # An optimizer's state saved from one and loaded into the other by position (momentum:
        # an update linear in the gradients, which Adam's first steps are not).
        for model in (theirs, mine):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            model(queries, keys, values).pow(2).sum().backward()
            optimizer.step()
            model.saved = optimizer.state_dict()
        resumed = torch.optim.SGD(mine.parameters(), lr=0.1, momentum=0.9)
        resumed.load_state_dict(copy.deepcopy(theirs.saved))  # (buffers of its own)
        for model, optimizer in ((theirs, None), (mine, resumed)):
            if optimizer is None:
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
                optimizer.load_state_dict(copy.deepcopy(model.saved))
            model.zero_grad()
            model(queries, keys, values).pow(2).sum().backward()
            optimizer.step()
        for (name, mine_p), (_, theirs_p) in zip(mine.named_parameters(), theirs.named_parameters()):
            torch.testing.assert_close(mine_p, theirs_p, rtol=1e-4, atol=1e-5, msg=name)


def test_multi_head_attention_keeps_its_weights_where_the_book_does():
    # The book's Transformer reads blk.attention.attention.attention_weights.
    module = attn.torch.MultiHeadAttention(5, 6, 7, 8, 2)
    module(torch.randn(2, 3, 6), torch.randn(2, 4, 5), torch.randn(2, 4, 7))
    assert module.attention.attention_weights is module.attention_weights
    assert module.attention_weights.shape == (4, 3, 4)
    copied = pickle.loads(pickle.dumps(module))
    torch.testing.assert_close(copied.attention.attention_weights, module.attention_weights)


@pytest.mark.parametrize("kind", ["dot", "additive"])
def test_a_failed_call_leaves_the_last_calls_weights(kind):
    # A call that raised wiped the weights of the call before, which the book's modules keep.
    module = (attn.torch.DotProductAttention() if kind == "dot"
              else attn.torch.AdditiveAttention(4, 4, 6))
    module(torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6))
    with pytest.raises(attn.ShapeError):
        module(torch.randn(2, 3, 4), torch.randn(2, 5, 3), torch.randn(2, 5, 6))
    assert module.attention_weights is not None and module.attention_weights.shape == (2, 3, 5)
    torch.testing.assert_close(module.attention_weights.sum(-1), torch.ones(2, 3))
