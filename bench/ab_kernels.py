#!/usr/bin/env python3
"""Interleaved A/B runs of `attn bench` against builds of libattn_kernels.so, with medians.

Copy a build's kernels library aside (cp -a build/release/src/kernels/libattn_kernels.so* /tmp/a/),
change and rebuild, then compare, e.g.

    python3 bench/ab_kernels.py --rounds 3 --lib before=/tmp/a --lib after= -- \\
        --cases decode-float32 --decode-batch 1 --decode-queries 1 --decode-lengths 32768 --threads 1

Each round runs every build once, in turn (the build's folder goes first on LD_LIBRARY_PATH; an
empty folder means the CLI's own), the order reversed every other round, so that drifts of the
machine and any cost of running second fall on all builds alike: with a fixed order, a build whose
one-thread path does the same work as the other's read 1.013-1.026x the other's time when it ran
second and 0.993-1.008x when it ran first (Zen 1, 2026-11-30). A row's median over the rounds is
printed per build, with its range, and the ratio first / last build's median. Code placement
alone moved the decode kernel by up to 10% between builds: compare builds side by side like this
rather than against figures from another run. `--no-ceilings` is added.

A setting of the same build can stand in for a build: `--env NAME=VAR=VALUE` runs the CLI's own
libraries with VAR=VALUE set (several VAR=VALUE joined by commas), e.g. the fp32 forward on AMX
tiles against FMAs:

    python3 bench/ab_kernels.py --rounds 3 --env fmas=ATTN_AMX_FP32=0 --env tiles=ATTN_AMX_FP32=1 \
        -- --cases fused --sizes 1024,4096 --threads 1
"""

import argparse
import collections
import os
import statistics
import subprocess
import sys


def parse_rows(output):
    """{row key: ms} from an `attn bench` table: a header line starting with "case" names the
    columns; the fields before its "ms" column name a row."""
    rows = {}
    ms_column = None
    for line in output.splitlines():
        fields = line.split()
        if fields and fields[0] == "case" and "ms" in fields:
            ms_column = fields.index("ms")
            continue
        if ms_column is None or len(fields) <= ms_column:
            continue
        try:
            rows[tuple(fields[:ms_column])] = float(fields[ms_column])
        except ValueError:
            continue
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="runs of every build (default 3)")
    parser.add_argument("--lib", action="append", default=[], metavar="NAME=FOLDER",
                        help="a build: a name and the folder holding its libattn_kernels.so "
                             "(empty: the CLI's own)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VAR=VALUE[,...]",
                        help="a setting: a name and the environment variables the CLI's own "
                             "build runs with; builds and settings together: two or more")
    parser.add_argument("--cli", default="build/release/cli/attn", help="the attn CLI")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER,
                        help="-- then the arguments of attn bench")
    args = parser.parse_args()
    builds = []
    for spec in args.lib:
        name, separator, folder = spec.partition("=")
        if not separator or not name:
            parser.error(f"--lib: expected NAME=FOLDER, got {spec!r}")
        if folder and not os.path.isdir(folder):
            parser.error(f"--lib {name}: no folder {folder!r}")
        builds.append((name, folder, {}))
    for spec in args.env:
        name, separator, assignments = spec.partition("=")
        variables = {}
        for assignment in assignments.split(","):
            variable, equals, value = assignment.partition("=")
            if not equals or not variable:
                parser.error(f"--env: expected NAME=VAR=VALUE[,VAR=VALUE...], got {spec!r}")
            variables[variable] = value
        if not separator or not name:
            parser.error(f"--env: expected NAME=VAR=VALUE[,VAR=VALUE...], got {spec!r}")
        builds.append((name, "", variables))
    if len(builds) < 2:
        parser.error(f"--lib, --env: expected two or more builds or settings, got {len(builds)}")
    if args.rounds < 1:
        parser.error(f"--rounds: expected at least 1, got {args.rounds}")
    bench_args = [a for a in args.bench_args if a != "--"]

    times = collections.defaultdict(lambda: collections.defaultdict(list))
    for round_index in range(args.rounds):
        for name, folder, variables in (builds if round_index % 2 == 0 else builds[::-1]):
            environment = dict(os.environ, **variables)
            if folder:  # first on the path, ahead of the other libraries' folders (a bundle's)
                environment["LD_LIBRARY_PATH"] = os.pathsep.join(
                    filter(None, [os.path.abspath(folder), environment.get("LD_LIBRARY_PATH")]))
            print(f"round {round_index + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
            result = subprocess.run([args.cli, "bench", *bench_args, "--no-ceilings"],
                                    env=environment, capture_output=True, text=True)
            if result.returncode != 0:
                sys.exit(f"attn bench with {name} failed ({result.returncode}):\n{result.stderr}")
            for key, ms in parse_rows(result.stdout).items():
                times[key][name].append(ms)

    names = [name for name, _, _ in builds]
    print("row | " + " | ".join(f"{name} ms median (min-max)" for name in names) +
          f" | {names[0]} / {names[-1]}")
    for key in sorted(times):
        medians = [statistics.median(times[key][name]) for name in names]
        cells = [f"{m:.3f} ({min(times[key][n]):.3f}-{max(times[key][n]):.3f})"
                 for m, n in zip(medians, names)]
        print(" ".join(key) + " | " + " | ".join(cells) + f" | {medians[0] / medians[-1]:.3f}")


if __name__ == "__main__":
    main()
