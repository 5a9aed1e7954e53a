#!/usr/bin/env python3
# Golden fixtures for attn's layers: runs the PyTorch code of d2l.ai's attention chapters and
# writes its inputs, parameters, outputs, attention weights and autograd gradients under
# tests/fixtures/<case>/.
"""Generate the PyTorch golden fixtures that tests/nn/pytorch_fixtures_test.cpp reads.

What it does
    Re-states, in this file, the PyTorch code of "Dive into Deep Learning" (d2l.ai), chapters
    "Attention Scoring Functions" (masked_softmax with the -1e6 trick, AdditiveAttention,
    DotProductAttention) and "Multi-Head Attention" (MultiHeadAttention with transpose_qkv /
    transpose_output, in the book's older signature that takes key/query/value sizes), plus
    Nadaraya-Watson Gaussian-kernel pooling, softmax(-((q - k) * w)**2 / 2) then a weighted sum.
    No d2l package is used. Every module runs in eval mode (dropout off) under a fixed seed, on
    one CPU thread, so a rerun writes the same bytes.

    Each case becomes a folder tests/fixtures/<case>/ holding
        queries.npy, keys.npy, values.npy   float32 inputs, (B, n, q), (B, m, k), (B, m, v)
        valid_lens.npy                      int64, (B,) or (B, n); absent when no mask is used
        params.safetensors                  the module's state_dict() (PyTorch names, Linear
                                            weights as (out, in)); absent for modules without
                                            parameters (DotProductAttention)
        output.npy                          float32 module output
        weights.npy                         float32 module.attention_weights; for multi-head
                                            attention the inner attention's (B*heads, n, m)
        case.json                           the layer and its hyper-parameters
        grad_output.npy                     float32 G, shaped like output.npy: a fixed random
                                            upstream gradient
        grads/                              PyTorch autograd's gradients of (output * G).sum(),
                                            float32, each shaped like what it differentiates:
            queries.npy, keys.npy, values.npy   w.r.t. the inputs
            <name>.npy                      w.r.t. each parameter, named as in the state dict
                                            (W_q.weight.npy, ..., w.npy); none for
                                            DotProductAttention
    and tests/fixtures/README.md describes this layout. The book's toy examples (toy_*) have no
    grad_output.npy or grads/: they check forward outputs only.

    G comes from its own generator, seeded from GRAD_SEED and the case name, so adding the
    gradients left the torch.manual_seed(SEED) stream, and with it every other file, unchanged.
    The gradients are taken in eval mode, like the outputs, in a second forward pass with
    requires_grad on the inputs (the first, under no_grad, writes output.npy).

    Valid lengths are all >= 1. A valid length of 0 is where attn deliberately differs from the
    book: the book's -1e6 trick then gives uniform weights over all m keys (every score is
    -1e6), while attn gives all-zero weights (the query attends to nothing). So no fixture holds
    one. With every length >= 1 the gradients agree too: a masked score's exp(-1e6 - max)
    underflows to exactly 0 in float32, so its weight and its softmax gradient are exactly 0, as
    attn's exact masking gives.

How to run (from the repository root)
    build/venv/bin/python tools/make_fixtures.py
    Needs torch, numpy and safetensors from PyPI; only regenerating the fixtures needs them, the
    test suite never does.

Generated with torch 2.15.0+cu132 (run on the CPU), numpy 2.4.6, safetensors 0.8.0.
"""

import json
import math
import pathlib
import zlib

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

SEED = 20240607
GRAD_SEED = 20250301  # for the upstream gradients G, kept apart from SEED's stream
FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"


# --- The book's code (d2l.ai, PyTorch version) ------------------------------------------------


