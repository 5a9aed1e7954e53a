// SequenceShards: the chunks of a sequence each rank holds, zig-zag or contiguous.
#include "attn/dist/sequence_shards.hpp"

#include <algorithm>
#include <string>

#include "attn/core/error.hpp"

namespace attn::dist {

std::string_view sharding_name(Sharding sharding) {
  return sharding == Sharding::kZigZag ? "zig-zag" : "contiguous";
}

SequenceShards::SequenceShards(int64_t length, int ranks, Sharding sharding)
    : length_(length), ranks_(ranks), sharding_(sharding) {
  if (length < 0) {
    throw ValueError("SequenceShards: expected a length >= 0, got " + std::to_string(length));
  }
  if (ranks < 1) {
    throw ValueError("SequenceShards: expected at least one rank, got " + std::to_string(ranks));
  }
  const int64_t count = sharding == Sharding::kZigZag ? 2 * int64_t{ranks} : ranks;
  std::vector<SequenceChunk> all(static_cast<size_t>(count));
  int64_t start = 0;
  for (int64_t c = 0; c < count; ++c) {
    const int64_t size = length / count + (c < length % count ? 1 : 0);
    all[static_cast<size_t>(c)] = {start, size};
    start += size;
  }
  chunks_.resize(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    auto& mine = chunks_[static_cast<size_t>(r)];
    mine.push_back(all[static_cast<size_t>(r)]);
    if (sharding == Sharding::kZigZag) mine.push_back(all[static_cast<size_t>(count - 1 - r)]);
  }
}

std::span<const SequenceChunk> SequenceShards::chunks(int rank) const {
  return chunks_.at(static_cast<size_t>(rank));
}

int64_t SequenceShards::local_length(int rank) const {
  int64_t total = 0;
  for (const SequenceChunk& chunk : chunks(rank)) total += chunk.length;
  return total;
}

int64_t SequenceShards::max_local_length() const {
  int64_t largest = 0;
  for (int r = 0; r < ranks_; ++r) largest = std::max(largest, local_length(r));
  return largest;
}

}  // namespace attn::dist
