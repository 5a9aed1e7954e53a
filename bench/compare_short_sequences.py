#!/usr/bin/env python3
"""attn.torch beside PyTorch's SDPA on short and ragged sequences, through the Python call.

Where per-call costs and padding decide: a training step (forward, then torch.autograd.grad of
query, key and value) and an inference forward (torch.no_grad()), contiguous (B, H, n, d) tensors,
n from 8 to 100 by default. Each figure is the best of 7 loops; the two libraries alternate shape
by shape in one process.

Usage: python bench/compare_short_sequences.py [--threads 1,2] [--causal]
           [--sizes 8,16,77 --batch 1 --heads 32 --kv-heads 8 --head-dim 128] [--dtype bfloat16]
           [--keys 4096]
Prints one line per (threads, shape): microseconds a call and PyTorch / attn. --sizes replaces the
default shapes by n = m = each size at the given batch, heads and head size (--kv-heads: grouped
query heads, enable_gqa=True on both sides); --keys sets m apart from n (one query against 1024
keys, say; with --causal, PyTorch's top-left diagonal: query i sees keys 0..i).
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
    parser.add_argument("--sizes", help="n = m values (default: the built-in shapes)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, help="key/value heads (default: --heads)")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--keys", type=int, help="keys m (default: m = n)")
    options = parser.parse_args()
    dtype = getattr(torch, options.dtype)
    kv_heads = options.kv_heads or options.heads
    shapes = SHAPES if options.sizes is None else tuple(
        (options.batch, options.heads, int(n), options.head_dim) for n in options.sizes.split(","))
    torch.manual_seed(0)
    for threads in (int(t) for t in options.threads.split(",")):
        torch.set_num_threads(threads)
        attn.set_num_threads(threads)
        for batch, heads, n, depth in shapes:
            groups = heads if options.sizes is None else kv_heads
            q = torch.randn(batch, heads, n, depth, dtype=dtype, requires_grad=True)
            m = options.keys or n
            k, v = (torch.randn(batch, groups, m, depth, dtype=dtype, requires_grad=True)
                    for _ in range(2))
            grad_output = torch.randn(batch, heads, n, depth, dtype=dtype)
            gqa = groups != heads

            def step(sdpa):
                out = sdpa(q, k, v, is_causal=options.causal, enable_gqa=gqa)
                torch.autograd.grad(out, (q, k, v), grad_output)

            def infer(sdpa):
                with torch.no_grad():
                    sdpa(q, k, v, is_causal=options.causal, enable_gqa=gqa)

            calls = max(20, int(200000 / (batch * heads * n * m * depth / 1e3 + 50)))
            train = [best_us(lambda: step(f), calls)
                     for f in (attn_torch.scaled_dot_product_attention,
                               F.scaled_dot_product_attention)]
            inference = [best_us(lambda: infer(f), calls)
                         for f in (attn_torch.scaled_dot_product_attention,
                                   F.scaled_dot_product_attention)]
            kv = f"/{groups}" if gqa else ""
            keys = f" m={m}" if m != n else ""
            print(f"threads={threads} B={batch} H={heads}{kv} n={n}{keys} d={depth} {options.dtype}: "
                  f"train attn {train[0]:.1f} torch {train[1]:.1f} us ({train[1] / train[0]:.2f}x) | "
                  f"inference attn {inference[0]:.1f} torch {inference[1]:.1f} us "
                  f"({inference[1] / inference[0]:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
