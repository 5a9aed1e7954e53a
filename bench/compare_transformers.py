#!/usr/bin/env python3
# A transformers model end to end with attn_implementation="attn" beside "sdpa" (PyTorch's SDPA),
# in one run: prefill of a long prompt, then greedy decoding token by token over transformers' own
# cache, the way a user runs a model on a CPU. Times, tokens per second, ratios, and whether the
# greedy tokens agree.
"""Compare a transformers causal LM on attn against the same model on PyTorch's SDPA (CPU).

Run with the Python that scripts/test.sh builds (attn, torch, transformers):
    build/venv/bin/python bench/compare_transformers.py --contexts 4096,16384 --threads 1,2

The model is a Llama of random weights (no download; seed fixed): 4 layers, hidden size 1024, 16
query heads over 4 key/value heads of 64, MLP 2816, vocabulary 32000 — small weights, so that
the attention over a long context is a large part of a decode step, as it is for long contexts of
larger models. For each dtype and thread count: one forward pass over a random prompt of
`--prefill` tokens (use_cache=True, the last position's logits, as generate() asks), then for each
context `--new-tokens` greedy steps of one token against transformers' DynamicCache (appends by
concatenation) and StaticCache (room for the steps; read through a mask over its empty slots;
with `--caches static-compiled`, model.forward under torch.compile as well) filled with `context`
tokens of random keys and values (a step's cost does not depend on them; a prefill of 32768
tokens would take minutes here); the median step is reported. Both implementations run the
same weights, one after the other. Not part of CI: timings need a quiet machine.
"""
import argparse
import inspect
import json
import os
import platform
import statistics
import time

import torch

import attn
import attn.transformers
from compare_decode import cpu_name, parse_ints  # this folder's decode comparison

IMPLEMENTATIONS = ("attn", "sdpa")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build_model(dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                         num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                         vocab_size=32000, max_position_embeddings=1 << 18)
    return LlamaForCausalLM(config).to(dtype).eval()


def prefill(model, implementation, prompt):
    """Seconds of one forward pass over the prompt, logits of its last position only (as
    generate() asks for them)."""
    model.set_attn_implementation(implementation)
    with torch.inference_mode():
        start = time.perf_counter()
        model(prompt, use_cache=True, logits_to_keep=1)
        return time.perf_counter() - start


