#!/usr/bin/env python3
"""Static bound of the fused forward kernels from their compiled inner loops (llvm-mca).

What bounds attn's fp32 forward (and the additive kernel's exponential form) on a CPU we cannot
profile: the inner loops are taken from the built library (objdump), each loop's steady-state
cycles per iteration come from llvm-mca's model of that CPU, and the loops are composed per score
vector (one vector of queries against one key) as the kernel runs them at head size d = dv = 64:

  QK product   d multiply-adds        (Gemm<false>'s register tile)
  P·V product  dv multiply-adds       (Gemm<true>'s register tile)
  softmax      one max, one exp       (ForwardKeyTile's loops over a key tile, 4 vectors each:
                                      on AVX-512 the lazy step's one loop, which reads a rise
                                      of the maximum from the sums, so no max; on AVX2 the
                                      full step's pass for the maximum and its exponentials')
  additive     h terms w/(e·f+1), two per reciprocal (AdditiveScoreRows, exponential form;
               replaces QK), and its softmax in base e: the full step's pass for the maximum and
               its exponentials by Cody–Waite reduction; then again with four and eight terms
               per reciprocal (AdditiveScoresShared, the forms inputs within ±8 and ±4 take)

The bound is the counted flops over the modelled cycles, against 2 FMA pipes of the target's
width — the FMA peak `attn bench` measures. It leaves out what happens once per tile (packing K
and V, Q's transpose, the output's write) and every memory stall: a kernel measured well below the
bound is limited by what the model leaves out, not by the instruction mix.

Usage: python3 tools/port_model.py [--library build/release/src/kernels/libattn_kernels.so]
                                    [--cpus icelake-server] [--loops] [--check]
icelake-server (the default) has the port layout of the Xeons we serve from for 512-bit code
(Sapphire and Emerald Rapids: 512-bit multiply-adds, shuffles and most vector ALU work only on
ports 0 and 5). LLVM 14 (Debian 12's llvm-mca, from scripts/install-deps.sh) has no Zen 4 or Zen 5
model, and its znver3 model issues one 256-bit multiply-add per cycle where Zen 3 issues two, so
AVX2 code on znver3 reads half its true bound; AVX-512 code is skipped there. Its znver1 model errs
the other way: two 256-bit multiply-adds per cycle where Zen 1 issues one (two 128-bit pipes), so
its AVX2 figure is not a bound for Zen 1 either.
"""
import argparse
import collections
import re
import subprocess
import sys

HEAD = 64  # d = dv = h = 64: the targets' shape (B = 4, 8 heads of 64)
TARGETS = {
    # name: (Highway namespace, lanes, register tile rows, the vector register prefix)
    "AVX3": ("N_AVX3", 16, 6, "zmm"),
    "AVX2": ("N_AVX2", 8, 3, "ymm"),
}


def symbols(library):
    """(demangled name, start, size) of every defined function."""
    out = subprocess.run(["nm", "-C", "-S", "--defined-only", library],
                         capture_output=True, text=True, check=True).stdout
    result = []
    for line in out.splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[2].lower() in ("t", "w"):
            result.append((parts[3], int(parts[0], 16), int(parts[1], 16)))
    return result


