"""attn's layers as ``torch.nn.Module``s, trainable inside a PyTorch model, and
``scaled_dot_product_attention`` as PyTorch custom operators.

Each module keeps its parameters as ``nn.Parameter``s under the book's state-dict names
(``W_q.weight``, ...), so ``load_state_dict`` takes the book's PyTorch modules' state dicts and
optimizers see them as usual. On every call the parameters are copied into a fresh attn layer,
which runs the forward pass (no GIL, no autograd graph of its own); a
``torch.autograd.Function`` hands ``grad_output`` to the layer's ``backward`` and returns the
input and parameter gradients to autograd. Dropout in training mode draws its seed from
PyTorch's generator, so ``torch.manual_seed`` makes a run reproducible.

``scaled_dot_product_attention`` replaces ``torch.nn.functional.scaled_dot_product_attention``
(with attn's windows, ALiBi, soft-capping, sinks and valid lengths besides): the operators
``attn::sdpa`` and ``attn::sdpa_backward`` (``torch.ops.attn``) have fake implementations and
autograd kernels, so ``torch.compile(fullgraph=True)`` traces through them; eager calls skip
their dispatch (see the function).

CPU tensors only (attn runs on the CPU); float32 inputs are read without a copy, and so are
``scaled_dot_product_attention``'s float16 and bfloat16 ones, which attn's half kernels compute.
Second-order gradients are not supported.

Threads: these calls use ``torch.get_num_threads()`` threads, as PyTorch's own operators, so
``torch.set_num_threads`` (and a DataLoader worker's single thread) governs them too; once
``attn.set_num_threads`` has been called, its count holds instead.
"""

import copy as _copy
import math as _math
import numbers as _numbers
from operator import index as _operator_index
import threading as _threading
import warnings
import weakref as _weakref
from typing import Optional

import numpy as _np
import torch
from torch import nn
from torch import _check_value
from torch.autograd import forward_ad as _forward_ad
from torch.utils import flop_counter as _flop_counter

import attn as _attn
from attn import _attn as _extension

_torch_threads = torch.get_num_threads
_follow_num_threads = _extension._follow_num_threads
# The thread count last handed to _follow_num_threads (0: none yet).
_followed_threads = [0]


def _follow_torch_threads():
    """attn's kernels take PyTorch's intra-op thread count, as PyTorch's operators do, unless
    attn.set_num_threads chose one (the extension ignores the count then). Called where attn.torch
    enters the extension; ~0.1 µs where the count is unchanged. Callers on hot paths test
    ``_torch_threads() != _followed_threads[0]`` first."""
    threads = _torch_threads()
    if threads != _followed_threads[0]:
        _follow_num_threads(min(threads, 1024))
        _followed_threads[0] = threads

__all__ = [
    "AdditiveAttention",
    "DotProductAttention",
    "GaussianKernelPooling",
    "GeneralAttention",
    "MultiHeadAttention",
    "override_sdpa",
    "scaled_dot_product_attention",
]

# Seeds for attn's dropout are drawn below this bound from PyTorch's generator.
_SEED_BOUND = 2**62


# The error of a second derivative through any of attn's autograd Functions.
_NO_SECOND_DERIVATIVE = (
    "attn: double backward is not supported: {} has no second derivative (a gradient made with "
    "create_graph=True can't be differentiated again through attn)"
)


class _SecondDerivativeRefused(torch.autograd.Function):
    """The identity on a backward's gradients, its node linked to ``sources`` (the first-order
    call's inputs that require grad, on which the gradients depend), raising
    _NO_SECOND_DERIVATIVE when differentiated, as PyTorch's operators without a double backward
    raise. The links make ``torch.autograd.grad(gradient, query)`` reach the error too, where
    once_differentiable's DelayedError, linked to nothing, gets "appears to not have been used in
    the graph"."""

    @staticmethod
    def forward(ctx, name, count, *tensors):
        ctx.name = name
        return tensors[:count]

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(_NO_SECOND_DERIVATIVE.format(ctx.name))


def _first_order_only(name, sources):
    """Decorates a Function's backward: run as it is where the backward records no graph (grad
    mode off, create_graph=False: nearly every call, which pays one is_grad_enabled test); under
    create_graph=True run without recording, its gradients returned through
    _SecondDerivativeRefused, linked to ``sources(ctx)``. The true second derivative is not zero,
    so gradients returned detached would drop it without a word: that is what
    torch.autograd.function.once_differentiable did here, attaching its error only where a
    grad_output requires grad (not ``output.sum()``'s); its no_grad block also cost ~2 µs a
    training step, 4% of a (1, 8, 8, 64) step on one Zen 5 core."""

    def decorate(backward):
        def wrapper(ctx, *grads):
            if not torch.is_grad_enabled():
                return backward(ctx, *grads)
            linked = [t for t in sources(ctx) if t is not None and t.requires_grad]
            # Inputs already freed (weak references): a leaf of its own still gives the gradients
            # the refusing node, so differentiating them again raises rather than reads 0.
            if not linked:
                linked = [torch.zeros((), requires_grad=True)]
            with torch.no_grad():
                gradients = backward(ctx, *grads)
            single = not isinstance(gradients, tuple)
            gradients = (gradients,) if single else gradients
            refused = _SecondDerivativeRefused.apply(name, len(gradients), *gradients, *linked)
            return refused[0] if single else refused

        return wrapper

    return decorate


def _saved_tensors(ctx):
    return ctx.saved_tensors


class _Lease:
    """Held by a call's autograd graph (on its saved marker) until the graph frees its saved
    tensors; the module's weak reference to it says when the layer may serve another call."""

    __slots__ = ("__weakref__",)


# is_grads_batched hands a backward pass a legacy batched tensor (torch.func's vmap, whose batched
# tensors the operators' batching rules take, hands a functorch one).
_is_legacy_batched = getattr(torch._C._functorch, "is_legacy_batchedtensor", lambda tensor: False)

# Held while a module finds and claims a spare layer (_AttnModule._call_layer).
_SPARE_LAYERS_LOCK = _threading.Lock()


def _check_not_batched(grad_output, name):
    """NotImplementedError for a batched grad_output (torch.autograd.grad(...,
    is_grads_batched=True), jacobian(..., vectorize=True)): attn's backward takes one gradient at
    a time, and the batched tensor failed its conversion with a TypeError naming its type."""
    if _is_legacy_batched(grad_output):
        raise NotImplementedError(
            f"{name}: batched gradients (is_grads_batched=True, or jacobian/hessian with "
            "vectorize=True) are not supported by its backward pass; compute them one at a time "
            "(is_grads_batched=False, vectorize=False)"
        )


class _LayerFunction(torch.autograd.Function):
    """forward: ``layer(queries, keys, values, valid_lens)``; backward: ``layer.backward`` for
    the inputs and ``layer.grads()`` for the parameters (passed after the inputs, in
    ``parameter_names`` order, so that autograd routes their gradients).

    The layer and its lease ride on an empty tensor saved for backward: autograd frees saved
    tensors after a backward pass unless the graph is retained, and with the graph otherwise, so
    the layer is held exactly as long as a backward pass may still need it (``retain_graph=True``
    and gradcheck run it again; a second pass without it gets PyTorch's own "backward through the
    graph a second time" error), then serves later calls."""

    @staticmethod
    def forward(
        ctx, layer, lease, lock, parameter_names, valid_lens, causal, queries, keys, values,
        *parameters
    ):
        marker = torch.empty(0)
        marker._attn_layer = layer
        marker._attn_lease = lease
        marker._attn_lock = lock
        ctx.save_for_backward(marker)
        ctx.parameter_names = parameter_names
        # What the gradients depend on, for a second derivative's refusal (_first_order_only):
        # weak references, so that the graph keeps no activation alive that nothing else needs (a
        # freed input is one nobody can differentiate with respect to).
        ctx.inputs = tuple(_weakref.ref(tensor) for tensor in (queries, keys, values, *parameters))
        ctx.input_dtypes = (queries.dtype, keys.dtype, values.dtype)
        ctx.parameter_dtypes = [parameter.dtype for parameter in parameters]
        _follow_torch_threads()
        output = layer(queries, keys, values, valid_lens, causal=causal)
        # Read only for a grad_output that is not finite (_layer_gradients_reached); a copy, as
        # the caller may reuse its buffer before the backward pass.
        ctx.valid_lens = None if valid_lens is None else torch.as_tensor(valid_lens).clone()
        return output

    @staticmethod
    @_first_order_only(
        "the attn layer of attn.torch's module", lambda ctx: [ref() for ref in ctx.inputs]
    )
    def backward(ctx, grad_output):
        (marker,) = ctx.saved_tensors
        # One backward pass at a time per layer: threads that take gradients of one graph at once
        # (retain_graph=True) each ran zero_grad, backward and grads on the same layer, and read
        # each other's parameter gradients (3.3 relative error, no error raised).
        with marker._attn_lock:
            return _LayerFunction._backward(ctx, marker._attn_layer, grad_output)

    @staticmethod
    def _backward(ctx, layer, grad_output):
        _check_not_batched(grad_output, "the attn layer of attn.torch's module")
        layer.zero_grad()
        _follow_torch_threads()
        grad_output = grad_output.contiguous()
        try:
            bad = None
            gradients = layer.backward(grad_output)
        except ValueError as error:
            if not str(error).startswith(_GRAD_OUTPUT_NOT_FINITE):
                raise
            # A grad_output that is not finite (a GradScaler's overflow): the book's modules
            # give gradients that are not finite, which the scaler counts on; as _carrying_non_finite.
            bad = grad_output.isfinite().logical_not_()
            layer.zero_grad()
            gradients = layer.backward(grad_output.masked_fill(bad, 0))
        input_grads = [
            gradients[name].to(dtype)
            for name, dtype in zip(("queries", "keys", "values"), ctx.input_dtypes)
        ]
        parameter_grads = layer.grads()
        parameter_grads = [
            torch.from_numpy(parameter_grads[name]).to(dtype)
            for name, dtype in zip(ctx.parameter_names, ctx.parameter_dtypes)
        ]
        if bad is not None:
            input_grads, parameter_grads = _layer_gradients_reached(
                bad, ctx.valid_lens, input_grads, ctx.parameter_names, parameter_grads)
        return (None, None, None, None, None, None, *input_grads, *parameter_grads)


def _layer_gradients_reached(bad, valid_lens, input_grads, parameter_names, parameter_grads):
    """The gradients of an attn.torch module's inputs and parameters with NaN where the book's
    module would carry ∞ or NaN from the elements ``bad`` of its grad_output (B, n, v): as in
    _carrying_non_finite, the rows of dQ, the keys of the batch entry within those rows' valid
    lengths and, where the values enter
    the output unmixed, dV's columns; under MultiHeadAttention's W_o every column of the
    attention's output row, so all of dV's entry, and W_o's gradient at the output's columns.
    Every other parameter takes a sum over the rows reached: all of it."""
    nan = float("nan")
    rows = bad.any(-1)  # (B, n)
    entries = rows.any(-1)[:, None, None]  # (B, 1, 1)
    columns = bad.any(-2).unsqueeze(-2)  # (B, 1, v)
    output_columns = bad.flatten(0, -2).any(0)  # (v,)
    mixed = "W_o.weight" in parameter_names
    d_queries, d_keys, d_values = input_grads
    if valid_lens is not None:
        valid_lens = torch.as_tensor(valid_lens)
    input_grads = [
        d_queries.masked_fill(rows.unsqueeze(-1), nan),
        d_keys.masked_fill(_keys_reached(rows, valid_lens, d_keys.shape[-2]).unsqueeze(-1), nan),
        d_values.masked_fill(entries if mixed else columns, nan),
    ]
    reached = {
        "W_o.weight": output_columns.unsqueeze(-1),  # (v, hidden): row c feeds output column c
        "W_o.bias": output_columns,
    }
    parameter_grads = [
        grad.masked_fill(reached.get(name, rows.any()), nan)
        for name, grad in zip(parameter_names, parameter_grads)
    ]
    return input_grads, parameter_grads


