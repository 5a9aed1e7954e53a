#!/usr/bin/env python3
"""attn.torch's book layers beside the book's own PyTorch modules, at the book's shapes.

The "Dive into Deep Learning" attention chapters train a Bahdanau decoder that calls
AdditiveAttention once per step with one query (batch 64, 10 source steps, 256 hidden units) and a
Transformer whose MultiHeadAttention sees short sequences. Each line: the module in evaluation mode
under torch.no_grad() (inference) and a training step (forward, then backward of the output's sum
into the queries, keys, values and parameters), best of several loops, attn.torch's module and the book's
(tests/python/book_torch.py) alternating in one process, with the same parameters.

Usage: python bench/compare_book_layers.py [--threads 1,2]
"""
import argparse
import os
import sys
import time

import torch

import attn
import attn.torch as attn_torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "python"))
import book_torch as book  # noqa: E402  (the book's modules, as the tests use them)

# (layer, batch, queries, keys, hidden, heads): the Bahdanau decoder's step at two widths and two
# batches, a whole target sequence at once, and MultiHeadAttention at the Transformer's sizes.
CASES = (
    ("additive", 64, 1, 10, 256, 0),
    ("additive", 4, 1, 10, 256, 0),
    ("additive", 64, 1, 10, 32, 0),
    ("additive", 64, 10, 10, 256, 0),
    ("multi_head", 64, 10, 10, 32, 4),
    ("multi_head", 128, 35, 35, 256, 4),
)


def best_us(fn, calls):
    for _ in range(5):
        fn()
    loops = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        loops.append((time.perf_counter() - start) / calls)
    return min(loops) * 1e6


def modules(layer, hidden, heads):
    if layer == "additive":
        return (attn_torch.AdditiveAttention(hidden, hidden, hidden, 0.0),
                book.AdditiveAttention(hidden, hidden, hidden, 0.0))
    return (attn_torch.MultiHeadAttention(hidden, hidden, hidden, hidden, heads, 0.0),
            book.MultiHeadAttention(hidden, hidden, hidden, hidden, heads, 0.0))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    options = parser.parse_args()
    torch.manual_seed(0)
    for threads in (int(t) for t in options.threads.split(",")):
        torch.set_num_threads(threads)
        attn.set_num_threads(threads)
        for layer, batch, n, m, hidden, heads in CASES:
            mine, reference = modules(layer, hidden, heads)
            mine.load_state_dict(reference.state_dict())
            # Keys and values require grad as the decoder's encoder outputs do.
            queries = torch.randn(batch, n, hidden, requires_grad=True)
            keys = torch.randn(batch, m, hidden, requires_grad=True)
            values = torch.randn(batch, m, hidden, requires_grad=True)
            lengths = torch.randint(1, m + 1, (batch,))
            work = batch * n * m * hidden + batch * (n + m) * hidden * hidden
            calls = max(3, int(2e8 / work))

            def infer(module):
                with torch.no_grad():
                    module(queries, keys, values, lengths)

            def train(module):
                module(queries, keys, values, lengths).sum().backward()

            for module in (mine, reference):
                module.eval()
            inference = [best_us(lambda: infer(module), calls) for module in (mine, reference)]
            for module in (mine, reference):
                module.train()
            step = [best_us(lambda: train(module), calls) for module in (mine, reference)]
            print(f"threads={threads} {layer} B={batch} n={n} m={m} hidden={hidden}"
                  f"{f' heads={heads}' if heads else ''}: inference attn {inference[0]:.0f} "
                  f"book {inference[1]:.0f} us ({inference[1] / inference[0]:.2f}x) | train attn "
                  f"{step[0]:.0f} book {step[1]:.0f} us ({step[1] / step[0]:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
