"""attn.MultiHeadAttention against torch.nn.MultiheadAttention (and ONNX Runtime) from Python.

Both layers in evaluation mode with biases, self-attention on x of shape (B, n, D), D = heads * d,
as a user calls them: attn on a NumPy array, PyTorch under inference_mode with need_weights=False.
When onnxruntime and onnx are installed (`pip install onnxruntime onnx`), the same layer (PyTorch's
weights) also runs as an ONNX graph in ONNX Runtime on the CPU: three projections (MatMul), the
com.microsoft MultiHeadAttention operator with the projections' biases, and the output projection,
in one run. Each library's passes run as a block (attn's, a pause, PyTorch's, a pause, ...): the
OpenMP and thread-pool runtimes would otherwise spin against each other on the same cores. Prints
the median times and the ratios; --json-out writes them too.

    python bench/compare_mha.py --sizes 1024,4096 --threads 1,2 --repeats 7

With --autocast, both run under torch.autocast("cpu") (bfloat16), as a user after speed runs a
PyTorch model: attn's layer is attn.torch.MultiHeadAttention holding PyTorch's weights (its
projections by PyTorch's linear in bfloat16, the attention by attn's bf16 kernels), on the same
torch tensor; no ONNX Runtime column (its graph is float32). With --compile, both layers run
compiled by torch.compile (Inductor), as a user who compiles a model runs them: attn's is
attn.torch.MultiHeadAttention with PyTorch's weights, compiled with fullgraph=True (in float32
too: attn.torch composes PyTorch's linear with attn's function while the compiler traces it); no
ONNX Runtime column. --compile and --autocast combine.

compare_pytorch.py --onnx-mha imports onnx_runtime_layer and max_difference_from_torch from here,
to put the same ONNX Runtime graph beside its nn.MultiheadAttention rows; importing this file needs
neither attn's module nor compare_decode (main imports them).
"""

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch


def median_ms(action, repeats):
    action()  # warm-up: threads started, buffers touched, oneDNN's kernels generated
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds) * 1e3


