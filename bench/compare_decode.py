#!/usr/bin/env python3
# Decoding side by side in one run: attn.scaled_dot_product_attention(query, attn.KVCache) and
# attn.torch.scaled_dot_product_attention on plain tensors (the call transformers makes) against
# PyTorch's scaled_dot_product_attention(enable_gqa=True) on the same cache, each dtype, every
# length and thread count, in GB/s of keys and values read and % of a stream read of the same run.
"""Compare attn's decode call with PyTorch's SDPA on a KV cache (CPU), and plot it.

Run with the Python that scripts/test.sh builds (attn, torch; matplotlib for --plot-out):
    build/venv/bin/python bench/compare_decode.py --lengths 4096,32768,131072 --threads 1,2 \
        --attn-cli build/release/cli/attn --json-out docs/decode.json --plot-out docs/decode.png

Both calls take a float32 query (B, 32, n, 128) against 8 key/value heads of 128 cached tokens
(the decode shape of a Llama-3-8B layer; --heads, --kv-heads and --head-dim change it: 8, 8, 64
or 128 for a multi-head model of one query row per key/value head); PyTorch's cache is a tensor of the dtype (its query too:
PyTorch SDPA wants one dtype), attn's an attn.KVCache of that dtype. PyTorch has no int8 SDPA.
The "attn-torch" rows call attn.torch.scaled_dot_product_attention on PyTorch's own tensors
(query of the cache's dtype, causal bottom-right for n > 1): attn's decode kernel behind the
PyTorch-shaped call, as a transformers model with attn_implementation="attn" decodes. The
"attn-functional" rows make the same call through attn.scaled_dot_product_attention on the same
tensors: attn.torch's own Python layers are the difference between the two.
Each timed pass follows a read of twice the L3, so the cache comes from memory as it does between
two layers of a model (--warm leaves it out: a cache small enough stays in L2 or L3, as a small
model's at short contexts). Not part of CI: timings need a quiet machine.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import time

import numpy as np
import torch
import torch.nn.functional as F

import attn
import attn.torch as attn_torch

LABELS = {"attn": "attn KVCache", "attn-torch": "attn.torch SDPA",
          "attn-functional": "attn.scaled_dot_product_attention", "torch": "PyTorch SDPA"}
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def parse_ints(text):
    return [int(part) for part in text.split(",") if part]


def l3_bytes():
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as size:
            text = size.read().strip()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
        return int(text.rstrip("KMG")) * scale
    except (OSError, ValueError):
        return 32 << 20


def cpu_name():
    fields = {}
    with open("/proc/cpuinfo") as info:
        for line in info:
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return (f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, "
            f"model {fields.get('model', '?')})")


def stream_read(threads, buffer, repeats=5):
    """GB/s of a multi-threaded sum over a buffer far larger than the L3 (PyTorch's reduction)."""
    torch.set_num_threads(threads)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * buffer.element_size() / best / 1e9


def timed(call, evict, repeats):
    call()  # warm-up
    times = []
    for _ in range(repeats):
        if evict is not None:
            evict.sum()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=parse_ints, default=[4096, 32768, 131072],
                        help="cached tokens m, comma-separated")
    parser.add_argument("--batch", type=int, default=1, help="sequences B")
    parser.add_argument("--queries", type=int, default=1, help="new queries n per sequence")
    parser.add_argument("--threads", type=parse_ints, default=[1, os.cpu_count() or 1])
    parser.add_argument("--dtypes", default="float32,float16,bfloat16,int8")
    parser.add_argument("--heads", type=int, default=32, help="query heads H_q")
    parser.add_argument("--kv-heads", type=int, default=8, help="key/value heads H_kv")
    parser.add_argument("--head-dim", type=int, default=128, help="head size d")
    parser.add_argument("--warm", action="store_true",
                        help="no eviction read between passes (the cache stays in L2/L3 if it fits)")
    parser.add_argument("--repeats", type=int, default=15, help="timed passes (median kept)")
    parser.add_argument("--json-out", help="write the rows as JSON here")
    parser.add_argument("--plot-out", help="draw GB/s against m per dtype here (PNG, matplotlib)")
    parser.add_argument("--attn-cli", help="attn executable: take the stream read from `attn "
                        "bench` (Highway, every thread summing its slice) instead of torch.sum")
    args = parser.parse_args()
    dtypes = [name for name in args.dtypes.split(",") if name]
    heads, kv_heads, head_dim = args.heads, args.kv_heads, args.head_dim

    rng = np.random.default_rng(1)
    evict = None if args.warm else torch.ones(2 * l3_bytes() // 4, dtype=torch.float32)
    if args.attn_cli:
        report = json.loads(subprocess.run(
            [args.attn_cli, "bench", "--cases", "decode-float32", "--quick", "--threads",
             ",".join(map(str, args.threads)), "--json"], check=True, capture_output=True,
            text=True).stdout)
        ceilings = {entry["threads"]: entry["gbytes_per_second"] for entry in report["stream_read"]}
        ceiling_source = "attn bench's stream read"
    else:
        stream_buffer = torch.ones((1 << 30) // 4, dtype=torch.float32)
        ceilings = {t: stream_read(t, stream_buffer) for t in args.threads}
        del stream_buffer
        ceiling_source = "torch.sum over 1 GiB"
    B, n = args.batch, args.queries
    rows = []
    for m in args.lengths:
        keys = rng.standard_normal((B, kv_heads, m, head_dim), dtype=np.float32)
        values = rng.standard_normal((B, kv_heads, m, head_dim), dtype=np.float32)
        query = rng.standard_normal((B, heads, n, head_dim), dtype=np.float32)
        for dtype in dtypes:
            cache = attn.KVCache(B, kv_heads, head_dim, m, dtype)
            cache.append(keys, values)
            element = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}[dtype]
            scales = 2 * 4 if dtype == "int8" else 0
            kv_bytes = B * m * kv_heads * (2 * head_dim * element + scales)
            torch_k = torch_v = torch_q = None
            if dtype in TORCH_DTYPES:
                torch_k = torch.from_numpy(keys).to(TORCH_DTYPES[dtype])
                torch_v = torch.from_numpy(values).to(TORCH_DTYPES[dtype])
                torch_q = torch.from_numpy(query).to(TORCH_DTYPES[dtype])
            for threads in args.threads:
                attn.set_num_threads(threads)
                torch.set_num_threads(threads)
                seconds = {"attn": timed(
                    lambda: attn.scaled_dot_product_attention(query, cache, None, is_causal=True,
                                                          enable_gqa=True),
                    evict, args.repeats)}
                if torch_k is not None:
                    # n > 1 new queries see the cache bottom-right causally: PyTorch's is_causal is
                    # top-left, so its mask is explicit.
                    mask = None
                    if n > 1:
                        mask = torch.ones(n, m, dtype=torch.bool).tril(diagonal=m - n)
                    with torch.inference_mode():
                        seconds["torch"] = timed(
                            lambda: F.scaled_dot_product_attention(
                                torch_q, torch_k, torch_v, attn_mask=mask, enable_gqa=True),
                            evict, args.repeats)
                        for name, function in (
                                ("attn-torch", attn_torch.scaled_dot_product_attention),
                                ("attn-functional", attn.scaled_dot_product_attention)):
                            seconds[name] = timed(
                                lambda: function(torch_q, torch_k, torch_v, is_causal=n > 1,
                                                 alignment="bottom-right", enable_gqa=True),
                                evict, args.repeats)
                for implementation, value in seconds.items():
                    rate = kv_bytes / value / 1e9
                    rows.append({"implementation": implementation, "dtype": dtype, "batch": B,
                                 "queries": n, "length": m, "threads": threads,
                                 "ms": value * 1e3, "gb_per_s": rate,
                                 "percent_of_stream_read": 100.0 * rate / ceilings[threads]})
            del cache, torch_k, torch_v, torch_q

    print(f"decode: {cpu_name()}, {os.cpu_count()} logical CPUs; attn {attn.__version__}, "
          f"torch {torch.__version__}; B={B}, n={n}, {heads} query heads over {kv_heads} of "
          f"{head_dim}; median of {args.repeats} passes, "
          + ("warm (no eviction read)" if args.warm
             else f"each after a {2 * l3_bytes() >> 20} MiB eviction read"))
    for threads, rate in ceilings.items():
        print(f"stream read ({ceiling_source}), {threads} thread(s): {rate:.1f} GB/s")
    print(f"{'dtype':10} {'m':>7} {'thr':>3} {'attn ms':>9} {'GB/s':>6} {'%read':>6} "
          f"{'torch ms':>9} {'GB/s':>6} {'%read':>6} {'attn/torch':>10} {'vs fp32':>8} "
          f"{'attn-torch ms':>13} {'torch/it':>8} {'functional ms':>13} {'torch/it':>8}")
    index = {(r["implementation"], r["dtype"], r["length"], r["threads"]): r for r in rows}
    for m in args.lengths:
        for dtype in dtypes:
            for threads in args.threads:
                a = index[("attn", dtype, m, threads)]
                t = index.get(("torch", dtype, m, threads))
                fp32 = index.get(("attn", "float32", m, threads))
                torch_text = (f"{t['ms']:9.3f} {t['gb_per_s']:6.1f} {t['percent_of_stream_read']:6.1f}"
                              f" {t['ms'] / a['ms']:9.2f}x" if t else f"{'-':>9} {'-':>6} {'-':>6} "
                              f"{'-':>10}")
                ratio = f"{fp32['ms'] / a['ms']:7.2f}x" if fp32 else "-"
                plain_texts = []
                for implementation in ("attn-torch", "attn-functional"):
                    plain = index.get((implementation, dtype, m, threads))
                    plain_texts.append(f"{plain['ms']:13.3f} {t['ms'] / plain['ms']:7.2f}x"
                                       if plain else f"{'-':>13} {'-':>8}")
                print(f"{dtype:10} {m:7d} {threads:3d} {a['ms']:9.3f} {a['gb_per_s']:6.1f} "
                      f"{a['percent_of_stream_read']:6.1f} {torch_text} {ratio:>8} "
                      + " ".join(plain_texts))
    document = {"machine": {"cpu": cpu_name(), "logical_cpus": os.cpu_count(),
                            "python": platform.python_version(), "torch": torch.__version__},
                "stream_read_gb_per_s": {str(k): v for k, v in ceilings.items()},
                "stream_read_source": ceiling_source, "rows": rows}
    if args.json_out:
        with open(args.json_out + ".tmp", "w") as out:
            json.dump(document, out, indent=1)
        os.replace(args.json_out + ".tmp", args.json_out)
    if args.plot_out:
        plot(document, args.plot_out, dtypes)


def plot(document, path, dtypes):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = document["rows"]
    thread_counts = sorted({r["threads"] for r in rows})
    figure, axes = plt.subplots(1, len(thread_counts), figsize=(6 * len(thread_counts), 4.5),
                                squeeze=False)
    colours = dict(zip(dtypes, ["C0", "C1", "C2", "C3"]))
    for axis, threads in zip(axes[0], thread_counts):
        for implementation, style in (("attn", "o-"), ("attn-torch", "s:"), ("torch", "^--")):
            for dtype in dtypes:
                points = sorted((r["length"], r["gb_per_s"]) for r in rows
                                if r["implementation"] == implementation and r["dtype"] == dtype
                                and r["threads"] == threads)
                if points:
                    axis.plot(*zip(*points), style, color=colours[dtype],
                              label=f"{LABELS[implementation]} {dtype}")
        ceiling = document["stream_read_gb_per_s"][str(threads)]
        axis.axhline(ceiling, color="grey", linestyle=":", label="stream read")
        axis.set_xscale("log", base=2)
        axis.set_xlabel("cached tokens m")
        axis.set_ylabel("GB/s of K and V read")
        axis.set_title(f"{threads} thread(s)")
        axis.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    figure.suptitle(f"Decoding one query, 32 heads over 8 of 128 — {document['machine']['cpu']}",
                    fontsize=9)
    figure.tight_layout()
    figure.savefig(path + ".tmp.png", dpi=110)
    os.replace(path + ".tmp.png", path)


if __name__ == "__main__":
    main()
