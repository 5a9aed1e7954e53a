// Overlap of memory regions, for calls whose outputs may share memory with their inputs.
#include "functional/memory_overlap.hpp"

namespace attn::functional_detail {

bool regions_overlap(MemoryRegion a, MemoryRegion b) {
  if (a.begin == nullptr || b.begin == nullptr || a.bytes == 0 || b.bytes == 0) return false;
  const auto first = reinterpret_cast<uintptr_t>(a.begin);
  const auto second = reinterpret_cast<uintptr_t>(b.begin);
  return second >= first ? second - first < a.bytes : first - second < b.bytes;
}

bool writes_over_reads(std::initializer_list<MemoryRegion> written,
                       std::initializer_list<MemoryRegion> read) {
  for (const MemoryRegion& output : written)
    for (const MemoryRegion& input : read)
      if (regions_overlap(output, input)) return true;
  return false;
}

OptionRegions option_regions(const AttentionOptions& options) {
  const AttentionMask& mask = options.attn_mask;
  OptionRegions regions;
  if (mask.kind() == MaskKind::kBool) {
    regions.mask = region_of(mask.bools());
  } else if (mask.holds_halves()) {
    regions.mask = region_of(mask.halves());
  } else if (mask.has_value()) {
    regions.mask = region_of(mask.floats());
  }
  regions.slopes = region_of(options.alibi_slopes.data(), options.alibi_slopes.size());
  regions.sinks = region_of(options.sinks.data(), options.sinks.size());
  return regions;
}

}  // namespace attn::functional_detail
