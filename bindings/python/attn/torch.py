"""attn's layers as ``torch.nn.Module``s, trainable inside a PyTorch model.

Each module keeps its parameters as ``nn.Parameter``s under the book's state-dict names
(``W_q.weight``, ...), so ``load_state_dict`` takes the book's PyTorch modules' state dicts and
optimizers see them as usual. On every call the parameters are copied into a fresh attn layer,
which runs the forward pass (no GIL, no autograd graph of its own); a
``torch.autograd.Function`` hands ``grad_output`` to the layer's ``backward`` and returns the
input and parameter gradients to autograd. Dropout in training mode draws its seed from
PyTorch's generator, so ``torch.manual_seed`` makes a run reproducible.

CPU tensors only (attn runs on the CPU); float32 inputs are read without a copy. Second-order
gradients are not supported.
"""

import copy as _copy

import torch
from torch import nn

import attn as _attn

__all__ = [
    "AdditiveAttention",
    "DotProductAttention",
    "GaussianKernelPooling",
    "MultiHeadAttention",
    "scaled_dot_product_attention",
]

# Seeds for attn's dropout are drawn below this bound from PyTorch's generator.
_SEED_BOUND = 2**62


class _LayerFunction(torch.autograd.Function):
    """forward: ``layer(queries, keys, values, valid_lens)``; backward: ``layer.backward`` for
    the inputs and ``layer.grads()`` for the parameters (passed after the inputs, in
    ``parameter_names`` order, so that autograd routes their gradients)."""

    @staticmethod
    def forward(
        ctx, layer, parameter_names, valid_lens, causal, queries, keys, values, *parameters
    ):
        ctx.layer = layer
        ctx.parameter_names = parameter_names
        ctx.input_dtypes = (queries.dtype, keys.dtype, values.dtype)
        ctx.parameter_dtypes = [parameter.dtype for parameter in parameters]
        return layer(queries, keys, values, valid_lens, causal=causal)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        layer = ctx.layer
        layer.zero_grad()
        gradients = layer.backward(grad_output.contiguous())
        input_grads = [
            gradients[name].to(dtype)
            for name, dtype in zip(("queries", "keys", "values"), ctx.input_dtypes)
        ]
        parameter_grads = layer.grads()
        parameter_grads = [
            torch.from_numpy(parameter_grads[name]).to(dtype)
            for name, dtype in zip(ctx.parameter_names, ctx.parameter_dtypes)
        ]
        ctx.layer = None  # the layer holds copies of the inputs: free them with the graph
        return (None, None, None, None, *input_grads, *parameter_grads)


def _register_parameter(module, name, value):
    """Registers ``value`` under a dotted state-dict name, making the submodules on the way
    (``W_q.weight`` → submodule ``W_q``, parameter ``weight``)."""
    *path, leaf = name.split(".")
    owner = module
    for part in path:
        if not hasattr(owner, part):
            owner.add_module(part, nn.Module())
        owner = getattr(owner, part)
    owner.register_parameter(leaf, nn.Parameter(value))


class _AttnModule(nn.Module):
    """Shared by the modules: parameters from an attn layer, forward through _LayerFunction."""

    def __init__(self, layer):
        super().__init__()
        # Never run: a template holding the hyper-parameters, copied on each call.
        self._template = layer
        state = layer.state_dict()
        self._parameter_names = list(state)
        for name, value in state.items():
            _register_parameter(self, name, torch.from_numpy(value))
        self.attention_weights = None

    def to_attn(self):
        """An attn layer (``attn.AdditiveAttention``, ...) holding this module's current
        parameters, in the same training/evaluation mode."""
        layer = _copy.copy(self._template)
        if self._parameter_names:
            layer.load_state_dict(
                {name: self.get_parameter(name).detach() for name in self._parameter_names}
            )
        return layer.train(self.training)

    def forward(self, queries, keys, values, valid_lens=None, *, causal=False):
        """queries (B, n, ·), keys (B, m, ·), values (B, m, ·) → (B, n, ·); valid_lens None, (B,)
        or (B, n) integers; causal=True hides keys j > i + m − n from query i."""
        layer = self.to_attn()
        if self.training:
            layer.seed_dropout(int(torch.randint(0, _SEED_BOUND, (1,)).item()))
        parameters = [self.get_parameter(name) for name in self._parameter_names]
        output = _LayerFunction.apply(
            layer, self._parameter_names, valid_lens, causal, queries, keys, values, *parameters
        )
        self.attention_weights = layer.attention_weights
        return output

    def extra_repr(self):
        return repr(self._template).split("(", 1)[1][:-1]


class AdditiveAttention(_AttnModule):
    """The book's AdditiveAttention, computed by attn: parameters ``W_q.weight``,
    ``W_k.weight``, ``w_v.weight``."""

    def __init__(self, key_size, query_size, num_hiddens, dropout=0.0, *, seed=0):
        super().__init__(
            _attn.AdditiveAttention(key_size, query_size, num_hiddens, dropout, seed=seed)
        )


class DotProductAttention(_AttnModule):
    """The book's DotProductAttention, computed by attn (no parameters)."""

    def __init__(self, dropout=0.0, *, scale=None, seed=0):
        super().__init__(_attn.DotProductAttention(dropout, scale=scale, seed=seed))


class MultiHeadAttention(_AttnModule):
    """The book's MultiHeadAttention, computed by attn: parameters ``W_q``, ``W_k``, ``W_v``,
    ``W_o`` ``.weight`` (and ``.bias`` with bias=True). ``attention_weights`` after a call are
    the inner attention's, (B·num_heads, n, m)."""

    def __init__(
        self,
        key_size,
        query_size,
        value_size,
        num_hiddens,
        num_heads,
        dropout=0.0,
        bias=False,
        *,
        seed=0,
    ):
        super().__init__(
            _attn.MultiHeadAttention(
                key_size, query_size, value_size, num_hiddens, num_heads, dropout, bias, seed=seed
            )
        )


class GaussianKernelPooling(_AttnModule):
    """Nadaraya–Watson Gaussian-kernel pooling, computed by attn: the width is the parameter
    ``w`` of shape (1,), learnable as in the book's NWKernelRegression."""

    def __init__(self, width=1.0, dropout=0.0, *, seed=0):
        super().__init__(_attn.GaussianKernelPooling(width, dropout, seed=seed))


def scaled_dot_product_attention(queries, keys, values, valid_lens=None, causal=False, scale=None):
    """softmax(Q Kᵀ · scale) V with autograd, computed by attn: queries (B, n, d), keys (B, m, d),
    values (B, m, v) → (B, n, v); scale defaults to 1/√d."""
    layer = _attn.DotProductAttention(0.0, scale=scale).eval()
    return _LayerFunction.apply(layer, [], valid_lens, causal, queries, keys, values)
