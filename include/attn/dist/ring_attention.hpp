// Ring attention (Liu et al., 2023; Megatron-LM's and PyTorch's context parallelism) over MPI:
// exact scaled dot-product attention, forward and backward, of one sequence split among the ranks
// of a communicator — each rank holds a shard of the queries, keys and values, key/value blocks
// travel around the ring while every rank attends to the block it holds, and the partial results
// merge by their log-sum-exp. The same result as attn::scaled_dot_product_attention on the whole
// sequence, within float round-off.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <span>
#include <vector>

#include "attn/core/strided_view.hpp"
#include "attn/core/tensor.hpp"
#include "attn/dist/sequence_shards.hpp"
#include "attn/functional/attention_options.hpp"

namespace attn::dist {

// Every rank of `comm` calls these collectively with its own shards, all of the same rank (2 to 4)
// and the functional API's shapes — query (..., H_q, L_r, E), key (..., H_kv, S_r, E), value
// (..., H_kv, S_r, Ev) — where L_r and S_r are the rank's shares (SequenceShards(L, P, sharding)
// .local_length(r)) of the whole sequences' L queries and S keys, their chunks concatenated along
// axis −2 in the order SequenceShards::chunks lists them. L and S are the sums over the ranks.
// Any strides with a contiguous last axis; the other axes and the options agree on every rank.
//
// The options are AttentionOptions as for the whole sequence: causal, its alignment (top-left,
// bottom-right or an offset, all on the whole sequence's positions), window, scale, enable_gqa,
// softcap and alibi_slopes. valid_lens: per batch element (B), the whole sequence's lengths, or
// per query (B, L_r), the lengths of this rank's own queries in its local order. Not available
// (ValueError): attn_mask, sinks, dropout.
//
// Errors: every argument is checked on every rank before any data moves (shapes, each rank's
// share, options, finite values, agreement between the ranks); a failure on any rank throws the
// same attn::Error, "rank r: ..." first, on all of them. A failure later, in the middle of the
// ring (memory), aborts every rank (MPI_Abort) rather than leave the others waiting.

// This rank's rows: the output (..., H_q, L_r, Ev), contiguous, and one log-sum-exp per query row
// in (..., H_q, L_r) order (−∞ for a row that sees no key), as the backward pass takes it.
struct RingAttentionForward {
  Tensor output;
  std::vector<float> log_sum_exp;
};

RingAttentionForward ring_attention_forward(MPI_Comm comm, ConstStridedView query,
                                            ConstStridedView key, ConstStridedView value,
                                            const AttentionOptions& options,
                                            Sharding sharding = Sharding::kZigZag);

// This rank's gradients of sum(output ⊙ grad_output) over the whole sequence, shaped as its
// shards: dQ of its queries, dK and dV of its keys and values (every rank's queries' share
// summed).
struct RingAttentionBackward {
  Tensor query;
  Tensor key;
  Tensor value;
};

// `output` and `log_sum_exp` are the forward pass's for these shards and options; `grad_output`
// is shaped as `output`.
RingAttentionBackward ring_attention_backward(MPI_Comm comm, ConstStridedView query,
                                              ConstStridedView key, ConstStridedView value,
                                              ConstStridedView output, ConstStridedView grad_output,
                                              std::span<const float> log_sum_exp,
                                              const AttentionOptions& options,
                                              Sharding sharding = Sharding::kZigZag);

// What one rank computed, for tests and benchmarks: (query chunk, key chunk) pairs computed and
// skipped because no key of the pair is visible to any query of it (causal, window, valid
// lengths), and the seconds spent waiting for blocks beyond the computation.
struct RingStatistics {
  int64_t pairs_computed = 0;
  int64_t pairs_skipped = 0;
  double compute_seconds = 0.0;
  double wait_seconds = 0.0;
};
// The figures of this rank's last ring_attention_forward or _backward call (this thread's).
RingStatistics last_ring_statistics();

}  // namespace attn::dist
