#!/usr/bin/env python3
# Decoding with ALiBi (BLOOM, MPT): attn's decode kernel (plain tensors and its KVCache) beside the
# prefill kernels attn used for it before, and PyTorch's SDPA given ALiBi as a float bias mask.
"""Time one decode step with ALiBi: B = 1, n = 1, 32 query heads over 8 of d = 128, fp32.
    build/venv/bin/python bench/compare_alibi_decode.py --lengths 4096,32768 --threads 1,2
Rows: attn-decode (plain tensors, alignment bottom-right: the decode kernel), attn-prefill (the
same call aligned top-left, which the decode kernel cannot take: the prefill kernels, as every
ALiBi call ran before), attn-kvcache (attn.KVCache), torch-sdpa (attn_mask = −slope·|position − j|
as a (1, H, 1, m) float tensor, how PyTorch models pass ALiBi). Median of --repeats warm passes."""
import argparse

import torch

import attn
from compare_decode import cpu_name, parse_ints  # this folder's decode comparison
from compare_mha import median_ms  # warm-up, then the median of the timed passes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=parse_ints, default=[4096, 32768])
    parser.add_argument("--threads", type=parse_ints, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    heads, kv_heads, d = 32, 8, 128
    slopes = [2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)]  # ALiBi's geometric series
    print(f"ALiBi decode step: {cpu_name()}; torch {torch.__version__}; B=1, n=1, {heads} heads "
          f"over {kv_heads} of {d}, fp32; median of {args.repeats}")
    print(f"{'m':>6} {'thr':>3} {'attn-decode':>12} {'attn-prefill':>13} {'attn-kvcache':>13} "
          f"{'torch-sdpa':>11} {'prefill/decode':>15} {'torch/decode':>13}")
    for m in args.lengths:
        generator = torch.Generator().manual_seed(m)
        q = torch.randn(1, heads, 1, d, generator=generator)
        k = torch.randn(1, kv_heads, m, d, generator=generator)
        v = torch.randn(1, kv_heads, m, d, generator=generator)
        cache = attn.KVCache(1, kv_heads, d, capacity=m)
        cache.append(k, v)
        distance = (torch.arange(m) - (m - 1)).abs().float()
        bias = (-torch.tensor(slopes)[:, None] * distance[None, :]).reshape(1, heads, 1, m)
        for threads in args.threads:
            torch.set_num_threads(threads)
            attn.set_num_threads(threads)
            call = dict(enable_gqa=True, alibi_slopes=slopes)
            decode = median_ms(lambda: attn.scaled_dot_product_attention(
                q, k, v, alignment="bottom-right", **call), args.repeats)
            prefill = median_ms(lambda: attn.scaled_dot_product_attention(q, k, v, **call),
                                args.repeats)
            kvcache = median_ms(lambda: attn.scaled_dot_product_attention(q, cache, None, **call),
                                args.repeats)
            sdpa = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, enable_gqa=True), args.repeats)
            print(f"{m:>6} {threads:>3} {decode:12.3f} {prefill:13.3f} {kvcache:13.3f} "
                  f"{sdpa:11.3f} {prefill / decode:14.2f}x {sdpa / decode:12.2f}x")


if __name__ == "__main__":
    main()