def _register_parameters(module, state, book_order):
    """Registers the layer's ``state`` (dotted names → tensors) on ``module``: a projection's
    ``weight`` (out, in) and ``bias`` as an ``nn.Linear`` submodule, as the book's modules hold
    them (its initialisers test ``type(m) == nn.Linear``: xavier_uniform_ had skipped attn's),
    anything else as a parameter under its name. Submodules and parameters come in the book's
    order (``book_order``: the submodules' names as its constructor makes them), which
    ``named_parameters()`` follows and an optimizer's state, saved by position, relies on (the
    layer's own names are sorted: a book model's Adam state resumed onto attn's
    MultiHeadAttention moved each matrix's moments to another, without an error)."""
    rank = {prefix: index for index, prefix in enumerate(book_order)}
    grouped = {}
    for name in sorted(state, key=lambda name: rank.get(name.split(".")[0], len(rank))):
        prefix, _, leaf = name.rpartition(".")
        grouped.setdefault(prefix, {})[leaf] = torch.from_numpy(state[name])
    for prefix, leaves in grouped.items():
        weight = leaves.get("weight")
        if prefix and "." not in prefix and set(leaves) <= {"weight", "bias"} and (
            weight is not None and weight.dim() == 2
        ):
            bias = leaves.get("bias")
            linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                               device="meta")
            linear.weight = nn.Parameter(weight)
            if bias is not None:
                linear.bias = nn.Parameter(bias)
            module.add_module(prefix, linear)
            continue
        for leaf, value in leaves.items():
            owner = module
            for part in prefix.split(".") if prefix else ():
                if not hasattr(owner, part):
                    owner.add_module(part, nn.Module())
                owner = getattr(owner, part)
            owner.register_parameter(leaf, nn.Parameter(value))


class _AttnModule(nn.Module):
    """Shared by the modules: parameters from an attn layer, forward through _LayerFunction."""

    # The book module's submodules in its constructor's order, where it differs from the sorted
    # names of attn's layer.
    _BOOK_ORDER = ()

    def __init__(self, layer):
        super().__init__()
        # Never run: a template holding the hyper-parameters, copied on each call.
        self._template = layer
        _register_parameters(self, layer.state_dict(), self._BOOK_ORDER)
        self._parameter_names = [name for name, _ in self.named_parameters()]
        # The last call's layer, until its weights are read (attention_weights), and the weights.
        self._weights_layer = None
        self._attention_weights = None
        # The dtype the last call's weights are read in (an autocast call's), None: as computed.
        self._weights_dtype = None
        # Layers of earlier calls, each [layer, weak reference to its call's _Lease], run again
        # once no autograd graph holds the lease (_call_layer).
        self._spare_layers = []

    @property
    def attention_weights(self):
        """The last call's attention weights, as the book's modules keep them; None before the
        first call. Computed on the first read after a call: the fused pass never forms them, and
        computing them at every call doubled a Bahdanau decoder step (B = 64, one query, 10 keys,
        256 hidden). Until then the module keeps the call's layer, with its copies of the inputs."""
        if self._weights_layer is not None:
            self._attention_weights = self._weights_layer.attention_weights
            if self._weights_dtype is not None and self._attention_weights is not None:
                self._attention_weights = self._attention_weights.to(self._weights_dtype)
            self._weights_layer = None
        return self._attention_weights

    def to_attn(self):
        """An attn layer (``attn.AdditiveAttention``, ...) holding this module's current
        parameters, in the same training/evaluation mode."""
        return self._load(_copy.copy(self._template), self._current_parameters())

    def _current_parameters(self):
        """The parameters in ``_parameter_names`` order (a call fetches them once)."""
        return [self._tensor(name) for name in self._parameter_names]

    def _tensor(self, name):
        """The parameter under a dotted name, or the plain tensor that stands in its place under
        ``torch.func.functional_call`` (get_parameter refused it: "`weight` is not an
        nn.Parameter")."""
        owner = self
        *path, leaf = name.split(".")
        for part in path:
            owner = getattr(owner, part)
        return getattr(owner, leaf)

    def _load(self, layer, parameters):
        """Copies ``parameters`` (``_current_parameters()``) into ``layer``, each once into the
        layer's own storage."""
        if self._parameter_names:
            # A float64 or half model's parameters in float32, the layer's type (.float() returns
            # a float32 parameter itself); their gradients go back in their own dtype.
            layer.load_state_dict(
                {name: p.detach().float() for name, p in zip(self._parameter_names, parameters)}
            )
        return layer.train(self.training)

    def forward(self, queries, keys, values, valid_lens=None, *, causal=False):
        """queries (B, n, ·), keys (B, m, ·), values (B, m, ·) → (B, n, ·); valid_lens None, (B,)
        or (B, n) integers; causal=True hides keys j > i + m − n from query i.

        Under ``torch.autocast("cpu")`` (float32, float16 or bfloat16 tensors) the output is in
        the autocast dtype, as the book's PyTorch modules give it: DotProductAttention,
        MultiHeadAttention and GeneralAttention then compute in that dtype as the book's code
        does under autocast (projections by PyTorch's linear, attention by attn's half kernels),
        the other modules in float32 with the output and the weights cast. Those three also
        compose PyTorch's linear with attn's function while torch.compile traces a float32 call,
        so that ``torch.compile(fullgraph=True)`` holds.

        Outside autocast, inputs all float64, float16 or bfloat16 (a model moved by ``.double()``,
        ``.half()`` or ``.bfloat16()``) give an output in their dtype, as the book's modules do:
        DotProductAttention, MultiHeadAttention and GeneralAttention compose PyTorch's linear in
        that dtype with attn's function (float64 attention computed in float32, as that function
        computes it), the other modules compute in float32 and cast."""
        if (
            _cpu_autocast()
            and all(
                isinstance(x, _Tensor) and x.dtype in _AUTOCAST_CAST_DTYPES
                for x in (queries, keys, values)
            )
        ):
            return self._forward_in(
                torch.get_autocast_dtype("cpu"), queries, keys, values, valid_lens, causal
            )
        if (
            isinstance(queries, _Tensor)
            and queries.dtype in _OTHER_FLOAT_DTYPES
            and all(isinstance(x, _Tensor) and x.dtype == queries.dtype for x in (keys, values))
        ):
            return self._forward_in(queries.dtype, queries, keys, values, valid_lens, causal)
        return self._layer_forward(queries, keys, values, valid_lens, causal)

    def _layer_forward(self, queries, keys, values, valid_lens, causal):
        """The call through attn's layer (_LayerFunction)."""
        if _under_transform():
            raise NotImplementedError(
                f"attn.torch.{type(self).__name__}: torch.func transforms (grad, vmap, jacrev, "
                "...) are not supported by its layer; DotProductAttention, MultiHeadAttention "
                "and GeneralAttention take them, and so does "
                "attn.torch.scaled_dot_product_attention"
            )
        parameters = self._current_parameters()
        layer, lease, lock = self._call_layer(parameters)
        # (Dropout of 0 draws nothing, as PyTorch's F.dropout does not: the book's model draws the
        # same random numbers after the call.)
        if self.training and getattr(self, "_dropout", 1.0) > 0:
            layer.seed_dropout(int(torch.randint(0, _SEED_BOUND, (1,)).item()))
        output = _LayerFunction.apply(
            layer, lease, lock, self._parameter_names, valid_lens, causal, queries, keys, values,
            *parameters
        )
        self._weights_layer, self._attention_weights, self._weights_dtype = layer, None, None
        return output

    # At most this many layers are kept for reuse: a decoder's steps in one graph each hold one.
    _MAX_SPARE_LAYERS = 16

    def _call_layer(self, parameters):
        """(layer, lease) for a call: an earlier call's layer whose lease no autograd graph holds
        (inference, or its backward has run), else a copy of the template, kept for later calls
        while there is room. A copy cost 0.3–1 ms at 256 hidden units (its parameters and
        buffers, fresh pages), more than a Bahdanau decoder step's attention; a reused layer
        keeps its buffers."""
        # The last call's layer, whose weights are still to be read, is not reused: a call that
        # fails leaves them as they were (they read None after one).
        pending = self._weights_layer
        lease = _Lease()
        # A spare is found free and claimed under one lock: two threads calling one module could
        # both find the same layer free between the test and the claim, and one call's backward
        # then read the other's forward (gradients 1.2 relative off, no error).
        with _SPARE_LAYERS_LOCK:
            for spare in self._spare_layers:
                if spare[1]() is None and spare[0] is not pending:
                    spare[1] = _weakref.ref(lease)
                    return self._load(spare[0], parameters), lease, spare[2]
            layer = self._load(_copy.copy(self._template), parameters)
            lock = _threading.Lock()  # the layer's backward passes, one at a time
            if len(self._spare_layers) < self._MAX_SPARE_LAYERS:
                self._spare_layers.append([layer, _weakref.ref(lease), lock])
        return layer, lease, lock

    def _forward_in(self, dtype, queries, keys, values, valid_lens, causal):
        """A call whose output is to be in `dtype` (autocast's, or a float64 or half model's):
        attn's float32 layer on the inputs in float32, the output (and its gradient's way back)
        and the weights in `dtype`."""
        output = self._layer_forward(
            queries.float(), keys.float(), values.float(), valid_lens, causal
        )
        self._weights_dtype = dtype  # the weights as the output
        return output.to(dtype)

    def _attend(self, queries, keys, values, valid_lens, causal, scale, callers=()):
        """The attention of the composed modules: queries (B, H, n, E), keys (B, H, m, E), values
        (B, H, m, Ev) projected → (B, H, n, Ev) by scaled_dot_product_attention (under autocast
        its cast, attn's half kernels), dropout in training mode; the weights (B·H, n, m) are
        computed from the same tensors when read. `callers` names those of queries and keys that
        are (views of) the caller's tensors, which the weights keep a copy of, as they keep one of
        valid_lens: a caller that reuses its buffers in place must not change the weights of a
        call made before (the book's modules keep the call's weights)."""
        if valid_lens is not None:
            valid_lens = torch.as_tensor(valid_lens).clone()
        # Cast here rather than inside the call, so that the weights come from what it computed.
        if _cpu_autocast():
            queries, keys, values = _autocast_inputs(queries, keys, values)
        dropout = self._dropout if self.training else 0.0
        output = scaled_dot_product_attention(
            queries, keys, values, dropout_p=dropout, scale=scale, valid_lens=valid_lens,
            causal=causal,
        )
        kept_queries, kept_keys = queries.detach(), keys.detach()
        if "queries" in callers:
            kept_queries = kept_queries.clone()
        if "keys" in callers:
            kept_keys = kept_keys.clone()
        self._weights_layer = _ComposedCallWeights(
            kept_queries, kept_keys, values.shape, valid_lens, causal, scale, output.dtype
        )
        self._attention_weights, self._weights_dtype = None, None
        return output

    def extra_repr(self):
        return repr(self._template).split("(", 1)[1][:-1]

    def __getstate__(self):
        """For pickle and torch.save: the module without attn's layer objects, which do not
        pickle; __setstate__ makes the template again from the constructor's arguments (the
        parameters are the module's own), and later calls make their layers from it."""
        state = self.__dict__.copy()
        state["_template"] = None
        state["_spare_layers"] = []
        state["_weights_layer"] = None
        state["_attention_weights"] = self.attention_weights  # computed now, if a call left some
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        arguments, keywords = self._arguments
        self._template = type(self)(*arguments, **keywords)._template
        for child in self.children():
            if isinstance(child, _InnerAttention):
                child._outer = _weakref.ref(self)


class _ComposedCallWeights:
    """A composed call's attention weights, computed on the first read by attn's function
    (need_weights) from the call's (projected) queries and keys, (B, H, n, m) as (B·H, n, m),
    and returned in the call's dtype, as the book's modules keep theirs under autocast."""

    def __init__(self, queries, keys, values_shape, valid_lens, causal, scale, dtype):
        self._call = (queries, keys, values_shape, valid_lens, causal, scale, dtype)

    @property
    def attention_weights(self):
        queries, keys, values_shape, valid_lens, causal, scale, dtype = self._call
        # The weights do not depend on the values: one column stands for them.
        values = keys.new_zeros((*values_shape[:-1], 1), dtype=torch.float32)
        _, weights = _attn.scaled_dot_product_attention(
            queries.float(), keys.float(), values, scale=scale, valid_lens=valid_lens,
            causal=causal, need_weights=True,
        )
        return torch.as_tensor(weights).flatten(0, 1).to(dtype)


