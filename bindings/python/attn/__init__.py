"""attn: the attention layers of *Dive into Deep Learning* over NumPy arrays and PyTorch tensors,
computed by attn's C++ library (masked softmax, additive, scaled dot-product and multi-head
attention, Nadaraya–Watson Gaussian-kernel pooling).

Arrays go in as NumPy arrays or anything speaking DLPack (PyTorch CPU tensors among them); float32
C-contiguous ones are read in place, without a copy. Results come back as NumPy arrays, or as
PyTorch tensors when the queries were one. The functions run outside autograd, so they refuse a
torch tensor that requires grad while grad mode is on (its gradient would be lost):
``attn.torch`` has ``scaled_dot_product_attention`` and the layers as ``torch.nn.Module``s with
autograd support. ``KVCache`` holds keys and values for decoding (float32, float16, bfloat16 or
int8), which ``scaled_dot_product_attention(query, cache)`` reads in that precision.
"""

import math as _math
import os as _os
from importlib import metadata as _metadata

from ._attn import (
    AdditiveAttention,
    DotProductAttention,
    FileError,
    GaussianKernelPooling,
    GeneralAttention,
    KVCache,
    MultiHeadAttention,
    ShapeError,
    additive_attention,
    amx_status,
    bf16_dot_status,
    bf16_probabilities_status,
    cached_bytes,
    empty_cache,
    gaussian_kernel_pooling,
    get_num_threads,
    available_simd_targets,
    get_strict_inputs,
    limit_simd_target,
    load_safetensors,
    masked_softmax,
    save_safetensors,
    scaled_dot_product_attention,
    set_num_threads,
    set_strict_inputs,
    simd_target,
    _data_pointer,
    _load_safetensors_metadata,
)

from ._arguments import named_argument_errors as _named_argument_errors

# Calls whose typed arguments nanobind may refuse answer naming the argument at fault (PyTorch's
# words) instead of the signature: these settings and file functions through a Python wrapper
# (0.1-0.2 µs a call, nothing for them). The layers' and KVCache's constructors and the array
# functions convert their scalars in C++ instead (nanobind builds an instance without looking up a
# replaced __init__, and a wrapper would add 10% to a 1.3 µs masked_softmax call); the layers'
# methods and masked_softmax take only arrays, as objects.
limit_simd_target = _named_argument_errors(limit_simd_target, "limit_simd_target")
load_safetensors = _named_argument_errors(load_safetensors, "load_safetensors")
save_safetensors = _named_argument_errors(save_safetensors, "save_safetensors")
set_num_threads = _named_argument_errors(set_num_threads, "set_num_threads")
set_strict_inputs = _named_argument_errors(set_strict_inputs, "set_strict_inputs")

try:
    __version__ = _metadata.version("attn")
except _metadata.PackageNotFoundError:  # imported from a build tree rather than installed
    __version__ = "unknown"

__all__ = [
    "AdditiveAttention",
    "DotProductAttention",
    "FileError",
    "GaussianKernelPooling",
    "GeneralAttention",
    "KVCache",
    "MultiHeadAttention",
    "ShapeError",
    "additive_attention",
    "amx_status",
    "bf16_dot_status",
    "bf16_probabilities_status",
    "available_simd_targets",
    "cached_bytes",
    "empty_cache",
    "gaussian_kernel_pooling",
    "get_num_threads",
    "get_strict_inputs",
    "limit_simd_target",
    "load",
    "load_safetensors",
    "masked_softmax",
    "save_safetensors",
    "scaled_dot_product_attention",
    "set_num_threads",
    "set_strict_inputs",
    "simd_target",
]

_LAYERS = {
    "AdditiveAttention": AdditiveAttention,
    "DotProductAttention": DotProductAttention,
    "GaussianKernelPooling": GaussianKernelPooling,
    "GeneralAttention": GeneralAttention,
    "MultiHeadAttention": MultiHeadAttention,
}

# A constructor argument in a file's metadata is a short literal: an int, a float, True, False or
# None (what ``layer.save`` writes). Anything longer or else is refused, never evaluated.
_MAX_ARGUMENT_LENGTH = 64


def _argument(path, key, text):
    """The value of constructor argument ``key`` written as ``text`` in the metadata of ``path``."""
    constants = {"True": True, "False": False, "None": None}
    if text in constants:
        return constants[text]
    if len(text) <= _MAX_ARGUMENT_LENGTH:
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            pass
    shown = text if len(text) <= _MAX_ARGUMENT_LENGTH else text[:_MAX_ARGUMENT_LENGTH] + "..."
    raise FileError(
        f"{_os.fspath(path)}: metadata {key!r}: expected a number, True, False or None "
        f"(at most {_MAX_ARGUMENT_LENGTH} characters), got {shown!r}"
    )


def _parameter_count(name, kwargs):
    """The parameter values a layer ``name`` built from ``kwargs`` holds, None where it has no
    sizes or a size is not a non-negative int (the constructor then says what is wrong)."""
    formulas = {
        "MultiHeadAttention": (("key_size", "query_size", "value_size", "num_hiddens"),
                               lambda k, q, v, h: h * (q + k + v + h)
                               + (4 * h if kwargs.get("bias") else 0)),
        "AdditiveAttention": (("key_size", "query_size", "num_hiddens"),
                              lambda k, q, h: h * (k + q + 1)),
        "GeneralAttention": (("key_size", "query_size"), lambda k, q: k * q),
    }
    if name not in formulas:
        return None  # DotProductAttention, GaussianKernelPooling: no sizes
    keys, count = formulas[name]
    sizes = [kwargs.get(key) for key in keys]
    if not all(type(size) is int and size >= 0 for size in sizes):
        return None
    return count(*sizes)


def load(path):
    """Rebuilds a layer saved with ``layer.save(path)``: its class and constructor arguments from
    the file's metadata, its parameters from the tensors. Training mode, as a new layer.

    A file written elsewhere (e.g. ``safetensors.torch.save_file(module.state_dict(), path)``)
    has no such metadata: construct the layer and call ``layer.load(path)`` instead. Any problem
    with the file — unreadable, not a regular file, malformed, or metadata that builds no layer —
    raises attn.FileError naming it."""
    # attn's own reader: bounded JSON, FIFOs and devices refused before reading, FileError always.
    metadata = _load_safetensors_metadata(path)
    name = metadata.get("layer")
    if name not in _LAYERS:
        raise FileError(
            f"{_os.fspath(path)}: expected a layer saved by attn (metadata 'layer' one of "
            f"{sorted(_LAYERS)}), got {name!r}; construct the layer and call layer.load(path)"
        )
    kwargs = {
        key: _argument(path, key, value) for key, value in metadata.items() if key != "layer"
    }
    # The parameters the metadata's sizes ask for, checked against the values the file holds
    # before any is allocated: a 200-byte file of sizes 40000 asked for 25 GB (MemoryError, or
    # the machine's memory) before its tensors were looked at.
    wanted = _parameter_count(name, kwargs)
    if wanted is not None and wanted > (
        held := sum(_math.prod(array.shape) for array in load_safetensors(path).values())
    ):
        raise FileError(
            f"{_os.fspath(path)}: metadata sizes {kwargs} ask for a {name} of {wanted} "
            f"parameters, but the file holds {held} values"
        )
    try:
        layer = _LAYERS[name](**kwargs)
    except (TypeError, ValueError) as error:
        raise FileError(
            f"{_os.fspath(path)}: metadata does not build a {name}: {error}"
        ) from None
    layer.load(path)
    return layer
