#!/usr/bin/env python3
# Draws GFLOP/s against sequence length (or, with --against threads, against the thread count at one
# length) for attn (fused, plain, from Python) and its PyTorch peers on one workload, with the FMA
# peak and sgemm ceilings, from the JSON compare_pytorch.py --json-out writes, or from
# interleaved_pytorch.py's (attn.torch and PyTorch's SDPA taking turns; ceilings from --ceilings).
"""Plot one workload of the attention benchmark (PNG) from compare_pytorch.py's JSON."""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = [  # (implementation, label, style)
    ("attn-fused", "attn fused", "o-"),
    ("attn-plain", "attn plain (book's algorithm, serial)", "s--"),
    ("attn-python", "attn from Python (attn.scaled_dot_product_attention, attn.torch)", "D-"),
    ("torch-sdpa", "PyTorch scaled_dot_product_attention", "^-"),
    ("torch-book", "PyTorch, the book's code (bmm + masked softmax + bmm)", "v--"),
    ("torch-book-additive", "PyTorch, the book's AdditiveAttention", "d--"),
    ("torch-mha", "PyTorch nn.MultiheadAttention", "^-"),
    # compare_pytorch.py --onnx-mha: the same layer as an ONNX graph
    ("onnxruntime-mha", "ONNX Runtime MultiHeadAttention (com.microsoft), with projections", "P-"),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", help="JSON from compare_pytorch.py --json-out")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--threads", type=int, help="thread count to plot (default: the largest)")
    parser.add_argument("--workload", default="dot",
                        help="dot, dot-padded, dot-causal, dot-backward, mha, additive or "
                             "additive-backward")
    parser.add_argument("--against", choices=["length", "threads"], default="length",
                        help="the x axis: sequence length (at --threads) or thread count (at --size)")
    parser.add_argument("--size", type=int, default=1024, help="n for --against threads")
    parser.add_argument("--ceilings",
                        help="attn bench --json-out of the same machine: the FMA peak and sgemm "
                             "lines for interleaved_pytorch.py's JSON")
    args = parser.parse_args()
    with open(args.results) as source:
        results = json.load(source)
    if results["rows"] and "attn_ms" in results["rows"][0]:
        ceilings = {"fma_peak": [], "sgemm": []}
        if args.ceilings:
            with open(args.ceilings) as source:
                ceilings = json.load(source)
        results = from_interleaved(results, ceilings)
    rows = results["rows"]
    if args.against == "threads":
        plot_against_threads(results, rows, args)
        return
    threads = args.threads or max(r["threads"] for r in rows)
    figure, axes = plt.subplots(figsize=(8, 6))
    sizes = []
    for impl, label, style in SERIES:
        points = sorted((r["n"], r["gflops"]) for r in rows if r["impl"] == impl
                        and r["workload"] == args.workload
                        # attn's serial plain path ran with 1 thread only
                        and (r["threads"] == threads or impl == "attn-plain"))
        if points:
            axes.plot(*zip(*points), style, label=label)
            sizes.extend(n for n, _ in points)
    # The ceilings are those of the dot-product products; additive work is mostly tanh.
    ceilings = args.workload.startswith("dot")
    sgemm = sorted((s["n"], s["gflops"]) for s in results["attn"]["sgemm"]
                   if s["threads"] == threads) if ceilings else []
    if sgemm:
        axes.plot(*zip(*sgemm), "x:", color="grey", label="oneDNN sgemm, attention shapes")
    for peak in results["attn"]["fma_peak"] if ceilings else []:
        if peak["threads"] == threads:
            axes.axhline(peak["gflops"], color="black", linestyle="-.",
                         label=f"FMA peak ({peak['gflops']:.0f} GFLOP/s)")
    axes.set_xscale("log", base=2)
    axes.set_xticks(sorted(set(sizes)), [str(n) for n in sorted(set(sizes))])
    axes.set_xlabel("sequence length n = m")
    finish(figure, axes, results, args, f"{run_shape(results, args)}, {threads} thread(s)")


# interleaved_pytorch.py's workloads by compare_pytorch.py's names.
INTERLEAVED_WORKLOADS = {"forward": "dot", "causal": "dot-causal", "backward": "dot-backward",
                         "bf16-forward": "dot-bf16", "bf16-causal": "dot-causal-bf16",
                         "bf16-backward": "dot-backward-bf16"}


def from_interleaved(interleaved, ceilings):
    """interleaved_pytorch.py's rows as compare_pytorch.py's: attn.torch as attn-python, PyTorch's
    SDPA as torch-sdpa at the same work (its GFLOP/s = attn's x attn ms / PyTorch ms)."""
    rows = []
    for row in interleaved["rows"]:
        common = {"workload": INTERLEAVED_WORKLOADS.get(row["workload"], row["workload"]),
                  "n": row["n"], "threads": row["threads"]}
        rows.append({**common, "impl": "attn-python", "gflops": row["attn_gflops"]})
        rows.append({**common, "impl": "torch-sdpa",
                     "gflops": row["attn_gflops"] * row["attn_ms"] / row["torch_ms"]})
    shape = {"batch": interleaved["batch"], "heads": interleaved["heads"],
             "head_dim": interleaved["head_dim"]}
    return {"rows": rows, "load_average_before": ceilings.get("load_average_before", "unrecorded"),
            "attn": {"shape": shape, "fma_peak": ceilings["fma_peak"],
                     "sgemm": ceilings["sgemm"]}}


def run_shape(results, args):
    """B, heads and d as the run recorded them (attn bench's "shape"; older files: B=4, 8 of 64)."""
    shape = results["attn"].get("shape", {})
    batch, heads, depth = shape.get("batch", 4), shape.get("heads", 8), shape.get("head_dim", 64)
    if args.workload.startswith("additive"):
        return f"B={batch}, h=d={depth}"
    return f"B={batch}, {heads} heads, d={depth}"


def finish(figure, axes, results, args, what):
    """The axes' labels, title (workload, `what`, the run's load) and legend; writes args.out."""
    axes.set_ylabel("GFLOP/s (unmasked work)")
    axes.set_ylim(bottom=0)
    axes.set_title(f"Attention, workload {args.workload}, {what}\nPyTorch run started at load "
                   f"average {results['load_average_before']}")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    figure.tight_layout()
    figure.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


def plot_against_threads(results, rows, args):
    """GFLOP/s against the thread count at n = args.size, with the FMA peak at each count."""
    figure, axes = plt.subplots(figsize=(8, 6))
    counts = set()
    for impl, label, style in SERIES:
        points = sorted((r["threads"], r["gflops"]) for r in rows if r["impl"] == impl
                        and r["workload"] == args.workload and r["n"] == args.size)
        if impl == "attn-plain" or not points:
            continue  # the plain path is serial
        axes.plot(*zip(*points), style, label=label)
        counts.update(t for t, _ in points)
    if args.workload.startswith("dot"):
        peaks = sorted((p["threads"], p["gflops"]) for p in results["attn"]["fma_peak"])
        if peaks:
            axes.plot(*zip(*peaks), "k-.", label="FMA peak")
    axes.set_xticks(sorted(counts), [str(t) for t in sorted(counts)])
    axes.set_xlabel("threads")
    finish(figure, axes, results, args, f"n = {args.size}, {run_shape(results, args)}")


if __name__ == "__main__":
    main()
