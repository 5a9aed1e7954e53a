#!/usr/bin/env python3
# Issue 14's `attn run` target: on n = m = 4096, 32 heads, d = 64, the CLI's time minus its file I/O
# within 10% of `attn bench`'s fused case at the same thread count, and its peak memory inputs +
# outputs + O(n·d). Measured as on Zen 5 (docs/benchmarks.md, "Issue 14's targets on Zen 5 at this
# code"): q, k, v as float32 .npy files (B, H, n, d) = (1, 32, 4096, 64), `attn run --layer
# dot-product` on them under `strace -ttt` (the time from closing the last input to creating the
# output file is the run minus its reads and its write; the Zen 5 figures took the same window as
# opening the last input to creating the output, minus one input's read), its peak RSS as
# `/usr/bin/time -f %M` gives it (the ru_maxrss of wait4), and `attn bench --cases fused,fused-sdpa`
# at the same shape (fused-sdpa was the Zen 5 figures' base: the functional API attn run calls).
"""attn run's time minus file I/O and peak memory against attn bench's fused case, same shape.

    build/venv/bin/python bench/run_vs_bench.py --threads 1,2
    build/venv/bin/python bench/run_vs_bench.py --attn build/release/cli/attn --threads 1 --n 4096

Each round runs `attn bench` (fused, fused-sdpa: median of --repeats passes), then `attn run` once
under strace and once alone (wall time and peak RSS without the tracer); the figures are medians
over --rounds rounds. attn run takes its thread count from OMP_NUM_THREADS (OpenMP's default), set
here to each --threads count; attn bench from --threads. Where strace is missing or may not trace
(containers without ptrace), the file windows come from polling /proc/PID/fd instead (about 1 ms
apart; the output says which).
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

MB = 1e6  # decimal megabytes, as the Zen 5 figures (144 MB for 134 MB of inputs and output)
OUTPUT_NAME = "attn_run_out.npy"  # distinctive: attn writes .attn_run_out.npy.attn-PID-0.tmp first


def parse_ints(text):
    return [int(part) for part in text.split(",") if part]


def load_average():
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


# Runs argv[2:] as its child and writes "wall seconds, ru_maxrss KiB" to argv[1]: what
# `/usr/bin/time -f %M` does, from a process small enough not to matter. Spawned straight from this
# script, the command's ru_maxrss would start at this script's peak RSS (38-70 MB with NumPy and the
# inputs made): subprocess starts it by vfork, and exec carries the old memory's high-water mark
# over into the new program's.
TIMER = """
import os, sys, time
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - start
with open(sys.argv[1], "w") as out:
    out.write(f"{wall} {usage.ru_maxrss}")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_checked(command, env):
    """Runs command, exiting with its error output when it fails."""
    result = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({result.returncode}):\n"
                 + result.stderr.decode(errors="replace"))


def run_alone(command, env, folder):
    """Runs command under TIMER: (wall seconds from its fork to its end, peak RSS bytes)."""
    figures = os.path.join(folder, "timer.txt")
    run_checked([sys.executable, "-S", "-c", TIMER, figures] + command, env)
    with open(figures) as source:
        wall, peak_kib = source.read().split()
    return float(wall), int(peak_kib) * 1024


def run_polled(command, env):
    """Runs command, its file windows polled from /proc/PID/fd (poll_open_files)."""
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=errors)
        windows = poll_open_files(process.pid, time.perf_counter())
        process.wait()
        if process.returncode != 0:
            errors.seek(0)
            sys.exit(f"{' '.join(command)} failed ({process.returncode}):\n"
                     + errors.read().decode(errors="replace"))
    return windows


