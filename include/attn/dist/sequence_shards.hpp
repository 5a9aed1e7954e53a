// SequenceShards: how ring attention splits one sequence among P ranks — zig-zag (rank r holds
// chunks r and 2P − 1 − r of 2P, so causal work is balanced) or contiguous (chunk r of P).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace attn::dist {

enum class Sharding {
  // 2P chunks; rank r holds chunks r and 2P − 1 − r, in that order. Under a causal mask every rank
  // then has the same number of visible (query, key) pairs: an early chunk, which sees little,
  // paired with a late one, which sees much.
  kZigZag,
  // P chunks; rank r holds chunk r. Unbalanced under a causal mask (the last rank does P times the
  // first's work), but each rank's positions are one range.
  kContiguous,
};

// "zig-zag" or "contiguous", for messages.
std::string_view sharding_name(Sharding sharding);

// Positions [start, start + length) of the whole sequence.
struct SequenceChunk {
  int64_t start = 0;
  int64_t length = 0;
};

class SequenceShards {
 public:
  // `length` positions over `ranks` ranks. Chunks differ by at most one position: the first
  // length % chunks chunks hold one more. ValueError for length < 0 or ranks < 1.
  SequenceShards(int64_t length, int ranks, Sharding sharding = Sharding::kZigZag);

  int64_t length() const { return length_; }
  int ranks() const { return ranks_; }
  Sharding sharding() const { return sharding_; }

  // Rank r's chunks in the order its shard holds them, concatenated along the sequence axis.
  std::span<const SequenceChunk> chunks(int rank) const;
  // How many positions rank r holds.
  int64_t local_length(int rank) const;
  // The largest local_length() over the ranks.
  int64_t max_local_length() const;

 private:
  int64_t length_ = 0;
  int ranks_ = 1;
  Sharding sharding_ = Sharding::kZigZag;
  // chunks_[r] for rank r.
  std::vector<std::vector<SequenceChunk>> chunks_;
};

}  // namespace attn::dist
