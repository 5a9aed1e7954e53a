#!/usr/bin/env python3
# Time of appending a prompt's keys and values to an attn.KVCache, per cache dtype: what a decoder
# pays once per layer after its prefill, before the first decode step.
"""Time attn.KVCache.append of a long prompt for each cache dtype (fresh cache each pass; best of
--repeats). Run with the Python that scripts/test.sh builds:
    build/venv/bin/python bench/kv_cache_append.py --tokens 32768 --threads 1
"""
import argparse
import time

import numpy as np

import attn
from compare_decode import cpu_name, parse_ints  # this folder's decode comparison


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32768, help="prompt tokens appended")
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--threads", type=parse_ints, default=[1])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    shape = (1, args.kv_heads, args.tokens, args.head_dim)
    keys = rng.standard_normal(shape, dtype=np.float32)
    values = rng.standard_normal(shape, dtype=np.float32)
    megabytes = 2 * keys.nbytes / 1e6
    print(f"KVCache.append: {cpu_name()}; B=1, {args.kv_heads} heads of {args.head_dim}, "
          f"{args.tokens} tokens ({megabytes:.0f} MB of fp32 K and V); best of {args.repeats}")
    print(f"{'dtype':<9} {'threads':>7} {'ms':>9} {'GB/s in':>8}")
    for threads in args.threads:
        attn.set_num_threads(threads)
        for dtype in ("float32", "float16", "bfloat16", "int8"):
            best = float("inf")
            for _ in range(args.repeats):
                cache = attn.KVCache(1, args.kv_heads, args.head_dim, capacity=args.tokens,
                                     dtype=dtype)
                start = time.perf_counter()
                cache.append(keys, values)
                best = min(best, time.perf_counter() - start)
            print(f"{dtype:<9} {threads:>7} {best * 1e3:9.1f} {megabytes / 1e3 / best:8.1f}")


if __name__ == "__main__":
    main()
