"""attn.torch's modules under PyTorch's threads and transforms: several threads differentiating one
graph, or calling one module, get the one-thread results; forward-mode AD and batched gradients
are refused by name; torch.func reaches the composed modules' parameters; a module with dropout 0
draws no random numbers. Each wrong result here was silent before its fix."""

import sys
import threading
import time

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the threads and transforms tests need it"
)
import torch.autograd.forward_ad as fwAD  # noqa: E402

import attn.torch as attn_torch  # noqa: E402


def _relative(actual, expected):
    return ((actual.double() - expected.double()).abs().max() / expected.double().abs().max()).item()


def test_threads_differentiating_one_graph_get_the_one_thread_gradients():
    # torch.autograd.grad(..., retain_graph=True) from 4 threads on one graph through a module's
    # layer: each thread ran zero_grad, backward and grads on the same layer and read the others'
    # parameter gradients (relative error up to 3.4; 377 of 800 results wrong).
    torch.manual_seed(0)
    module = attn_torch.AdditiveAttention(16, 16, 24, 0.0)
    x = torch.randn(2, 9, 16, requires_grad=True)
    kv = torch.randn(2, 11, 16, requires_grad=True)
    out = module(x, kv, kv)
    leaves = [x, kv, *module.parameters()]
    grad_outputs = [torch.randn_like(out) for _ in range(4)]
    alone = [torch.autograd.grad(out, leaves, g, retain_graph=True) for g in grad_outputs]
    worst = [0.0]

    def worker(i):
        for _ in range(40):
            got = torch.autograd.grad(out, leaves, grad_outputs[i], retain_graph=True)
            worst[0] = max(worst[0], max(_relative(a, b) for a, b in zip(got, alone[i])))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # The same layer, the same inputs: the same sums in the same order.
    assert worst[0] == 0.0


def _claim_line():
    """The line of _call_layer that claims a spare layer found free."""
    lines, first = __import__("inspect").getsourcelines(attn_torch._AttnModule._call_layer)
    for offset, line in enumerate(lines):
        if "spare[1] = _weakref.ref(lease)" in line:
            return first + offset
    raise AssertionError("the claim's line is gone")


def test_two_threads_calling_one_module_each_get_their_own_layer():
    # Two threads found the same spare layer free and both claimed it (the test and the claim
    # were two steps): one call's backward then read the other's forward (gradients 1.2 off).
    # A 50 ms pause at the claim stands for an unlucky thread switch there.
    torch.manual_seed(0)
    module = attn_torch.AdditiveAttention(16, 16, 24, 0.0)
    inputs = [(torch.randn(2, 9, 16), torch.randn(2, 11, 16), torch.randn(2, 11, 16))
              for _ in range(2)]

    def run(i):
        q, k, v = [t.clone().requires_grad_() for t in inputs[i]]
        out = module(q, k, v)
        return [out.detach(), *torch.autograd.grad(out.pow(2).sum(), [q, k, v])]

    expected = [run(i) for i in range(2)]  # leaves a spare layer whose lease is free
    claim = _claim_line()

    def tracer(frame, event, arg):
        if frame.f_code.co_name != "_call_layer":
            return None

        def local(frame, event, arg):
            if event == "line" and frame.f_lineno == claim:
                time.sleep(0.05)
            return local
        return local

    results = [None, None]
    barrier = threading.Barrier(2)

    def worker(i):
        sys.settrace(tracer)
        barrier.wait()
        q, k, v = [t.clone().requires_grad_() for t in inputs[i]]
        out = module(q, k, v)
        sys.settrace(None)
        barrier.wait()  # both forward passes before either backward
        results[i] = [out.detach(), *torch.autograd.grad(out.pow(2).sum(), [q, k, v])]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for got, wanted in zip(results, expected):
        for a, b in zip(got, wanted):
            assert torch.equal(a, b)


def test_forward_mode_ad_is_refused_by_name():
    # Inputs that needed no grad took the direct call, which returned the output with the
    # tangent dropped (silently zero); PyTorch's own function raises NotImplementedError.
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    with fwAD.dual_level():
        dual = fwAD.make_dual(q, torch.randn_like(q))
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            attn_torch.scaled_dot_product_attention(dual, k, v, is_causal=True)
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            attn_torch.scaled_dot_product_attention(dual, k, v, window=(2, 0))
        with attn_torch.override_sdpa(), pytest.raises(NotImplementedError, match="forward-mode"):
            torch.nn.functional.scaled_dot_product_attention(dual, k, v)
        # Outside the tangents, the same call computes.
        plain = attn_torch.scaled_dot_product_attention(q, k, v)
    assert torch.equal(plain, attn_torch.scaled_dot_product_attention(q, k, v))
    # torch.func's forward mode, jacfwd and hessian (jacfwd of jacrev), gets the same words
    # (hessian got PyTorch's generic "implement the jvp function" for custom Functions).
    def attend(q):
        return attn_torch.scaled_dot_product_attention(q, k, v)

    for transform in (torch.func.jacfwd(attend), torch.func.hessian(lambda q: attend(q).sum())):
        with pytest.raises(NotImplementedError, match="forward-mode AD .* is not supported"):
            transform(q)


@pytest.mark.parametrize("kind", ["plain", "window", "module"])
def test_batched_gradients_are_refused_by_name(kind):
    # is_grads_batched=True handed the backward a batched tensor, refused as "expected a NumPy
    # array or a tensor supporting DLPack, got torch.Tensor".
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    if kind == "module":
        layer = attn_torch.MultiHeadAttention(8, 8, 8, 8, 2)
        x = torch.randn(2, 5, 8, requires_grad=True)
        out, leaf = layer(x, x, x), x
    else:
        out = attn_torch.scaled_dot_product_attention(
            q, k, v, window=(2, 0) if kind == "window" else None)
        leaf = q
    grads = torch.randn(3, *out.shape)
    with pytest.raises(NotImplementedError, match="batched gradients"):
        torch.autograd.grad(out, leaf, grads, is_grads_batched=True)


def test_torch_func_reaches_a_composed_modules_parameters():
    # functional_call with plain tensors in the parameters' places: get_parameter refused them
    # ("`weight` is not an nn.Parameter"), and func.grad failed converting a wrapped tensor.
    torch.manual_seed(0)
    module = attn_torch.MultiHeadAttention(8, 8, 8, 16, 2, 0.0)
    x = torch.randn(2, 5, 8)
    parameters = {name: p.detach().clone() for name, p in module.named_parameters()}

    def loss(parameters):
        return torch.func.functional_call(module, parameters, (x, x, x)).pow(2).sum()

    gradients = torch.func.grad(loss)(parameters)
    module.zero_grad()
    module(x, x, x).pow(2).sum().backward()
    for name, p in module.named_parameters():
        assert _relative(gradients[name], p.grad) < 1e-5, name


def test_a_module_without_dropout_draws_no_random_numbers():
    # A training-mode module with dropout 0 drew a seed from torch's generator on every call,
    # so the book's model, whose F.dropout(p=0) draws nothing, drew different numbers after it.
    module = attn_torch.AdditiveAttention(8, 8, 16, 0.0).train()
    x = torch.randn(2, 3, 8)
    torch.manual_seed(5)
    module(x, x, x)
    after = torch.rand(1)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(1))
