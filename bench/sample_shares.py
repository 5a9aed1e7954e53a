#!/usr/bin/env python3
"""Where the fused forward's samples fall within one run, per build of libattn_kernels.so.

On a host whose neighbours move a case's time by 25% between runs, a change of a few percent is
read from the shares of one run instead: functions that run in the same pass share its
disturbance. Each round runs `perf record -e cpu-clock` on one `attn bench` call per build (the
build's folder first on LD_LIBRARY_PATH, as bench/ab_kernels.py; an empty folder means the CLI's
own), builds alternating, and prints per run the milliseconds, the kernel functions' shares of the
samples and two ratios: the softmax step's samples against the two products' (fp32:
FlashForwardTiles' lambda against Gemm<false> + Gemm<true>; bf16: FlashForwardTileBF16 against the
AMX ProductOnTiles) and everything else of the pass against the products. The fp32 backward
(--cases fused-backward) reads the same way: its five products are the Gemm samples, its "softmax"
FlashBackwardQueryHead's own (P, dS), "pack" the padded copies and "write" the gradients' rows.
Only ratios of runs side by side count. Needs `perf` (linux-perf) and a Release build; e.g.

    python3 bench/sample_shares.py --rounds 3 --lib before=/tmp/a --lib after= -- \\
        --cases fused --sizes 2048
"""

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile

# (symbol substring, part) for the fp32 and bf16 forward passes.
PARTS = [
    ("Gemm<false", "QK"),
    ("Gemm<true", "PV"),
    ("ProductOnTiles<false", "QK"),
    ("ProductOnTiles<true", "PV"),
    ("FlashForwardTiles(", "softmax"),
    ("FlashForwardTileBF16", "softmax"),
    ("PackKeysAndValues", "pack"),
    ("PackKeyValue", "pack"),
    ("PrepareQueryTile", "prepare"),
    ("WriteOutputRows", "write"),
    # The fp32 backward (fused-backward): Gemm<false> makes Sᵀ and dPᵀ, Gemm<true> dV, dK and dQ
    # (printed as QK and PV); the query head's own samples are P, dS and the rest of its steps.
    ("FlashBackwardQueryHead", "softmax"),
    ("PadRows", "pack"),
    ("WriteGradientRow", "write"),
    ("PrefetchGradientRow", "write"),
]


def shares(report):
    """Per part, the percentage of all samples (perf report --no-children --sort symbol)."""
    parts = collections.Counter()
    for line in report.splitlines():
        fields = line.split(None, 2)
        if len(fields) < 3 or not fields[0].endswith("%"):
            continue
        for needle, part in PARTS:
            if needle in fields[2]:
                parts[part] += float(fields[0].rstrip("%"))
                break
    return parts


def run(cli, library, bench_args, data):
    env = dict(os.environ)
    if library:
        env["LD_LIBRARY_PATH"] = library + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    out = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", "4000", "-o", data, cli,
                          "bench", "--no-ceilings", "--threads", "1", *bench_args],
                         env=env, capture_output=True, text=True, check=True).stdout
    report = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "symbol"],
                            capture_output=True, text=True, check=True).stdout
    times = [line.split()[3] for line in out.splitlines()
             if line.split()[:1] and line.split()[0].startswith("fused")
             and len(line.split()) > 3]
    return (times[0] if times else "?"), shares(report)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lib", action="append", required=True, metavar="NAME=FOLDER")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cli", default="build/release/cli/attn")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER,
                        help="after --: attn bench's arguments (one case and one size)")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        sys.exit("sample_shares.py needs perf: apt-get install linux-perf (Debian)")
    bench_args = [a for a in args.bench_args if a != "--"]
    builds = [tuple(item.split("=", 1)) for item in args.lib]
    with tempfile.TemporaryDirectory() as folder:
        data = os.path.join(folder, "perf.data")
        for round_index in range(args.rounds):
            for name, library in builds:
                ms, parts = run(args.cli, library, bench_args, data)
                products = parts["QK"] + parts["PV"]
                if products == 0:
                    sys.exit("no samples in the products: not a fused case?")
                rest = parts["softmax"] + parts["pack"] + parts["prepare"] + parts["write"]
                print(f"round {round_index + 1} {name}: {ms} ms; QK {parts['QK']:.1f}% "
                      f"PV {parts['PV']:.1f}% softmax {parts['softmax']:.1f}% "
                      f"pack {parts['pack']:.1f}% prepare {parts['prepare']:.1f}% "
                      f"write {parts['write']:.1f}% | softmax / products "
                      f"{parts['softmax'] / products:.3f}, rest / products {rest / products:.3f}",
                      flush=True)


if __name__ == "__main__":
    main()
