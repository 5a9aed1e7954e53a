#!/usr/bin/env python3
# Few queries against many keys, short calls with large heads, fp16/bf16 calls of up to 16 queries
# (the decode kernel's), through attn.torch beside PyTorch's SDPA, interleaved in one process:
# per call and thread count, best of R rounds of the median of K calls, forward alone (no_grad) or
# a training step (forward and backward), and PyTorch's time over attn's. The calls are those the
# user-call sweep (sweep_pytorch.py) listed behind PyTorch on a Xeon with AMX (2026-12-04).
# Usage: build/venv/bin/python bench/compare_few_queries.py [--threads 1,2] [--rounds 5]
# Run it once with an older build's module first on PYTHONPATH to compare builds, alternating.
import argparse

import torch
import torch.nn.functional as F

import attn
import attn.torch as at
from compare_mha import median_ms  # this folder's timing: a warm-up call, then the median

# (B, H, n, m, d, dtype, is_causal, train)
CALLS = [
    (2, 1, 16, 4096, 256, "bfloat16", False, True),   # a few queries' training step, long keys
    (2, 1, 16, 4096, 64, "bfloat16", False, True),
    (2, 1, 16, 4096, 256, "bfloat16", False, False),  # their forward: the prefill on AMX tiles
    (2, 1, 16, 4096, 128, "bfloat16", False, False),
    (2, 2, 64, 64, 256, "bfloat16", False, False),    # a short call with heads of 256
    (8, 8, 128, 128, 64, "bfloat16", False, False),
    (2, 4, 16, 16, 256, "float16", True, False),      # fp16 up to 16 queries: the decode kernel
    (8, 8, 16, 16, 64, "float16", False, False),
    (1, 8, 16, 1024, 96, "bfloat16", False, False),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"attn {attn.__file__}")
    print(f"attn.torch / PyTorch SDPA, µs (best of {args.rounds} rounds' medians of "
          f"{args.repeats} calls); ratio = PyTorch time / attn time")
    print(f"{'T':>2} {'(B, H, n, m, d)':<24} {'dtype':<9} {'call':<14} {'attn':>9} {'PyTorch':>9} "
          f"{'ratio':>6}")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        attn.set_num_threads(threads)
        for b, h, n, m, d, name, causal, train in CALLS:
            dtype = getattr(torch, name)
            q, k, v = (torch.randn(b, h, rows, d).to(dtype).requires_grad_(train)
                       for rows in (n, m, m))
            grad = torch.randn(b, h, n, d).to(dtype)
            best = {}
            for _ in range(args.rounds):
                for who, sdpa in (("attn", at.scaled_dot_product_attention),
                                  ("torch", F.scaled_dot_product_attention)):
                    if train:
                        def action():
                            for x in (q, k, v):
                                x.grad = None
                            sdpa(q, k, v, is_causal=causal).backward(grad)
                    else:
                        def action():
                            with torch.no_grad():
                                sdpa(q, k, v, is_causal=causal)
                    ms = median_ms(action, args.repeats)
                    best[who] = min(best.get(who, float("inf")), ms)
            call = ("causal " if causal else "") + ("training" if train else "forward")
            print(f"{threads:>2} {str((b, h, n, m, d)):<24} {name:<9} {call:<14} "
                  f"{best['attn'] * 1e3:9.1f} {best['torch'] * 1e3:9.1f} "
                  f"{best['torch'] / best['attn']:6.2f}", flush=True)


if __name__ == "__main__":
    main()
