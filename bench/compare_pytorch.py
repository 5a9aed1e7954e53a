#!/usr/bin/env python3
# Puts attn (through `attn bench --json`) side by side with PyTorch on the CPU in one run: the
# book's code (bmm + masked softmax + bmm, and its additive attention), scaled_dot_product_attention
# (fp32, and bf16/fp16 against attn's half-precision kernels) and nn.MultiheadAttention, same
# shapes, same thread count, one table; with --onnx-mha, ONNX Runtime's MultiHeadAttention graph
# (compare_mha.py's) beside the layer rows too. Not part of CI.
"""Compare attn's attention kernels with PyTorch's on the CPU.

Run with a Python that has torch, e.g.
    build/venv/bin/python bench/compare_pytorch.py --attn build-bench/cli/attn \
        --sizes 128,512,1024,2048,4096 --threads 1,2 --json-out docs/benchmarks.json
Add --onnx-mha (onnxruntime and onnx installed) for the onnxruntime-mha rows.
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

MIB = 1024.0 * 1024.0


def parse_ints(text):
    return [int(part) for part in text.split(",") if part]


def load_average():
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


# Peak extra memory, measured as `attn bench` does: the growth of the peak resident set (VmHWM)
# over the resident set just before the call, after resetting the peak through clear_refs.
def _status_bytes(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return None


# Run before each memory probe: attn.empty_cache once attn's module is imported (blocks attn keeps
# for reuse would serve the probed call from pages already resident and hide its allocations).
BEFORE_MEMORY_PROBE = []


def peak_extra_bytes(action):
    for release in BEFORE_MEMORY_PROBE:
        release()
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        action()
        return None
    before = _status_bytes("VmRSS")
    action()
    peak = _status_bytes("VmHWM")
    if before is None or peak is None:
        return None
    return max(peak - before, 0)


def time_median_ms(action, repeats):
    extra = peak_extra_bytes(action)  # the warm-up pass doubles as the memory probe
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, extra


# The book's masked softmax: positions at or past a row's valid length are set to -1e6 before the
# softmax. valid_lens is (batch) or (batch, queries).
def book_masked_softmax(scores, valid_lens):
    if valid_lens is None:
        return F.softmax(scores, dim=-1)
    shape = scores.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    flat = scores.reshape(-1, shape[-1])
    keep = torch.arange(shape[-1], dtype=torch.float32)[None, :] < valid_lens[:, None]
    flat[~keep] = -1e6
    return F.softmax(flat.reshape(shape), dim=-1)


def book_dot_product(q, k, v, valid_lens):
    scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.shape[-1])
    return torch.bmm(book_masked_softmax(scores, valid_lens), v)


class BookAdditive(torch.nn.Module):
    """The book's AdditiveAttention: materialises the (B, n, m, h) features before tanh."""

    def __init__(self, key_size, query_size, hidden):
        super().__init__()
        self.w_k = torch.nn.Linear(key_size, hidden, bias=False)
        self.w_q = torch.nn.Linear(query_size, hidden, bias=False)
        self.w_v = torch.nn.Linear(hidden, 1, bias=False)

    def forward(self, queries, keys, values, valid_lens):
        queries, keys = self.w_q(queries), self.w_k(keys)
        features = torch.tanh(queries.unsqueeze(2) + keys.unsqueeze(1))
        scores = self.w_v(features).squeeze(-1)
        return torch.bmm(book_masked_softmax(scores, valid_lens), values)


def dot_flops(batch, heads, n, m, d, padding, causal):
    visible = 0
    for b in range(batch):
        for i in range(n):
            keys = padding[b] if padding else m
            if causal:
                keys = min(keys, max(0, min(m, i + m - n + 1)))
            visible += keys
    return 4.0 * heads * d * visible


