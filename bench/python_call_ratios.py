#!/usr/bin/env python3
# Same-run ratios through the Python calls users make: additive attention in its two score
# forms, the dot-product backward (attn.torch autograd) with one (batch, head) on 1 and 2 threads,
# and the bf16 forward against fp32 (issue 14's >= 1.8x) on torch tensors, the two interleaved.
# Usage: python bench/python_call_ratios.py (prints one line per ratio).
import statistics, time, numpy as np, torch, attn, attn.torch as at
def ms(fn, n=7):
    fn(); t = []
    for _ in range(n):
        s = time.perf_counter(); fn(); t.append(time.perf_counter() - s)
    return statistics.median(t) * 1e3
rng = np.random.default_rng(0)
B, n, h = 4, 1024, 64
x = rng.standard_normal((B, n, h), dtype=np.float32); v = rng.standard_normal((B, n, h), dtype=np.float32)
I = np.eye(h, dtype=np.float32); w = rng.standard_normal((1, h), dtype=np.float32)
for threads in (1, 2):
    attn.set_num_threads(threads)
    small = ms(lambda: attn.additive_attention(x, x, v, I, I, w))          # projected inputs within ±21: exponential form
    large = ms(lambda: attn.additive_attention(30 * x, 30 * x, v, I, I, w))  # past ±21: the tanh form
    print(f"additive n={n} threads={threads}: tanh form {large:.1f} ms, exponential form {small:.1f} ms, ratio {large/small:.2f}x")
torch.manual_seed(0)
for dtype in (torch.float32, torch.bfloat16):
    q, k, vv = (torch.randn(1, 1, 4096, 64, dtype=dtype, requires_grad=True) for _ in range(3))
    res = {}
    for threads in (1, 2):
        attn.set_num_threads(threads)
        out = at.scaled_dot_product_attention(q, k, vv)
        g = torch.randn_like(out)
        res[threads] = ms(lambda: torch.autograd.grad(out, (q, k, vv), g, retain_graph=True))
    print(f"attn.torch backward B=H=1 n=4096 {dtype}: 1 thread {res[1]:.1f} ms, 2 threads {res[2]:.1f} ms, {res[1]/res[2]:.2f}x")
for n in (1024, 4096):
    q32, k32, v32 = (torch.rand(4, 8, n, 64) * 2 - 1 for _ in range(3))
    q16, k16, v16 = (x.to(torch.bfloat16) for x in (q32, k32, v32))
    for threads in (1, 2):
        attn.set_num_threads(threads)
        fp32, bf16 = [], []
        for _ in range(3):  # interleaved rounds, medians of their medians
            fp32.append(ms(lambda: attn.scaled_dot_product_attention(q32, k32, v32), 5))
            bf16.append(ms(lambda: attn.scaled_dot_product_attention(q16, k16, v16), 5))
        f, b = statistics.median(fp32), statistics.median(bf16)
        print(f"sdpa forward B=4 H=8 n={n} d=64 threads={threads}: float32 {f:.1f} ms, bfloat16 {b:.1f} ms, {f/b:.2f}x")