def loops(library, start, size):
    """Bodies (lists of AT&T instructions) of the loops in [start, start + size): each backward
    conditional jump and the instructions from its target to it."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-M", "att",
                          f"--start-address={start}", f"--stop-address={start + size}", library],
                         capture_output=True, text=True, check=True).stdout
    instructions = []
    for line in out.splitlines():
        match = re.match(r"\s+([0-9a-f]+):\s+(.*)$", line)
        if match:
            text = re.sub(r"\s*<.*>$", "", match.group(2).split("#")[0]).strip()
            instructions.append((int(match.group(1), 16), text))
    bodies = []
    for address, text in instructions:
        jump = re.match(r"(j\w+)\s+([0-9a-f]+)$", text)
        if jump and jump.group(1) != "jmp" and int(jump.group(2), 16) < address:
            target = int(jump.group(2), 16)
            body = [t for a, t in instructions if target <= a <= address]
            if not any(t.startswith(".byte") or t.startswith("(bad)") for t in body):
                bodies.append(body)
    return bodies


def mix(body):
    return collections.Counter(t.split()[0] for t in body if t)


def count(body, prefixes):
    return sum(n for op, n in mix(body).items() if op.startswith(prefixes))


def fmas(body, register):
    return sum(1 for t in body if re.match(r"vf(n?m)(add|sub)\d+ps", t) and f"%{register}" in t)


def find_loop(library, table, symbol_pattern, accept):
    """The first loop of a function matching symbol_pattern that `accept` takes."""
    for name, start, size in table:
        if re.search(symbol_pattern, name):
            for body in loops(library, start, size):
                if accept(body):
                    return body
    return None


def mca_cycles(body, cpu, iterations=400):
    """Steady-state cycles per iteration of `body` on llvm-mca's model of `cpu`."""
    result = subprocess.run(["llvm-mca", f"-mcpu={cpu}", f"-iterations={iterations}"],
                            input="\n".join(body) + "\n", capture_output=True, text=True)
    if result.returncode != 0:
        return None
    total = re.search(r"Total Cycles:\s+(\d+)", result.stdout)
    return int(total.group(1)) / iterations if total else None


