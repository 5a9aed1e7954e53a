#!/usr/bin/env python3
# Decoding beside ggml's flash_attn_ext (llama.cpp's CPU attention): attn bench's decode cases and
# bench/ggml's ggml_decode_bench, interleaved on the same shape, lengths and thread counts.
"""Compare attn's decode step with ggml's ggml_flash_attn_ext on an F32 and an F16 KV cache.

Build ggml and its benchmark first (PyPI's llama-cpp-python sdist, portable AVX-512 flags):
    bash scripts/build-ggml.sh
    python3 bench/compare_ggml_decode.py --lengths 4096,32768,65536 --threads 1,2 --rounds 2 \\
        --json-out ggml.json

Both take one float32 query token per sequence (B = 1 unless --batch), 32 query heads over 8
key/value heads of 128, against m cached tokens of float32 (ggml: F32) or float16 (F16); in both
programs every timed pass follows a read of twice the L3, and GB/s counts the K and V bytes of the
cache. The two run in turn (attn, ggml, attn, ggml, ... for --rounds rounds), so that drifts of
the machine hit both; the table holds the median over the rounds of each program's median pass.
attn/ggml is ggml's time over attn's: how many times faster attn is. Issue 13's target is
attn/ggml >= 3 at m = 65536.
Standard library only; not part of CI: timings need a quiet machine.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

DTYPES = {"float32": "f32", "float16": "f16"}  # attn bench's cases ↔ ggml's cache types
TARGET_LENGTH, TARGET_RATIO = 65536, 3.0


def parse_ints(text):
    problem = f"expected positive integers separated by commas, got '{text}'"
    try:
        values = [int(part) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(problem) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(problem)
    return values


def parse_dtypes(text):
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in DTYPES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"expected {' or '.join(DTYPES)} separated by commas, got '{text}'")
    return names


def run(command, what):
    """Runs one benchmark; its progress lines (stderr) are shown only when it fails."""
    print(f"  {what}: {' '.join(command)}", file=sys.stderr, flush=True)
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{what} failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result.stdout


def run_attn(args, json_path, ceilings):
    command = [args.attn_cli, "bench", "--cases", ",".join(f"decode-{d}" for d in args.dtypes),
               "--decode-batch", str(args.batch), "--decode-queries", "1",
               "--decode-lengths", ",".join(map(str, args.lengths)),
               "--threads", ",".join(map(str, args.threads)),
               "--decode-repeats", str(args.repeats), "--json-out", json_path]
    if not ceilings:
        command.append("--no-ceilings")
    run(command, "attn")
    with open(json_path) as report:
        return json.load(report)


def run_ggml(args, json_path):
    command = [args.ggml_bench, "--cache", ",".join(DTYPES[d] for d in args.dtypes),
               "--batch", str(args.batch), "--lengths", ",".join(map(str, args.lengths)),
               "--threads", ",".join(map(str, args.threads)), "--repeats", str(args.repeats),
               "--kv-layout", args.kv_layout, "--json-out", json_path]
    run(command, "ggml")
    with open(json_path) as report:
        return json.load(report)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attn-cli", default="build/release/cli/attn", help="attn's CLI")
    parser.add_argument("--ggml-bench", default="build/ggml/ggml_decode_bench",
                        help="the benchmark scripts/build-ggml.sh builds")
    parser.add_argument("--lengths", type=parse_ints, default=[4096, 32768, TARGET_LENGTH],
                        help="cached tokens m, comma-separated")
    cpus = os.cpu_count() or 1
    parser.add_argument("--threads", type=parse_ints, default=sorted({1, cpus}),
                        help=f"thread counts, comma-separated (default 1 and the CPUs: {cpus})")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each program, interleaved (default 2)")
    parser.add_argument("--repeats", type=int, default=9,
                        help="timed passes per row in each run; the median is kept (default 9)")
    parser.add_argument("--batch", type=int, default=1, help="sequences B (default 1)")
    parser.add_argument("--dtypes", type=parse_dtypes, default=list(DTYPES),
                        help="cache dtypes: float32,float16 (ggml: f32,f16)")
    parser.add_argument("--kv-layout", choices=["heads", "tokens"], default="heads",
                        help="ggml's K/V layout: heads = [d, m, Hkv] contiguous (as attn's cache), "
                             "tokens = llama.cpp's KV cache (the heads of a token adjacent)")
    parser.add_argument("--json-out", help="write the table, every round and both machines' "
                        "descriptions as JSON here")
    args = parser.parse_args()
    for name, value in (("--rounds", args.rounds), ("--repeats", args.repeats),
                        ("--batch", args.batch)):
        if value < 1:
            parser.error(f"{name}: expected a positive integer, got {value}")
    for option, path, hint in (("--attn-cli", args.attn_cli, "cmake --build build/release -j2 "
                                "--target attn_cli"),
                               ("--ggml-bench", args.ggml_bench, "bash scripts/build-ggml.sh")):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            parser.error(f"{option}: expected an executable, got '{path}' (build it: {hint})")

    attn_runs, ggml_runs = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            print(f"round {round_index + 1} of {args.rounds}", file=sys.stderr, flush=True)
            # The stream read (attn bench's ceiling, a few seconds) only in the first round.
            attn_runs.append(run_attn(args, os.path.join(scratch, f"attn{round_index}.json"),
                                      ceilings=round_index == 0))
            ggml_runs.append(run_ggml(args, os.path.join(scratch, f"ggml{round_index}.json")))

    rows = []
    for dtype in args.dtypes:
        for m in args.lengths:
            for threads in args.threads:
                def pick(report, key, field, value):
                    matches = [row for row in report[key] if row[field] == value and
                               row["m"] == m and row["threads"] == threads and
                               row["batch"] == args.batch]
                    if len(matches) != 1:
                        sys.exit(f"expected one {value} row at m={m}, {threads} thread(s) in a "
                                 f"{key} report, found {len(matches)} (a length skipped for "
                                 "memory?)")
                    return matches[0]

                attn_rows = [pick(r, "decode", "dtype", dtype) for r in attn_runs]
                ggml_rows = [pick(r, "rows", "cache", DTYPES[dtype]) for r in ggml_runs]
                attn_bytes, ggml_bytes = attn_rows[0]["bytes_read"], ggml_rows[0]["bytes_read"]
                if attn_bytes != ggml_bytes:  # same cache, same count: anything else is a mix-up
                    sys.exit(f"{dtype} m={m}: attn counts {attn_bytes} bytes, ggml {ggml_bytes}")
                attn_ms = statistics.median(r["ms"] for r in attn_rows)
                ggml_ms = statistics.median(r["ms"] for r in ggml_rows)
                rows.append({"dtype": dtype, "ggml_cache": DTYPES[dtype], "batch": args.batch,
                             "n": 1, "m": m, "threads": threads, "bytes_read": attn_bytes,
                             "attn_ms": attn_ms, "attn_gb_per_s": attn_bytes / attn_ms * 1e-6,
                             "ggml_ms": ggml_ms, "ggml_gb_per_s": ggml_bytes / ggml_ms * 1e-6,
                             "attn_over_ggml": ggml_ms / attn_ms,
                             "attn_ms_rounds": [r["ms"] for r in attn_rows],
                             "ggml_ms_rounds": [r["ms"] for r in ggml_rows]})

    ggml = ggml_runs[0]["ggml"]
    first = attn_runs[0]
    # 1-minute load averages before each run, attn's and ggml's in turn: a busy machine shows here.
    loads = [run_report.get("load_average_before", "?").split()[0]
             for pair in zip(attn_runs, ggml_runs) for run_report in pair]
    print(f"decode beside ggml: {first['machine']}; attn (Highway {first.get('simd_target', '?')}) "
          f"against ggml {ggml['version']} (llama.cpp {ggml['commit']}, {ggml['build']})")
    print(f"B={args.batch}, n=1, 32 query heads over 8 key/value heads of 128, ggml's K/V layout "
          f"'{args.kv_layout}'; per program: median of {args.repeats} passes, each after a "
          f"{first['decode_shape']['evicted_bytes'] >> 20} MiB eviction read; "
          f"{args.rounds} interleaved rounds, median of the rounds; 1-min load before each "
          f"run: {' '.join(loads)}")
    for entry in first.get("stream_read", []):
        print(f"stream read (attn bench), {entry['threads']} thread(s): "
              f"{entry['gbytes_per_second']:.1f} GB/s")
    print(f"{'dtype':8} {'ggml':>4} {'m':>7} {'thr':>3} {'attn ms':>9} {'GB/s':>6} "
          f"{'ggml ms':>9} {'GB/s':>6} {'attn/ggml':>9}")
    for row in rows:
        print(f"{row['dtype']:8} {row['ggml_cache']:>4} {row['m']:7d} {row['threads']:3d} "
              f"{row['attn_ms']:9.3f} {row['attn_gb_per_s']:6.1f} {row['ggml_ms']:9.3f} "
              f"{row['ggml_gb_per_s']:6.1f} {row['attn_over_ggml']:8.2f}x")

    target_rows = [row for row in rows if row["m"] == TARGET_LENGTH]
    target = None
    if target_rows:
        low = min(row["attn_over_ggml"] for row in target_rows)
        target = {"length": TARGET_LENGTH, "ratio": TARGET_RATIO, "lowest": low,
                  "met": low >= TARGET_RATIO}
        print(f"issue 13's target, attn >= {TARGET_RATIO:g}x ggml at m = {TARGET_LENGTH}: "
              f"{'met' if target['met'] else 'NOT met'} (lowest {low:.2f}x; "
              + ", ".join(f"{r['dtype']} {r['threads']} thr {r['attn_over_ggml']:.2f}x"
                          for r in target_rows) + ")")

    if args.json_out:
        document = {"machine": first["machine"], "attn": {"simd_target": first.get("simd_target"),
                                                          "stream_read": first.get("stream_read"),
                                                          "load_average_before": loads},
                    "ggml": ggml, "ggml_machine": ggml_runs[0]["machine"],
                    "shape": ggml_runs[0]["shape"], "repeats": args.repeats,
                    "rounds": args.rounds, "rows": rows, "target": target}
        with open(args.json_out + ".tmp", "w") as out:
            json.dump(document, out, indent=1)
        os.replace(args.json_out + ".tmp", args.json_out)


if __name__ == "__main__":
    main()
