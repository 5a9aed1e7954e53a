#!/usr/bin/env python3
# A random sweep of the calls PyTorch users make, through attn.torch beside PyTorch's SDPA in one
# process: head sizes, query and key counts (decoding steps to full prefill), fp32/bf16/fp16,
# masks (none, is_causal, bool with gaps, float bias), grouped heads, (B, n, H, d) views, scale,
# training (forward + backward) and thread counts, drawn from a seed. Prints the ratio PyTorch
# time / attn time per call, its quantiles, and the calls where attn is slowest against PyTorch:
# that list is where to look next.
# Usage: build/venv/bin/python bench/sweep_pytorch.py [--calls 200] [--seed 1] [--threads 1,2]
import argparse
import random
import statistics

import torch
import torch.nn.functional as F

import attn
import attn.torch as at
from compare_mha import median_ms  # this folder's timing: a warm-up call, then the median

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def draw_call(rng, budget):
    """One call's description, its work (B·H·n·m·d) kept under `budget` so a call takes ms."""
    while True:
        call = {
            "d": rng.choice([32, 64, 80, 96, 128, 256]),
            "n": rng.choice([1, 1, 4, 16, 64, 128, 256, 512, 1024]),
            "dtype": rng.choice(["fp32", "fp32", "bf16", "fp16"]),
            "mask": rng.choice(["none", "none", "causal", "bool", "float"]),
            "kv_heads": rng.choice([1, 2, 4, 8]),
            "group": rng.choice([1, 1, 4]),
            "batch": rng.choice([1, 2, 4]),
            "view": rng.random() < 0.25,
            "scale": rng.choice([None, None, 0.1]),
            "train": rng.random() < 0.25,
            "threads": rng.choice(budget["threads"]),
        }
        call["m"] = call["n"] if rng.random() < 0.5 else rng.choice([64, 256, 1024, 4096])
        call["m"] = max(call["m"], call["n"]) if call["mask"] == "causal" else call["m"]
        heads = call["kv_heads"] * call["group"]
        work = call["batch"] * heads * call["n"] * call["m"] * call["d"]
        if work <= budget["work"]:
            return call


def tensors(call, seed):
    gen = torch.Generator().manual_seed(seed)
    dtype = DTYPES[call["dtype"]]
    heads = call["kv_heads"] * call["group"]

    def make(h, length, d):
        if call["view"]:  # (B, L, H, d) storage seen as (B, H, L, d), as after a projection
            x = torch.randn(call["batch"], length, h, d, generator=gen).to(dtype).transpose(1, 2)
        else:
            x = torch.randn(call["batch"], h, length, d, generator=gen).to(dtype)
        return x.requires_grad_(call["train"])

    q = make(heads, call["n"], call["d"])
    k = make(call["kv_heads"], call["m"], call["d"])
    v = make(call["kv_heads"], call["m"], call["d"])
    extra = {"scale": call["scale"], "enable_gqa": call["group"] > 1}
    n, m = call["n"], call["m"]
    if call["mask"] == "causal":
        extra["is_causal"] = True
    elif call["mask"] == "bool":  # a bottom-right causal pattern with 10% of its entries dropped
        allowed = torch.ones(n, m, dtype=torch.bool).tril(m - n)
        allowed &= torch.rand(n, m, generator=gen) > 0.1
        allowed[:, 0] = True
        extra["attn_mask"] = allowed
    elif call["mask"] == "float":
        extra["attn_mask"] = torch.randn(n, m, generator=gen).to(dtype)
    return q, k, v, extra


def time_call(call, seed, rounds, repeats):
    q, k, v, extra = tensors(call, seed)
    grad = torch.randn(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    torch.set_num_threads(call["threads"])
    attn.set_num_threads(call["threads"])
    best = {}
    for _ in range(rounds):
        for who, sdpa in (("attn", at.scaled_dot_product_attention),
                          ("torch", F.scaled_dot_product_attention)):
            if call["train"]:
                def action():
                    for x in (q, k, v):
                        x.grad = None
                    sdpa(q, k, v, **extra).backward(grad)
            else:
                def action():
                    with torch.no_grad():
                        sdpa(q, k, v, **extra)
            ms = median_ms(action, repeats)
            best[who] = min(best.get(who, float("inf")), ms)
    return best["attn"], best["torch"]


def describe(call):
    heads = call["kv_heads"] * call["group"]
    kv = f"/{call['kv_heads']}" if call["group"] > 1 else ""
    return (f"B={call['batch']} H={heads}{kv} n={call['n']} m={call['m']} d={call['d']} "
            f"{call['dtype']} {call['mask']}{' view' if call['view'] else ''}"
            f"{' scale' if call['scale'] else ''}{' train' if call['train'] else ''} "
            f"T={call['threads']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--work", type=float, default=2**27,
                        help="the most B·H·n·m·d a call may have (keeps each call to ms)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (best kept)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per round (median)")
    parser.add_argument("--worst", type=int, default=15, help="how many of the slowest to list")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    budget = {"work": args.work, "threads": [int(t) for t in args.threads.split(",")]}
    results = []
    for index in range(args.calls):
        call = draw_call(rng, budget)
        ours, theirs = time_call(call, args.seed * 100003 + index, args.rounds, args.repeats)
        results.append((theirs / ours, ours, theirs, call))
        print(f"{index:4d} {describe(call):70s} attn {ours:8.3f} ms  PyTorch {theirs:8.3f} ms"
              f"  {theirs / ours:6.2f}x", flush=True)
    ratios = sorted(r[0] for r in results)
    quantile = lambda p: ratios[min(len(ratios) - 1, int(p * len(ratios)))]  # noqa: E731
    print(f"\nPyTorch time / attn time over {len(ratios)} calls: min {ratios[0]:.2f}x, "
          f"10% {quantile(0.1):.2f}x, median {statistics.median(ratios):.2f}x, "
          f"90% {quantile(0.9):.2f}x; behind PyTorch (< 1.0x) in "
          f"{sum(r < 1.0 for r in ratios)} calls")
    print(f"the {args.worst} calls where attn is slowest beside PyTorch:")
    for ratio, ours, theirs, call in sorted(results, key=lambda r: r[0])[:args.worst]:
        print(f"  {ratio:5.2f}x  {describe(call):70s} attn {ours:8.3f} ms  PyTorch {theirs:8.3f} ms")


if __name__ == "__main__":
    main()
