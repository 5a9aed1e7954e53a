"""Float32 error of attn's and PyTorch's SDPA (output and gradients) against float64 as the scores
grow: the measurement behind docs/kernels.md, "fp32 gradients at large scores".

    python tools/gradient_error_by_magnitude.py --queries 1,10,16,17,64 --keys 1024 --depth 64

Each row: the query scale (q ~ N(0, scale²), k, v, grad_output ~ N(0, 1), softmax scale 1), the
largest |score|, and the largest error of the output, dQ, dK and dV relative to that tensor's
largest magnitude, over --seeds draws (the worst draw's), for PyTorch's float32 SDPA and for
attn.torch's.
"""

import argparse

import torch
import torch.nn.functional as F

import attn.torch as attn_torch


def relative_error(value, reference):
    return ((value.double() - reference).abs().max() / reference.abs().max()).item()


def errors(function, inputs, grad_output, dtype):
    leaves = [tensor.to(dtype).clone().requires_grad_() for tensor in inputs]
    output = function(*leaves, scale=1.0)
    output.backward(grad_output.to(dtype))
    return [output] + [leaf.grad for leaf in leaves]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", default="1,10,16,17,64", help="query counts, comma-separated")
    parser.add_argument("--keys", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--scales", default="0.25,0.5,1,1.5,2,3", help="query scales")
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args()
    print("queries  scale  max|S|  | PyTorch fp32: O, dQ, dK, dV | attn fp32: O, dQ, dK, dV")
    for queries in (int(q) for q in args.queries.split(",")):
        for scale in (float(s) for s in args.scales.split(",")):
            worst = {"torch": [0.0] * 4, "attn": [0.0] * 4}
            largest_score = 0.0
            for seed in range(args.seeds):
                generator = torch.Generator().manual_seed(seed)
                shape = (2, args.heads, queries, args.depth)
                kv_shape = (2, args.heads, args.keys, args.depth)
                q = torch.randn(shape, generator=generator) * scale
                k = torch.randn(kv_shape, generator=generator)
                v = torch.randn(kv_shape, generator=generator)
                g = torch.randn(shape, generator=generator)
                scores = q.double() @ k.double().transpose(-1, -2)
                largest_score = max(largest_score, scores.abs().max().item())
                reference = errors(F.scaled_dot_product_attention, (q, k, v), g, torch.float64)
                for name, function in (("torch", F.scaled_dot_product_attention),
                                       ("attn", attn_torch.scaled_dot_product_attention)):
                    result = errors(function, (q, k, v), g, torch.float32)
                    worst[name] = [max(w, relative_error(r, ref))
                                   for w, r, ref in zip(worst[name], result, reference)]
            print(f"{queries:7d}  {scale:5.2f}  {largest_score:6.1f}  | "
                  + " ".join(f"{e:.1e}" for e in worst["torch"]) + " | "
                  + " ".join(f"{e:.1e}" for e in worst["attn"]))


if __name__ == "__main__":
    main()
