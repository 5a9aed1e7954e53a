#!/usr/bin/env python3
"""attn bench's fused kernel beside attn's Python call, interleaved rounds in one run.

The Xeon's side by side (docs/benchmarks.md) read attn's Python call 1.09-1.45x `attn bench`'s
fused time, level on Zen 4, from two phases run minutes apart. This script takes the two in turn,
round after round, on the same process's machine state: `attn bench --cases fused,fused-sdpa`
(the kernel on preallocated (B, n, H*d) storage, then the functional call on (B, H, n, d) views of
it) and attn.scaled_dot_product_attention on torch tensors, both contiguous (B, H, n, d) and as
transposed (B, n, H, d) storage (the bench's layout, and what transformers passes). B = 4, 8 heads
of 64, fp32, no mask.

Usage: python bench/python_call_overhead.py [--attn build/release/cli/attn] [--sizes 1024,4096]
           [--threads 1,2] [--rounds 3] [--repeats 3] [--per-call]
Prints one line per (n, threads): the medians over rounds of each round's median, in ms, and
python / fused. --per-call instead times a decode-sized call (1 query, 8 heads of 64, 16 keys,
1 thread, no grad; best of 3 interleaved rounds of 5 loops of 2000 calls) through attn.torch, attn's module function and
PyTorch's SDPA: what a call costs beside its arithmetic.
"""
import argparse
import json
import statistics
import subprocess
import time

import torch

import attn
from interleaved_pytorch import median_ms  # this folder's attn-beside-PyTorch rounds


def python_ms(fn, repeats):
    fn()  # warm-up
    return median_ms(fn, repeats)


def bench_ms(cli, n, threads, repeats):
    out = subprocess.run([cli, "bench", "--cases", "fused,fused-sdpa", "--sizes", str(n),
                          "--threads", str(threads), "--repeats", str(repeats), "--no-ceilings",
                          "--json"], capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)["cases"]
    return {row["case"]: row["ms"] for row in rows}


def per_call():
    import attn.torch as attn_torch

    attn.set_num_threads(1)
    torch.set_num_threads(1)
    q, k, v = torch.rand(1, 8, 1, 64), torch.rand(1, 8, 16, 64), torch.rand(1, 8, 16, 64)

    def microseconds(fn, calls=2000):
        for _ in range(200):
            fn()
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - start) / calls * 1e6)
        return best

    calls = {
        "attn.torch.scaled_dot_product_attention":
            lambda: attn_torch.scaled_dot_product_attention(q, k, v),
        "attn.scaled_dot_product_attention": lambda: attn.scaled_dot_product_attention(q, k, v),
        "torch.nn.functional.scaled_dot_product_attention":
            lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v),
    }
    best = {name: float("inf") for name in calls}
    with torch.no_grad():
        for _ in range(3):  # interleaved rounds: the VM's slow spells fall on every call alike
            for name, fn in calls.items():
                best[name] = min(best[name], microseconds(fn))
    for name, us in best.items():
        print(f"{name}: {us:.1f} us per call (best of 3 rounds)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attn", default="build/release/cli/attn")
    parser.add_argument("--sizes", default="1024,4096")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-call", action="store_true")
    args = parser.parse_args()
    if args.per_call:
        per_call()
        return
    print(f"B = 4, 8 heads of 64, fp32; {args.rounds} interleaved rounds, medians of "
          f"{args.repeats} passes; torch {torch.__version__}")
    for n in (int(s) for s in args.sizes.split(",")):
        generator = torch.Generator().manual_seed(n)
        transposed = [(torch.rand(4, n, 8, 64, generator=generator) * 2 - 1).transpose(1, 2)
                      for _ in range(3)]
        contiguous = [x.contiguous() for x in transposed]
        for threads in (int(t) for t in args.threads.split(",")):
            attn.set_num_threads(threads)
            torch.set_num_threads(threads)
            rounds = {"fused": [], "fused-sdpa": [], "python": [], "python-transposed": []}
            for _ in range(args.rounds):
                for case, ms in bench_ms(args.attn, n, threads, args.repeats).items():
                    rounds[case].append(ms)
                rounds["python"].append(python_ms(
                    lambda: attn.scaled_dot_product_attention(*contiguous), args.repeats))
                rounds["python-transposed"].append(python_ms(
                    lambda: attn.scaled_dot_product_attention(*transposed), args.repeats))
            median = {k: statistics.median(v) for k, v in rounds.items()}
            print(f"n={n} threads={threads}: " +
                  ", ".join(f"{k} {v:.1f}" for k, v in median.items()) +
                  f"; python / fused {median['python'] / median['fused']:.2f}x, "
                  f"python-transposed / fused {median['python-transposed'] / median['fused']:.2f}x, "
                  f"fused-sdpa / fused {median['fused-sdpa'] / median['fused']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
