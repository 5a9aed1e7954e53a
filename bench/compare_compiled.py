#!/usr/bin/env python3
"""attn.torch beside PyTorch's SDPA, both under torch.compile(fullgraph=True): the calls users
compile, eager beside them.

Decode steps under no_grad (one query row against a cache: a (1, 8, 1, 64) call on 16 keys,
where a call's fixed costs dominate, and Llama-3-8B's (1, 32, 1, 128) over 8 key/value heads,
bf16, on 1024 keys) and training steps (forward and torch.autograd.grad of query, key and
value, (1, 8, n, 64) fp32). Per call the best of --rounds loops' mean; the four variants take
turns loop by loop. Prints microseconds and PyTorch / attn (above 1: attn faster).

    python bench/compare_compiled.py --threads 1 --rounds 7
"""
import argparse
import time

import torch
import torch.nn.functional as F

import attn
import attn.torch as attn_torch
from compare_decode import cpu_name  # this folder's decode comparison


def workloads():
    """(name, inputs, training, enable_gqa, calls per loop)."""
    def tensors(query_shape, key_shape, dtype, grad):
        return [torch.randn(shape, dtype=dtype, requires_grad=grad)
                for shape in (query_shape, key_shape, key_shape)]

    yield ("decode (1,8,1,64) m=16 fp32", tensors((1, 8, 1, 64), (1, 8, 16, 64), torch.float32,
                                                  False), False, False, 2000)
    yield ("decode Llama-3-8B m=1024 bf16", tensors((1, 32, 1, 128), (1, 8, 1024, 128),
                                                    torch.bfloat16, False), False, True, 300)
    for n in (16, 64, 256):
        yield (f"train (1,8,{n},64) fp32", tensors((1, 8, n, 64), (1, 8, n, 64), torch.float32,
                                                   True), True, False, 2000 // n * 8 + 20)


def step(attend, inputs, training, enable_gqa):
    """One call: the attention under no_grad, or a training step's forward and backward."""
    if not training:
        with torch.no_grad():
            return attend(*inputs, enable_gqa=enable_gqa)
    output = attend(*inputs, enable_gqa=enable_gqa)
    return torch.autograd.grad(output, inputs, torch.ones_like(output))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"# {cpu_name()}, torch {torch.__version__}, attn from {attn.__file__}")
    print(f"{'workload':32} {'thr':>3} {'attn eager':>10} {'torch eager':>11} "
          f"{'attn compiled':>13} {'torch compiled':>14} {'eager ratio':>11} "
          f"{'compiled ratio':>14}")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        attn.set_num_threads(threads)
        for name, inputs, training, enable_gqa, calls in workloads():
            variants = {
                "attn eager": attn_torch.scaled_dot_product_attention,
                "torch eager": F.scaled_dot_product_attention,
                "attn compiled": torch.compile(attn_torch.scaled_dot_product_attention,
                                               fullgraph=True),
                "torch compiled": torch.compile(F.scaled_dot_product_attention, fullgraph=True),
            }
            for attend in variants.values():  # compile and warm up
                for _ in range(20):
                    step(attend, inputs, training, enable_gqa)
            best = dict.fromkeys(variants, float("inf"))
            for _ in range(args.rounds):
                for key, attend in variants.items():
                    start = time.perf_counter()
                    for _ in range(calls):
                        step(attend, inputs, training, enable_gqa)
                    best[key] = min(best[key], (time.perf_counter() - start) / calls * 1e6)
            print(f"{name:32} {threads:3d} {best['attn eager']:10.1f} {best['torch eager']:11.1f} "
                  f"{best['attn compiled']:13.1f} {best['torch compiled']:14.1f} "
                  f"{best['torch eager'] / best['attn eager']:11.2f} "
                  f"{best['torch compiled'] / best['attn compiled']:14.2f}", flush=True)
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
