#!/usr/bin/env python3
"""attn.torch beside PyTorch's SDPA through the calls users make, in interleaved rounds.

Issue 14's targets are ratios to PyTorch "measured side by side in one run". compare_pytorch.py
times attn through its CLI first and PyTorch minutes later; on a noisy machine (the device tool's
Xeon moved 1.3-1.5x between phases) that ratio carries the machine's drift. Here each point's two
calls take turns, round after round, in one process on the same tensors: per round the median of
`--repeats` passes of each (their order alternating between rounds), and the reported ratio is
the median over rounds of PyTorch / attn, with its range; "best" is PyTorch's fastest pass over
attn's fastest, over every round (on a host whose other guests slow some passes, the two
undisturbed figures side by side, as `attn bench`'s best columns). B = 4, 8 heads of 64 unless
set; q, k, v contiguous (B, H, n, d); the backward rows time torch.autograd.grad of the output
alone. With --kv-heads (dividing --heads), key and value have that many heads and both calls pass
enable_gqa=True: grouped-query attention as Llama-style models run it (e.g. --batch 1 --heads 32
--kv-heads 8 --head-dim 128 --workloads causal,bf16-causal for a Llama-3-8B layer's prefill).
With --simd-target (e.g. avx2) attn's kernels are capped at that Highway target; set PyTorch's
cap the same way before it starts (ATEN_CPU_CAPABILITY=avx2), and both run the kernels an AVX2-only
CPU (Zen 1-3, older Xeons) would run, on this machine's cores; the header prints both.

Usage: python bench/interleaved_pytorch.py [--sizes 1024,4096] [--threads 1,4,16]
           [--batch 4] [--heads 8] [--kv-heads H_kv] [--head-dim 64]
           [--workloads forward,causal,backward,bf16-forward,bf16-causal,bf16-backward]
           (also causal-backward, bf16-causal-backward, fp16-forward, fp16-causal, fp16-backward)
           [--rounds 3] [--repeats 3] [--simd-target avx2] [--json-out FILE]
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import attn
import attn.torch as attn_torch

WORKLOADS = {  # name: (dtype, causal, backward)
    "forward": (torch.float32, False, False),
    "causal": (torch.float32, True, False),
    "backward": (torch.float32, False, True),
    "bf16-forward": (torch.bfloat16, False, False),
    "bf16-causal": (torch.bfloat16, True, False),
    "bf16-backward": (torch.bfloat16, False, True),
    # Not in the default list (issue 14's targets, which the Xeon's phase runs in its time):
    "causal-backward": (torch.float32, True, True),
    "bf16-causal-backward": (torch.bfloat16, True, True),
    "fp16-forward": (torch.float16, False, False),
    "fp16-causal": (torch.float16, True, False),
    "fp16-backward": (torch.float16, False, True),
}
DEFAULT_WORKLOADS = ("forward", "causal", "backward", "bf16-forward", "bf16-causal", "bf16-backward")


def pass_ms(fn, repeats):
    """The times of `repeats` passes of fn, in ms."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def median_ms(fn, repeats):
    """The median of `repeats` passes of fn, in ms (the other bench scripts' timer)."""
    return statistics.median(pass_ms(fn, repeats))


def make_calls(workload, q, k, v):
    """The two callables of one point: attn.torch's and PyTorch's, forward or backward; grouped
    heads (enable_gqa) where key and value have fewer heads than query."""
    _, causal, backward = WORKLOADS[workload]
    gqa = k.shape[1] != q.shape[1]
    sdpa = {"attn": attn_torch.scaled_dot_product_attention, "torch": F.scaled_dot_product_attention}
    if not backward:
        def forward(fn):
            def call():
                with torch.no_grad():
                    fn(q, k, v, is_causal=causal, enable_gqa=gqa)
            return call
        return {name: forward(fn) for name, fn in sdpa.items()}
    calls = {}
    for name, fn in sdpa.items():
        inputs = [x.detach().requires_grad_() for x in (q, k, v)]
        out = fn(*inputs, is_causal=causal, enable_gqa=gqa)
        grad = torch.ones_like(out) / out.numel() ** 0.5

        def call(out=out, inputs=inputs, grad=grad):
            torch.autograd.grad(out, inputs, grad, retain_graph=True)
        calls[name] = call
    return calls