def sequence_mask(X, valid_len, value=0.0):
    """Sets the entries of each row of X (rows, m) at or beyond its valid length to value."""
    maxlen = X.size(1)
    mask = torch.arange(maxlen, dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
    X[~mask] = value
    return X


def masked_softmax(X, valid_lens):
    """Softmax over the last axis of X (B, n, m), keeping only the first valid_lens keys."""
    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    # Masked scores become -1e6, whose exponential is 0 in float32.
    X = sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
    return nn.functional.softmax(X.reshape(shape), dim=-1)


class AdditiveAttention(nn.Module):
    def __init__(self, key_size, query_size, num_hiddens, dropout):
        super().__init__()
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None):
        queries, keys = self.W_q(queries), self.W_k(keys)
        # (B, n, 1, h) + (B, 1, m, h) -> (B, n, m, h)
        features = torch.tanh(queries.unsqueeze(2) + keys.unsqueeze(1))
        scores = self.w_v(features).squeeze(-1)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


class DotProductAttention(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


class MultiHeadAttention(nn.Module):
    def __init__(self, key_size, query_size, value_size, num_hiddens, num_heads, dropout,
                 bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.attention = DotProductAttention(dropout)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=bias)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=bias)
        self.W_v = nn.Linear(value_size, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

    def transpose_qkv(self, X):
        # (B, n, h) -> (B, heads, n, h / heads) -> (B * heads, n, h / heads)
        X = X.reshape(X.shape[0], X.shape[1], self.num_heads, -1)
        X = X.permute(0, 2, 1, 3)
        return X.reshape(-1, X.shape[2], X.shape[3])

    def transpose_output(self, X):
        # The inverse of transpose_qkv.
        X = X.reshape(-1, self.num_heads, X.shape[1], X.shape[2])
        X = X.permute(0, 2, 1, 3)
        return X.reshape(X.shape[0], X.shape[1], -1)

    def forward(self, queries, keys, values, valid_lens=None):
        queries = self.transpose_qkv(self.W_q(queries))
        keys = self.transpose_qkv(self.W_k(keys))
        values = self.transpose_qkv(self.W_v(values))
        if valid_lens is not None:
            valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)
        output = self.attention(queries, keys, values, valid_lens)
        return self.W_o(self.transpose_output(output))


class GaussianKernelPooling(nn.Module):
    """The book's NWKernelRegression pooling, with keys shared by the queries of a batch element
    (B, m, d) instead of repeated per query, and the masked softmax of the other layers. For
    d > 1 the squared distance sums over the feature axis."""

    def __init__(self, width):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([width], dtype=torch.float32))

    def forward(self, queries, keys, values, valid_lens=None):
        differences = (queries.unsqueeze(2) - keys.unsqueeze(1)) * self.w  # (B, n, m, d)
        scores = -(differences**2).sum(-1) / 2
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.attention_weights, values)


# --- Writing cases ------------------------------------------------------------------------------


def write_gradients(folder, name, module, queries, keys, values, valid_lens, output_shape):
    """Writes grad_output.npy (a seeded G) and grads/: autograd's gradients of (output * G).sum()
    w.r.t. the inputs and every parameter, in eval mode."""
    # Seeded from the case name, so G does not depend on the order or number of cases.
    generator = torch.Generator().manual_seed(GRAD_SEED + zlib.crc32(name.encode("utf-8")))
    grad_output = torch.randn(output_shape, dtype=torch.float32, generator=generator)

    inputs = {"queries": queries.detach().clone().requires_grad_(True),
              "keys": keys.detach().clone().requires_grad_(True),
              "values": values.detach().clone().requires_grad_(True)}
    module.eval()
    module.zero_grad(set_to_none=True)
    output = module(inputs["queries"], inputs["keys"], inputs["values"], valid_lens)
    (output * grad_output).sum().backward()

    grads = folder / "grads"
    grads.mkdir()
    np.save(folder / "grad_output.npy", grad_output.numpy().astype(np.float32))
    for input_name, tensor in inputs.items():
        np.save(grads / f"{input_name}.npy", tensor.grad.numpy().astype(np.float32))
    for parameter_name, parameter in module.named_parameters():
        assert parameter.grad is not None, f"{name}: {parameter_name} got no gradient"
        np.save(grads / f"{parameter_name}.npy", parameter.grad.numpy().astype(np.float32))
    # Every parameter is in the state dict under the same name (no buffers), so the C++ test can
    # require one gradient file per parameter it loads.
    assert ({parameter_name for parameter_name, _ in module.named_parameters()} ==
            set(module.state_dict())), f"{name}: parameters and state dict differ"


