# Type stubs for the attn package: the functions and layers of its C++ extension (attn._attn) and
# attn.load, with the array types they take and return.
import os
from typing import Any, Literal, Mapping, Sequence, TypeVar, Union

import numpy as np
import numpy.typing as npt

__version__: str

# NumPy arrays, PyTorch CPU tensors, or anything else speaking DLPack or the buffer protocol.
# float32 C-contiguous arrays are read in place; float64 or strided ones are copied
# (scaled_dot_product_attention also reads float16 and bfloat16 in place: see there).
ArrayLike = Any
# None (no mask), (B,) one length per batch element, or (B, n) one per query: an int array or
# tensor, or a list of ints / of equal-length lists of ints.
ValidLens = Union[None, Sequence[int], Sequence[Sequence[int]], ArrayLike]
# scaled_dot_product_attention's attn_mask: None, a bool or float array or tensor, or (the book's
# call) integer valid lengths.
Mask = Union[None, ArrayLike, Sequence[int], Sequence[Sequence[int]]]
# One float per query head: None, a 1-d float array or tensor, or a list of numbers.
Floats = Union[None, Sequence[float], ArrayLike]
# A NumPy float32 array, or a torch.Tensor when the (first) input was one; float16 or bfloat16
# where scaled_dot_product_attention's inputs were.
Array = Any
PathLike = Union[str, os.PathLike[str]]

class ShapeError(ValueError):
    """An array of the wrong rank or shape, or shapes that do not agree with each other."""

class FileError(OSError):
    """A file that cannot be opened, is truncated, corrupt, or holds something unexpected."""

def masked_softmax(X: ArrayLike, valid_lens: ValidLens = None) -> Array:
    """Softmax over the last axis of X (B, n, m), keeping only the first valid_lens keys; masked
    keys and rows of valid length 0 get weight exactly 0."""

def scaled_dot_product_attention(
    query: ArrayLike,
    key: ArrayLike | KVCache,
    value: ArrayLike | KVCache | None,
    attn_mask: Mask = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    window: tuple[int | None, int | None] | None = None,
    alibi_slopes: Floats = None,
    softcap: float | None = None,
    sinks: Floats = None,
    valid_lens: ValidLens = None,
    alignment: Literal["top-left", "bottom-right"] | None = None,
    need_weights: bool = False,
    seed: int | None = None,
    causal: bool = False,
    dropout: float | None = None,
) -> Any:
    """PyTorch's scaled_dot_product_attention: query (..., H_q, L, E), key (..., H_kv, S, E),
    value (..., H_kv, S, Ev) -> (..., H_q, L, Ev), rank 2 to 8. attn_mask: bool (True: attend) or
    float (added), broadcastable to (..., H_q, L, S); integers or a list there are valid_lens.
    is_causal and window=(left, right) (-1/None: unbounded) follow `alignment`; alibi_slopes and
    sinks hold H_q floats; softcap caps the scores. alignment None is "top-left" (PyTorch's), or
    with the book's causal=True, which is causal aligned bottom-right, "bottom-right" (an explicit
    "top-left" beside causal=True is a ValueError). dropout= is dropout_p. Returns the output, or
    (output, weights) with need_weights=True.

    float16 (NumPy or torch) and bfloat16 (torch) query, key and value, all three of one dtype
    (a mix raises TypeError), are read in place and computed by attn's half kernels (fp32 scores,
    softmax and sums, the output rounded once); the output and weights come back in that dtype
    (bfloat16 as a torch.Tensor). Masks, alibi_slopes and sinks stay float32 (or bool).

    With a KVCache as key (value None or the same cache): query (B, H_q, n, E) holds the last n
    tokens of each sequence, already appended; query i of sequence b sits at position
    lengths[b] − n + i, which is_causal, window and ALiBi refer to. scale, enable_gqa, softcap,
    sinks and alibi_slopes are taken; attn_mask, valid_lens, dropout and need_weights raise
    ValueError. A float16 or bfloat16 query (a half model's) is widened exactly and its output
    comes back in its dtype."""

def additive_attention(
    queries: ArrayLike,
    keys: ArrayLike,
    values: ArrayLike,
    W_q: ArrayLike,
    W_k: ArrayLike,
    w_v: ArrayLike,
    valid_lens: ValidLens = None,
    need_weights: bool = False,
) -> Any:
    """Additive attention with given nn.Linear weights W_q (h, query_size), W_k (h, key_size),
    w_v (1, h). Returns the output, or (output, weights) with need_weights=True."""

def gaussian_kernel_pooling(
    queries: ArrayLike,
    keys: ArrayLike,
    values: ArrayLike,
    width: float = 1.0,
    valid_lens: ValidLens = None,
    need_weights: bool = False,
) -> Any:
    """Nadaraya–Watson pooling: weights softmax(−½‖(q − k)·width‖²). Returns the output, or
    (output, weights) with need_weights=True."""