def flops(workload, batch, heads, n, d):
    _, causal, backward = WORKLOADS[workload]
    pairs = n * (n + 1) / 2 if causal else n * n
    return batch * heads * pairs * (8 if backward else 4) * d


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1024,4096")
    parser.add_argument("--threads", default=f"1,4,{os.cpu_count()}")
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, help="key/value heads (default: --heads)")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--simd-target", help="cap attn's kernels at this Highway target "
                        f"(one of {attn.available_simd_targets()}, any case)")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    if args.simd_target:
        try:
            attn.limit_simd_target(args.simd_target)
        except ValueError as error:
            parser.error(f"--simd-target: {error}")
    sizes = [int(s) for s in args.sizes.split(",")]
    thread_counts = sorted({int(t) for t in args.threads.split(",")})
    workloads = args.workloads.split(",")
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"--workloads: unknown {unknown}; expected some of {list(WORKLOADS)}")
    if args.rounds < 1 or args.repeats < 1:
        parser.error("--rounds and --repeats must be at least 1")
    kv_heads = args.heads if args.kv_heads is None else args.kv_heads
    if kv_heads < 1 or args.heads % kv_heads != 0:
        parser.error(f"--kv-heads: expected a divisor of --heads ({args.heads}), got {kv_heads}")

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(f"attn.torch vs PyTorch {torch.__version__} SDPA, interleaved: B={args.batch}, "
          f"heads={args.heads} (key/value heads {kv_heads}), d={args.head_dim}; "
          f"{args.rounds} rounds of the median of "
          f"{args.repeats} passes each; {cpu}, {os.cpu_count()} logical CPUs")
    print(f"kernels: attn {attn.simd_target()}, PyTorch {torch.backends.cpu.get_cpu_capability()}"
          f" (ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', 'unset')})")
    # Which products attn's calls in this process take: a run whose attn.torch rows differ from
    # `attn bench`'s kernel rows (Emerald Rapids, 12-04: 77.7 against 61.5 ms) shows here whether
    # this process had the AMX tiles.
    print(f"attn products: {attn.amx_status()}; {attn.bf16_dot_status()}; "
          f"{attn.bf16_probabilities_status()}")
    print("ratio = PyTorch ms / attn ms per round: the median over rounds [lowest, highest]; "
          "best = PyTorch's fastest pass / attn's fastest pass over all rounds; "
          "GFLOP/s count visible pairs, 4d (forward) or 8d (backward) per pair\n")
    print(f"{'workload':<21}{'n':>6}{'thr':>4}{'attn ms':>10}{'torch ms':>10}{'attn GF/s':>10}"
          f"{'ratio':>7}  {'range':<14}{'best':>6}")
    rows = []
    for n in sizes:
        generator = torch.Generator().manual_seed(n)
        shapes = [(args.batch, heads, n, args.head_dim)
                  for heads in (args.heads, kv_heads, kv_heads)]
        base = [torch.rand(shape, generator=generator) * 2 - 1 for shape in shapes]
        for workload in workloads:
            dtype = WORKLOADS[workload][0]
            q, k, v = (x.to(dtype) for x in base)
            for threads in thread_counts:
                attn.set_num_threads(threads)
                torch.set_num_threads(threads)
                calls = make_calls(workload, q, k, v)
                for call in calls.values():
                    call()  # warm-up: first-touch pages, thread pools
                per_round = {"attn": [], "torch": []}
                fastest = {"attn": float("inf"), "torch": float("inf")}
                for r in range(args.rounds):
                    order = ("attn", "torch") if r % 2 == 0 else ("torch", "attn")
                    for name in order:
                        times = pass_ms(calls[name], args.repeats)
                        per_round[name].append(statistics.median(times))
                        fastest[name] = min(fastest[name], min(times))
                ratios = [t / a for a, t in zip(per_round["attn"], per_round["torch"])]
                attn_ms = statistics.median(per_round["attn"])
                torch_ms = statistics.median(per_round["torch"])
                gflops = flops(workload, args.batch, args.heads, n, args.head_dim) / attn_ms / 1e6
                row = {"workload": workload, "n": n, "threads": threads, "attn_ms": attn_ms,
                       "torch_ms": torch_ms, "attn_gflops": gflops,
                       "ratio": statistics.median(ratios), "ratio_min": min(ratios),
                       "ratio_max": max(ratios), "attn_rounds": per_round["attn"],
                       "torch_rounds": per_round["torch"], "attn_best_ms": fastest["attn"],
                       "torch_best_ms": fastest["torch"],
                       "best_ratio": fastest["torch"] / fastest["attn"]}
                rows.append(row)
                print(f"{workload:<21}{n:>6}{threads:>4}{attn_ms:>10.2f}{torch_ms:>10.2f}"
                      f"{gflops:>10.1f}{row['ratio']:>7.2f}  "
                      f"{f'[{min(ratios):.2f}, {max(ratios):.2f}]':<14}{row['best_ratio']:>6.2f}",
                      flush=True)
                del calls
    scaling = [(r["workload"], r["n"], r["threads"], s["attn_ms"] / r["attn_ms"])
               for r in rows for s in rows
               if s["workload"] == r["workload"] and s["n"] == r["n"] and s["threads"] == 1
               and r["threads"] > 1]
    if scaling:
        print("\nattn's thread scaling (1-thread ms / T-thread ms, same run):")
        for workload, n, threads, factor in scaling:
            print(f"  {workload:<21} n={n:<6} T={threads:<3} {factor:.2f}x")
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump({"torch": torch.__version__, "cpu": cpu, "batch": args.batch,
                       "heads": args.heads, "kv_heads": kv_heads, "head_dim": args.head_dim,
                       "attn_simd_target": attn.simd_target(),
                       "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
                       "rounds": args.rounds,
                       "repeats": args.repeats, "rows": rows}, out, indent=1)
        print(f"wrote {args.json_out}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