def write_case(name, config, module, queries, keys, values, valid_lens=None, weights_of=None,
               with_gradients=True):
    """Runs module in eval mode on the inputs and writes the case folder; with_gradients also
    writes grad_output.npy and grads/."""
    folder = FIXTURES / name
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.iterdir():
        if stale.is_dir():
            for stale_file in stale.iterdir():
                stale_file.unlink()
            stale.rmdir()
        else:
            stale.unlink()
    module.eval()
    with torch.no_grad():
        output = module(queries, keys, values, valid_lens)
    weights = (weights_of or module).attention_weights

    np.save(folder / "queries.npy", queries.numpy().astype(np.float32))
    np.save(folder / "keys.npy", keys.numpy().astype(np.float32))
    np.save(folder / "values.npy", values.numpy().astype(np.float32))
    if valid_lens is not None:
        assert int(valid_lens.min()) >= 1, "valid length 0: attn differs from the book there"
        np.save(folder / "valid_lens.npy", valid_lens.numpy().astype(np.int64))
    state = {key: tensor.detach().contiguous() for key, tensor in module.state_dict().items()}
    if state:
        save_file(state, str(folder / "params.safetensors"))
    np.save(folder / "output.npy", output.numpy().astype(np.float32))
    np.save(folder / "weights.npy", weights.numpy().astype(np.float32))

    config = dict(config)
    config["valid_lens"] = ("none" if valid_lens is None else
                            "per_batch" if valid_lens.dim() == 1 else "per_query")
    with open(folder / "case.json", "w", encoding="utf-8") as file:
        json.dump(config, file, indent=2, sort_keys=True)
        file.write("\n")

    if with_gradients:
        write_gradients(folder, name, module, queries, keys, values, valid_lens, output.shape)


def normal(*shape):
    return torch.randn(*shape, dtype=torch.float32)


def lengths(*values):
    return torch.tensor(values, dtype=torch.int64)


def additive_case(name, description, batch, n, m, query_size, key_size, num_hiddens, value_size,
                  valid_lens):
    dropout = 0.1  # a non-zero rate, so a layer left in training mode would not match
    module = AdditiveAttention(key_size, query_size, num_hiddens, dropout)
    config = {"description": description, "layer": "additive", "key_size": key_size,
              "query_size": query_size, "num_hiddens": num_hiddens, "dropout": dropout}
    write_case(name, config, module, normal(batch, n, query_size), normal(batch, m, key_size),
               normal(batch, m, value_size), valid_lens)


def dot_product_case(name, description, batch, n, m, d, value_size, valid_lens):
    dropout = 0.2
    module = DotProductAttention(dropout)
    config = {"description": description, "layer": "dot_product", "dropout": dropout}
    write_case(name, config, module, normal(batch, n, d), normal(batch, m, d),
               normal(batch, m, value_size), valid_lens)


def multi_head_case(name, description, batch, n, m, query_size, key_size, value_size, num_hiddens,
                    num_heads, bias, valid_lens):
    dropout = 0.1
    module = MultiHeadAttention(key_size, query_size, value_size, num_hiddens, num_heads, dropout,
                                bias=bias)
    config = {"description": description, "layer": "multi_head", "key_size": key_size,
              "query_size": query_size, "value_size": value_size, "num_hiddens": num_hiddens,
              "num_heads": num_heads, "bias": bias, "dropout": dropout}
    write_case(name, config, module, normal(batch, n, query_size), normal(batch, m, key_size),
               normal(batch, m, value_size), valid_lens, weights_of=module.attention)


def gaussian_case(name, description, batch, n, m, d, value_size, width, spread, valid_lens):
    module = GaussianKernelPooling(width)
    config = {"description": description, "layer": "gaussian", "width": width}
    # Points uniform in [0, spread)^d, with spread chosen against the width so that the weights
    # are neither flat nor one-hot.
    queries = torch.rand(batch, n, d) * spread
    keys = torch.rand(batch, m, d) * spread
    write_case(name, config, module, queries, keys, normal(batch, m, value_size), valid_lens)


