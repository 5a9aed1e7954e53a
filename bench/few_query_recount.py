#!/usr/bin/env python3
# What the backward's recount costs (docs/kernels.md, "A few queries' backward at scores far from
# 0"): attn.torch's backward of a few queries against many keys, with scores near 0 (q ~ N(0,
# 0.05²): no recount) and far from it (q ~ N(0, 2²), softmax scale 1: the recount), interleaved in
# one process on the same keys and values; per call the median of R rounds and far / near.
# Usage: build/venv/bin/python bench/few_query_recount.py [--threads 1] [--rounds 15]
import argparse
import time

import torch

import attn.torch as at

# (B, H, n, m, d)
CALLS = [(1, 32, 1, 4096, 128), (1, 32, 8, 4096, 128), (4, 8, 16, 1024, 64), (8, 8, 4, 512, 64)]


def main():
    parser = argparse.ArgumentParser(description="the few-query backward's recount, timed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for batch, heads, queries, keys, depth in CALLS:
        k = torch.randn(batch, heads, keys, depth, requires_grad=True)
        v = torch.randn(batch, heads, keys, depth, requires_grad=True)
        calls = {}
        for name, spread in (("near", 0.05), ("far", 2.0)):
            q = (torch.randn(batch, heads, queries, depth) * spread).requires_grad_()
            output = at.scaled_dot_product_attention(q, k, v, scale=1.0)
            calls[name] = (q, output, torch.randn_like(output))
        times = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, (q, output, grad_output) in calls.items():
                start = time.perf_counter()
                torch.autograd.grad(output, (q, k, v), grad_output, retain_graph=True)
                times[name].append(time.perf_counter() - start)
        median = {name: sorted(t)[len(t) // 2] * 1e3 for name, t in times.items()}
        print(f"B={batch} H={heads} n={queries} m={keys} d={depth}: backward near 0 "
              f"{median['near']:.2f} ms, far {median['far']:.2f} ms, far / near "
              f"{median['far'] / median['near']:.2f}")


if __name__ == "__main__":
    main()
