#!/usr/bin/env python3
"""attn.torch beside PyTorch's SDPA under torch.func: vmap and per-sample gradients.

Per-sample gradients (torch.func.vmap of torch.func.grad, as differential-privacy training and
influence functions use them) and vmap over a batch of independent attention calls (model
ensembles), each sample (1, H, n, d) with its own keys and values, causal. attn's batching rule
makes one call for the batch; --per-sample times attn's calls made one per sample instead (what
vmap's fallback did before the rule). Interleaved rounds: per round the median of `--repeats`
passes of each, the ratio the median over rounds of PyTorch / attn.

    python bench/compare_torch_func.py --samples 64 --sizes 128,512 --threads 1,2
"""
import argparse
import statistics

import torch
import torch.nn.functional as F

import attn.torch as attn_torch
from compare_decode import cpu_name  # this folder's decode comparison
from interleaved_pytorch import median_ms  # and its interleaved rounds' timer


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--sizes", default="128,512")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-sample", action="store_true",
                        help="also time attn one call per sample (a Python loop of its calls)")
    args = parser.parse_args()
    print(f"machine: {cpu_name()}; torch {torch.__version__}; {args.samples} samples of (1, "
          f"{args.heads}, n, {args.head_dim}), causal, float32; median of {args.repeats} per "
          f"round, {args.rounds} rounds")
    print(f"{'workload':>16} {'n':>5} {'threads':>7} {'torch ms':>9} {'attn ms':>9} "
          f"{'torch/attn':>10} {'range':>13}" + (f" {'per-sample ms':>13}" if args.per_sample
                                                 else ""))
    for n in [int(s) for s in args.sizes.split(",")]:
        shape = (args.samples, 1, args.heads, n, args.head_dim)
        q, k, v = (torch.randn(shape) for _ in range(3))
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            for workload in ("vmap", "per-sample grads"):
                def run(function):
                    def attend(q, k, v):
                        return function(q, k, v, is_causal=True)

                    if workload == "vmap":
                        return lambda: torch.func.vmap(attend)(q, k, v)
                    loss = lambda q, k, v: (attend(q, k, v) ** 2).sum()  # noqa: E731
                    return lambda: torch.func.vmap(torch.func.grad(loss, argnums=(0, 1, 2)))(
                        q, k, v)

                calls = (run(F.scaled_dot_product_attention),
                         run(attn_torch.scaled_dot_product_attention))
                for call in calls:
                    call()  # warm-up
                ratios, times = [], ([], [])
                for round_index in range(args.rounds):
                    order = (0, 1) if round_index % 2 == 0 else (1, 0)
                    measured = {i: median_ms(calls[i], args.repeats) for i in order}
                    times[0].append(measured[0])
                    times[1].append(measured[1])
                    ratios.append(measured[0] / measured[1])
                line = (f"{workload:>16} {n:>5} {threads:>7} {statistics.median(times[0]):>9.2f} "
                        f"{statistics.median(times[1]):>9.2f} {statistics.median(ratios):>9.2f}x "
                        f"{min(ratios):>6.2f}-{max(ratios):.2f}x")
                if args.per_sample:
                    def loop():
                        for i in range(args.samples):
                            if workload == "vmap":
                                attn_torch.scaled_dot_product_attention(q[i], k[i], v[i],
                                                                        is_causal=True)
                            else:
                                x = [t[i].requires_grad_(True) for t in (q, k, v)]
                                out = attn_torch.scaled_dot_product_attention(*x, is_causal=True)
                                torch.autograd.grad((out ** 2).sum(), x)

                    line += f" {median_ms(loop, args.repeats):>13.2f}"
                print(line)


if __name__ == "__main__":
    main()