def decode(model, implementation, context, new_tokens, cache_kind="dynamic"):
    """(median seconds of a greedy decode step, token ids) against a cache ("dynamic": a
    DynamicCache, which appends by concatenation; "static": a StaticCache of room for the steps,
    which transformers reads through a mask over its empty slots; "static-compiled": the same
    with model.forward under torch.compile(fullgraph=True), transformers' recipe for fast
    decoding, its first step compiling: the median leaves it out) holding `context` tokens of
    random keys and values in every layer (what a prefill would leave; the cost of a step does not
    depend on the values)."""
    from transformers import DynamicCache, StaticCache

    model.set_attn_implementation(implementation)
    config = model.config
    generator = torch.Generator().manual_seed(context)
    dtype = next(model.parameters()).dtype
    cache = (DynamicCache(config=config) if cache_kind == "dynamic"
             else StaticCache(config=config, max_cache_len=context + new_tokens + 1))
    forward = model
    if cache_kind == "static-compiled":
        torch._dynamo.reset()  # one implementation's graphs at a time, under the recompile limit
        forward = torch.compile(model.forward, fullgraph=True)
    shape = (1, config.num_key_value_heads, context, config.head_dim)
    for layer in range(config.num_hidden_layers):
        cache.update(torch.randn(shape, generator=generator).to(dtype),
                     torch.randn(shape, generator=generator).to(dtype), layer)
    token = torch.tensor([[1]])
    tokens, steps = [], []
    # transformers 5.24 renamed forward's past_key_values to cache (the old name warns).
    cache_argument = ("cache" if "cache" in inspect.signature(model.forward).parameters
                      else "past_key_values")
    with torch.inference_mode():
        for step in range(new_tokens):
            # The positions spelled out: inferring them from a StaticCache's slots breaks the graph.
            positions = ({"cache_position": torch.tensor([context + step]),
                          "position_ids": torch.tensor([[context + step]])}
                         if cache_kind == "static-compiled" else {})
            start = time.perf_counter()
            out = forward(token, use_cache=True, **{cache_argument: cache}, **positions)
            token = out.logits[:, -1:].argmax(-1)
            steps.append(time.perf_counter() - start)
            tokens.append(token.item())
    return statistics.median(steps), tokens


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=parse_ints, default=[4096, 32768],
                        help="tokens in the cache for the decode steps, comma-separated")
    parser.add_argument("--prefill", type=int, default=4096, help="prompt length of the prefill")
    parser.add_argument("--new-tokens", type=int, default=16, help="greedy decode steps")
    parser.add_argument("--threads", type=parse_ints, default=[1, os.cpu_count() or 1])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--caches", default="dynamic,static",
                        help="transformers cache classes for the decode steps: dynamic, static, "
                             "static-compiled (a StaticCache, model.forward compiled)")
    parser.add_argument("--json-out", help="write the rows as JSON here")
    args = parser.parse_args()
    attn.transformers.register()
    rows = []
    for dtype in [name for name in args.dtypes.split(",") if name]:
        model = build_model(DTYPES[dtype])
        prompt = torch.randint(0, model.config.vocab_size, (1, args.prefill),
                               generator=torch.Generator().manual_seed(1))
        for threads in args.threads:
            torch.set_num_threads(threads)
            attn.set_num_threads(threads)
            for name in IMPLEMENTATIONS:  # warm-up: thread pools, first-call allocations
                prefill(model, name, prompt[:, :64])
                for kind in args.caches.split(","):
                    if kind and kind != "static-compiled":  # that one compiles at each call
                        decode(model, name, 64, 2, kind)
            for name in IMPLEMENTATIONS:
                rows.append({"implementation": name, "dtype": dtype, "threads": threads,
                             "phase": "prefill", "context": args.prefill,
                             "seconds": prefill(model, name, prompt)})
            for context, cache_kind in [(c, k) for c in args.contexts
                                        for k in args.caches.split(",") if k]:
                results = {name: decode(model, name, context, args.new_tokens, cache_kind)
                           for name in IMPLEMENTATIONS}
                for name, (step, tokens) in results.items():
                    rows.append({"implementation": name, "dtype": dtype, "threads": threads,
                                 "phase": f"decode-{cache_kind}", "context": context,
                                 "seconds": step,
                                 "tokens_equal_to_sdpa": sum(
                                     a == b for a, b in zip(tokens, results["sdpa"][1])),
                                 "tokens": len(tokens)})
        del model
    import transformers

    print(f"transformers: {cpu_name()}, {os.cpu_count()} logical CPUs; attn {attn.__version__}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}; random Llama, 4 "
          f"layers, 16 heads over 4 of 64; prefill: one pass over the prompt; decode: the median "
          f"of {args.new_tokens} greedy steps against a cache of `context` tokens")
    print(f"{'dtype':9} {'phase':14} {'context':>7} {'thr':>3} {'attn ms':>9} {'sdpa ms':>9} "
          f"{'sdpa/attn':>9} {'attn tok/s':>10} {'same tokens':>11}")
    index = {(r["implementation"], r["dtype"], r["phase"], r["context"], r["threads"]): r
             for r in rows}
    for r in rows:
        if r["implementation"] != "attn":
            continue
        s = index[("sdpa", r["dtype"], r["phase"], r["context"], r["threads"])]
        decoding = r["phase"].startswith("decode")
        rate = f"{1.0 / r['seconds']:10.1f}" if decoding else f"{'-':>10}"
        same = f"{r['tokens_equal_to_sdpa']:7d}/{r['tokens']}" if decoding else f"{'-':>11}"
        print(f"{r['dtype']:9} {r['phase']:14} {r['context']:7d} {r['threads']:3d} "
              f"{r['seconds'] * 1e3:9.1f} {s['seconds'] * 1e3:9.1f} "
              f"{s['seconds'] / r['seconds']:8.2f}x {rate} {same:>11}")
    if args.json_out:
        document = {"machine": {"cpu": cpu_name(), "logical_cpus": os.cpu_count(),
                                "python": platform.python_version(),
                                "torch": torch.__version__}, "rows": rows}
        with open(args.json_out + ".tmp", "w") as out:
            json.dump(document, out, indent=1)
        os.replace(args.json_out + ".tmp", args.json_out)


if __name__ == "__main__":
    main()
