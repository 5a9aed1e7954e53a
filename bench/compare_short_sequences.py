#!/usr/bin/env python3
"""attn.torch beside PyTorch's SDPA on short and ragged sequences, through the Python call.

Where per-call costs and padding decide: a training step (forward, then torch.autograd.grad of
query, key and value) and an inference forward (torch.no_grad()), contiguous (B, H, n, d) float32
tensors, n from 8 to 100. Each figure is the best of 7 loops; the two libraries alternate shape by
shape in one process.

Usage: python bench/compare_short_sequences.py [--threads 1,2] [--causal]
Prints one line per (threads, shape): microseconds a call and PyTorch / attn.
"""
import argparse
import time

import torch
import torch.nn.functional as F

import attn
import attn.torch as attn_torch

SHAPES = ((1, 8, 8, 64), (1, 8, 16, 64), (1, 8, 32, 64), (1, 8, 64, 64), (4, 8, 100, 64),
          (4, 8, 200, 64))


def best_us(fn, calls):
    for _ in range(10):
        fn()
    loops = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        loops.append((time.perf_counter() - start) / calls)
    return min(loops) * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--causal", action="store_true")
    options = parser.parse_args()
    torch.manual_seed(0)
    for threads in (int(t) for t in options.threads.split(",")):
        torch.set_num_threads(threads)
        attn.set_num_threads(threads)
        for batch, heads, n, depth in SHAPES:
            q, k, v = (torch.randn(batch, heads, n, depth, requires_grad=True) for _ in range(3))
            grad_output = torch.randn(batch, heads, n, depth)

            def step(sdpa):
                out = sdpa(q, k, v, is_causal=options.causal)
                torch.autograd.grad(out, (q, k, v), grad_output)

            def infer(sdpa):
                with torch.no_grad():
                    sdpa(q, k, v, is_causal=options.causal)

            calls = max(20, int(200000 / (batch * heads * n * n * depth / 1e3 + 50)))
            train = [best_us(lambda: step(f), calls)
                     for f in (attn_torch.scaled_dot_product_attention,
                               F.scaled_dot_product_attention)]
            inference = [best_us(lambda: infer(f), calls)
                         for f in (attn_torch.scaled_dot_product_attention,
                                   F.scaled_dot_product_attention)]
            print(f"threads={threads} B={batch} H={heads} n={n} d={depth}: "
                  f"train attn {train[0]:.1f} torch {train[1]:.1f} us ({train[1] / train[0]:.2f}x) | "
                  f"inference attn {inference[0]:.1f} torch {inference[1]:.1f} us "
                  f"({inference[1] / inference[0]:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
