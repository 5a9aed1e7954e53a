# A small NumPy (float64) restatement of the book's attention code, to check attn's Python module
# against something independent of both attn's C++ and PyTorch.
"""Float64 NumPy references: masked softmax, dot-product, additive, multi-head and Gaussian-kernel
attention, following d2l.ai's definitions (with exact masking: masked keys weigh exactly 0 and a
row of valid length 0 weighs nothing)."""

import numpy as np


def lengths_per_query(valid_lens, batch, queries, keys):
    """valid_lens None, (B,) or (B, n) as an int array (B, n)."""
    if valid_lens is None:
        return np.full((batch, queries), keys, dtype=np.int64)
    valid_lens = np.asarray(valid_lens, dtype=np.int64)
    if valid_lens.ndim == 1:
        return np.repeat(valid_lens[:, None], queries, axis=1)
    return valid_lens


def masked_softmax(scores, valid_lens=None):
    scores = np.asarray(scores, dtype=np.float64)
    batch, queries, keys = scores.shape
    lengths = lengths_per_query(valid_lens, batch, queries, keys)
    mask = np.arange(keys)[None, None, :] < lengths[:, :, None]
    shifted = np.where(mask, scores, -np.inf)
    row_max = np.max(shifted, axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    exps = np.where(mask, np.exp(shifted - row_max), 0.0)
    sums = exps.sum(axis=-1, keepdims=True)
    return np.divide(exps, sums, out=np.zeros_like(exps), where=sums > 0)


def dot_product_attention(queries, keys, values, valid_lens=None, scale=None):
    queries, keys, values = (np.asarray(a, dtype=np.float64) for a in (queries, keys, values))
    scale = 1.0 / np.sqrt(queries.shape[-1]) if scale is None else scale
    weights = masked_softmax(queries @ keys.transpose(0, 2, 1) * scale, valid_lens)
    return weights @ values, weights


def additive_attention(queries, keys, values, W_q, W_k, w_v, valid_lens=None):
    queries, keys, values = (np.asarray(a, dtype=np.float64) for a in (queries, keys, values))
    projected_queries = queries @ np.asarray(W_q, np.float64).T  # (B, n, h)
    projected_keys = keys @ np.asarray(W_k, np.float64).T  # (B, m, h)
    features = np.tanh(projected_queries[:, :, None, :] + projected_keys[:, None, :, :])
    scores = (features @ np.asarray(w_v, np.float64).T)[..., 0]
    weights = masked_softmax(scores, valid_lens)
    return weights @ values, weights


def gaussian_kernel_pooling(queries, keys, values, width=1.0, valid_lens=None):
    queries, keys, values = (np.asarray(a, dtype=np.float64) for a in (queries, keys, values))
    differences = (queries[:, :, None, :] - keys[:, None, :, :]) * width
    weights = masked_softmax(-(differences**2).sum(-1) / 2, valid_lens)
    return weights @ values, weights


def linear(x, state, name):
    y = x @ np.asarray(state[f"{name}.weight"], np.float64).T
    if f"{name}.bias" in state:
        y = y + np.asarray(state[f"{name}.bias"], np.float64)
    return y


def multi_head_attention(queries, keys, values, state, num_heads, valid_lens=None):
    queries, keys, values = (np.asarray(a, dtype=np.float64) for a in (queries, keys, values))

    def split_heads(x):  # (B, n, h) -> (B * heads, n, h / heads)
        batch, rows, hiddens = x.shape
        x = x.reshape(batch, rows, num_heads, hiddens // num_heads).transpose(0, 2, 1, 3)
        return x.reshape(batch * num_heads, rows, hiddens // num_heads)

    q = split_heads(linear(queries, state, "W_q"))
    k = split_heads(linear(keys, state, "W_k"))
    v = split_heads(linear(values, state, "W_v"))
    if valid_lens is not None:
        valid_lens = np.repeat(np.asarray(valid_lens, np.int64), num_heads, axis=0)
    heads, weights = dot_product_attention(q, k, v, valid_lens)
    batch = queries.shape[0]
    heads = heads.reshape(batch, num_heads, heads.shape[1], heads.shape[2]).transpose(0, 2, 1, 3)
    concatenated = heads.reshape(batch, heads.shape[1], -1)
    return linear(concatenated, state, "W_o"), weights


def sdpa(
    query,
    key,
    value,
    attn_mask=None,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    alignment="top-left",
    valid_lens=None,
):
    """PyTorch's scaled_dot_product_attention in float64 over (..., H, L, E) arrays: a bool mask
    hides keys (True = attend), a float one is added; causal hides keys past each query's
    diagonal (top-left: key i; bottom-right: key i + S − L); valid lengths (B,) or (B, L) hide
    keys past them; a row that sees no key gives zeros."""
    query, key, value = (np.asarray(a, dtype=np.float64) for a in (query, key, value))
    if enable_gqa and query.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        groups = query.shape[-3] // key.shape[-3]
        key = np.repeat(key, groups, axis=-3)
        value = np.repeat(value, groups, axis=-3)
    L, S = query.shape[-2], key.shape[-2]
    scale = 1.0 / np.sqrt(query.shape[-1]) if scale is None else scale
    scores = query @ np.swapaxes(key, -1, -2) * scale
    visible = np.ones(scores.shape, dtype=bool)
    if attn_mask is not None:
        attn_mask = np.asarray(attn_mask)
        if attn_mask.dtype == bool:
            visible = visible & attn_mask
        else:
            scores = scores + attn_mask
    rows, cols = np.arange(L)[:, None], np.arange(S)[None, :]
    diagonal = rows if alignment == "top-left" else rows + S - L
    if is_causal:
        visible = visible & (cols <= diagonal)
    if valid_lens is not None:
        lengths = np.asarray(valid_lens, dtype=np.int64)
        middle = (1,) * (scores.ndim - 3)
        shape = (lengths.shape[0], *middle, 1 if lengths.ndim == 1 else L, 1)
        visible = visible & (cols < lengths.reshape(shape))
    scores = np.where(visible, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    exps = np.where(visible, np.exp(scores - row_max), 0.0)
    sums = exps.sum(axis=-1, keepdims=True)
    weights = np.divide(exps, sums, out=np.zeros_like(exps), where=sums > 0)
    return weights @ value, weights