def _check_layer_inputs(queries, keys, values, sizes):
    """The checks attn's layers make, for the modules that compose PyTorch's operators with
    attn's (_ComposedModule), with their messages: 3-d inputs of one batch, as many values as keys,
    and `sizes` {name: (last dimension, what it is)} (the dot product's keys: the queries')."""
    for name, x in (("queries", queries), ("keys", keys), ("values", values)):
        if x.dim() != 3:
            raise ValueError(f"{name}: expected a 3-d array, got shape {tuple(x.shape)}")
    for name, x in (("queries", queries), ("keys", keys), ("values", values)):
        if name in sizes and x.shape[2] != sizes[name][0]:
            size, what = sizes[name]
            raise _ShapeError(
                f"{name}: expected the last dimension to be {size} ({what}), got shape "
                f"{tuple(x.shape)}"
            )
    if "keys" not in sizes and keys.shape[2] != queries.shape[2]:
        raise _ShapeError(
            f"keys: expected dimension 2 to be {queries.shape[2]} (the size of each query), got "
            f"shape {tuple(keys.shape)}"
        )
    for name, x in (("keys", keys), ("values", values)):
        if x.shape[0] != queries.shape[0]:
            raise _ShapeError(
                f"{name}: expected dimension 0 to be {queries.shape[0]} (the batch size of "
                f"queries), got shape {tuple(x.shape)}"
            )
    if values.shape[1] != keys.shape[1]:
        raise _ShapeError(
            f"values: expected dimension 1 to be {keys.shape[1]} (the number of keys), got "
            f"shape {tuple(values.shape)}"
        )


class _ComposedModule(_AttnModule):
    """A book module whose forward is PyTorch's linear and attn's scaled_dot_product_attention,
    as the book composes it (_composed_forward): run so under torch.autocast("cpu") (in its
    dtype) and while torch.compile traces a float32 call, so that the graph holds PyTorch's and
    attn's operators only (attn's layer objects break it); an eager float32 call runs attn's
    layer, 6–30% faster than the composition (Zen 4)."""

    def forward(self, queries, keys, values, valid_lens=None, *, causal=False):
        # (Under a torch.func transform too — grad, vmap, functional_call's per-sample gradients —
        # which attn's layer objects cannot take: the composition's operators can.)
        if (
            (torch.compiler.is_compiling() or _under_transform())
            and not _cpu_autocast()
            and all(
                isinstance(x, _Tensor) and x.dtype == torch.float32
                for x in (queries, keys, values)
            )
        ):
            return self._composed_forward(queries, keys, values, valid_lens, causal)
        return super().forward(queries, keys, values, valid_lens, causal=causal)

    forward.__doc__ = _AttnModule.forward.__doc__

    def _forward_in(self, dtype, queries, keys, values, valid_lens, causal):
        # PyTorch's linear in the inputs' dtype (autocast's under autocast), attn's function.
        return self._composed_forward(queries, keys, values, valid_lens, causal)


class AdditiveAttention(_AttnModule):
    """The book's AdditiveAttention, computed by attn: parameters ``W_k.weight``,
    ``W_q.weight``, ``w_v.weight``, each an ``nn.Linear`` without bias as the book's."""

    _BOOK_ORDER = ("W_k", "W_q", "w_v")

    def __init__(self, key_size, query_size, num_hiddens, dropout=0.0, *, seed=0):
        super().__init__(
            _attn.AdditiveAttention(key_size, query_size, num_hiddens, dropout, seed=seed)
        )
        self._arguments = ((key_size, query_size, num_hiddens, dropout), {"seed": seed})
        self._dropout = dropout


class DotProductAttention(_ComposedModule):
    """The book's DotProductAttention, computed by attn (no parameters)."""

    def __init__(self, dropout=0.0, *, scale=None, seed=0):
        super().__init__(_attn.DotProductAttention(dropout, scale=scale, seed=seed))
        self._arguments = ((dropout,), {"scale": scale, "seed": seed})
        self._dropout, self._scale = dropout, scale

    def _composed_forward(self, queries, keys, values, valid_lens, causal):
        _check_layer_inputs(queries, keys, values, {})
        output = self._attend(
            queries.unsqueeze(1), keys.unsqueeze(1), values.unsqueeze(1), valid_lens, causal,
            self._scale, callers=("queries", "keys"),
        )
        return output.squeeze(1)


class _InnerAttention(nn.Module):
    """``attention`` of a MultiHeadAttention, where the book's module keeps its
    DotProductAttention: its ``attention_weights`` are the outer module's (the book's Transformer
    reads ``blk.attention.attention.attention_weights``). It holds no parameters."""

    def __init__(self, outer):
        super().__init__()
        self._outer = _weakref.ref(outer)

    @property
    def attention_weights(self):
        outer = self._outer() if self._outer is not None else None
        return None if outer is None else outer.attention_weights

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_outer"] = None  # a weak reference does not pickle; the outer module sets it again
        return state


class MultiHeadAttention(_ComposedModule):
    """The book's MultiHeadAttention, computed by attn: parameters ``W_q``, ``W_k``, ``W_v``,
    ``W_o`` ``.weight`` (and ``.bias`` with bias=True), each an ``nn.Linear`` as the book's, in
    its order. ``attention_weights`` after a call are the inner attention's, (B·num_heads, n, m),
    also read as ``attention.attention_weights``, where the book keeps them."""

    _BOOK_ORDER = ("W_q", "W_k", "W_v", "W_o")

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
        self._arguments = (
            (key_size, query_size, value_size, num_hiddens, num_heads, dropout, bias),
            {"seed": seed},
        )
        self._dropout, self._num_heads, self._bias = dropout, num_heads, bias
        self.attention = _InnerAttention(self)
        self._sizes = {
            name: (size, "the layer's input size")
            for name, size in (("queries", query_size), ("keys", key_size), ("values", value_size))
        }

    @classmethod
    def from_torch(cls, layer):
        """This module holding the parameters of ``torch.nn.MultiheadAttention`` `layer` (copies,
        in its dtype, in its training mode): called on (B, n, ·) tensors as the layer is with
        ``batch_first=True`` and ``need_weights=False``, it computes the same output; the layer's
        ``key_padding_mask`` of padded tails is ``valid_lens`` here, ``is_causal=True`` with a
        square causal mask is ``causal=True``. in_proj_weight (or q_, k_, v_proj_weight where
        kdim or vdim differ from embed_dim) gives W_q, W_k and W_v, out_proj W_o; bias=True
        carries in_proj_bias and out_proj.bias. add_bias_kv and add_zero_attn are refused."""
        if not isinstance(layer, nn.MultiheadAttention):
            raise TypeError(
                "layer: expected a torch.nn.MultiheadAttention, got " + type(layer).__name__)
        if layer.bias_k is not None or layer.add_zero_attn:
            raise ValueError(
                "layer: expected a MultiheadAttention without add_bias_kv and add_zero_attn "
                "(the book's layer has neither), got one with "
                + ("add_bias_kv" if layer.bias_k is not None else "add_zero_attn"))
        bias = layer.in_proj_bias is not None
        if bias != (layer.out_proj.bias is not None):
            raise ValueError(
                "layer: expected biases on both the input and output projections or on neither "
                "(the book's layer has one flag for both), got "
                + ("in_proj_bias without out_proj.bias" if bias else
                   "out_proj.bias without in_proj_bias"))
        embed = layer.embed_dim
        module = cls(layer.kdim, embed, layer.vdim, embed, layer.num_heads, layer.dropout, bias)
        if layer._qkv_same_embed_dim:
            weights = layer.in_proj_weight.chunk(3)
        else:
            weights = (layer.q_proj_weight, layer.k_proj_weight, layer.v_proj_weight)
        sources = dict(zip(("W_q.weight", "W_k.weight", "W_v.weight"), weights))
        sources["W_o.weight"] = layer.out_proj.weight
        if bias:
            sources.update(zip(("W_q.bias", "W_k.bias", "W_v.bias"), layer.in_proj_bias.chunk(3)))
            sources["W_o.bias"] = layer.out_proj.bias
        dtype = layer.out_proj.weight.dtype
        with torch.no_grad():
            for name, parameter in module.named_parameters():
                parameter.copy_(sources[name])
        return module.to(dtype).train(layer.training)

    def _composed_forward(self, queries, keys, values, valid_lens, causal):
        # The book's forward: W_q, W_k, W_v and W_o are PyTorch's linear (under autocast in its
        # dtype), the heads' attention attn's kernels on (B, H, rows, h / H) views.
        _check_layer_inputs(queries, keys, values, self._sizes)
        heads = self._num_heads

        def project(x, name):
            weight = self._tensor(name + ".weight")
            bias = self._tensor(name + ".bias") if self._bias else None
            return nn.functional.linear(x, weight, bias)

        def split(x):  # (B, rows, h) → (B, H, rows, h / H)
            return x.unflatten(-1, (heads, -1)).transpose(1, 2)

        output = self._attend(
            split(project(queries, "W_q")), split(project(keys, "W_k")),
            split(project(values, "W_v")), valid_lens, causal, None,
        )
        return project(output.transpose(1, 2).flatten(2), "W_o")


class GeneralAttention(_ComposedModule):
    """Luong's general attention, computed by attn: scores (W q)·k for queries and keys of
    different sizes, parameter ``W.weight`` (key_size, query_size)."""

    def __init__(self, query_size, key_size, dropout=0.0, *, seed=0):
        super().__init__(_attn.GeneralAttention(query_size, key_size, dropout, seed=seed))
        self._arguments = ((query_size, key_size, dropout), {"seed": seed})
        self._dropout = dropout
        self._sizes = {
            "queries": (query_size, "the layer's input size"),
            "keys": (key_size, "the layer's key size"),
        }

    def _composed_forward(self, queries, keys, values, valid_lens, causal):
        # (W q)·k unscaled: W by PyTorch's linear (under autocast in its dtype), then attn's.
        _check_layer_inputs(queries, keys, values, self._sizes)
        projected = nn.functional.linear(queries, self._tensor("W.weight"))
        output = self._attend(
            projected.unsqueeze(1), keys.unsqueeze(1), values.unsqueeze(1), valid_lens, causal,
            1.0, callers=("keys",),
        )
        return output.squeeze(1)


class GaussianKernelPooling(_AttnModule):
    """Nadaraya–Watson Gaussian-kernel pooling, computed by attn: the width is the parameter
    ``w`` of shape (1,), learnable as in the book's NWKernelRegression."""

    def __init__(self, width=1.0, dropout=0.0, *, seed=0):
        super().__init__(_attn.GaussianKernelPooling(width, dropout, seed=seed))
        self._arguments = ((width, dropout), {"seed": seed})
        self._dropout = dropout


# --- scaled_dot_product_attention as custom operators -------------------------------------------
#
# attn::sdpa runs attn's forward pass and returns (output, log-sum-exp); attn::sdpa_backward its
# backward pass. Both have fake (meta) implementations, so torch.compile(fullgraph=True) traces
# them without running attn, and their Autograd kernels connect them, so gradients reach query,
# key, value, a float attn_mask that requires grad, and sinks. The options travel as plain
# scalars.


