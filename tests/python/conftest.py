# Shared helpers for the Python tests: the committed PyTorch fixtures (tests/fixtures/<case>/),
# read with NumPy and attn's own safetensors reader, and the attn layer each case describes.
import json
import pathlib

import numpy as np
import pytest

import attn

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures"

# Every layer case that has gradients (the toy_* cases check forward outputs only).
GRADIENT_CASES = sorted(
    path.name
    for path in FIXTURES.iterdir()
    if (path / "case.json").exists() and (path / "grads").is_dir()
)
ALL_CASES = sorted(path.name for path in FIXTURES.iterdir() if (path / "case.json").exists())


class Case:
    """One fixture folder: inputs, valid lengths, parameters, outputs, weights and gradients."""

    def __init__(self, name):
        self.name = name
        folder = FIXTURES / name
        self.config = json.loads((folder / "case.json").read_text(encoding="utf-8"))
        self.queries = np.load(folder / "queries.npy")
        self.keys = np.load(folder / "keys.npy")
        self.values = np.load(folder / "values.npy")
        lens = folder / "valid_lens.npy"
        self.valid_lens = np.load(lens) if lens.exists() else None
        params = folder / "params.safetensors"
        self.params_path = params if params.exists() else None
        self.params = attn.load_safetensors(params) if params.exists() else {}
        self.output = np.load(folder / "output.npy")
        self.weights = np.load(folder / "weights.npy")
        grads = folder / "grads"
        self.grad_output = np.load(folder / "grad_output.npy") if grads.is_dir() else None
        self.grads = (
            {path.name[: -len(".npy")]: np.load(path) for path in grads.glob("*.npy")}
            if grads.is_dir()
            else {}
        )

    @property
    def layer_kind(self):
        return self.config["layer"]

    def make_layer(self):
        """The attn layer with the case's hyper-parameters and parameters, in evaluation mode."""
        c = self.config
        if c["layer"] == "additive":
            layer = attn.AdditiveAttention(
                c["key_size"], c["query_size"], c["num_hiddens"], c["dropout"]
            )
        elif c["layer"] == "dot_product":
            layer = attn.DotProductAttention(c["dropout"])
        elif c["layer"] == "multi_head":
            layer = attn.MultiHeadAttention(
                c["key_size"],
                c["query_size"],
                c["value_size"],
                c["num_hiddens"],
                c["num_heads"],
                c["dropout"],
                bias=c["bias"],
            )
        elif c["layer"] == "gaussian":
            layer = attn.GaussianKernelPooling(c["width"])
        else:
            raise AssertionError(f"unknown layer {c['layer']}")
        layer.load_state_dict(self.params)
        return layer.eval()


@pytest.fixture(params=ALL_CASES)
def case(request):
    return Case(request.param)


@pytest.fixture(params=GRADIENT_CASES)
def gradient_case(request):
    return Case(request.param)


def book_toy_inputs():
    """The book's toy example: keys all ones, values arange(40) as (1, 10, 4) repeated twice,
    valid lengths [2, 6]; the outputs are the means of the first 2 and 6 value rows."""
    keys = np.ones((2, 10, 2), dtype=np.float32)
    values = np.tile(np.arange(40, dtype=np.float32).reshape(1, 10, 4), (2, 1, 1))
    valid_lens = np.array([2, 6])
    return keys, values, valid_lens
