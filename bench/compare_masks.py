#!/usr/bin/env python3
# Attention masks as PyTorch and transformers users pass them, through attn.torch beside PyTorch's
# SDPA, interleaved in one process: the causal pattern as is_causal, as a bool mask and as a float
# mask of 0 and -inf (a mask of intervals: attn reads it once into key ranges), a float mask with
# a bias and a bool causal mask with random gaps (both read entry by entry). Then decoding steps
# (1 and 4 new queries against 4096 keys) without a mask, with key padding (an interval), with a
# random bool mask (gaps in every row, as tree attention or sparse patterns give), with a float
# bias and with 4 attention sinks beside a window of 1024 keys. Prints, per point, attn's time for
# each form, each form's time over the first form's, and PyTorch's time for the same form over
# attn's.
# Usage: build/venv/bin/python bench/compare_masks.py [--threads 1,2] [--rounds 3] [--repeats 3]
import argparse

import torch
import torch.nn.functional as F

import attn
import attn.torch as at
from compare_mha import median_ms  # this folder's timing: a warm-up call, then the median


def best_times(q, k, v, forms, rounds, repeats):
    """{(who, form): best over `rounds` of the median of `repeats` calls}, attn.torch and PyTorch
    taking turns on each form."""
    best = {(who, form): float("inf") for who in ("attn", "torch") for form in forms}
    with torch.no_grad():
        for _ in range(rounds):
            for form, extra in forms.items():
                for who, sdpa in (("attn", at.scaled_dot_product_attention),
                                  ("torch", F.scaled_dot_product_attention)):
                    ms = median_ms(lambda: sdpa(q, k, v, enable_gqa=True, **extra), repeats)
                    best[who, form] = min(best[who, form], ms)
    return best


def report(title, forms, best):
    first = next(iter(forms))
    print(title)
    for form in forms:
        ours, theirs = best["attn", form], best["torch", form]
        print(f"  {form:12s} attn {ours:9.3f} ms ({ours / best['attn', first]:5.3f}x {first})   "
              f"PyTorch {theirs:9.3f} ms ({theirs / ours:5.2f}x attn's)", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best kept)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per round (median)")
    args = parser.parse_args()
    # (query heads, key/value heads, n, d, dtype): grouped heads as in Llama-style models.
    points = [(32, 8, 512, 128, torch.float32), (32, 8, 2048, 64, torch.float32),
              (32, 8, 512, 128, torch.bfloat16)]
    # Decoding steps: (batch, new queries n, cached keys m, dtype), 32 heads over 8 of 128.
    decode_points = [(2, 1, 4096, torch.float32), (2, 4, 4096, torch.float32),
                     (2, 1, 4096, torch.bfloat16)]
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
            gaps = keep & (torch.rand(n, n) < 0.9)  # causal with gaps: no interval either
            forms = {"is_causal": {"is_causal": True}, "bool": {"attn_mask": keep},
                     "float 0/-inf": {"attn_mask": hidden}, "float bias": {"attn_mask": biased},
                     "bool gaps": {"attn_mask": gaps}}
            name = str(dtype).split(".")[1]
            report(f"threads {threads}, ({heads}/{kv_heads} heads, n = m = {n}, d = {d}, {name}):",
                   forms, best_times(q, k, v, forms, args.rounds, args.repeats))
        for batch, n, m, dtype in decode_points:
            q = torch.randn(batch, 32, n, 128, dtype=dtype)
            k = torch.randn(batch, 8, m, 128, dtype=dtype)
            v = torch.randn(batch, 8, m, 128, dtype=dtype)
            padding = torch.ones(batch, 1, n, m, dtype=torch.bool)
            padding[0, ..., : m // 4] = False  # the first sequence left-padded
            scattered = torch.rand(batch, 1, n, m) < 0.7  # gaps in every row
            bias = torch.randn(batch, 1, n, m).masked_fill(~scattered, float("-inf")).to(dtype)
            sinks = torch.zeros(batch, 1, n, m, dtype=torch.bool)  # StreamingLLM's pattern
            sinks[..., :4] = True
            sinks[..., -1024:] = True
            forms = {"no mask": {}, "padding": {"attn_mask": padding},
                     "scattered": {"attn_mask": scattered}, "float bias": {"attn_mask": bias},
                     "sinks+window": {"attn_mask": sinks}}
            name = str(dtype).split(".")[1]
            report(f"threads {threads}, decoding (B = {batch}, 32/8 heads of 128, n = {n}, "
                   f"m = {m}, {name}):", forms,
                   best_times(q, k, v, forms, args.rounds, args.repeats))


if __name__ == "__main__":
    main()
