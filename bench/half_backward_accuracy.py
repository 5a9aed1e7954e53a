"""Half-precision backward accuracy where one key dominates each row: attn.torch's fp16/bf16
gradients of query and key against float64 on the same rounded inputs, beside PyTorch's own half
backward and beside attn's backward without the forward's rounding residuals (D = rowsum(dO ∘ O)
from the rounded output alone, as PyTorch takes it).

Prints, per dtype and input magnitude, the largest error of dQ and dK over the largest gradient,
the worst over the seeds: `python bench/half_backward_accuracy.py [--seeds 4]`. With `--timing`,
also what the residuals cost: attn's forward and backward passes (the extension's calls, one
thread) with and without them, interleaved, fastest of 5 rounds.
"""

import argparse
import time

import torch

import attn
import attn.torch as attn_torch

F = torch.nn.functional


def gradients(function, q, k, v, grad_output):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    function(*leaves).backward(grad_output)
    return [t.grad.double() for t in leaves]


def without_residuals(q, k, v, grad_output):
    """attn's extension called as before the residuals: D from the rounded output."""
    output, log_sum_exp = attn._attn._sdpa_forward(q, k, v)
    return [g.double() for g in attn._attn._sdpa_backward(q, k, v, output, grad_output,
                                                          log_sum_exp)[:3]]


def relative_errors(got, want):
    return [float((a - b).abs().max() / b.abs().max()) for a, b in zip(got[:2], want[:2])]


def timing(rounds=5):
    torch.set_num_threads(1)
    extension = attn._attn
    options = (None, 0.0, True, None, False)  # attn_mask, dropout_p, is_causal, scale, enable_gqa
    print("one thread, causal; ms, fastest of", rounds, "interleaved rounds")
    for dtype in (torch.float16, torch.bfloat16):
        for shape in ((4, 8, 1024, 64), (1, 8, 128, 64)):
            q, k, v, grad_output = (torch.randn(shape).to(dtype) for _ in range(4))
            repeats = 3 if shape[2] >= 1024 else 200
            output, log_sum_exp, residual = extension._sdpa_forward(
                q, k, v, *options, output_residual=True)

            def forward(with_residual):
                extension._sdpa_forward(q, k, v, *options, output_residual=with_residual)

            def backward(with_residual):
                extension._sdpa_backward(q, k, v, output, grad_output, log_sum_exp, *options,
                                         output_residual=residual if with_residual else None)

            times = {}
            for _ in range(rounds):
                for name, call, flag in (("forward", forward, False),
                                         ("forward, residuals", forward, True),
                                         ("backward", backward, False),
                                         ("backward, residuals", backward, True)):
                    start = time.perf_counter()
                    for _ in range(repeats):
                        call(flag)
                    elapsed = (time.perf_counter() - start) / repeats * 1e3
                    times[name] = min(times.get(name, elapsed), elapsed)
            print(f"{str(dtype)[6:]:9} {shape}: forward {times['forward']:.3f} -> "
                  f"{times['forward, residuals']:.3f} "
                  f"({times['forward, residuals'] / times['forward']:.3f}x), backward "
                  f"{times['backward']:.3f} -> {times['backward, residuals']:.3f} "
                  f"({times['backward, residuals'] / times['backward']:.3f}x)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--shape", type=int, nargs=4, default=(1, 1, 64, 128),
                        metavar=("B", "H", "L", "E"))
    arguments = parser.parse_args()
    print(f"attn {attn.__version__}, PyTorch {torch.__version__}; {attn.amx_status()}; "
          f"{attn.bf16_dot_status()}; {attn.bf16_probabilities_status()}")
    print("shape (B, H, L = S, E):", tuple(arguments.shape))
    print("dtype     x   | dQ, dK error / largest:  attn          attn, no residuals  PyTorch")
    for dtype in (torch.float16, torch.bfloat16):
        for magnitude in (1.0, 10.0, 20.0):
            worst = {"attn": [0.0, 0.0], "old": [0.0, 0.0], "torch": [0.0, 0.0]}
            for seed in range(arguments.seeds):
                generator = torch.Generator().manual_seed(seed)
                q, k = (torch.randn(*arguments.shape, generator=generator) * magnitude
                        for _ in range(2))
                v, grad_output = (torch.randn(*arguments.shape, generator=generator)
                                  for _ in range(2))
                q, k, v, grad_output = (t.to(dtype) for t in (q, k, v, grad_output))
                want = gradients(F.scaled_dot_product_attention, q.double(), k.double(),
                                 v.double(), grad_output.double())
                results = {
                    "attn": gradients(attn_torch.scaled_dot_product_attention, q, k, v,
                                      grad_output),
                    "old": without_residuals(q, k, v, grad_output),
                    "torch": gradients(F.scaled_dot_product_attention, q, k, v, grad_output),
                }
                for name, got in results.items():
                    errors = relative_errors(got, want)
                    worst[name] = [max(a, b) for a, b in zip(worst[name], errors)]
            cells = "  ".join(f"{worst[n][0]:.1e}, {worst[n][1]:.1e}"
                              for n in ("attn", "old", "torch"))
            print(f"{str(dtype)[6:]:9} {magnitude:4g} | {cells}")
    if arguments.timing:
        timing()


if __name__ == "__main__":
    main()