def set_num_threads(n: int) -> None:
    """How many threads attn's OpenMP kernels use (at least 1), from any Python thread; kernels
    not parallelised yet run on the calling thread, with the GIL released. Until it is called,
    attn.torch's calls use torch.get_num_threads() threads."""

def get_num_threads() -> int: ...
def simd_target() -> str:
    """The instruction set attn's kernels run on now, by Highway's name: AVX3 (AVX-512), AVX2, ..."""

def available_simd_targets() -> list[str]:
    """The instruction sets attn has kernels for and this CPU runs, best first."""

def limit_simd_target(name: str) -> None:
    """Run the kernels no better than `name` (one of available_simd_targets(), or 'best')."""

def empty_cache() -> None:
    """Free the blocks of 64 KiB or more (256 + 16 MiB at most) that attn keeps from freed outputs,
    gradients and its kernels' scratch for the next of the same size, as torch.cuda.empty_cache
    does for PyTorch's."""

def cached_bytes() -> int:
    """Bytes attn keeps now for reuse (see empty_cache)."""

def amx_status() -> str:
    """Whether bf16 attention runs on AMX tiles ('no AMX', 'AMX-BF16 in use ...', the default
    where the CPU has them, or 'AMX-BF16 available, turned off ...' under ATTN_AMX=0)."""

def bf16_dot_status() -> str:
    """Whether bf16 attention off the AMX tiles multiplies on vdpbf16ps ('bf16 products on
    vdpbf16ps', the default where it outpaces fp32 FMAs: AMD's Zen 4 and 5) or widens bf16 to fp32
    ('bf16 widened to fp32 (...)': Intel's cores, CPUs without AVX512-BF16; ATTN_BF16_DOT=1 or 0
    forces either)."""

def bf16_probabilities_status() -> str:
    """How bf16 attention on bf16 products gives P to P·V: in two bf16 parts (within 2^-16 of P)
    on AMX tiles and rounded to bf16 (2^-8, as PyTorch's bf16 kernels) on vdpbf16ps by default;
    ATTN_BF16_P=split or rounded chooses one everywhere."""

def set_strict_inputs(strict: bool) -> None:
    """When strict, inputs that would need a copy (not float32 or not C-contiguous) are refused."""

def get_strict_inputs() -> bool: ...
def load_safetensors(path: PathLike) -> dict[str, npt.NDArray[np.float32]]:
    """{name: float32 array} from a safetensors file (F32 or F64 tensors)."""

def save_safetensors(
    path: PathLike, tensors: Mapping[str, ArrayLike], metadata: Mapping[str, str] = ...
) -> None:
    """Writes {name: array} as F32 tensors, with optional string metadata."""

def load(
    path: PathLike,
) -> (
    AdditiveAttention
    | DotProductAttention
    | MultiHeadAttention
    | GeneralAttention
    | GaussianKernelPooling
):
    """Rebuilds a layer written by layer.save(path)."""

def _data_pointer(x: ArrayLike, strided: bool = False) -> int:
    """The address of the float32 data the kernels would read for x (for tests); strided=True:
    as scaled_dot_product_attention reads it (any strides with a contiguous last axis)."""

