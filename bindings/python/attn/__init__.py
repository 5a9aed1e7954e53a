"""attn: the attention layers of *Dive into Deep Learning* over NumPy arrays and PyTorch tensors,
computed by attn's C++ library (masked softmax, additive, scaled dot-product and multi-head
attention, Nadaraya–Watson Gaussian-kernel pooling).

Arrays go in as NumPy arrays or anything speaking DLPack (PyTorch CPU tensors among them); float32
C-contiguous ones are read in place, without a copy. Results come back as NumPy arrays, or as
PyTorch tensors when the queries were one. ``attn.torch`` wraps the layers as ``torch.nn.Module``s
with autograd support. ``KVCache`` holds keys and values for decoding (float32, float16, bfloat16
or int8), which ``scaled_dot_product_attention(query, cache)`` reads in that precision.
"""

import ast as _ast
import json as _json
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
    gaussian_kernel_pooling,
    get_num_threads,
    get_strict_inputs,
    load_safetensors,
    masked_softmax,
    save_safetensors,
    scaled_dot_product_attention,
    set_num_threads,
    set_strict_inputs,
    _data_pointer,
)

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
    "gaussian_kernel_pooling",
    "get_num_threads",
    "get_strict_inputs",
    "load",
    "load_safetensors",
    "masked_softmax",
    "save_safetensors",
    "scaled_dot_product_attention",
    "set_num_threads",
    "set_strict_inputs",
]

_LAYERS = {
    "AdditiveAttention": AdditiveAttention,
    "DotProductAttention": DotProductAttention,
    "GaussianKernelPooling": GaussianKernelPooling,
    "GeneralAttention": GeneralAttention,
    "MultiHeadAttention": MultiHeadAttention,
}

# A safetensors header is at most this long (the format's own limit is 100 MB).
_MAX_HEADER_BYTES = 100_000_000


def _safetensors_metadata(path):
    """The string metadata (``__metadata__``) of a safetensors file, {} when it has none."""
    with open(path, "rb") as file:
        prefix = file.read(8)
        if len(prefix) != 8:
            raise FileError(
                f"{_os.fspath(path)}: expected a safetensors file, got {len(prefix)} bytes"
            )
        size = int.from_bytes(prefix, "little")
        if size > _MAX_HEADER_BYTES:
            raise FileError(
                f"{_os.fspath(path)}: header of {size} bytes exceeds {_MAX_HEADER_BYTES}"
            )
        header = file.read(size)
    try:
        metadata = _json.loads(header).get("__metadata__", {})
    except (ValueError, AttributeError) as error:
        raise FileError(f"{_os.fspath(path)}: header is not a JSON object ({error})") from None
    return metadata if isinstance(metadata, dict) else {}


def load(path):
    """Rebuilds a layer saved with ``layer.save(path)``: its class and constructor arguments from
    the file's metadata, its parameters from the tensors. Training mode, as a new layer.

    A file written elsewhere (e.g. ``safetensors.torch.save_file(module.state_dict(), path)``)
    has no such metadata: construct the layer and call ``layer.load(path)`` instead."""
    metadata = _safetensors_metadata(path)
    name = metadata.get("layer")
    if name not in _LAYERS:
        raise ValueError(
            f"{_os.fspath(path)}: expected a layer saved by attn (metadata 'layer' one of "
            f"{sorted(_LAYERS)}), got {name!r}; construct the layer and call layer.load(path)"
        )
    kwargs = {key: _ast.literal_eval(value) for key, value in metadata.items() if key != "layer"}
    layer = _LAYERS[name](**kwargs)
    layer.load(path)
    return layer