def torch_cases(args, n, threads, attn_lengths, attn_module=None):
    """Yields result rows for every PyTorch case at length n with `threads` threads, and attn's
    Python calls when `attn_module` is given."""
    torch.set_num_threads(threads)
    if attn_module is not None:
        attn_module.set_num_threads(threads)
    batch, heads, d = args.batch, args.heads, args.head_dim
    generator = torch.Generator().manual_seed(1)
    rand = lambda *shape: torch.rand(*shape, generator=generator) * 2 - 1  # noqa: E731
    budget = args.max_working_set_mib * MIB
    score_bytes = 4.0 * batch * heads * n * n
    masks = {"dot": (None, False), "dot-padded": (attn_lengths.get(n), False),
             "dot-causal": (None, True)}
    q4, k4, v4 = (rand(batch, heads, n, d) for _ in range(3))
    q3, k3, v3 = (x.reshape(batch * heads, n, d) for x in (q4, k4, v4))
    for workload, (padding, causal) in masks.items():
        if args.half_only:
            break
        if workload == "dot-padded" and padding is None:
            continue  # attn did not run its padded case: no lengths to share
        flops = dot_flops(batch, heads, n, n, d, padding, causal)
        if padding:
            lengths = torch.tensor(padding, dtype=torch.float32)
            book_lens = torch.repeat_interleave(lengths, heads)
            sdpa_mask = (torch.arange(n)[None, :] < torch.tensor(padding)[:, None])[:, None, None, :]
        elif causal:
            book_lens = torch.arange(1, n + 1, dtype=torch.float32).repeat(batch * heads, 1)
            sdpa_mask = None
        else:
            book_lens, sdpa_mask = None, None
        # The book's code holds the scores, the mask and the weights: about 3 score tensors.
        if 3 * score_bytes <= budget:
            ms, extra = time_median_ms(lambda: book_dot_product(q3, k3, v3, book_lens), args.repeats)
            yield row("torch-book", workload, n, threads, ms, flops, extra)
        # Causal through is_causal (top-left aligned, the same as bottom-right for n = m).
        ms, extra = time_median_ms(
            lambda: F.scaled_dot_product_attention(q4, k4, v4, attn_mask=sdpa_mask,
                                                   is_causal=causal), args.repeats)
        yield row("torch-sdpa", workload, n, threads, ms, flops, extra)
    # Half precision without mask: PyTorch's SDPA on the same values rounded to bf16 / fp16,
    # against attn bench's fused-bf16 / fused-fp16 (workloads dot-bf16, dot-fp16).
    flops = dot_flops(batch, heads, n, n, d, None, False)
    for workload, dtype in (("dot-bf16", torch.bfloat16), ("dot-fp16", torch.float16)):
        qh, kh, vh = (x.to(dtype) for x in (q4, k4, v4))
        ms, extra = time_median_ms(lambda: F.scaled_dot_product_attention(qh, kh, vh),
                                   args.repeats)
        yield row("torch-sdpa", workload, n, threads, ms, flops, extra)
    # attn called from Python on the same tensors (attn.scaled_dot_product_attention: what a
    # PyTorch user runs), when the module is installed: fp32, bf16 and fp16 without mask.
    if attn_module is not None:
        for workload, dtype in (("dot", torch.float32), ("dot-bf16", torch.bfloat16),
                                ("dot-fp16", torch.float16)):
            if args.half_only and dtype == torch.float32:
                continue
            qh, kh, vh = (x.to(dtype) for x in (q4, k4, v4))
            ms, extra = time_median_ms(
                lambda: attn_module.scaled_dot_product_attention(qh, kh, vh), args.repeats)
            yield row("attn-python", workload, n, threads, ms, flops, extra)
    # bf16 causal and backward, PyTorch beside attn.torch (the autograd-registered operator a
    # PyTorch model calls), same tensors; the backward timed alone as below.
    qb, kb, vb = (x.to(torch.bfloat16) for x in (q4, k4, v4))
    causal_flops = dot_flops(batch, heads, n, n, d, None, True)
    implementations = [("torch-sdpa", F.scaled_dot_product_attention)]
    if attn_module is not None:
        import attn.torch as attn_torch
        implementations.append(("attn-python", attn_torch.scaled_dot_product_attention))
    for name, function in implementations:
        ms, extra = time_median_ms(lambda: function(qb, kb, vb, is_causal=True), args.repeats)
        yield row(name, "dot-causal-bf16", n, threads, ms, causal_flops, extra)
        inputs = [x.clone().requires_grad_() for x in (qb, kb, vb)]
        out = function(*inputs)
        grad = rand(*out.shape).to(torch.bfloat16)
        ms, extra = time_median_ms(
            lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True), args.repeats)
        yield row(name, "dot-backward-bf16", n, threads, ms, 2 * flops, extra)
        del out
    if args.half_only:
        return
    # Backward passes without mask (workload dot-backward), timed alone: one forward pass keeps its
    # graph, then each timed pass is autograd's backward through it (torch.autograd.grad, so
    # nothing accumulates). GFLOP/s count 8·d per pair (dV, dP, dQ, dK), as attn bench does.
    flops = 2 * dot_flops(batch, heads, n, n, d, None, False)
    if 4 * score_bytes <= budget:  # the saved weights, their gradient and the score gradient
        inputs = [x.clone().requires_grad_() for x in (q3, k3, v3)]
        out = book_dot_product(*inputs, None)
        grad = rand(*out.shape)
        ms, extra = time_median_ms(
            lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True), args.repeats)
        yield row("torch-book", "dot-backward", n, threads, ms, flops, extra)
        del out
    inputs = [x.clone().requires_grad_() for x in (q4, k4, v4)]
    out = F.scaled_dot_product_attention(*inputs)
    grad = rand(*out.shape)
    ms, extra = time_median_ms(
        lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True), args.repeats)
    yield row("torch-sdpa", "dot-backward", n, threads, ms, flops, extra)
    del out
    # nn.MultiheadAttention over (B, n, heads·d) with its four projections; need_weights=False
    # lets it take its fast path. Its GFLOP/s count the projections too (8·B·n·D² more).
    embed = heads * d
    mha = torch.nn.MultiheadAttention(embed, heads, batch_first=True)
    x = rand(batch, n, embed)
    flops = dot_flops(batch, heads, n, n, d, None, False) + 8.0 * batch * n * embed * embed
    ms, extra = time_median_ms(lambda: mha(x, x, x, need_weights=False), args.repeats)
    yield row("torch-mha", "mha", n, threads, ms, flops, extra)
    if args.onnx_mha:
        yield onnx_mha_row(mha, x, heads, n, threads, flops, args.repeats)
    # The book's additive attention, h = 64 (queries, keys, values of size d): the (B, n, m, h)
    # features and their tanh are two tensors of B·n·m·h floats.
    hidden = args.additive_hidden
    if n in args.additive_sizes and 2 * 4.0 * batch * n * n * hidden <= budget:
        additive = BookAdditive(d, d, hidden)
        qa, ka, va = (rand(batch, n, d) for _ in range(3))
        # Per (query, key) pair: h adds and h multiply-adds for w_v (tanh not counted), then the
        # weighted sum of d values.
        flops = batch * n * n * (3.0 * hidden + 2.0 * d)
        ms, extra = time_median_ms(lambda: additive(qa, ka, va, None), args.repeats)
        yield row("torch-book-additive", "additive", n, threads, ms, flops, extra)
        # Its backward pass, to the inputs and the three weight matrices, as attn's layer does.
        # The graph holds the features, their tanh and its gradient: about 4 such tensors.
        if 4 * 4.0 * batch * n * n * hidden <= budget:
            inputs = [x.clone().requires_grad_() for x in (qa, ka, va)]
            out = additive(*inputs, None)
            grad = rand(*out.shape)
            wrt = inputs + list(additive.parameters())
            ms, extra = time_median_ms(
                lambda: torch.autograd.grad(out, wrt, grad, retain_graph=True), args.repeats)
            yield row("torch-book-additive", "additive-backward", n, threads, ms, 2 * flops, extra)
            del out


