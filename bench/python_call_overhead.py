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
           [--threads 1,2] [--rounds 3] [--repeats 3]
Prints one line per (n, threads): the medians over rounds of each round's median, in ms, and
python / fused.
"""
import argparse
import json
import statistics
import subprocess
import time

import torch

import attn


def python_ms(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def bench_ms(cli, n, threads, repeats):
    out = subprocess.run([cli, "bench", "--cases", "fused,fused-sdpa", "--sizes", str(n),
                          "--threads", str(threads), "--repeats", str(repeats), "--no-ceilings",
                          "--json"], capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)["cases"]
    return {row["case"]: row["ms"] for row in rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attn", default="build/release/cli/attn")
    parser.add_argument("--sizes", default="1024,4096")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
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
