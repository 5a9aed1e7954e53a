#!/usr/bin/env python3
"""Checks that the kernels library still holds the software prefetches its strided copies need.

GCC 12 deleted every prefetch loop that sat in a template's instance (PrefetchMatrixRow) for five
days without a test noticing: the strided K/V copies waited on memory again (2.8% of the AVX2
forward, Zen 1). src/kernels/prefetch.hpp now issues them as asm statements; this check reads the
optimised library's disassembly and fails when a function that copies strided rows has none.

    python3 tests/kernels/check_prefetches.py --library build/release/src/kernels/libattn_kernels.so
"""

import argparse
import collections
import re
import shutil
import subprocess
import sys

# Functions that copy or read strided rows with their lines requested ahead (PrefetchMatrixRow):
# each must hold a prefetcht0 in every Highway target that has it out of line.
L1_PREFETCHERS = ("PackKeysAndValues", "PadRows", "PrepareQueryTile")

FUNCTION = re.compile(r"^[0-9a-f]+ <(?P<name>.*)>:$")
TARGET = re.compile(r"attn::(N_[A-Z0-9_]+)::(\w+)\(")


def prefetch_counts(library):
    """{(target, function): {mnemonic: count}} over the library's functions in attn::N_*."""
    text = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", "-C", library],
        check=True, capture_output=True, text=True).stdout
    counts = collections.defaultdict(collections.Counter)
    key = None
    for line in text.splitlines():
        header = FUNCTION.match(line)
        if header:
            found = TARGET.search(header.group("name"))
            key = (found.group(1), found.group(2)) if found else None
            if key is not None:
                counts[key]  # present, even with no prefetch
            continue
        if key is not None and "\tprefetch" in line:
            counts[key][line.split("\t")[-1].split()[0]] += 1
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", required=True, help="libattn_kernels.so of a Release build")
    args = parser.parse_args()
    if shutil.which("objdump") is None:
        print("objdump not found: nothing checked")
        return 0
    counts = prefetch_counts(args.library)
    checked, missing = 0, []
    for (target, function), mnemonics in sorted(counts.items()):
        if function in L1_PREFETCHERS:
            checked += 1
            if mnemonics["prefetcht0"] == 0:
                missing.append(f"attn::{target}::{function} has no prefetcht0")
    # Each target also keeps its L2 requests (prefetcht1: SpreadPrefetch, the decode kernel's).
    targets = sorted({target for target, _ in counts})
    for target in targets:
        for mnemonic in ("prefetcht0", "prefetcht1"):
            if not any(c[mnemonic] for (t, _), c in counts.items() if t == target):
                missing.append(f"no function of attn::{target} has a {mnemonic}")
    if checked == 0:
        print(f"none of {', '.join(L1_PREFETCHERS)} found in {args.library}")
        return 1
    if missing:
        print("prefetches missing:\n  " + "\n  ".join(missing))
        return 1
    print(f"{checked} functions over {len(targets)} targets hold their prefetches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