def onnx_mha_row(mha, x, heads, n, threads, flops, repeats):
    """ONNX Runtime running mha's computation (its weights, the com.microsoft MultiHeadAttention
    operator between the projections: compare_mha.py's graph) on x with `threads` intra-op
    threads: the onnxruntime-mha row, its output checked against mha's."""
    # This folder's; imported here only, as it needs NumPy, which the rest of this script does not.
    import compare_mha

    # Each runtime's threads spin a while after their last call: the pauses keep PyTorch's and
    # ONNX Runtime's pools from running against each other on the same cores, as compare_mha.py
    # does between its libraries.
    time.sleep(0.5)
    ort_layer = compare_mha.onnx_runtime_layer(mha, heads, threads)
    x_numpy = x.numpy()  # the same storage as x
    # The session's first call is the memory probe: ONNX Runtime keeps its buffers in an arena
    # between calls, so a later call's peak would not grow at all.
    ms, extra = time_median_ms(lambda: ort_layer(x_numpy), repeats)
    difference = compare_mha.max_difference_from_torch(ort_layer, mha, x_numpy)
    del ort_layer  # the session and its thread pool
    time.sleep(0.5)
    result = row("onnxruntime-mha", "mha", n, threads, ms, flops, extra)
    result["max_difference"] = difference  # against nn.MultiheadAttention's output
    return result


