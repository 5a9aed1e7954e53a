#!/usr/bin/env python3
# Tiny .npy and safetensors files written by NumPy and safetensors.torch, so that tests/io checks
# attn's readers against the real writers without needing Python itself.
"""Generate tests/fixtures/io/*, the files tests/io/*_test.cpp read.

Run from the repository root with the venv that has numpy, torch and safetensors:

    build/venv/bin/python tools/make_io_fixtures.py

Every array is written from fixed values (no randomness), so a rerun writes the same bytes for a
given NumPy / safetensors version. The files, each a few hundred bytes:

    f4_2x3.npy            float32 (2, 3): arange(6) / 4 - 0.5
    f8_3.npy              float64 (3,): [0.1, -2.5, 1e300] (rounds to [0.1f, -2.5f, inf])
    i4_2x2.npy            int32 (2, 2): [[1, -2], [3, 2147483647]]
    i8_2.npy              int64 (2,): [2, 6], valid lengths per batch element
    i8_scalar.npy         int64 (): -7
    f4_0x3.npy            float32 (0, 3), no data
    f4_v2.npy, f4_v3.npy  float32 (2,): [1.5, -1] in format versions 2.0 and 3.0
    f4_fortran.npy        float32 (2, 3) in Fortran order (attn reads it in C order)
    f4_big_endian.npy     '>f4' (3,) (attn must refuse it)
    f4_rank5.npy          float32 (1, 1, 1, 1, 2) (attn reads ranks up to 8)
    params.safetensors    {'W_q.weight': (2, 3) float32, 'bias': (2,) float32,
                           'scale': () float64 0.1} with metadata {'format': 'pt'}
    f16.safetensors       {'half': (2,) float16 [1, 2]} (attn widens it to float32)
    bf16.safetensors      {'half': (3,) bfloat16 [1.5, -2, 3.140625]} (widened too)
    f2_3.npy              float16 (3,): [0.5, -1.25, 65504]
"""

import io
import pathlib

import numpy as np
import safetensors.torch
import torch

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "io"


def save_npy(name, array, version=None):
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, version=version)
    (OUT / name).write_bytes(buffer.getvalue())


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    save_npy("f4_2x3.npy", (np.arange(6, dtype=np.float32) / 4 - 0.5).reshape(2, 3))
    save_npy("f8_3.npy", np.array([0.1, -2.5, 1e300], dtype=np.float64))
    save_npy("i4_2x2.npy", np.array([[1, -2], [3, 2147483647]], dtype=np.int32))
    save_npy("i8_2.npy", np.array([2, 6], dtype=np.int64))
    save_npy("i8_scalar.npy", np.array(-7, dtype=np.int64))
    save_npy("f4_0x3.npy", np.zeros((0, 3), dtype=np.float32))
    save_npy("f4_v2.npy", np.array([1.5, -1], dtype=np.float32), version=(2, 0))
    save_npy("f4_v3.npy", np.array([1.5, -1], dtype=np.float32), version=(3, 0))
    save_npy("f4_fortran.npy",
             np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
    save_npy("f4_big_endian.npy", np.array([1, 2, 3], dtype=">f4"))
    save_npy("f4_rank5.npy", np.array([1, 2], dtype=np.float32).reshape(1, 1, 1, 1, 2))

    params = {
        "W_q.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3) - 2.5,
        "bias": torch.tensor([0.25, -4.0]),
        "scale": torch.tensor(0.1, dtype=torch.float64),
    }
    safetensors.torch.save_file(params, str(OUT / "params.safetensors"),
                                metadata={"format": "pt"})
    safetensors.torch.save_file({"half": torch.tensor([1.0, 2.0], dtype=torch.float16)},
                                str(OUT / "f16.safetensors"))
    safetensors.torch.save_file(
        {"half": torch.tensor([1.5, -2.0, 3.140625], dtype=torch.bfloat16)},
        str(OUT / "bf16.safetensors"))
    save_npy("f2_3.npy", np.array([0.5, -1.25, 65504], dtype=np.float16))


if __name__ == "__main__":
    main()