def target_loops(library, table, target):
    namespace, lanes, rows, register = TARGETS[target]
    simd = rf"hwy::{namespace}::Simd<float, {lanes}ul, 0>"
    tile = rows * 4  # the register tile's multiply-adds per step (kMaxRows x kMaxVectors)
    small = lambda body: len(body) < 12 * tile // 4 + 10
    exp_marker = "vscalefps" if target == "AVX3" else "vpslld"
    # The dot-product forward's P is in base 2 (no Cody–Waite reduction, whose negated
    # multiply-adds mark the additive kernel's base-e softmax in the same function); on AVX-512 the
    # lazy step's loop takes no maximum (no vmaxps: a rise is read from the sums).
    cody_waite = ("vfnmadd132ps", "vfnmadd213ps", "vfnmadd231ps")
    lazy_max = 0 if target == "AVX3" else None
    found = {
        "qk": find_loop(library, table, rf"attn::{namespace}::Gemm<false, {re.escape(simd)}",
                        lambda b: fmas(b, register) == tile and small(b)),
        "pv": find_loop(library, table, rf"attn::{namespace}::Gemm<true, {re.escape(simd)}",
                        lambda b: fmas(b, register) == tile and small(b)),
        "exp": find_loop(library, table, rf"attn::{namespace}::FlashForwardTiles\(",
                         lambda b: count(b, (exp_marker,)) == 4 and len(b) < 120
                         and count(b, cody_waite) == 0
                         and (lazy_max is None or count(b, ("vmaxps",)) == lazy_max)),
        "exp_natural": find_loop(library, table, rf"attn::{namespace}::FlashForwardTiles\(",
                                 lambda b: count(b, (exp_marker,)) == 4 and len(b) < 120
                                 and count(b, cody_waite) > 0),
        "max": find_loop(library, table, rf"attn::{namespace}::FlashForwardTiles\(",
                         lambda b: count(b, ("vmaxps",)) == 4 and len(b) <= 12),
        "additive": find_loop(
            library, table, rf"attn::{namespace}::AdditiveScores<\d+ul, true, hwy",
            lambda b: count(b, ("vrcp14ps", "vrcpps")) == (16 if target == "AVX3" else 8)
            and count(b, ("vminps",)) == 0),
    }
    # four and eight terms a reciprocal: the loop over a key tile's keys, one vector of queries
    rcps = lambda b: count(b, ("vrcp14ps", "vrcpps"))
    # (eight only on AVX-512: AVX2's 16 registers take four, AdditiveScoresInForm)
    shared = (("additive_quads", 4), ("additive_eights", 8)) if target == "AVX3" else (
        ("additive_quads", 4),)
    for name, terms in shared:
        found[name] = find_loop(
            library, table, rf"attn::{namespace}::AdditiveScoresShared<{terms}ul, 4ul",
            lambda b, terms=terms: 0 < rcps(b) < 4 and count(b, ("vaddps",)) == terms * rcps(b)
            and len(b) < 200)
    # per iteration: multiply-adds of the tile (qk, pv), score vectors (exp, max), term vectors
    # of the additive tile (4 x 4 on AVX-512, 2 x 4 on AVX2), two terms per reciprocal
    per_iteration = {"qk": tile, "pv": tile, "exp": 4, "exp_natural": 4, "max": 4,
                     "additive": 2 * (16 if target == "AVX3" else 8),
                     # four (eight) term vectors per reciprocal, however far it was unrolled
                     "additive_quads": 4 * rcps(found["additive_quads"] or []),
                     "additive_eights": 8 * rcps(found.get("additive_eights") or [])}
    # The lazy step needs no pass of its own for the maximum (found all the same: the first key
    # tile and any tile that raises a maximum past the margin take the full step).
    uses_max_pass = lazy_max is None
    return found, per_iteration, uses_max_pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--library", default="build/release/src/kernels/libattn_kernels.so")
    parser.add_argument("--cpus", default="icelake-server")
    parser.add_argument("--loops", action="store_true", help="print each loop's instructions")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 unless every loop is found and each bound lies in (0, 100]%%: "
                             "the test that keeps docs/benchmarks.md's figures reproducible")
    args = parser.parse_args()
    failures = []
    table = symbols(args.library)
    print(f"static bound of the fused forward at d = dv = h = {HEAD} "
          f"(llvm-mca steady state, per score vector)")
    for target in TARGETS:
        found, per_iteration, uses_max_pass = target_loops(args.library, table, target)
        missing = [k for k, v in found.items() if v is None]
        if missing:
            failures.append(f"{target}: loops not found: {', '.join(missing)} "
                            "(compiler output changed?)")
            continue
        for cpu in args.cpus.split(","):
            if target == "AVX3" and cpu.startswith("znver"):
                continue  # LLVM 14's Zen models predate AVX-512
            cycles = {k: mca_cycles(body, cpu) for k, body in found.items()}
            if any(c is None for c in cycles.values()):
                failures.append(f"{target} on {cpu}: llvm-mca failed")
                continue
            unit = {k: cycles[k] / per_iteration[k] for k in cycles}
            softmax = unit["exp"] + (unit["max"] if uses_max_pass else 0.0)
            dot = HEAD * unit["qk"] + HEAD * unit["pv"] + softmax
            additive = (HEAD * unit["additive"] + HEAD * unit["pv"] + unit["exp_natural"] +
                        unit["max"])
            ideal_dot = HEAD  # (d + dv) multiply-adds on 2 pipes
            ideal_additive = (3 * HEAD + 2 * HEAD) / 4  # counted flops / (2 pipes x 2 flops)
            print(f"{target} on {cpu}: cycles per score vector: QK {HEAD * unit['qk']:.1f}, "
                  f"PV {HEAD * unit['pv']:.1f}, softmax {softmax:.1f} (exp {unit['exp']:.2f}, "
                  f"max {unit['max']:.2f}{'' if uses_max_pass else ', not taken: lazy step'}), "
                  f"additive terms {HEAD * unit['additive']:.1f}, "
                  f"base-e exp {unit['exp_natural']:.2f}")
            bounds = (100 * ideal_dot / dot, 100 * ideal_additive / additive)
            shared = ""
            for name, words in (("additive_quads", "four"), ("additive_eights", "eight")):
                if name not in unit:
                    continue
                bound = 100 * ideal_additive / (additive + HEAD * (unit[name] - unit["additive"]))
                bounds += (bound,)
                shared += f", {words} terms a reciprocal {bound:.1f}%"
            print(f"  fp32 forward bound {bounds[0]:.1f}% of the FMA peak; "
                  f"additive (exponential form) {bounds[1]:.1f}%{shared}")
            if not all(0 < bound <= 100 for bound in bounds):
                failures.append(f"{target} on {cpu}: bounds {bounds} outside (0, 100]%")
            if args.loops:
                for k, body in found.items():
                    print(f"  -- {k}: {cycles[k]:.2f} cycles / iteration; "
                          f"{dict(mix(body).most_common(8))}")
                    for line in body:
                        print(f"     {line}")
    for failure in failures:
        print(f"port_model.py: {failure}", file=sys.stderr)
    if args.check and failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