def main():
    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # one thread, so reductions always run in the same order

    additive_case("additive_per_batch", "AdditiveAttention, one valid length per batch element",
                  batch=2, n=3, m=5, query_size=4, key_size=3, num_hiddens=6, value_size=2,
                  valid_lens=lengths(2, 5))
    additive_case("additive_per_query", "AdditiveAttention, one valid length per query",
                  batch=2, n=3, m=4, query_size=5, key_size=2, num_hiddens=7, value_size=3,
                  valid_lens=lengths([1, 4, 2], [3, 3, 4]))
    additive_case("additive_no_lens_n1", "AdditiveAttention, no mask, a single query",
                  batch=2, n=1, m=6, query_size=3, key_size=4, num_hiddens=5, value_size=2,
                  valid_lens=None)

    dot_product_case("dot_product_per_batch",
                     "DotProductAttention, one valid length per batch element",
                     batch=2, n=3, m=5, d=4, value_size=3, valid_lens=lengths(3, 1))
    dot_product_case("dot_product_per_query", "DotProductAttention, one valid length per query",
                     batch=2, n=4, m=3, d=6, value_size=2,
                     valid_lens=lengths([1, 2, 3, 2], [3, 1, 1, 2]))
    dot_product_case("dot_product_m1", "DotProductAttention, a single key (weights all 1)",
                     batch=2, n=3, m=1, d=4, value_size=3, valid_lens=None)

    multi_head_case("multi_head_no_bias_per_batch",
                    "MultiHeadAttention without bias, one valid length per batch element",
                    batch=2, n=4, m=4, query_size=5, key_size=3, value_size=4, num_hiddens=8,
                    num_heads=2, bias=False, valid_lens=lengths(3, 4))
    multi_head_case("multi_head_bias_per_query",
                    "MultiHeadAttention with bias, one valid length per query",
                    batch=2, n=3, m=3, query_size=4, key_size=4, value_size=4, num_hiddens=8,
                    num_heads=4, bias=True, valid_lens=lengths([1, 3, 2], [2, 2, 3]))
    multi_head_case("multi_head_n_ne_m",
                    "MultiHeadAttention with 2 queries and 5 keys, per-batch valid lengths",
                    batch=2, n=2, m=5, query_size=6, key_size=3, value_size=2, num_hiddens=6,
                    num_heads=3, bias=False, valid_lens=lengths(5, 2))

    gaussian_case("gaussian_width_1", "Gaussian-kernel pooling, width 1 (the book's model)",
                  batch=2, n=4, m=6, d=1, value_size=1, width=1.0, spread=4.0,
                  valid_lens=None)
    gaussian_case("gaussian_width_2_5",
                  "Gaussian-kernel pooling, width 2.5, 2-d points, per-batch valid lengths",
                  batch=2, n=3, m=5, d=2, value_size=2, width=2.5, spread=1.0,
                  valid_lens=lengths(4, 2))

    # The book's toy examples: every key is the same, so the weights are uniform over the valid
    # keys and the outputs are the means of the first 2 and 6 value rows: [[2, 3, 4, 5]] and
    # [[10, 11, 12, 13]].
    toy_keys = torch.ones((2, 10, 2))
    toy_values = torch.arange(40, dtype=torch.float32).reshape(1, 10, 4).repeat(2, 1, 1)
    toy_lens = torch.tensor([2, 6])
    write_case("toy_additive",
               {"description": "the book's AdditiveAttention example", "layer": "additive",
                "key_size": 2, "query_size": 20, "num_hiddens": 8, "dropout": 0.1},
               AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1),
               torch.normal(0, 1, (2, 1, 20)), toy_keys, toy_values, toy_lens,
               with_gradients=False)
    write_case("toy_dot_product",
               {"description": "the book's DotProductAttention example", "layer": "dot_product",
                "dropout": 0.5},
               DotProductAttention(dropout=0.5),
               torch.normal(0, 1, (2, 1, 2)), toy_keys, toy_values, toy_lens,
               with_gradients=False)


if __name__ == "__main__":
    main()
