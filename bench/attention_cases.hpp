// The benchmark cases, one table of named entries shared by `attn bench` and the Google Benchmark
// targets: each prepares its inputs for a shape and returns one timed pass (a forward pass, or a
// backward pass after the forward pass it needs ran in preparation). A new kernel is one more
// entry in attention_cases().
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace attn::bench {

struct AttentionShape {
  int64_t batch = 4;
  int64_t heads = 8;
  int64_t queries = 128;  // n
  int64_t keys = 128;     // m
  int64_t head_dim = 64;  // d (queries, keys and values alike)
  // The sliding-window case's left size: query i sees keys i − window … i (causal, Mistral's).
  int64_t window = 256;
};

// A case ready to run: inputs and outputs allocated and filled, `run` does one pass. Whatever
// `run` allocates is the case's extra memory.
struct PreparedCase {
  std::function<void()> run;
  // Flops of the work the mask leaves, per visible (query, key) pair summed over batch, heads and
  // queries: 4·d for dot-product attention forward, 8·d for its backward pass (dV, dP, dQ, dK;
  // recomputing the scores is not counted), 3·h + 2·d for additive attention forward (add, w_v
  // multiply-add; tanh not counted) and 6·h + 4·d for its backward; multi-head attention adds its
  // four projections, 8·B·n·(H·d)². Masked cases count only
  // this, so their rate compares with unmasked ones.
  double useful_flops = 0.0;
  // The valid length of each batch element of a padded case (empty for none), so that peers
  // (bench/compare_pytorch.py) can run the very same mask.
  std::vector<int64_t> padding_lengths;
};

struct AttentionCase {
  std::string name;      // e.g. "fused-causal"; what --cases selects
  std::string workload;  // cases with the same workload compute the same thing, e.g. "dot-causal"
  std::string path;      // "fused" or "plain"; the plain case of a workload is the speedup's base
  bool uses_threads = true;  // false: a serial path, measured with 1 thread only
  // 0, or the longest n = m at which the case runs (the serial reference loops of additive
  // attention would take minutes per pass beyond it).
  int64_t max_length = 0;
  // Bytes the case materialises beyond inputs and outputs, known from the algorithm; sizes whose
  // working set exceeds the memory budget are skipped.
  std::function<double(const AttentionShape&)> working_set_bytes;
  std::function<PreparedCase(const AttentionShape&, uint64_t seed)> prepare;
};

// Every case, in the order tables list them.
const std::vector<AttentionCase>& attention_cases();
// ValueError naming the known cases when `name` is not one of them.
const AttentionCase& find_attention_case(const std::string& name);

}  // namespace attn::bench
