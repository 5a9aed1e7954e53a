#!/usr/bin/env python3
"""Interleaved A/B runs of attn.torch calls against a saved copy of an older attn Python module.

The Python module links its kernels in, so bench/ab_kernels.py (which swaps libattn_kernels.so)
cannot compare two of its builds. Copy the installed package aside before rebuilding it, e.g.

    mkdir -p /tmp/attn-old && cp -a build/venv/lib/python3.*/site-packages/attn /tmp/attn-old/
    (change, then pip install . again)
    build/venv/bin/python bench/ab_python.py --old /tmp/attn-old --sizes 1024 --threads 1 \\
        --layout bnhd --rounds 4

Each round runs one process per build (the old one with --old first on PYTHONPATH), their order
alternating between rounds, so that drifts of the machine fall on both alike. A process times
the forward (under no_grad) and the backward (torch.autograd.grad of the output) of
attn.torch.scaled_dot_product_attention for fp16, bf16 and fp32 tensors of B = 4, 8 heads of
64: the median of --repeats calls after one warm-up. `--layout bhnd` makes contiguous (B, H, n,
d) tensors; `bnhd` makes (B, n, H, d) storage seen as (B, H, n, d), the layout Hugging Face
transformers passes. Prints each row's median over rounds per build and old / new.
"""
import argparse
import collections
import os
import statistics
import subprocess
import sys
import time

DTYPES = ("float16", "bfloat16", "float32")


def measure(n, threads, layout, repeats):
    """One build's medians in ms, {"<dtype>-fwd": ms, "<dtype>-bwd": ms}."""
    import torch

    import attn
    import attn.torch as attn_torch

    attn.set_num_threads(threads)
    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(0)
    result = {}
    for name in DTYPES:
        dtype = getattr(torch, name)

        def tensor():
            if layout == "bnhd":
                x = torch.randn(4, n, 8, 64, generator=generator).to(dtype).transpose(1, 2)
            else:
                x = torch.randn(4, 8, n, 64, generator=generator).to(dtype)
            return x.requires_grad_()

        q, k, v = tensor(), tensor(), tensor()
        out = attn_torch.scaled_dot_product_attention(q, k, v)
        grad_out = torch.randn_like(out)

        def forward():
            with torch.no_grad():
                attn_torch.scaled_dot_product_attention(q, k, v)

        def backward():
            torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)

        for label, call in (("fwd", forward), ("bwd", backward)):
            call()
            seconds = []
            for _ in range(repeats):
                start = time.perf_counter()
                call()
                seconds.append(time.perf_counter() - start)
            result[f"{name}-{label}"] = statistics.median(seconds) * 1e3
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="folder holding the older build's attn package")
    parser.add_argument("--sizes", default="1024")
    parser.add_argument("--threads", default="1")
    parser.add_argument("--layout", choices=("bhnd", "bnhd"), default="bhnd")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--worker", nargs=2, type=int, metavar=("N", "THREADS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        figures = measure(args.worker[0], args.worker[1], args.layout, args.repeats)
        print(" ".join(f"{key}={ms:.4f}" for key, ms in figures.items()))
        return
    if not args.old or not os.path.isdir(os.path.join(args.old, "attn")):
        sys.exit(f"ab_python.py: --old: expected a folder holding an attn package, got {args.old}")
    for n in (int(s) for s in args.sizes.split(",")):
        for threads in (int(s) for s in args.threads.split(",")):
            medians = {"old": collections.defaultdict(list), "new": collections.defaultdict(list)}
            for round_index in range(args.rounds):
                order = ("old", "new") if round_index % 2 == 0 else ("new", "old")
                for build in order:
                    env = dict(os.environ)
                    if build == "old":
                        env["PYTHONPATH"] = os.pathsep.join(
                            [args.old] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
                    command = [sys.executable, __file__, "--worker", str(n), str(threads),
                               "--layout", args.layout, "--repeats", str(args.repeats)]
                    run = subprocess.run(command, env=env, capture_output=True, text=True,
                                         check=False)
                    if run.returncode != 0:
                        sys.exit(f"ab_python.py: the {build} build's process failed:\n{run.stderr}")
                    for field in run.stdout.split():
                        key, ms = field.split("=")
                        medians[build][key].append(float(ms))
            for key in medians["old"]:
                old = statistics.median(medians["old"][key])
                new = statistics.median(medians["new"][key])
                print(f"n={n} threads={threads} layout={args.layout} {key:14s} old {old:9.2f} ms"
                      f"  new {new:9.2f} ms  old/new {old / new:.3f}")


if __name__ == "__main__":
    main()