def poll_open_files(pid, start):
    """The fallback of strace: [(path, first seen, first poll without it)] in seconds from start,
    for every file the process held open, until it exits; the end as ("exit", time, time)."""
    seen = {}  # (fd, path) -> [first seen, last seen]
    closed = []
    while True:
        now = time.perf_counter() - start
        current = {}
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    current[(fd, os.readlink(f"/proc/{pid}/fd/{fd}"))] = now
                except OSError:
                    pass  # closed between the listing and the link
        except OSError:
            current = {}
        for key in list(seen):
            if key not in current:
                closed.append((key[1], seen.pop(key)[0], now))
        for key in current:
            seen.setdefault(key, [now, now])[1] = now
        # A process that exited is a zombie until wait4: its /proc/PID/fd is empty or gone.
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                closed.extend((key[1], first, now) for key, (first, _) in seen.items())
                closed.append(("exit", now, now))
                return closed
        time.sleep(0.001)  # the loop takes ~14% of a core at this rate (a third at 0.2 ms)


def strace_works():
    """Whether strace exists and may trace here (containers often forbid ptrace)."""
    if shutil.which("strace") is None:
        return False
    probe = subprocess.run(["strace", "-o", os.devnull, "true"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    return probe.returncode == 0


TRACE_LINE = re.compile(r"^(\d+\.\d+) (?:(\w+)\((.*)\)\s+= (-?\d+|\?)|\+\+\+ exited)")


def strace_windows(trace_path):
    """[(path, open time, close time)] from `strace -ttt -e trace=execve,openat,close,rename,fsync`
    of the main thread (attn opens, reads and writes its files there, its workers never), the
    rename's time as a window of the output's new name, and ("start", ...), ("exit", ...)."""
    windows, open_fds = [], {}
    with open(trace_path) as trace:
        for line in trace:
            match = TRACE_LINE.match(line)
            if not match:
                continue
            when, call, arguments, result = match.groups()
            when = float(when)
            if call is None:
                windows.append(("exit", when, when))
            elif call == "execve" and result == "0":
                windows.append(("start", when, when))
            elif call == "openat" and result not in ("?",) and int(result) >= 0:
                open_fds[result] = (re.search(r'"([^"]*)"', arguments).group(1), when)
            elif call == "close" and arguments in open_fds:
                path, opened = open_fds.pop(arguments)
                windows.append((path, opened, when))
            elif call == "rename":
                windows.append((re.findall(r'"([^"]*)"', arguments)[-1], when, when))
    return windows


def phases(windows, inputs, start=None):
    """The run's parts in seconds from its windows: start (exec to the first input opened), read
    (first input opened to the last closed before the output exists), compute (that close to the
    output's creation: the run minus its file I/O), write (creation to the last touch of the
    output: write, fsync, rename), exit; total."""
    def is_output(path):
        return OUTPUT_NAME in os.path.basename(path)

    begin = start if start is not None else next(w[1] for w in windows if w[0] == "start")
    end = next(w[2] for w in windows if w[0] == "exit")
    created = min(opened for path, opened, _ in windows if is_output(path))
    written = max(closed for path, _, closed in windows if is_output(path))
    reads = [(opened, closed) for path, opened, closed in windows
             if os.path.basename(path) in inputs and closed <= created]
    first_open = min(opened for opened, _ in reads)
    last_close = max(closed for _, closed in reads)
    return {"start_s": first_open - begin, "read_s": last_close - first_open,
            "compute_s": created - last_close, "write_s": written - created,
            "exit_s": end - written, "total_s": end - begin}


def bench_seconds(args, threads):
    """attn bench's fused and fused-sdpa at the run's shape and thread count: {case: seconds},
    and the machine's name as attn bench reports it."""
    command = [args.attn, "bench", "--cases", "fused,fused-sdpa", "--batch", str(args.batch),
               "--heads", str(args.heads), "--head-dim", str(args.head_dim), "--sizes",
               str(args.n), "--threads", str(threads), "--repeats", str(args.repeats),
               "--no-ceilings", "--json"]
    result = subprocess.run(command, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    report = json.loads(result.stdout)
    return {case["case"]: case["ms"] * 1e-3 for case in report["cases"]}, report["machine"]


def write_inputs(folder, shape, seed):
    """q, k, v as float32 .npy files of `shape` in folder; their paths."""
    rng = np.random.default_rng(seed)
    paths = []
    for name in ("q", "k", "v"):
        path = os.path.join(folder, f"{name}.npy")
        np.save(path, rng.standard_normal(shape, dtype=np.float32))
        paths.append(path)
    return paths


def attn_run(attn, inputs, output):
    """The command line of the measured call: no --heads, the files being (B, H, n, d) already."""
    return [attn, "run", "--layer", "dot-product", "--queries", inputs[0], "--keys", inputs[1],
            "--values", inputs[2], "--out", output]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attn", default="build/release/cli/attn", help="the attn CLI")
    parser.add_argument("--threads", type=parse_ints, default=[1],
                        help="thread counts, comma-separated")
    parser.add_argument("--n", type=int, default=4096, help="queries n = keys m")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of (attn bench, traced attn run, attn run) per thread count")
    parser.add_argument("--repeats", type=int, default=3, help="attn bench's timed passes")
    parser.add_argument("--io-timing", choices=["auto", "strace", "poll"], default="auto",
                        help="how the file windows are timed (auto: strace where it can trace)")
    parser.add_argument("--workdir", help="where the .npy files go (default: a temporary folder "
                        "under $TMPDIR, removed afterwards)")
    parser.add_argument("--json-out", help="also write every figure to this JSON file")
    args = parser.parse_args()
    if not os.access(args.attn, os.X_OK):
        parser.error(f"no attn CLI at {args.attn} (--attn)")
    use_strace = args.io_timing == "strace" or (args.io_timing == "auto" and strace_works())
    method = ("strace -ttt -e trace=execve,openat,close,rename,fsync (main thread)" if use_strace
              else "polling /proc/PID/fd about every ms")

    shape = (args.batch, args.heads, args.n, args.head_dim)
    tensor_bytes = 4 * int(np.prod(shape))
    in_out_bytes = 4 * tensor_bytes  # q, k, v and the output, all (B, H, n, d) float32
    load_before = load_average()
    with tempfile.TemporaryDirectory(dir=args.workdir) as folder:
        inputs = write_inputs(folder, shape, seed=1)
        output = os.path.join(folder, OUTPUT_NAME)
        run = attn_run(args.attn, inputs, output)
        # The process without the tensors: libraries, runtime and stacks, from a 16-token run.
        small = os.path.join(folder, "small")
        os.mkdir(small)
        small_run = attn_run(args.attn, write_inputs(small, shape[:2] + (16, args.head_dim), 2),
                             os.path.join(small, OUTPUT_NAME))
        baseline_rss = run_alone(small_run, dict(os.environ, OMP_NUM_THREADS="1"), folder)[1]
        rows, machine = [], None
        for threads in args.threads:
            env = dict(os.environ, OMP_NUM_THREADS=str(threads))
            rounds = []
            for number in range(args.rounds):
                print(f"{threads} thread(s), round {number + 1}", file=sys.stderr)
                bench, machine = bench_seconds(args, threads)
                if use_strace:
                    trace = os.path.join(folder, "trace.txt")
                    run_checked(["strace", "-ttt", "-o", trace, "-e",
                                 "trace=execve,openat,close,rename,fsync"] + run, env)
                    parts = phases(strace_windows(trace), {os.path.basename(p) for p in inputs})
                else:
                    parts = phases(run_polled(run, env), {os.path.basename(p) for p in inputs},
                                   start=0.0)
                wall, peak = run_alone(run, env, folder)
                rounds.append({"bench_s": bench, **parts, "wall_s": wall, "peak_rss_bytes": peak})
            check = np.load(output, mmap_mode="r")
            if check.shape != shape or not np.isfinite(check[0, 0]).all():
                sys.exit(f"attn run wrote {check.shape}, expected {shape} and finite values")
            rows.append(summarise(threads, rounds))
    load_after = load_average()

    print(f"attn run against attn bench: B={args.batch}, {args.heads} heads, n = m = {args.n}, "
          f"d = {args.head_dim}, float32 .npy files {shape}; medians of {args.rounds} rounds "
          f"(attn bench: median of {args.repeats} passes each)")
    print(f"machine: {machine}; load average {load_before} before, {load_after} after; file I/O "
          f"timed by {method}")
    print("ms; run - I/O = from closing the last input to creating the output (the result check "
          "included); wall: attn run alone, fork to exit; fused, sdpa: "
          "attn bench's fused (the kernel) and fused-sdpa (the functional API attn run calls)\n")
    print(f"{'thr':>3} {'wall':>8} {'start':>7} {'read':>7} {'write':>7} {'exit':>6} "
          f"{'run - I/O':>9} {'fused':>8} {'sdpa':>8} {'/ fused':>8} {'/ sdpa':>7} "
          f"{'/ fused, rounds':>16}")
    for r in rows:
        ms = {key: 1e3 * r[key] for key in ("wall_s", "start_s", "read_s", "write_s", "exit_s",
                                             "compute_s", "fused_s", "sdpa_s")}
        print(f"{r['threads']:>3} {ms['wall_s']:>8.1f} {ms['start_s']:>7.1f} {ms['read_s']:>7.1f} "
              f"{ms['write_s']:>7.1f} {ms['exit_s']:>6.1f} {ms['compute_s']:>9.1f} "
              f"{ms['fused_s']:>8.1f} {ms['sdpa_s']:>8.1f} {r['ratio_fused']:>7.3f}x "
              f"{r['ratio_sdpa']:>6.3f}x {r['ratio_fused_min']:>7.3f}-{r['ratio_fused_max']:.3f}x")
    # One (n, m) score matrix: what a run that built the weights would hold per head.
    scores = 4.0 * args.n * args.n
    print(f"\npeak RSS (wait4's ru_maxrss, as /usr/bin/time -f %M; MB = 1e6 bytes): inputs + "
          f"output {in_out_bytes / MB:.1f} MB; the same CLI's peak on 16 tokens "
          f"{baseline_rss / MB:.1f} MB; one (n, m) score matrix would be {scores / MB:.1f} MB")
    print(f"{'thr':>3} {'peak MB':>8} {'peak - inputs - output':>23}")
    for r in rows:
        print(f"{r['threads']:>3} {r['peak_rss_bytes'] / MB:>8.1f} "
              f"{(r['peak_rss_bytes'] - in_out_bytes) / MB:>23.1f}")
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump({"machine": machine, "logical_cpus": os.cpu_count(), "attn": args.attn,
                       "shape": {"batch": args.batch, "heads": args.heads, "n": args.n,
                                 "head_dim": args.head_dim},
                       "rounds": args.rounds, "bench_repeats": args.repeats, "io_timing": method,
                       "load_average_before": load_before, "load_average_after": load_after,
                       "inputs_outputs_bytes": in_out_bytes,
                       "baseline_peak_rss_bytes": baseline_rss,
                       "rows": rows}, out, indent=2)
        print(f"\nwrote {args.json_out}", file=sys.stderr)


def summarise(threads, rounds):
    """Medians over the rounds; the ratio of the medians, and its range over the rounds."""
    def median(key):
        return statistics.median(r[key] for r in rounds)

    row = {"threads": threads, "rounds": rounds}
    for key in ("start_s", "read_s", "compute_s", "write_s", "exit_s", "total_s", "wall_s"):
        row[key] = median(key)
    row["fused_s"] = statistics.median(r["bench_s"]["fused"] for r in rounds)
    row["sdpa_s"] = statistics.median(r["bench_s"]["fused-sdpa"] for r in rounds)
    row["ratio_fused"] = row["compute_s"] / row["fused_s"]
    row["ratio_sdpa"] = row["compute_s"] / row["sdpa_s"]
    per_round = [r["compute_s"] / r["bench_s"]["fused"] for r in rounds]
    row["ratio_fused_min"], row["ratio_fused_max"] = min(per_round), max(per_round)
    row["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in rounds)
    return row


if __name__ == "__main__":
    main()
