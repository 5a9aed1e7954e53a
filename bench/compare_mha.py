"""attn.MultiHeadAttention against torch.nn.MultiheadAttention from Python, in one run.

Both layers in evaluation mode with biases, self-attention on x of shape (B, n, D), D = heads * d,
as a user calls them: attn on a NumPy array, PyTorch under inference_mode with need_weights=False.
Each library's passes run as a block (attn's, a pause, PyTorch's, a pause): the two OpenMP runtimes
would otherwise spin against each other on the same cores. Prints the median times and the ratio;
--json-out writes them too.

    python bench/compare_mha.py --sizes 1024,4096 --threads 1,2 --repeats 7
"""

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch

import attn
from compare_decode import cpu_name, parse_ints  # this folder's decode comparison


def median_ms(action, repeats):
    action()  # warm-up: threads started, buffers touched, oneDNN's kernels generated
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,4096", help="sequence lengths n, comma-separated")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json-out", help="also write the figures to this JSON file")
    args = parser.parse_args()

    width = args.heads * args.head_dim
    torch_layer = torch.nn.MultiheadAttention(width, args.heads, bias=True, batch_first=True).eval()
    attn_layer = attn.MultiHeadAttention(width, width, width, width, args.heads, bias=True).eval()
    rows = []
    print(f"machine: {cpu_name()}, {os.cpu_count()} logical CPUs; torch {torch.__version__}")
    print(f"B={args.batch}, {args.heads} heads of {args.head_dim}, D={width}, biases, eval mode; "
          f"median of {args.repeats}")
    print(f"{'n':>6} {'threads':>7} {'attn ms':>9} {'torch ms':>9} {'torch/attn':>10}")
    for n in parse_ints(args.sizes):
        x = np.random.default_rng(0).standard_normal((args.batch, n, width), dtype=np.float32)
        x_torch = torch.from_numpy(x)
        for threads in parse_ints(args.threads):
            attn.set_num_threads(threads)
            torch.set_num_threads(threads)
            attn_ms = median_ms(lambda: attn_layer(x, x, x), args.repeats)
            time.sleep(0.5)
            with torch.inference_mode():
                torch_ms = median_ms(
                    lambda: torch_layer(x_torch, x_torch, x_torch, need_weights=False),
                    args.repeats)
            time.sleep(0.5)
            rows.append({"n": n, "threads": threads, "attn_ms": attn_ms, "torch_ms": torch_ms})
            print(f"{n:>6} {threads:>7} {attn_ms:>9.1f} {torch_ms:>9.1f} {torch_ms / attn_ms:>9.2f}x")
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump({"machine": cpu_name(), "torch": torch.__version__, "batch": args.batch,
                       "heads": args.heads, "head_dim": args.head_dim, "repeats": args.repeats,
                       "rows": rows}, out, indent=2)


if __name__ == "__main__":
    main()
