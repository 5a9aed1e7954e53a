#!/usr/bin/env python3
# Attention masks as PyTorch and transformers users pass them, through attn.torch beside PyTorch's
# SDPA, interleaved in one process: the causal pattern as is_causal, as a bool mask and as a float
# mask of 0 and -inf (a mask of intervals: attn reads it once into key ranges), and a float mask
# with a bias (read entry by entry). Prints, per point, attn's time for each form, each form's
# time over is_causal's, and PyTorch's time for the same form over attn's.
# Usage: build/venv/bin/python bench/compare_masks.py [--threads 1,2] [--rounds 3] [--repeats 3]
import argparse

import torch
import torch.nn.functional as F

import attn
import attn.torch as at
from compare_mha import median_ms  # this folder's timing: a warm-up call, then the median


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best kept)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per round (median)")
    args = parser.parse_args()
    # (query heads, key/value heads, n, d, dtype): grouped heads as in Llama-style models.
    points = [(32, 8, 512, 128, torch.float32), (32, 8, 2048, 64, torch.float32),
              (32, 8, 512, 128, torch.bfloat16)]
    torch.manual_seed(0)
    for threads in map(int, args.threads.split(",")):
        torch.set_num_threads(threads)
        attn.set_num_threads(threads)
        for heads, kv_heads, n, d, dtype in points:
            q = torch.randn(1, heads, n, d, dtype=dtype)
            k = torch.randn(1, kv_heads, n, d, dtype=dtype)
            v = torch.randn(1, kv_heads, n, d, dtype=dtype)
            keep = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
            hidden = torch.zeros(1, 1, n, n, dtype=dtype).masked_fill(~keep, float("-inf"))
            biased = hidden + 0.01 * torch.randn(n, n, dtype=dtype)  # a bias: no interval
            forms = {"is_causal": {"is_causal": True}, "bool": {"attn_mask": keep},
                     "float 0/-inf": {"attn_mask": hidden}, "float bias": {"attn_mask": biased}}
            best = {(who, form): float("inf") for who in ("attn", "torch") for form in forms}
            with torch.no_grad():
                for _ in range(args.rounds):
                    for form, extra in forms.items():
                        for who, sdpa in (("attn", at.scaled_dot_product_attention),
                                          ("torch", F.scaled_dot_product_attention)):
                            ms = median_ms(lambda: sdpa(q, k, v, enable_gqa=True, **extra),
                                           args.repeats)
                            best[who, form] = min(best[who, form], ms)
            causal = best["attn", "is_causal"]
            name = str(dtype).split(".")[1]
            print(f"threads {threads}, ({heads}/{kv_heads} heads, n = m = {n}, d = {d}, {name}):")
            for form in forms:
                ours, theirs = best["attn", form], best["torch", form]
                print(f"  {form:12s} attn {ours:9.2f} ms ({ours / causal:5.3f}x is_causal)   "
                      f"PyTorch {theirs:9.2f} ms ({theirs / ours:5.2f}x attn's)", flush=True)


if __name__ == "__main__":
    main()
