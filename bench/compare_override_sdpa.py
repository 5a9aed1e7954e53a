#!/usr/bin/env python3
"""A PyTorch model's own layers with and without attn.torch.override_sdpa, in interleaved rounds.

What a PyTorch user gets from one line: torch.nn.TransformerEncoderLayer (d_model = heads ·
head_dim, feed-forward 4 · d_model, no dropout, batch_first, a causal mask) whose self-attention
calls torch.nn.functional.scaled_dot_product_attention, timed as the user runs it — a training
step (forward and backward of the whole layer, projections and feed-forward included) and a
forward in training mode under torch.no_grad (the modules' C++ fast path, which bypasses the
Python function, serves evaluation mode only). Each round times PyTorch's function and attn's
(under the override) `--repeats` times each, their order alternating between rounds; the ratio
is the median over rounds of PyTorch / attn, with its range. float32, or bfloat16 under
torch.autocast("cpu") with --autocast.

    python bench/compare_override_sdpa.py --sizes 1024,4096 --threads 1,2 [--autocast]
"""
import argparse
import statistics

import torch

import attn.torch as attn_torch
from compare_decode import cpu_name  # this folder's decode comparison
from interleaved_pytorch import median_ms  # and its interleaved rounds' timer


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,4096")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--autocast", action="store_true", help="bfloat16 under torch.autocast")
    args = parser.parse_args()

    width = args.heads * args.head_dim
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(width, args.heads, 4 * width, dropout=0.0,
                                             batch_first=True)
    print(f"machine: {cpu_name()}; torch {torch.__version__}; "
          f"TransformerEncoderLayer d_model={width} ({args.heads} heads of {args.head_dim}), "
          f"B={args.batch}, causal; {'bfloat16 autocast' if args.autocast else 'float32'}; "
          f"median of {args.repeats} per round, {args.rounds} rounds")
    print(f"{'workload':>9} {'n':>6} {'threads':>7} {'torch ms':>9} {'attn ms':>9} "
          f"{'torch/attn':>10} {'range':>13}")
    for n in [int(s) for s in args.sizes.split(",")]:
        x = torch.randn(args.batch, n, width)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(n)

        def train_step():
            with torch.autocast("cpu", enabled=args.autocast):
                output = layer(x.requires_grad_(True), src_mask=mask, is_causal=True)
            output.float().sum().backward()

        def forward():
            with torch.no_grad(), torch.autocast("cpu", enabled=args.autocast):
                layer(x, src_mask=mask, is_causal=True)

        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            for name, fn in (("training", train_step), ("forward", forward)):
                fn()  # warm-up of both: threads, buffers
                with attn_torch.override_sdpa():
                    fn()
                ratios, torch_times, attn_times = [], [], []
                for round_index in range(args.rounds):
                    def with_attn():
                        with attn_torch.override_sdpa():
                            return median_ms(fn, args.repeats)

                    if round_index % 2 == 0:
                        t, a = median_ms(fn, args.repeats), with_attn()
                    else:
                        a, t = with_attn(), median_ms(fn, args.repeats)
                    torch_times.append(t)
                    attn_times.append(a)
                    ratios.append(t / a)
                print(f"{name:>9} {n:>6} {threads:>7} {statistics.median(torch_times):>9.1f} "
                      f"{statistics.median(attn_times):>9.1f} {statistics.median(ratios):>9.2f}x "
                      f"{min(ratios):>6.2f}-{max(ratios):.2f}x")


if __name__ == "__main__":
    main()