def _window_arguments(window):
    """(window_left, window_right) for the operators: -1 leaves a side unbounded; (-1, -1) and
    None both mean no window."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(
            "window: expected None or a pair (left, right) of ints (-1 or None: unbounded), got "
            f"{type(window).__name__}"
        )
    return tuple(_window_side(side, name) for side, name in zip(window, ("left", "right")))


def _window_side(side, name):
    """-1 for None, the int of an int or of what stands for one by __index__ (NumPy's integers)."""
    if side is None:
        return -1
    if not isinstance(side, bool):
        try:
            return _operator_index(side)
        except TypeError:
            pass
    raise TypeError(
        f"window: expected (left, right) as ints or None, got {name} of type {type(side).__name__}"
    )


def _window(window_left, window_right):
    """The ``window=`` argument of attn's functions for the operators' two ints."""
    if window_left == -1 and window_right == -1:
        return None
    return (window_left, window_right)


def _forward(query, key, value, attn_mask, valid_lens, alibi_slopes, sinks, seed, dropout_p,
             is_causal, scale, enable_gqa, window_left, window_right, softcap, alignment,
             output_residual):
    """The attn::sdpa operator's body, on its arguments, for the operator and the eager calls
    alike: the extension reads torch tensors in place (torch._C._to_dlpack) and returns tensors
    (torch._C._from_dlpack): (output, log_sum_exp), and with ``output_residual`` a third, the
    output's rounding residuals for the backward pass (float16 and bfloat16; None for float32).
    The autograd Functions ask for them: their backward then takes D = rowsum(dO ∘ O) from the
    output before its rounding, which where one key dominates a row keeps dQ and dK within the
    float32 kernels' bound (docs/kernels.md)."""
    if _torch_threads() != _followed_threads[0]:
        _follow_torch_threads()
    return _extension._sdpa_forward(
        query,
        key,
        value,
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        window=_window(window_left, window_right),
        alibi_slopes=alibi_slopes,
        softcap=softcap,
        sinks=sinks,
        valid_lens=valid_lens,
        alignment=alignment,
        seed=0 if seed is None else int(seed),
        output_residual=output_residual,
    )


def _forward_operator(query, *arguments):
    """attn::sdpa's CPU kernel: _forward's results, the residuals an empty tensor where there are
    none (the schema returns three tensors)."""
    result = _forward(query, *arguments)
    if len(result) == 3 and result[2] is not None:
        return result
    return result[0], result[1], query.new_empty(0)


def _sdpa_fake(query, key, value, attn_mask, valid_lens, alibi_slopes, sinks, seed, *options):
    # The shapes' agreement that the output's shape rests on, checked as attn's kernels check it
    # (ValueError naming the argument), so that meta tensors and tracing refuse what a call would.
    enable_gqa = options[3]
    _check_value(
        key.dim() >= 2 and key.shape[-1] == query.shape[-1],
        lambda: f"key: expected the last axis {query.shape[-1]} (that of query), got shape "
        f"{tuple(key.shape)}",
    )
    _check_value(
        value.dim() == key.dim() and value.shape[:-1] == key.shape[:-1],
        lambda: f"value: expected the shape of key {tuple(key.shape[:-1])} up to the last axis, "
        f"got {tuple(value.shape[:-1])}",
    )
    if query.dim() >= 3 and key.dim() >= 3 and value.dim() >= 3:
        heads, kv_heads = query.shape[-3], key.shape[-3]
        if enable_gqa:
            _check_value(
                heads % kv_heads == 0,
                lambda: "enable_gqa: expected the key/value heads to divide the query's "
                f"{heads} heads, got {kv_heads}",
            )
        else:
            _check_value(
                heads == kv_heads,
                lambda: f"key: expected {heads} heads (those of query; set enable_gqa for "
                f"grouped-query attention), got {kv_heads}",
            )
    # The output in the query's dtype (float16 and bfloat16 too); the log-sum-exp always float32;
    # the residuals shaped as the output where asked for on half inputs, else empty.
    output = query.new_empty((*query.shape[:-1], value.shape[-1]))
    residual = (
        query.new_empty(output.shape) if options[-1] and query.dtype in _HALF_DTYPES
        else query.new_empty(0)
    )
    return output, query.new_empty(query.shape[:-1], dtype=torch.float32), residual


def _backward(grad_output, query, key, value, output, log_sum_exp, output_residual, attn_mask,
              valid_lens, alibi_slopes, sinks, seed, dropout_p, is_causal, scale, enable_gqa,
              window_left, window_right, softcap, alignment, mask_gradient, sinks_gradient):
    """The attn::sdpa_backward operator's body, on its arguments: (d query, d key, d value,
    d attn_mask or None, d sinks or None), tensors as _forward's. The keywords are spelled out
    here and in _forward: a shared dict of them cost ~1 µs a call, 7% of a decode-sized call."""
    if _torch_threads() != _followed_threads[0]:
        _follow_torch_threads()

    def gradients(grad_output):
        return _extension._sdpa_backward(
            query,
            key,
            value,
            output,
            grad_output,
            log_sum_exp,
            attn_mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            window=_window(window_left, window_right),
            alibi_slopes=alibi_slopes,
            softcap=softcap,
            sinks=sinks,
            valid_lens=valid_lens,
            alignment=alignment,
            seed=0 if seed is None else int(seed),
            mask_gradient=mask_gradient,
            sinks_gradient=sinks_gradient,
            output_residual=output_residual,
        )

    return _carrying_non_finite(gradients, grad_output, valid_lens)


_GRAD_OUTPUT_NOT_FINITE = "grad_output: expected finite values"


def _flags_summed_to(flags, shape):
    """Boolean ``flags`` reduced, by any, to ``shape``, which broadcasts against them (a mask's
    or the sinks' shape against the scores' or the heads')."""
    flags = flags.to(torch.float32)
    flags = flags.broadcast_to(torch.broadcast_shapes(flags.shape, shape))
    return flags.sum_to_size(shape) > 0


def _keys_reached(rows, valid_lens, keys):
    """(…, keys) flags: the keys that the rows of grad_output flagged in ``rows`` (…, L) carry
    ∞ or NaN into. Every key, as in PyTorch's SDPA (a masked key's P of 0 times ∞ is NaN there
    too), but valid lengths, (B,) or (B, L) with B the first axis, are the book's masked_softmax,
    whose assignment of −10⁶ cuts the gradient of the keys past a row's length."""
    if valid_lens is None:
        return rows.any(-1, keepdim=True).expand(*rows.shape[:-1], keys)
    lengths = valid_lens.to(torch.int64)
    lengths = lengths.view(
        lengths.shape[0], *[1] * (rows.dim() - lengths.dim()), *lengths.shape[1:])
    limit = torch.where(rows, lengths, 0).amax(-1, keepdim=True)
    return torch.arange(keys) < limit


def _carrying_non_finite(gradients, grad_output, valid_lens=None):
    """``gradients(grad_output)``, the 5-tuple of attn's backward, where a grad_output that is not
    finite gets PyTorch's answer instead of attn's refusal: fp16 training under a GradScaler counts
    on an overflowed grad_output giving gradients that are not finite, and skips that step.

    PyTorch's SDPA carries a row i of grad_output holding ∞ or NaN, through dS = P ⊙ (dP − D),
    into every key of the head (dK; _keys_reached), that row of dQ, and dV's columns where it
    holds them (a masked or dropped key's P of 0 times ∞ is NaN, so no key escapes). attn computes the gradients
    with those elements as 0, which gives PyTorch's value at every entry they do not reach, and
    sets the entries they reach to NaN (PyTorch's are ±∞ or NaN there, by the signs and zeros of
    the other factors)."""
    try:
        return gradients(grad_output)
    except ValueError as error:
        if not str(error).startswith(_GRAD_OUTPUT_NOT_FINITE):
            raise
    bad = grad_output.isfinite().logical_not_()
    d_query, d_key, d_value, d_mask, d_sinks = gradients(grad_output.masked_fill(bad, 0))
    nan = float("nan")
    rows = bad.any(-1)  # (..., L): the rows of dQ and dS reached
    d_query = d_query.masked_fill(rows.unsqueeze(-1), nan)
    if grad_output.dim() >= 3:
        # Axis -3 holds the heads (or a batch axis, groups of one): a key/value head carries on
        # what any query head of its group received.
        groups = (d_key.shape[-3], grad_output.shape[-3] // d_key.shape[-3])
        keys = _keys_reached(rows, valid_lens, d_key.shape[-2]).unflatten(-2, groups).any(-2)
        columns = bad.any(-2).unflatten(-2, groups).any(-2)
        d_key = d_key.masked_fill(keys.unsqueeze(-1), nan)
        d_value = d_value.masked_fill(columns.unsqueeze(-2), nan)
    else:
        d_key = d_key.masked_fill(rows.any(), nan)
        d_value = d_value.masked_fill(bad.any(-2), nan)
    if d_mask is not None:
        scores = (*rows.shape, d_key.shape[-2])
        d_mask = d_mask.masked_fill(
            _flags_summed_to(rows.unsqueeze(-1).expand(scores), d_mask.shape), nan)
    if d_sinks is not None:
        d_sinks = d_sinks.masked_fill(_flags_summed_to(rows.any(-1), d_sinks.shape), nan)
    return d_query, d_key, d_value, d_mask, d_sinks


def _backward_operator(grad_output, query, key, value, output, log_sum_exp, output_residual,
                       attn_mask, valid_lens, alibi_slopes, sinks, seed, dropout_p, is_causal,
                       scale, enable_gqa, window_left, window_right, softcap, alignment,
                       mask_gradient, sinks_gradient):
    """attn::sdpa_backward's CPU kernel: _backward's gradients, with empty float32 tensors for
    the mask's and the sinks' when not asked for (the schema returns five tensors)."""
    d_query, d_key, d_value, d_mask, d_sinks = _backward(
        grad_output, query, key, value, output, log_sum_exp, output_residual, attn_mask,
        valid_lens, alibi_slopes, sinks, seed, dropout_p, is_causal, scale, enable_gqa,
        window_left, window_right, softcap, alignment, mask_gradient, sinks_gradient)
    # The mask's and the sinks' gradients are float32 whatever the inputs' dtype.
    return (
        d_query,
        d_key,
        d_value,
        query.new_empty(0, dtype=torch.float32) if d_mask is None else d_mask,
        query.new_empty(0, dtype=torch.float32) if d_sinks is None else d_sinks,
    )


# The operators, defined on torch.library's low-level API rather than torch.library.custom_op:
# custom_op wraps each kernel in Python layers of its own (a device-type table, an aliasing
# check, a dynamo guard, its autograd wrapper's redispatch) that cost 11-12 µs a call under
# torch.compile, 23% of a compiled decode-sized call on Zen 4 (docs/benchmarks.md). The schemas
# are those custom_op derived from the Python signatures. The fake implementations, the autograd
# kernels and the vmap rules are registered below.
_operators = torch.library.Library("attn", "FRAGMENT")
_operators.define(
    "sdpa(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, Tensor? valid_lens, "
    "Tensor? alibi_slopes, Tensor? sinks, Tensor? seed, float dropout_p, bool is_causal, "
    "float? scale, bool enable_gqa, SymInt window_left, SymInt window_right, float? softcap, "
    "str alignment, bool output_residual) -> (Tensor, Tensor, Tensor)",
    tags=(torch.Tag.pt2_compliant_tag,),
)
_operators.define(
    "sdpa_backward(Tensor grad_output, Tensor query, Tensor key, Tensor value, Tensor output, "
    "Tensor log_sum_exp, Tensor? output_residual, Tensor? attn_mask, Tensor? valid_lens, Tensor? alibi_slopes, "
    "Tensor? sinks, Tensor? seed, float dropout_p, bool is_causal, float? scale, bool enable_gqa, "
    "SymInt window_left, SymInt window_right, float? softcap, str alignment, bool mask_gradient, "
    "bool sinks_gradient) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    tags=(torch.Tag.pt2_compliant_tag,),
)
# attn's forward pass: (output (..., H_q, L, Ev), log-sum-exp (..., H_q, L), the output's rounding
# residuals where output_residual is set and the inputs are half (else an empty tensor)). Callers
# pass output_residual False; the autograd kernels set it wherever they record a backward pass
# (so a call with an input requiring grad returns residuals whatever its flag said).
_sdpa = torch.ops.attn.sdpa.default
# attn's backward pass: gradients of query, key, value, and of the float attn_mask and the sinks
# when asked for (empty tensors otherwise).
_sdpa_backward = torch.ops.attn.sdpa_backward.default
_operators.impl("sdpa", _forward_operator, "CPU")
_operators.impl("sdpa_backward", _backward_operator, "CPU")
# How many leading arguments of each operator are (optional) tensors.
_SDPA_TENSORS, _SDPA_BACKWARD_TENSORS = 8, 12


def _sdpa_backward_fake(
    grad_output,
    query,
    key,
    value,
    output,
    log_sum_exp,
    output_residual,
    attn_mask,
    valid_lens,
    alibi_slopes,
    sinks,
    seed,
    *options,
):
    mask_gradient, sinks_gradient = options[-2:]
    return (
        query.new_empty(query.shape),
        key.new_empty(key.shape),
        value.new_empty(value.shape),
        query.new_empty(attn_mask.shape if mask_gradient else (0,), dtype=torch.float32),
        query.new_empty(sinks.shape if sinks_gradient else (0,), dtype=torch.float32),
    )


torch.library.register_fake("attn::sdpa", _sdpa_fake, lib=_operators)
torch.library.register_fake("attn::sdpa_backward", _sdpa_backward_fake, lib=_operators)


# FlopCounterMode counts the operators as PyTorch counts its own SDPA (torch.utils.flop_counter's
# sdpa_flop and sdpa_backward_flop): every (query row, key) pair's products, whatever masks,
# causal or windows hide — Q·Kᵀ and P·V forward; the scores again, dP, dV, dQ and dK backward.
# Arguments arrive as shapes (None for an absent tensor).
def _sdpa_flops(query, key, value, *_, out_shape=None, **__):
    pairs = _math.prod(query[:-1]) * key[-2]
    return 2 * pairs * (query[-1] + value[-1])


def _sdpa_backward_flops(grad_output, query, key, value, *_, out_shape=None, **__):
    pairs = _math.prod(query[:-1]) * key[-2]
    return 2 * pairs * (3 * query[-1] + 2 * value[-1])


_flop_counter.register_flop_formula(torch.ops.attn.sdpa)(_sdpa_flops)
_flop_counter.register_flop_formula(torch.ops.attn.sdpa_backward)(_sdpa_backward_flops)


# --- vmap of the operators ------------------------------------------------------------------------
# Where every tensor of a call's shapes is batched alike, vmap's axis joins the batch: one call of
# attn for the whole batch instead of vmap's fallback, one call per sample. The log-sum-exp is
# in an order of attn's choosing, which equals the natural one only up to four axes, so that
# path takes inputs of at most four axes and a log-sum-exp made by it or per sample alike. The
# rest goes per sample: unbatched query, key or value (jacrev's rows; expanding them would copy
# them per sample), batched masks, valid lengths (they index the first axis), ALiBi slopes, sinks
# or seeds that are batched, the gradients of a mask or the sinks (summed over the axes they
# broadcast on), dropout under vmap(randomness="same"). Dropout under randomness="error" is
# refused, as PyTorch refuses random operators there.


def _merged(tensor, dim, merge):
    """`tensor` with vmap's axis `dim` in front, merged into the next axis with `merge` (query
    samples of four axes; fewer take it as a new first axis)."""
    tensor = tensor.movedim(dim, 0)
    return tensor.flatten(0, 1) if merge else tensor


def _split(tensor, batch, merge):
    """A whole call's result with vmap's axis in front again (the inverse of _merged)."""
    return tensor.unflatten(0, (batch, -1)) if merge else tensor


def _per_sample(operator, info, in_dims, arguments, out_dims):
    """vmap's fallback, written out: `operator` on each sample, the outputs stacked on axis 0
    (those of out_dims None taken from the first sample)."""
    samples = [
        operator(*(a if d is None else a.select(d, i) for a, d in zip(arguments, in_dims)))
        for i in range(info.batch_size)
    ]
    outputs = tuple(
        samples[0][j] if dim is None else torch.stack([sample[j] for sample in samples])
        for j, dim in enumerate(out_dims)
    )
    return outputs, out_dims


def _refuse_error_randomness(info, dropout_p):
    """Dropout under vmap(randomness="error"): refused, as PyTorch refuses random operators."""
    if dropout_p > 0.0 and info.randomness == "error":
        raise RuntimeError(
            "vmap: attn's scaled_dot_product_attention with dropout is a random operation: "
            "pass randomness='different' or 'same' to vmap"
        )


def _batched_whole(info, rows, attn_mask, valid_lens, optional_dims, dropout_p):
    """Whether a call goes whole: the tensors of `rows` all batched and of at most four axes per
    sample, no valid lengths, nothing of `optional_dims` (the mask's and later ones) batched, a
    mask without a batch axis of its own beyond one (the samples' batches merge), no dropout that
    vmap wants the same per sample."""
    return (
        valid_lens is None
        and all(dim is not None and tensor.dim() <= 5 for tensor, dim in rows)
        and all(dim is None for dim in optional_dims)
        and not (attn_mask is not None and attn_mask.dim() >= 4 and attn_mask.shape[-4] != 1)
        and not (dropout_p > 0.0 and info.randomness == "same")
    )


@torch.library.register_vmap("attn::sdpa")
def _sdpa_vmap(info, in_dims, query, key, value, attn_mask, valid_lens, alibi_slopes, sinks, seed,
               *options):
    arguments = (query, key, value, attn_mask, valid_lens, alibi_slopes, sinks, seed, *options)
    rows = list(zip(arguments[:3], in_dims[:3]))
    _refuse_error_randomness(info, options[0])
    # The residuals: per sample where the inputs are half and they are asked for, else empty.
    residual_dim = 0 if options[-1] and query.dtype in _HALF_DTYPES else None
    if not _batched_whole(info, rows, attn_mask, valid_lens, in_dims[3:8], options[0]):
        return _per_sample(_sdpa, info, in_dims, arguments, (0, 0, residual_dim))
    merge, batch = query.dim() == 5, info.batch_size
    output, log_sum_exp, residual = _sdpa(*(_merged(x, d, merge) for x, d in rows), attn_mask,
                                          None, alibi_slopes, sinks, seed, *options)
    if residual_dim is not None:
        residual = _split(residual, batch, merge)
    return (
        (_split(output, batch, merge), _split(log_sum_exp, batch, merge), residual),
        (0, 0, residual_dim),
    )


@torch.library.register_vmap("attn::sdpa_backward")
def _sdpa_backward_vmap(info, in_dims, grad_output, query, key, value, output, log_sum_exp,
                        output_residual, attn_mask, valid_lens, alibi_slopes, sinks, seed,
                        *options):
    arguments = (grad_output, query, key, value, output, log_sum_exp, output_residual, attn_mask,
                 valid_lens, alibi_slopes, sinks, seed, *options)
    # Residuals (of half inputs) go whole batched as the output is, or per sample.
    residual = output_residual is not None and output_residual.numel() > 0
    mask_gradient, sinks_gradient = options[-2], options[-1]
    rows = list(zip(arguments[:5], in_dims[:5]))  # the log-sum-exp checked apart: fewer axes
    _refuse_error_randomness(info, options[0])
    if (
        mask_gradient
        or sinks_gradient
        or in_dims[5] is None
        or (residual and in_dims[6] is None)
        or not _batched_whole(info, rows, attn_mask, valid_lens, in_dims[7:12], options[0])
    ):
        out_dims = (0, 0, 0, 0 if mask_gradient else None, 0 if sinks_gradient else None)
        return _per_sample(_sdpa_backward, info, in_dims, arguments, out_dims)
    merge, batch = query.dim() == 5, info.batch_size
    d_query, d_key, d_value, d_mask, d_sinks = _sdpa_backward(
        *(_merged(x, d, merge) for x, d in rows),
        _merged(log_sum_exp, in_dims[5], merge).contiguous(),
        _merged(output_residual, in_dims[6], merge) if residual else output_residual, attn_mask,
        None, alibi_slopes,
        sinks, seed, *options,
    )
    gradients = tuple(_split(g, batch, merge) for g in (d_query, d_key, d_value))
    return (*gradients, d_mask, d_sinks), (0, 0, 0, None, None)


# Positions of the operator's inputs that can have gradients.
_MASK, _SINKS = 3, 6


def _sdpa_setup_context(ctx, inputs, output):
    # (The last option, output_residual, is the forward's alone: sdpa_backward takes the rest.)
    query, key, value, attn_mask, valid_lens, alibi_slopes, sinks, seed, *options, _ = inputs
    result, log_sum_exp, residual = output
    ctx.save_for_backward(
        query, key, value, result, log_sum_exp, residual, attn_mask, valid_lens, alibi_slopes,
        sinks, seed
    )
    ctx.options = options
    if residual is None:
        ctx.mark_non_differentiable(log_sum_exp)
    else:
        ctx.mark_non_differentiable(log_sum_exp, residual)


def _gradients(ctx, grad_output, backward):
    """The gradients of the inputs saved by _sdpa_setup_context, from ``backward``: the
    attn::sdpa_backward operator, or the eager path's direct call of its body."""
    (query, key, value, result, log_sum_exp, residual, attn_mask, valid_lens, alibi_slopes, sinks,
     seed) = ctx.saved_tensors
    mask_gradient = (
        attn_mask is not None and attn_mask.is_floating_point() and ctx.needs_input_grad[_MASK]
    )
    sinks_gradient = sinks is not None and ctx.needs_input_grad[_SINKS]
    _check_not_batched(grad_output, "attn's scaled_dot_product_attention")
    if grad_output.stride(-1) != 1:
        grad_output = grad_output.contiguous()
    d_query, d_key, d_value, d_mask, d_sinks = backward(
        grad_output,
        query,
        key,
        value,
        result,
        log_sum_exp,
        residual,
        attn_mask,
        valid_lens,
        alibi_slopes,
        sinks,
        seed,
        *ctx.options,
        mask_gradient,
        sinks_gradient,
    )
    return (
        d_query,
        d_key,
        d_value,
        d_mask.to(attn_mask.dtype) if mask_gradient else None,
        None,
        None,
        d_sinks.to(sinks.dtype) if sinks_gradient else None,
        None,
        *([None] * (len(ctx.options) + 1)),  # the options and output_residual
    )


_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_AutoDispatchBelowAutograd = torch._C._AutoDispatchBelowAutograd
_CPU_KEY = torch._C.DispatchKey.CPU
_grad_enabled = torch.is_grad_enabled


def _below_autograd(operator, below, inputs):
    """``operator`` on ``inputs`` from the dispatch key set ``below`` autograd on."""
    with _AutoDispatchBelowAutograd():
        return operator.redispatch(below, *inputs)


class _OperatorSdpa(torch.autograd.Function):
    """attn::sdpa's autograd: the operator below the Autograd key, the inputs saved by
    _sdpa_setup_context, the gradients by the attn::sdpa_backward operator. The last two inputs
    are the operator and the dispatch key set to continue with (last, so that the positions
    _gradients reads in ctx.needs_input_grad are the operator's)."""

    @staticmethod
    def forward(ctx, *inputs):
        *inputs, operator, below = inputs
        inputs[-1] = True  # output_residual: the backward pass takes them
        output = _below_autograd(operator, below, inputs)
        _sdpa_setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, grad_output, _grad_log_sum_exp, _grad_residual):
        return *_gradients(ctx, grad_output, _sdpa_backward), None, None


class _OperatorSdpaBackward(torch.autograd.Function):
    """attn::sdpa_backward where its inputs need gradients (create_graph=True): computed, and
    refused in a second backward pass, as attn's other paths refuse it. Inputs as
    _OperatorSdpa's."""

    @staticmethod
    def forward(ctx, *inputs):
        *inputs, operator, below = inputs
        return _below_autograd(operator, below, inputs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise RuntimeError(_NO_SECOND_DERIVATIVE.format("attn's scaled_dot_product_attention"))


def _autograd_kernel(operator, cpu_kernel, function, tensors):
    """The Autograd-key kernel of ``operator``: ``function`` (a Function above) where grad mode is
    on and one of the first ``tensors`` arguments requires grad; otherwise the operator below
    autograd, and where nothing but the CPU kernel lies below (no dispatch mode, fake or
    functional tensor: a compiled inference graph's calls after its first, which runs under a
    mode of PyTorch's; compiled training graphs call the CPU kernel below autograd themselves),
    that kernel called directly, which is what the redispatch would run."""

    def kernel(keyset, *inputs):
        below = keyset & _AFTER_AUTOGRAD
        if _grad_enabled():
            for tensor in inputs[:tensors]:
                if tensor is not None and tensor.requires_grad:
                    return function.apply(*inputs, operator, below)
        if below.highestPriorityTypeId() == _CPU_KEY:
            return cpu_kernel(*inputs)
        return _below_autograd(operator, below, inputs)

    return kernel


_operators.impl(
    "sdpa", _autograd_kernel(_sdpa, _forward_operator, _OperatorSdpa, _SDPA_TENSORS), "Autograd",
    with_keyset=True,
)
_operators.impl(
    "sdpa_backward",
    _autograd_kernel(_sdpa_backward, _backward_operator, _OperatorSdpaBackward,
                     _SDPA_BACKWARD_TENSORS),
    "Autograd",
    with_keyset=True,
)


class _EagerSdpa(torch.autograd.Function):
    """attn::sdpa's autograd for eager calls, without the operators' dispatch: through the
    operators a (1, 8, 64, 64) training step took 474 µs against this Function's 422 on one Zen 4
    core (558 while torch.library.custom_op defined them, whose autograd wrapper cost ~100 µs a
    pass on Zen 5). The same bodies, saved tensors and gradient rule as the operators;
    torch.compile, tracing and dispatch modes take the operators."""

    # forward(ctx, ...) rather than a separate setup_context: that form's apply cost ~30 µs more.
    @staticmethod
    def forward(ctx, *inputs):
        query, key, value, *options = inputs
        # (output, log_sum_exp, the output's rounding residuals or None for float32)
        result = _forward(query, key, value, *options[:-1], True)
        _sdpa_setup_context(ctx, inputs, result)
        return result

    @staticmethod
    @_first_order_only("attn's scaled_dot_product_attention", _saved_tensors)
    def backward(ctx, grad_output, _grad_log_sum_exp, _grad_residual):
        return _gradients(ctx, grad_output, _backward)


class _TransformedSdpa(torch.autograd.Function):
    """attn::sdpa under torch.func transforms (grad, vjp, jacrev, vmap of them): the operators'
    autograd kernels apply Functions without setup_context (they take the dispatch key set),
    which those transforms refuse. This Function and _TransformedSdpaBackward run the same
    operators with the same saved tensors and gradient rule; functorch hands their forwards the
    tensors of the level below (plain ones, or batched ones, which the operators' batching rules
    take)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(*inputs):
        return _sdpa(*inputs[:-1], True)  # with the residuals, for the backward pass

    @staticmethod
    def setup_context(ctx, inputs, output):
        _sdpa_setup_context(ctx, inputs, output)

    @staticmethod
    def backward(ctx, grad_output, _grad_log_sum_exp, _grad_residual):
        return _gradients(ctx, grad_output, _TransformedSdpaBackward.apply)

    @staticmethod
    def jvp(ctx, *tangents):
        # Forward mode under a transform (torch.func.jacfwd, hessian = jacfwd(jacrev)): attn's
        # refusal, as _refuse_tangents words it (PyTorch's generic "implement the jvp function"
        # otherwise).
        raise NotImplementedError(_NO_FORWARD_MODE)


class _TransformedSdpaBackward(torch.autograd.Function):
    """attn::sdpa_backward as a Function, so that _TransformedSdpa's backward reaches the
    operator below the transform's level (its own autograd wrapper would be refused there too);
    no second derivative, as attn's other paths."""

    generate_vmap_rule = True

    @staticmethod
    def forward(*inputs):
        return _sdpa_backward(*inputs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise RuntimeError(_NO_SECOND_DERIVATIVE.format("attn's scaled_dot_product_attention"))


class _PlainSdpa(torch.autograd.Function):
    """_EagerSdpa for the plain call (query, key and value of one dtype attn computes as it is;
    a bool, float32, float16 or bfloat16 attn_mask that needs no gradient, is_causal, scale
    and enable_gqa the only options): the same operator bodies' extension calls with those options
    alone, saving six tensors and returning the output only. _EagerSdpa's general argument
    handling cost ~13 µs of a 59 µs training step at (1, 8, 8, 64) on one Zen 5 core, where
    PyTorch's whole step took 47."""

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, is_causal, scale, enable_gqa):
        if _torch_threads() != _followed_threads[0]:
            _follow_torch_threads()
        output, log_sum_exp, residual = _extension._sdpa_forward(
            query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa, output_residual=True)
        ctx.save_for_backward(query, key, value, output, log_sum_exp, attn_mask, residual)
        ctx.options = (is_causal, scale, enable_gqa)
        return output

    @staticmethod
    @_first_order_only("attn's scaled_dot_product_attention", _saved_tensors)
    def backward(ctx, grad_output):
        _check_not_batched(grad_output, "attn's scaled_dot_product_attention")
        if grad_output.stride(-1) != 1:
            grad_output = grad_output.contiguous()
        query, key, value, output, log_sum_exp, attn_mask, residual = ctx.saved_tensors
        if _torch_threads() != _followed_threads[0]:
            _follow_torch_threads()
        options = ctx.options
        d_query, d_key, d_value, _, _ = _carrying_non_finite(
            lambda grad_output: _extension._sdpa_backward(
                query, key, value, output, grad_output, log_sum_exp, attn_mask, 0.0, *options,
                output_residual=residual),
            grad_output)
        return d_query, d_key, d_value, None, None, None, None


def _is_lengths(attn_mask):
    """Whether an attn_mask argument is really the book's valid lengths: a Python list or tuple,
    or integers (PyTorch never takes an integer mask)."""
    if isinstance(attn_mask, (list, tuple)):
        return True
    if isinstance(attn_mask, torch.Tensor):
        # (Complex masks are no lengths: the mask's own check names their dtype.)
        return not (
            attn_mask.is_floating_point() or attn_mask.is_complex() or attn_mask.dtype == torch.bool
        )
    return attn_mask is not None and _np.issubdtype(_np.asarray(attn_mask).dtype, _np.integer)


def _warn_if_token_mask(lengths, key):
    """Warns where integer lengths given as attn_mask look like a tokenizer's attention_mask
    ((B, S) of 0s and 1s): read as per-query valid lengths (the book's call) each query would see
    at most its first key, where PyTorch refuses an integer mask outright. `lengths`: a tensor."""
    if (
        lengths.dim() == 2
        and lengths.numel() > 0
        and key.shape[-2] > 1
        and bool(((lengths == 0) | (lengths == 1)).all())
    ):
        warnings.warn(_TOKEN_MASK_WARNING, UserWarning, stacklevel=3)


_TOKEN_MASK_WARNING = (
    "attn_mask: integers here are read as valid lengths (the book's valid_lens, a key count per "
    "query), and these are all 0 or 1, as a tokenizer's attention_mask is: each query would see "
    "at most one key. For a padding mask pass attention_mask.bool()[:, None, None, :] "
    "(PyTorch's masks are bool or floating-point)"
)


# Lengths given as attn_mask (_is_lengths), as errors about them name them: the argument the
# caller gave, and how it was read (as attn.scaled_dot_product_attention names them).
_MASK_LENGTHS = "attn_mask (integers, read as valid_lens)"


def _mask_lengths_error(error):
    """`error`, which attn's functions report about valid_lens, for lengths given as attn_mask."""
    return type(error)(f"{_MASK_LENGTHS}: {error}")


def _as_float32(tensor, name=None, below_is_minus_infinity=False):
    """`tensor` in float32. A float64 one (`name` given: the argument) whose finite values float32
    cannot hold is a ValueError naming the first, as attn's own functions name it (the
    conversion's ∞ was refused as "expected finite values, got inf"); not while torch.compile or a
    torch.func transform traces the call, whose values are not there to read. With
    `below_is_minus_infinity` (an additive mask: a float64 model's transformers masks hold
    float64's lowest), values below float32's range are −∞, as the conversion makes them."""
    if tensor is None or tensor.dtype == torch.float32:
        return tensor
    if (
        name is not None
        and tensor.dtype == torch.float64
        and not torch.compiler.is_compiling()
        and not _under_transform()
    ):
        beyond = (tensor if below_is_minus_infinity else tensor.abs()) > _FLOAT32_MAX
        beyond &= tensor.isfinite()
        if bool(beyond.any()):
            index = int(beyond.flatten().nonzero()[0])
            value = float(tensor.flatten()[index])
            raise ValueError(
                f"{name}: expected values float32 holds (within ±3.4e38; attn computes in "
                f"float32), got {value:g} at flat index {index}"
            )
    return tensor.to(torch.float32)


_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


_HALF_DTYPES = (torch.float16, torch.bfloat16)
# The dtypes attn's functions compute as they are and return unchanged (others go to float32).
_DIRECT_DTYPES = (torch.float32, *_HALF_DTYPES)
_DIRECT_DTYPE_SET = frozenset(_DIRECT_DTYPES)
# Masks attn's functions read as they are: bool, float32, and float16 and bfloat16 (PyTorch's
# float masks come in the inputs' dtype; transformers builds its masks in the model's), whose
# entries the kernels widen exactly. Other float masks (float64) go to float32 first.
_PLAIN_MASK_DTYPES = frozenset((torch.bool, torch.float32, *_HALF_DTYPES))
# Looked up once: the plain call's test and call read them on every call.
_Tensor = torch.Tensor
_sdpa_function = _extension.scaled_dot_product_attention
_ShapeError = _attn.ShapeError
_any_autocast = torch._C._is_any_autocast_enabled


def _cpu_autocast():
    """Whether torch.autocast("cpu") is on (the any-device check first, the cheaper one)."""
    return _any_autocast() and torch.is_autocast_enabled("cpu")
# The dtypes torch.autocast casts for scaled_dot_product_attention, one of its lower-precision
# operators on the CPU: float32, float16 and bfloat16 (float64 stays as it is).
_AUTOCAST_CAST_DTYPES = frozenset((torch.float32, *_HALF_DTYPES))
# The module inputs attn's float32 layers do not take as they are: a .double(), .half() or
# .bfloat16() model's (_AttnModule._forward_in).
_OTHER_FLOAT_DTYPES = frozenset((torch.float64, *_HALF_DTYPES))


def _autocast_inputs(*tensors):
    """torch.autocast("cpu")'s cast for scaled_dot_product_attention: the floating tensors in
    _AUTOCAST_CAST_DTYPES in the autocast dtype (bfloat16 by default), the rest (None, a bool
    mask, float64, a KVCache) as they are; differentiable, as autocast's casts."""
    target = torch.get_autocast_dtype("cpu")
    return tuple(
        tensor.to(target)
        if isinstance(tensor, torch.Tensor) and tensor.dtype in _AUTOCAST_CAST_DTYPES
        else tensor
        for tensor in tensors
    )


def _computed_dtypes(query, key, value):
    """query, key and value as attn computes them: float16 and bfloat16 as they are (attn's half
    kernels); float32 and float64 converted to float32. All three of one dtype, else a TypeError,
    as torch.nn.functional.scaled_dot_product_attention refuses a mix (a float64 key beside a
    float32 query would otherwise lose its precision without a word)."""
    for name, tensor in (("key", key), ("value", value)):
        if tensor.dtype != query.dtype:
            raise TypeError(
                f"{name}: expected the dtype of query ({query.dtype}), got {tensor.dtype}"
            )
    if query.dtype in _HALF_DTYPES:
        return query, key, value
    return _as_float32(query), _as_float32(key), _as_float32(value)


def _broadcast_leading(query, key, value, enable_gqa):
    """query, key and value with their leading axes broadcast against each other as PyTorch's
    function broadcasts them (its math path's matmuls): all axes before (L, E) / (S, E), or with
    enable_gqa the batch axes before the heads, which grouping relates instead. Views of stride 0
    (``expand``), no copies; autograd sums the gradients back. None where they already agree or do
    not broadcast (attn's own shape error then names the argument)."""
    tensors = (query, key, value)
    kept = 3 if enable_gqa else 2
    if any(tensor.dim() < kept for tensor in tensors):
        return None
    try:
        leading = torch.broadcast_shapes(*(tensor.shape[:-kept] for tensor in tensors))
    except RuntimeError:
        return None
    shapes = [(*leading, *tensor.shape[-kept:]) for tensor in tensors]
    if all(tuple(tensor.shape) == shape for tensor, shape in zip(tensors, shapes)):
        return None
    return tuple(tensor.expand(shape) for tensor, shape in zip(tensors, shapes))


def _general_call(eager, query, key, value, options):
    """The general path's output: the operator's body directly in inference, _EagerSdpa under
    eager autograd, the operators otherwise (_eager's None)."""
    if eager == "inference":
        return _forward(query, key, value, *options)[0]
    if eager == "training":
        return _EagerSdpa.apply(query, key, value, *options)[0]
    if _under_torch_func():
        return _TransformedSdpa.apply(query, key, value, *options)[0]
    return _sdpa(query, key, value, *options)[0]


def _on_meta(*tensors):
    """Whether every one of the tensors (None allowed, and skipped) is on the meta device: a mix
    with CPU tensors is refused naming the device, as PyTorch refuses it."""
    return all(tensor is None or isinstance(tensor, _Tensor) and tensor.is_meta
               for tensor in tensors)


def _under_torch_func():
    """Whether a torch.func transform is running this call (eagerly: Dynamo reads a transform's
    stack as never empty, so compiled calls are not)."""
    return (
        not torch.compiler.is_compiling()
        and torch._C._functorch.peek_interpreter_stack() is not None
    )


def _as_tensor(values, dtype, name):
    """None, a tensor, or anything torch.as_tensor reads (lists, NumPy arrays); `name` is the
    argument's name in the error for anything else (a ragged list)."""
    if values is None or isinstance(values, torch.Tensor):
        return values
    try:
        return torch.as_tensor(values, dtype=dtype)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"{name}: expected a tensor, an array or a (nested) list of numbers, got "
            f"{type(values).__name__} that torch.as_tensor refused ({error})"
        ) from None


def _operator_required():
    """Whether the attn::sdpa operator must run whatever the tensors: under torch.compile, jit
    tracing, a dispatch mode (FakeTensor, profilers' modes: torch._C._len_torch_dispatch_stack
    counts the infra modes with the user's) or a torch.func transform (vmap's fallback runs the
    operator per sample). At C level: through their Python wrappers these checks cost 0.7 µs of a
    5 µs decode-sized call."""
    return (
        torch.compiler.is_compiling()
        or torch._C._is_tracing()
        or torch._C._len_torch_dispatch_stack() > 0
        or torch._C._functorch.peek_interpreter_stack() is not None
    )


def _under_transform():
    """Whether a torch.func transform (grad, vmap, jvp, ...) is running."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def _refuse_tangents(*tensors):
    """NotImplementedError where an input carries a forward-mode tangent (inside
    torch.autograd.forward_ad.dual_level()), as PyTorch's own function refuses it: attn has no
    forward derivative, and a call whose inputs needed no grad returned the output with the
    tangent dropped (silently zero)."""
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and _forward_ad.unpack_dual(tensor).tangent is not None:
            raise NotImplementedError(_NO_FORWARD_MODE)


_NO_FORWARD_MODE = (
    "attn's scaled_dot_product_attention: forward-mode AD (torch.autograd.forward_ad) "
    "is not supported: an input carries a tangent; use reverse mode (backward, "
    "torch.func.jacrev) instead"
)


def _eager_plain(query, key, value):
    """_eager for the plain call's three tensors, whose types the caller has checked, without
    _eager's loop."""
    if _operator_required():
        return None
    if torch._C.is_grad_enabled() and (
        query.requires_grad or key.requires_grad or value.requires_grad
    ):
        return "training"
    return "inference"


def _eager(*tensors):
    """None where the attn::sdpa operator must run: _operator_required(), or a tensor subclass.
    Otherwise "inference" where no autograd is to be recorded (grad mode off or no input
    requiring grad): the operator's body is called directly, as the dispatch costs ~12 µs a call,
    a decode step's whole attention at short contexts; "training" where autograd records:
    _EagerSdpa, without the operators' autograd."""
    if _operator_required():
        return None
    grad = torch.is_grad_enabled()
    records = False
    for tensor in tensors:
        if tensor is None:
            continue
        if type(tensor) is not torch.Tensor:
            return None
        records = records or (grad and tensor.requires_grad)
    return "training" if records else "inference"


def _cache_attention(query, cache, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                     extras):
    """scaled_dot_product_attention with a KVCache: attn's decode call, which takes float32,
    float16 and bfloat16 queries as they are (the half ones widened exactly, their output rounded
    once to their dtype); other floating dtypes go as float32, the output in the query's dtype.
    `extras`: attn's keyword arguments, or None where each is its default: the call then passes
    none of them (nanobind matches keywords by name): on a decode step of 6 µs (1 new token, 32
    query heads over 8 of 64, 16 keys) attn.torch's cost over attn's own call fell from 2.0-3.0 to
    0.6-1.1 µs (Zen 4)."""
    if not isinstance(query, torch.Tensor) or not query.is_floating_point():
        got = query.dtype if isinstance(query, torch.Tensor) else type(query).__name__
        raise TypeError(f"query: expected a floating-point torch.Tensor, got {got}")
    if query.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            "query: requires grad, but attention against a KVCache has no backward pass "
            "(decode under torch.no_grad() or torch.inference_mode())"
        )
    # A model's sinks or slopes are parameters: named as the query is (the message of attn's own
    # function sent the user to this very function).
    for name in ("sinks", "alibi_slopes"):
        tensor = None if extras is None else extras.get(name)
        if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
            raise ValueError(
                f"{name}: requires grad, but attention against a KVCache has no backward pass "
                f"(pass {name}.detach(), or decode under torch.no_grad() or "
                "torch.inference_mode())"
            )
    dtype = query.dtype
    computed = query if dtype in _DIRECT_DTYPE_SET else _as_float32(query)
    if _torch_threads() != _followed_threads[0]:
        _follow_torch_threads()
    arguments = (computed, cache, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if extras is None:
        output = _sdpa_function(*arguments)
    else:
        output = _sdpa_function(*arguments, **extras)
    return output if output.dtype is dtype else output.to(dtype)


def _type_name(value):
    """A value's type as PyTorch's argument errors name it: "int", "NoneType", "Tensor",
    "numpy.bool"."""
    if isinstance(value, torch.Tensor):
        return "Tensor"
    kind = type(value)
    if kind.__module__ == "builtins":
        return kind.__name__
    return f"{kind.__module__}.{kind.__qualname__}"


def _argument_error(name, expected, value):
    return TypeError(
        f"scaled_dot_product_attention(): argument '{name}' must be {expected}, "
        f"not {_type_name(value)}"
    )


def _bool_argument(name, value):
    """`value` when it is True or False; else PyTorch's TypeError for the argument (an int, None,
    a NumPy bool or a tensor is refused, as torch's SDPA refuses them)."""
    if value is True or value is False:
        return value
    if isinstance(value, torch.SymBool):  # traced with dynamic shapes: specialised, as before
        return bool(value)
    raise _argument_error(name, "bool", value)


def _float_argument(name, value, optional=False):
    """`value` as a float where PyTorch's SDPA takes it as one (a Python or NumPy real, a bool, a
    real 0-dim tensor; None when `optional`); else PyTorch's TypeError for the argument."""
    if value is None and optional:
        return value
    if type(value) is not float:
        if not (
            isinstance(value, (_numbers.Real, torch.SymFloat, torch.SymInt))
            or (isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_complex())
        ):
            raise _argument_error(name, "float", value)
        value = float(value)
    # A finite number past float32 (softcap=1e300) would reach attn as ±inf and be refused as
    # "got inf": named as typed.
    if _FLOAT32_MAX < abs(value) < float("inf"):
        raise ValueError(
            f"{name}: expected a number float32 holds (within ±3.4e38; attn computes in "
            f"float32), got {value:g}"
        )
    return value


def _checked_sdpa_arguments(dropout_p, is_causal, scale, enable_gqa, softcap, alignment, causal,
                            dropout):
    """The scalar arguments of scaled_dot_product_attention checked as PyTorch checks its own
    (attn's additions alike): a wrong type is a TypeError naming the argument, in PyTorch's words
    where PyTorch has the argument."""
    if alignment is not None and not isinstance(alignment, str):
        raise _argument_error("alignment", "str or None", alignment)
    return (
        _float_argument("dropout_p", dropout_p),
        _bool_argument("is_causal", is_causal),
        _float_argument("scale", scale, optional=True),
        _bool_argument("enable_gqa", enable_gqa),
        _float_argument("softcap", softcap, optional=True),
        alignment,
        _bool_argument("causal", causal),
        _float_argument("dropout", dropout, optional=True),
    )


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    *,
    window: Optional[tuple[Optional[int], Optional[int]]] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    softcap: Optional[float] = None,
    sinks: Optional[torch.Tensor] = None,
    valid_lens: Optional[torch.Tensor] = None,
    alignment: str | None = None,
    causal: bool = False,
    dropout: Optional[float] = None,
) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` computed by attn, with autograd and
    ``torch.compile(fullgraph=True)`` support (custom operators attn::sdpa, attn::sdpa_backward).

    query (..., H_q, L, E), key (..., H_kv, S, E), value (..., H_kv, S, Ev) → (..., H_q, L, Ev),
    CPU tensors; the arguments are those of ``attn.scaled_dot_product_attention`` (window,
    alibi_slopes, softcap, sinks, valid_lens, alignment besides PyTorch's; the book's
    ``causal=True``, aligned bottom-right, and ``dropout=``; an integer tensor or list as
    attn_mask is read as valid_lens). query, key and value share one dtype (a mix is a
    TypeError, as PyTorch's). float16 and bfloat16 are computed by attn's half kernels as
    PyTorch computes them (fp32 scores, softmax and accumulation, the output rounded once to
    their dtype), their gradients too; float64 is computed in float32, the output returned in
    float64. A float attn_mask, alibi_slopes and sinks are used in float32 whatever the
    inputs' dtype. Gradients reach query, key, value, a float attn_mask that requires grad
    (summed over its broadcast axes) and sinks; alibi_slopes get none. Dropout (whenever
    dropout_p > 0, as PyTorch) draws its seed from PyTorch's generator, so ``torch.manual_seed``
    makes it reproducible.

    Eager calls (not compiling, tracing, under a dispatch mode or a torch.func transform; plain
    tensors) run the operators' implementations directly, without their dispatch: in inference
    (no input requiring grad, or grad mode off) as a plain call — to
    ``attn.scaled_dot_product_attention`` itself when no mask, dropout or other argument beyond
    is_causal, scale and enable_gqa is given (an alignment too, where the call is not causal) and
    the three tensors are float32, float16 or bfloat16 alike — and under autograd through a ``torch.autograd.Function`` with the
    operators' gradients.

    Under torch.func transforms (grad, vjp, jacrev, vmap and their compositions, such as
    per-sample gradients) it runs the operators through autograd Functions those transforms
    accept (the operators' own autograd kernels they refuse); vmap makes one call for the
    batch where every tensor of the call's shapes is batched alike, one per sample otherwise.
    There is no second derivative and no forward mode (jvp), as for PyTorch's CPU kernels.

    With an ``attn.KVCache`` as key (value None or the same cache) it is the decode call of
    ``attn.scaled_dot_product_attention``, for inference: there is no backward pass, so a query
    that requires grad is refused while autograd records.

    Under ``torch.autocast("cpu")`` it casts as autocast casts PyTorch's function (one of its
    lower-precision operators): float32, float16 and bfloat16 query, key, value and float
    attn_mask to the autocast dtype, so the output is in that dtype; float64 and bool stay.

    Scalar arguments take what PyTorch's take (is_causal and enable_gqa only True or False;
    dropout_p and scale a Python or NumPy real or a 0-dim tensor) and refuse the rest with
    PyTorch's TypeError, word for word; attn's softcap, causal, dropout and alignment alike."""
    if _forward_ad._current_level >= 0:  # (one attribute read outside dual_level())
        _refuse_tangents(query, key, value, attn_mask, alibi_slopes, sinks)
    if _cpu_autocast():
        query, key, value, attn_mask = _autocast_inputs(query, key, value, attn_mask)
    # The plain call (no dropout or attn's extra arguments; plain tensors of one dtype that attn
    # computes as it is; no mask, or a bool, float32 or half one that needs no gradient, as
    # transformers passes for padding and static caches), eager: in inference attn's own function
    # on the tensors, without the argument handling below — 14 → 10 µs a decode-sized call, 7.8 →
    # 4.4 with a mask, 9.5 → 6.5 with a bfloat16 one; under autograd _PlainSdpa. The test is
    # ordered and written for its cost (0.45 → 0.23 µs): the types first (a KVCache key fails
    # there), dtypes compared by identity (torch's dtypes are singletons).
    if (
        type(query) is _Tensor
        and type(key) is _Tensor
        and type(value) is _Tensor
        and (
            attn_mask is None
            or type(attn_mask) is _Tensor
            and attn_mask.dtype in _PLAIN_MASK_DTYPES
            and not attn_mask.requires_grad
        )
        and dropout_p == 0.0
        and dropout is None
        and not causal
        and window is None
        and alibi_slopes is None
        and softcap is None
        and sinks is None
        and valid_lens is None
        # Alignment places only a causal diagonal here (no window or ALiBi on this path): a call
        # that is not causal computes the same for either, as decoding code that passes
        # alignment="bottom-right" for every step makes its one-query steps here (8 heads of 64
        # over 1024 bf16 keys, one thread of the Xeon dev: 92-106 → 86 µs warm, 295-298 → 218-243
        # µs with the cache read from memory).
        and (
            alignment is None
            or alignment == "top-left"
            or alignment == "bottom-right" and is_causal is False
        )
        and (dtype := query.dtype) in _DIRECT_DTYPE_SET
        and key.dtype is dtype
        and value.dtype is dtype
    ):
        eager = _eager_plain(query, key, value)
        if eager is not None:
            # PyTorch's types as they are, checked by identity (cheaper than the conversions they
            # replace); anything else goes through the checks that name the argument.
            if (
                (is_causal is True or is_causal is False)
                and (enable_gqa is True or enable_gqa is False)
                and (scale is None or type(scale) is float)
            ):
                options = (is_causal, scale, enable_gqa)
            else:
                options = (
                    _bool_argument("is_causal", is_causal),
                    _float_argument("scale", scale, optional=True),
                    _bool_argument("enable_gqa", enable_gqa),
                )
            # Leading axes that differ are broadcast once attn has refused them (no cost to the
            # calls whose shapes agree).
            try:
                if eager == "inference":
                    if _torch_threads() != _followed_threads[0]:
                        _follow_torch_threads()
                    return _sdpa_function(query, key, value, attn_mask, 0.0, *options)
                return _PlainSdpa.apply(query, key, value, attn_mask, *options)
            except _ShapeError:
                broadcast = _broadcast_leading(query, key, value, enable_gqa)
                if broadcast is None:
                    raise
                return scaled_dot_product_attention(*broadcast, attn_mask, 0.0, *options)
            except ValueError:
                # Meta tensors go on to the general path, which gives them the operator's shapes.
                if not _on_meta(query, key, value, attn_mask):
                    raise
    # Nested tensors (jagged ones are a tensor subclass, which would reach the operator and its
    # NotImplementedError): refused in the words of the array import's refusal of strided ones.
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if isinstance(tensor, _Tensor) and tensor.is_nested:
            raise TypeError(
                f"{name}: expected a strided tensor, got a nested one (pad it, e.g. "
                ".to_padded_tensor(0), and pass valid lengths or a mask)"
            )
    if isinstance(key, _attn.KVCache):
        extras = None
        if (
            window is not None
            or alibi_slopes is not None
            or softcap is not None
            or sinks is not None
            or valid_lens is not None
            or alignment is not None
            or causal
            or dropout is not None
        ):
            extras = {
                "window": window,
                "alibi_slopes": alibi_slopes,
                "softcap": softcap,
                "sinks": sinks,
                "valid_lens": valid_lens,
                "alignment": alignment,
                "causal": causal,
                "dropout": dropout,
            }
        # The scalars go to attn's function as they are, whose binding refuses what PyTorch
        # refuses: checked only when it did, for PyTorch's message (no cost to a decode step).
        try:
            return _cache_attention(
                query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, extras
            )
        except TypeError:
            try:
                _checked_sdpa_arguments(dropout_p, is_causal, scale, enable_gqa, softcap,
                                        alignment, causal, dropout)
            except TypeError as named:
                raise named from None  # the binding's own message adds nothing to it
            raise
    dropout_p, is_causal, scale, enable_gqa, softcap, alignment, causal, dropout = (
        _checked_sdpa_arguments(dropout_p, is_causal, scale, enable_gqa, softcap, alignment, causal,
                                dropout)
    )
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            got = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(f"{name}: expected a floating-point torch.Tensor, got {got}")
    if dropout is not None:
        if dropout_p != 0.0:
            raise ValueError(
                "dropout: the book's name of dropout_p; give one of dropout_p and dropout"
            )
        dropout_p = dropout
    if causal:
        if is_causal:
            raise ValueError(
                "causal: the book's causal=True (aligned bottom-right) and is_causal=True "
                "(PyTorch's, aligned top-left) were both given; give one"
            )
        if alignment is not None and alignment != "bottom-right":
            raise ValueError(
                "alignment: causal=True is the book's causal, aligned bottom-right, got "
                f'alignment="{alignment}" beside it; for a causal mask aligned top-left pass '
                "is_causal=True instead"
            )
        is_causal, alignment = True, "bottom-right"
    elif alignment is None:
        alignment = "top-left"
    lengths_from_mask = _is_lengths(attn_mask)
    if lengths_from_mask:
        if valid_lens is not None:
            raise ValueError(
                "attn_mask: integer lengths here are read as valid_lens, which was given too; "
                "pass a bool or float mask as attn_mask"
            )
        attn_mask, valid_lens = None, attn_mask
    valid_lens = _as_tensor(
        valid_lens, torch.int64, _MASK_LENGTHS if lengths_from_mask else "valid_lens"
    )
    if lengths_from_mask:
        _warn_if_token_mask(valid_lens, key)
    alibi_slopes = _as_float32(
        _as_tensor(alibi_slopes, torch.float32, "alibi_slopes"), "alibi_slopes")
    sinks = _as_float32(_as_tensor(sinks, torch.float32, "sinks"), "sinks")
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        attn_mask = torch.as_tensor(attn_mask)
    if (
        attn_mask is not None
        and attn_mask.dtype not in _PLAIN_MASK_DTYPES
        and attn_mask.is_floating_point()
    ):
        # (others, complex ones, refused naming their dtype)
        attn_mask = _as_float32(attn_mask, "attn_mask", below_is_minus_infinity=True)
    window_left, window_right = _window_arguments(window)
    # Dropout of every weight (dropout_p = 1), as PyTorch: a zero output and zero gradients. attn's
    # kernels take probabilities below 1 (each kept weight is scaled by 1/(1 − p)): the pass without
    # dropout, times zero, gives both (its output is finite: attn refuses non-finite inputs).
    drops_all = dropout_p == 1.0
    if drops_all:
        dropout_p = 0.0
    seed = torch.randint(0, _SEED_BOUND, ()) if dropout_p > 0.0 else None
    computed_query, computed_key, computed_value = _computed_dtypes(query, key, value)
    options = (
        attn_mask,
        valid_lens,
        alibi_slopes,
        sinks,
        seed,
        float(dropout_p),
        bool(is_causal),
        None if scale is None else float(scale),
        bool(enable_gqa),
        window_left,
        window_right,
        None if softcap is None else float(softcap),
        alignment,
        False,  # output_residual: the autograd Functions ask for them
    )
    eager = _eager(computed_query, computed_key, computed_value, attn_mask, valid_lens,
                   alibi_slopes, sinks)
    computed = (computed_query, computed_key, computed_value)
    if eager is None:
        # The operators' fake output follows the query's shape: broadcast before tracing them.
        computed = _broadcast_leading(*computed, enable_gqa) or computed
    try:
        try:
            output = _general_call(eager, *computed, options)
        except _ShapeError:
            broadcast = None if eager is None else _broadcast_leading(*computed, enable_gqa)
            if broadcast is None:
                raise
            output = _general_call(eager, *broadcast, options)
        except ValueError:
            # Tensors on the meta device (shape inference; FlopCounterMode over a model built on
            # it), which attn's kernels refuse: the operator's fake implementation gives the
            # output's shape and dtype, as PyTorch's function gives them, and its gradients'.
            if eager is None or not _on_meta(*computed, attn_mask, alibi_slopes, sinks):
                raise
            computed = _broadcast_leading(*computed, enable_gqa) or computed
            output = _general_call(None, *computed, options)
    except ValueError as error:  # attn.ShapeError is one
        if lengths_from_mask and str(error).startswith("valid_lens"):
            raise _mask_lengths_error(error) from None
        raise
    if drops_all:
        output = output * 0.0
    return output if output.dtype == query.dtype else output.to(query.dtype)


# --- torch.nn.functional.scaled_dot_product_attention replaced by attn's --------------------------


def _computes(query, key, value, attn_mask, is_causal=False):
    """Whether attn computes PyTorch's call on these arguments as PyTorch would: plain CPU
    tensors (not nested, of either layout, nor sparse, nor on other devices), query, key and
    value in float32, float16 or bfloat16 (PyTorch computes float64 in float64, attn in
    float32), a bool or floating mask (attn would read an integer one as valid lengths, which
    PyTorch refuses). Calls PyTorch refuses and attn's own function takes go to PyTorch's for
    its error: a mask with is_causal, a mask of one axis, a floating mask neither float32 nor of
    the query's dtype."""

    def plain(tensor):
        return (
            (type(tensor) is _Tensor or type(tensor) in _TRACED_TENSOR_TYPES)
            and tensor.device.type == "cpu"
            and not tensor.is_nested
            and not tensor.is_sparse
        )

    if not all(plain(x) and x.dtype in _DIRECT_DTYPE_SET for x in (query, key, value)):
        return False
    if attn_mask is None:
        return True
    if not plain(attn_mask) or is_causal is True or attn_mask.dim() < 2:
        return False
    return attn_mask.dtype in (torch.bool, torch.float32, query.dtype)


# The tensors of a compiled graph's tracing that _computes takes as plain ones: Dynamo keeps
# F.multi_head_attention_forward (nn.MultiheadAttention, the nn.Transformer* layers) whole in its
# graph, and AOTAutograd runs it on these, whose calls of the function then reach attn's
# operators (they were handed to PyTorch's, and a compiled layer never ran attn).
_TRACED_TENSOR_TYPES = frozenset((torch._subclasses.fake_tensor.FakeTensor,
                                  torch._subclasses.functional_tensor.FunctionalTensor))


# The words of attn's refusals that override_sdpa hands to PyTorch's own function (inputs it
# computes with NaN or ∞ carried on, or at magnitudes attn's float32 scores do not hold).
_OVERRIDE_GIVES_PYTORCH_THESE = ("finite", "2^127", "float32 holds")


class override_sdpa:
    """Makes ``torch.nn.functional.scaled_dot_product_attention`` attn's, so that a model that
    calls PyTorch's function — directly, or through ``torch.nn.MultiheadAttention`` and
    ``torch.nn.Transformer*`` where they take ``F.multi_head_attention_forward`` (training, or
    any call their fast path declines) — runs attn's attention, forward and backward, also
    under ``torch.compile``::

        with attn.torch.override_sdpa():
            loss = model(batch).loss     # every F.scaled_dot_product_attention inside is attn's
        attn.torch.override_sdpa()       # or from here on (``.restore()`` undoes it)

    Calls attn does not compute as PyTorch would go to PyTorch's function unchanged: tensors on
    another device, nested or sparse tensors, float64 (which PyTorch computes in float64, attn in
    float32), integer masks (PyTorch's error), calls under a torch.func transform (which may ask
    for forward-mode or second derivatives, which attn lacks). Code that bound the function
    before (``from torch.nn.functional import scaled_dot_product_attention``) and PyTorch's
    C++ callers (the modules' inference fast path) keep PyTorch's. Nests: each restores what
    it replaced."""

    def __init__(self):
        self._replaced = nn.functional.scaled_dot_product_attention
        original = self._replaced

        def attend(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                   scale=None, enable_gqa=False, **later_arguments):
            # Arguments a later PyTorch may add are PyTorch's to handle, and so are calls under a
            # torch.func transform, which may ask for derivatives attn lacks (forward mode,
            # second order).
            if (
                not later_arguments
                and not _under_torch_func()
                and _computes(query, key, value, attn_mask, is_causal)
            ):
                try:
                    return scaled_dot_product_attention(
                        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
                    )
                except ValueError as error:
                    # Inputs that are not finite (an fp16 overflow upstream; a scale of inf), or
                    # past what attn's float32 base-2 scores hold (mask entries past 2^127,
                    # float64 values past float32), which attn refuses: PyTorch's function
                    # carries them on, as a model written for it expects.
                    message = str(error)
                    if not any(words in message for words in _OVERRIDE_GIVES_PYTORCH_THESE):
                        raise
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                            is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                            **later_arguments)

        attend.__doc__ = "attn's scaled_dot_product_attention (attn.torch.override_sdpa)."
        attend._attn_override = self
        self._active = True
        nn.functional.scaled_dot_product_attention = attend

    def restore(self):
        """Ends this override: puts back the function it replaced, or, while a later override
        is in place, leaves that one there and lets its restore skip this one."""
        self._active = False
        current = nn.functional.scaled_dot_product_attention
        while getattr(current, "_attn_override", None) is not None:
            if current._attn_override._active:
                break
            current = current._attn_override._replaced
        nn.functional.scaled_dot_product_attention = current

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.restore()
