#!/usr/bin/env python3
# Float masks in the inputs' half dtype (PyTorch requires a float attn_mask of the query's dtype),
# through attn.torch beside PyTorch's SDPA, interleaved in one process: per shape and thread count,
# the call without a mask, with the mask in float32 and with the mask in the inputs' dtype (which
# attn reads in place), best of R rounds of the median of K calls, and PyTorch's time over attn's.
# Usage: build/venv/bin/python bench/compare_half_masks.py [--dtype bfloat16] [--threads 1,2]
import argparse

import torch
import torch.nn.functional as F

import attn
import attn.torch as at
from compare_mha import median_ms  # this folder's timing: a warm-up call, then the median

# (B, H, n, m, d): prefill, short prefill against a long cache, and decoding steps.
SHAPES = [(1, 2, 256, 256, 64), (1, 4, 16, 4096, 64), (1, 8, 16, 1024, 96), (2, 4, 1, 256, 32),
          (1, 4, 1, 1024, 80)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    print(f"attn.torch / PyTorch SDPA, {args.dtype} inputs, µs (best of {args.rounds} rounds' "
          f"medians of {args.repeats} calls); ratio = PyTorch time / attn time")
    print(f"{'T':>2} {'(B, H, n, m, d)':<22} {'form':<12} {'attn':>9} {'PyTorch':>9} {'ratio':>6}")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for b, h, n, m, d in SHAPES:
            q, k, v = (torch.randn(b, h, rows, d).to(dtype) for rows in (n, m, m))
            mask = torch.randn(n, m).to(dtype)
            forms = {"none": None, "float32": mask.float(), args.dtype: mask}
            best = {}
            with torch.no_grad():
                for _ in range(args.rounds):
                    for form, extra in forms.items():
                        for who, sdpa in (("attn", at.scaled_dot_product_attention),
                                          ("torch", F.scaled_dot_product_attention)):
                            def call(sdpa=sdpa, extra=extra):
                                return sdpa(q, k, v, attn_mask=extra)
                            us = 1e3 * median_ms(call, args.repeats)
                            best[who, form] = min(best.get((who, form), float("inf")), us)
            for form in forms:
                mine, theirs = best["attn", form], best["torch", form]
                print(f"{threads:>2} {str((b, h, n, m, d)):<22} {form:<12} {mine:9.1f} "
                      f"{theirs:9.1f} {theirs / mine:6.2f}")


if __name__ == "__main__":
    main()