class KVCache:
    """Keys (B, H_kv, capacity, head_dim) and values (B, H_kv, capacity, value_dim) of a batch of
    sequences being decoded, stored as float32, float16, bfloat16 or int8 (a scale per row and
    head) and read in that precision by scaled_dot_product_attention(query, cache)."""

    def __init__(
        self,
        batch: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: Literal["float32", "float16", "bfloat16", "int8"] = "float32",
        value_dim: int | None = None,
    ) -> None: ...
    def append(self, keys: ArrayLike, values: ArrayLike, counts: ValidLens = None) -> None:
        """Appends keys (B, H_kv, T, head_dim) and values (B, H_kv, T, value_dim) of one dtype
        (float32, float64, or a half model's float16 or bfloat16, widened exactly); counts (B
        ints <= T): sequence b takes only its first counts[b] tokens. The GIL is released."""

    def reserve(self, capacity: int) -> None:
        """Room for `capacity` tokens per sequence now (never shrinks)."""

    def clear(self) -> None:
        """Empties every sequence; the storage stays."""

    def keys(self) -> npt.NDArray[np.float32]:
        """Stored keys widened to float32, (B, H_kv, max(lengths), head_dim), zero past each
        length."""

    def values(self) -> npt.NDArray[np.float32]:
        """Stored values widened to float32, (B, H_kv, max(lengths), value_dim)."""

    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        """Tokens held per sequence, (B,)."""

    @property
    def capacity(self) -> int: ...
    @property
    def dtype(self) -> Literal["float32", "float16", "bfloat16", "int8"]: ...
    @property
    def batch(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def value_dim(self) -> int: ...
    @property
    def bytes_per_token(self) -> int:
        """Bytes of keys and values per cached token of one sequence (int8 scales included)."""

_Layer = TypeVar("_Layer", bound="_AttentionLayer")

class _AttentionLayer:
    """What every layer offers (not a runtime class: each layer defines these methods)."""

    training: bool
    @property
    def attention_weights(self) -> Array | None:
        """Weights of the last call before dropout, (B, n, m) ((B·heads, n, m) for multi-head)."""

    @property
    def dropout_mask(self) -> Array | None:
        """Dropout multipliers of the last call (0 or 1/(1 − p)), or None when none applied."""

    def forward(
        self,
        queries: ArrayLike,
        keys: ArrayLike,
        values: ArrayLike,
        valid_lens: ValidLens = None,
        *,
        causal: bool = False,
    ) -> Array:
        """(B, n, ·), (B, m, ·), (B, m, ·) → (B, n, ·); keeps what backward() needs."""

    def __call__(
        self,
        queries: ArrayLike,
        keys: ArrayLike,
        values: ArrayLike,
        valid_lens: ValidLens = None,
        *,
        causal: bool = False,
    ) -> Array: ...
    def backward(self, grad_output: ArrayLike) -> dict[str, Array]:
        """{'queries', 'keys', 'values'} gradients of sum(output * grad_output); accumulates the
        parameters' gradients into grads()."""

    def train(self: _Layer, mode: bool = True) -> _Layer: ...
    def eval(self: _Layer) -> _Layer: ...
    def seed_dropout(self, seed: int) -> None: ...
    def state_dict(self) -> dict[str, npt.NDArray[np.float32]]:
        """Parameters under PyTorch's names (W_q.weight, ...), as copies."""

    def load_state_dict(self, state_dict: Mapping[str, ArrayLike]) -> None:
        """Strict, as PyTorch's: missing, unexpected or mis-shaped entries raise ValueError."""

    def grads(self) -> dict[str, npt.NDArray[np.float32]]: ...
    def zero_grad(self) -> None: ...
    def save(self, path: PathLike) -> None:
        """Parameters to a safetensors file, constructor arguments as metadata."""

    def load(self, path: PathLike) -> None:
        """Parameters from a safetensors file (attn's or PyTorch's)."""

    def __copy__(self: _Layer) -> _Layer: ...
    def __deepcopy__(self: _Layer, memo: Any) -> _Layer: ...

class AdditiveAttention(_AttentionLayer):
    """The book's AdditiveAttention: scores w_vᵀ tanh(W_q q + W_k k)."""

    def __init__(
        self,
        key_size: int,
        query_size: int,
        num_hiddens: int,
        dropout: float = 0.0,
        *,
        seed: int = 0,
    ) -> None: ...
    @property
    def key_size(self) -> int: ...
    @property
    def query_size(self) -> int: ...
    @property
    def num_hiddens(self) -> int: ...
    @property
    def dropout(self) -> float: ...

class DotProductAttention(_AttentionLayer):
    """The book's DotProductAttention: scores Q Kᵀ · scale (1/√d by default)."""

    def __init__(
        self, dropout: float = 0.0, *, scale: float | None = None, seed: int = 0
    ) -> None: ...
    @property
    def dropout(self) -> float: ...

class MultiHeadAttention(_AttentionLayer):
    """The book's MultiHeadAttention over num_heads scaled dot-product heads."""

    def __init__(
        self,
        key_size: int,
        query_size: int,
        value_size: int,
        num_hiddens: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = False,
        *,
        seed: int = 0,
    ) -> None: ...
    @property
    def key_size(self) -> int: ...
    @property
    def query_size(self) -> int: ...
    @property
    def value_size(self) -> int: ...
    @property
    def num_hiddens(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def bias(self) -> bool: ...

class GeneralAttention(_AttentionLayer):
    """Luong's general attention: scores (W q)·k for queries and keys of different sizes."""

    def __init__(
        self, query_size: int, key_size: int, dropout: float = 0.0, *, seed: int = 0
    ) -> None: ...
    @property
    def query_size(self) -> int: ...
    @property
    def key_size(self) -> int: ...
    @property
    def dropout(self) -> float: ...

class GaussianKernelPooling(_AttentionLayer):
    """Nadaraya–Watson Gaussian-kernel pooling with a learnable width w."""

    def __init__(self, width: float = 1.0, dropout: float = 0.0, *, seed: int = 0) -> None: ...
    @property
    def width(self) -> float: ...
    @property
    def dropout(self) -> float: ...