def row(name, workload, n, threads, ms, flops, extra):
    return {"impl": name, "workload": workload, "n": n, "threads": threads, "ms": ms,
            "gflops": flops / (ms * 1e-3) * 1e-9, "extra_bytes": extra}


def run_attn(args):
    if args.attn_json:
        with open(args.attn_json) as source:
            return json.load(source)
    command = [args.attn, "bench", "--json", "--sizes", ",".join(map(str, args.sizes)),
               "--threads", ",".join(map(str, args.threads)), "--repeats", str(args.repeats),
               "--batch", str(args.batch), "--heads", str(args.heads),
               "--head-dim", str(args.head_dim)]
    if args.quick:
        command.append("--quick")
    if args.half_only:
        command += ["--cases", "fused-bf16,fused-fp16,fused-bf16-backward"]
    print("running:", " ".join(command), file=sys.stderr)
    result = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(result.stdout)


def format_bytes(value):
    return "n/a" if value is None else f"{value / MIB:.1f} MiB"


def main():
    # As `attn bench` does: every allocation above 64 KiB a fresh mapping returned on free, so
    # memory freed by an earlier case cannot hide a later one's from the peak-RSS probe. glibc
    # reads these at start-up only, hence the re-execution.
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="65536")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_attn = shutil.which("attn") or os.path.join(
        os.path.dirname(__file__), "..", "build-bench", "cli", "attn")
    parser.add_argument("--attn", default=default_attn, help="the attn executable")
    parser.add_argument("--attn-json", help="reuse the output of `attn bench --json-out FILE` "
                        "(same sizes, threads and shape) instead of running attn")
    parser.add_argument("--sizes", type=parse_ints, default=[128, 512, 1024, 2048, 4096])
    parser.add_argument("--threads", type=parse_ints, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--additive-hidden", type=int, default=64)
    parser.add_argument("--additive-sizes", type=parse_ints, default=[128, 512, 1024, 4096])
    parser.add_argument("--max-working-set-mib", type=float, default=3072.0,
                        help="skip PyTorch cases that would materialise more than this")
    parser.add_argument("--quick", action="store_true", help="sizes 128,512, 2 repeats")
    parser.add_argument("--json-out", help="also write every figure to this JSON file")
    parser.add_argument("--half-only", action="store_true",
                        help="bf16/fp16 workloads only (forward, bf16 causal and backward)")
    parser.add_argument("--onnx-mha", action="store_true",
                        help="also time ONNX Runtime's MultiHeadAttention graph (compare_mha.py's: "
                             "the projections around com.microsoft.MultiHeadAttention) beside "
                             "nn.MultiheadAttention, rows onnxruntime-mha (needs onnxruntime and "
                             "onnx)")
    args = parser.parse_args()
    onnxruntime_version = None
    if args.onnx_mha:
        try:
            import onnx  # noqa: F401  (compare_mha.py builds the graph with it)
            import onnxruntime
        except ImportError as error:
            parser.error(f"--onnx-mha needs onnxruntime and onnx ({error}): "
                         "pip install onnxruntime onnx")
        onnxruntime_version = onnxruntime.__version__
    if args.quick:
        args.sizes = [s for s in args.sizes if s <= 512] or [128]
        args.repeats = min(args.repeats, 2)

    try:
        import attn as attn_module  # the Python module, when installed (pip install .)
    except ImportError:
        attn_module = None
        print("attn's Python module is not installed: no attn-python rows", file=sys.stderr)
    if attn_module is not None and hasattr(attn_module, "empty_cache"):
        BEFORE_MEMORY_PROBE.append(attn_module.empty_cache)
    load_before = load_average()
    attn = run_attn(args)
    attn_lengths = {case["n"]: case["padding_lengths"] for case in attn["cases"]
                    if case["workload"] == "dot-padded"}
    # attn's rows are named by path (attn-fused, attn-plain); the workload tells the masks apart.
    rows = [{"impl": "attn-" + case["path"], "workload": case["workload"],
             "n": case["n"], "threads": case["threads"], "ms": case["ms"],
             "gflops": case["gflops"], "extra_bytes": case["extra_bytes"]}
            for case in attn["cases"]]
    for n in args.sizes:
        for threads in args.threads:
            print(f"torch n={n}, {threads} thread(s)", file=sys.stderr)
            rows.extend(torch_cases(args, n, threads, attn_lengths, attn_module))
    load_after = load_average()

    # attn's fused case of the same workload, length and thread count is every ratio's base; the
    # serial plain path ran with 1 thread only.
    fused = {(r["workload"], r["n"], r["threads"]): r["ms"] for r in rows
             if r["impl"] == "attn-fused"}
    # Workloads attn bench has no case for (bf16 causal and backward) compare with attn's Python
    # call instead.
    for r in rows:
        if r["impl"] == "attn-python":
            fused.setdefault((r["workload"], r["n"], r["threads"]), r["ms"])
    peaks = {p["threads"]: p["gflops"] for p in attn["fma_peak"]}
    print(f"attn vs PyTorch {torch.__version__} on the CPU: B={args.batch}, heads={args.heads}, "
          f"d={args.head_dim}, n=m, additive h={args.additive_hidden}; median of {args.repeats}")
    print(f"machine: {attn['machine']}; load average {load_before} before, {load_after} after")
    print("FMA peak: " + ", ".join(f"{t} thread(s) {g:.1f} GFLOP/s" for t, g in peaks.items()))
    print("GFLOP/s count only unmasked work; torch-mha counts its projections too; "
          "'attn faster by' = this time / attn fused time (same workload, n, threads); backward "
          "rows time the backward pass alone")
    if args.onnx_mha:
        print(f"onnxruntime-mha: ONNX Runtime {onnxruntime_version}'s com.microsoft "
              "MultiHeadAttention between MatMul projections, nn.MultiheadAttention's weights, "
              "intra-op threads = thr; its 'attn faster by' is against attn's layer (fused-mha)")
    print(attn["memory_method"] + " (the same for PyTorch)\n")
    header = f"{'workload':<17} {'n':>5} {'thr':>3} {'implementation':<20} {'ms':>10} " \
             f"{'GFLOP/s':>8} {'% peak':>7} {'attn faster by':>14} {'extra memory':>13}"
    print(header)
    order = ["dot", "dot-padded", "dot-causal", "dot-bf16", "dot-fp16", "dot-causal-bf16",
             "dot-backward", "dot-backward-bf16", "mha", "additive", "additive-backward"]
    rows.sort(key=lambda r: (order.index(r["workload"]) if r["workload"] in order else 99,
                             r["n"], r["threads"], r["impl"]))
    for r in rows:
        base = fused.get((r["workload"], r["n"], r["threads"]))
        is_base = r["impl"] == "attn-fused" or (r["impl"] == "attn-python" and base == r["ms"])
        ratio = f"{r['ms'] / base:.2f}x" if base and not is_base else "-"
        peak = peaks.get(r["threads"])
        percent = f"{100 * r['gflops'] / peak:.1f}" if peak else "-"
        print(f"{r['workload']:<17} {r['n']:>5} {r['threads']:>3} {r['impl']:<20} "
              f"{r['ms']:>10.2f} {r['gflops']:>8.1f} {percent:>7} {ratio:>14} "
              f"{format_bytes(r['extra_bytes']):>13}")
    if args.json_out:
        with open(args.json_out, "w") as out:
            results = {"torch_version": torch.__version__, "load_average_before": load_before,
                       "load_average_after": load_after, "attn": attn, "rows": rows}
            if args.onnx_mha:
                results["onnxruntime_version"] = onnxruntime_version
            json.dump(results, out, indent=2)
        print(f"\nwrote {args.json_out}", file=sys.stderr)


if __name__ == "__main__":
    main()