def onnx_runtime_layer(torch_layer, heads, threads):
    """A callable running torch_layer's computation in ONNX Runtime with `threads` intra-op
    threads, or None when onnxruntime or onnx is not installed."""
    try:
        import onnx
        import onnxruntime
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    width = torch_layer.embed_dim
    weight = torch_layer.in_proj_weight.detach().numpy()
    bias = torch_layer.in_proj_bias.detach().numpy()
    initializers = [
        numpy_helper.from_array(np.ascontiguousarray(weight[i * width:(i + 1) * width].T), name)
        for i, name in enumerate(("w_q", "w_k", "w_v"))]
    initializers += [
        numpy_helper.from_array(bias, "qkv_bias"),
        numpy_helper.from_array(
            np.ascontiguousarray(torch_layer.out_proj.weight.detach().numpy().T), "w_o"),
        numpy_helper.from_array(torch_layer.out_proj.bias.detach().numpy(), "b_o")]
    nodes = [helper.make_node("MatMul", ["x", w], [out])
             for w, out in (("w_q", "q"), ("w_k", "k"), ("w_v", "v"))]
    nodes.append(helper.make_node("MultiHeadAttention", ["q", "k", "v", "qkv_bias"], ["heads"],
                                  domain="com.microsoft", num_heads=heads))
    nodes.append(helper.make_node("MatMul", ["heads", "w_o"], ["projected"]))
    nodes.append(helper.make_node("Add", ["projected", "b_o"], ["y"]))
    shape = ["batch", "n", width]
    graph = helper.make_graph(nodes, "mha", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    # onnx writes its own newest IR version, which an older ONNX Runtime refuses (onnx 1.23 writes
    # 14, ONNX Runtime 1.30 reads up to 13); the graph uses nothing past IR 8 (opset 17's).
    model.ir_version = min(model.ir_version, 8)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    return lambda x: session.run(["y"], {"x": x})[0]


def max_difference_from_torch(ort_layer, torch_layer, x):
    """The largest difference of onnx_runtime_layer's output on x (a float32 NumPy array
    (B, n, D)) from torch_layer's, with a warning when they disagree."""
    with torch.inference_mode():
        expected = torch_layer(*(torch.from_numpy(x),) * 3, need_weights=False)[0]
    # The same layer: its output agrees with PyTorch's to float32 rounding.
    difference = float(np.max(np.abs(ort_layer(x) - expected.numpy())))
    if difference > 1e-4:
        print(f"warning: ONNX Runtime's output differs from PyTorch's by {difference}")
    return difference


def main():
    # Here rather than at the top: compare_pytorch.py imports this file where attn's module may
    # be missing (compare_decode imports it too).
    import attn
    from compare_decode import cpu_name, parse_ints  # this folder's decode comparison

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,4096", help="sequence lengths n, comma-separated")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json-out", help="also write the figures to this JSON file")
    parser.add_argument("--autocast", action="store_true",
                        help='both layers under torch.autocast("cpu") (bfloat16), attn through '
                             "attn.torch.MultiHeadAttention")
    parser.add_argument("--compile", action="store_true",
                        help="both layers compiled by torch.compile, attn through "
                             "attn.torch.MultiHeadAttention (fullgraph=True)")
    args = parser.parse_args()
    through_torch = args.autocast or args.compile  # attn's layer: attn.torch's, on torch tensors

    width = args.heads * args.head_dim
    torch_layer = torch.nn.MultiheadAttention(width, args.heads, bias=True, batch_first=True).eval()
    attn_layer = attn.MultiHeadAttention(width, width, width, width, args.heads, bias=True).eval()
    if through_torch:
        attn_layer = attn_torch_layer(torch_layer, args.heads)
    attn_call = lambda x: attn_layer(x, x, x)  # noqa: E731
    torch_call = lambda x: torch_layer(x, x, x, need_weights=False)[0]  # noqa: E731
    if args.compile:
        attn_call = torch.compile(attn_call, fullgraph=True)
        torch_call = torch.compile(torch_call)
    rows = []
    print(f"machine: {cpu_name()}, {os.cpu_count()} logical CPUs; torch {torch.__version__}")
    print(f"B={args.batch}, {args.heads} heads of {args.head_dim}, D={width}, biases, eval mode; "
          f"median of {args.repeats}")
    has_ort = not through_torch and onnx_runtime_layer(torch_layer, args.heads, 1) is not None
    if args.autocast:
        print('both under torch.autocast("cpu", dtype=torch.bfloat16); attn: attn.torch')
    if args.compile:
        print("both compiled by torch.compile (attn.torch's with fullgraph=True)")
    elif not has_ort and not through_torch:
        print("onnxruntime/onnx not installed: no ONNX Runtime column "
              "(pip install onnxruntime onnx)")
    print(f"{'n':>6} {'threads':>7} {'attn ms':>9} {'torch ms':>9} {'torch/attn':>10}"
          + (f" {'ort ms':>9} {'ort/attn':>9}" if has_ort else "")
          + (f" {'max |attn - torch|':>19}" if through_torch else ""))
    for n in parse_ints(args.sizes):
        x = np.random.default_rng(0).standard_normal((args.batch, n, width), dtype=np.float32)
        x_torch = torch.from_numpy(x)
        for threads in parse_ints(args.threads):
            attn.set_num_threads(threads)
            torch.set_num_threads(threads)
            with torch.inference_mode(), torch.autocast("cpu", enabled=args.autocast):
                attn_input = x_torch if through_torch else x
                attn_ms = median_ms(lambda: attn_call(attn_input), args.repeats)
                time.sleep(0.5)
                torch_ms = median_ms(lambda: torch_call(x_torch), args.repeats)
                if through_torch:  # the same layer both ways
                    difference = (attn_call(x_torch).float()
                                  - torch_call(x_torch).float()).abs().max()
            time.sleep(0.5)
            row = {"n": n, "threads": threads, "attn_ms": attn_ms, "torch_ms": torch_ms}
            if through_torch:
                row["max_difference"] = float(difference)
            line = (f"{n:>6} {threads:>7} {attn_ms:>9.1f} {torch_ms:>9.1f} "
                    f"{torch_ms / attn_ms:>9.2f}x")
            if has_ort:
                ort_layer = onnx_runtime_layer(torch_layer, args.heads, threads)
                difference = max_difference_from_torch(ort_layer, torch_layer, x)
                row["ort_ms"] = median_ms(lambda: ort_layer(x), args.repeats)
                row["ort_max_difference"] = difference
                time.sleep(0.5)
                line += f" {row['ort_ms']:>9.1f} {row['ort_ms'] / attn_ms:>8.2f}x"
            if through_torch:
                line += f" {row['max_difference']:>19.2e}"
            rows.append(row)
            print(line)
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump({"machine": cpu_name(), "torch": torch.__version__,
                       "autocast": "bfloat16" if args.autocast else None,
                       "compiled": args.compile,
                       "onnxruntime": _onnxruntime_version(), "batch": args.batch,
                       "heads": args.heads, "head_dim": args.head_dim, "repeats": args.repeats,
                       "rows": rows}, out, indent=2)


def attn_torch_layer(torch_layer, heads):
    """attn.torch.MultiHeadAttention in evaluation mode with torch_layer's weights (its packed
    in_proj split into W_q, W_k, W_v)."""
    import attn.torch

    width = torch_layer.embed_dim
    layer = attn.torch.MultiHeadAttention(width, width, width, width, heads, bias=True).eval()
    weights, biases = torch_layer.in_proj_weight.chunk(3), torch_layer.in_proj_bias.chunk(3)
    state = {f"{name}.weight": w for name, w in zip(("W_q", "W_k", "W_v"), weights)}
    state |= {f"{name}.bias": b for name, b in zip(("W_q", "W_k", "W_v"), biases)}
    state |= {"W_o.weight": torch_layer.out_proj.weight, "W_o.bias": torch_layer.out_proj.bias}
    layer.load_state_dict(state)
    return layer


def _onnxruntime_version():
    try:
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime.__version__


if __name__ == "__main__":
    main()
