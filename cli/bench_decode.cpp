// `attn bench`'s decode cases: one cache per (batch, length, dtype), timed for each number of new
// queries and thread count, after an eviction read so that every pass reads the cache from memory,
// against the stream-read bandwidth measured in the same run.
#include "bench_decode.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "attn/core/error.hpp"
#include "number_options.hpp"

namespace attn::cli {
namespace {

// --decode-query-dtype's names (DecodeBenchOptions::query_dtype) and what each asks of the cases.
const std::map<std::string, bench::DecodeQueryDType>& query_dtypes() {
  static const std::map<std::string, bench::DecodeQueryDType> names{
      {"cache", bench::DecodeQueryDType::kCache},
      {"float32", bench::DecodeQueryDType::kFloat32},
      {"bfloat16", bench::DecodeQueryDType::kBFloat16},
      {"float16", bench::DecodeQueryDType::kFloat16}};
  return names;
}

}  // namespace

void add_decode_options(CLI::App& command, DecodeBenchOptions& options) {
  command
      .add_option("--decode-batch", options.batches, "Decode cases: batch sizes B, comma-separated")
      ->delimiter(',')
      ->transform(number_check(options.batches, from_to(1, 4096)));
  command
      .add_option("--decode-queries", options.queries,
                  "Decode cases: new queries n per sequence, comma-separated; n x (heads / "
                  "kv-heads) at most " +
                      std::to_string(kMaxDecodeRows) + ", the decode kernel's rows (n <= " +
                      std::to_string(kMaxDecodeRows / (options.heads / options.kv_heads)) +
                      " with the default " + std::to_string(options.heads) + " heads over " +
                      std::to_string(options.kv_heads) + ")")
      ->delimiter(',')
      // The range of one query head per key/value head; check_decode_options checks the rest,
      // which depends on --decode-heads and --decode-kv-heads.
      ->transform(number_check(options.queries, from_to(1, kMaxDecodeRows)));
  command
      .add_option("--decode-lengths", options.lengths,
                  "Decode cases: cached tokens m per sequence, comma-separated (e.g. "
                  "4096,32768,131072)")
      ->delimiter(',')
      ->transform(number_check(options.lengths, from_to(1, 1 << 24)));
  command.add_option("--decode-heads", options.heads, "Decode cases: query heads H_q")
      ->transform(number_check(options.heads, from_to(1, 4096)));
  command.add_option("--decode-kv-heads", options.kv_heads, "Decode cases: key/value heads H_kv")
      ->transform(number_check(options.kv_heads, from_to(1, 4096)));
  command.add_option("--decode-head-dim", options.head_dim, "Decode cases: head size d")
      ->transform(number_check(options.head_dim, from_to(1, 4096)));
  command
      .add_option("--decode-repeats", options.repeats,
                  "Decode cases: timed passes per row (the median is kept)")
      ->transform(number_check(options.repeats, from_to(1, 10000)));
  command.add_flag("--decode-warm", options.warm,
                   "Decode cases: no eviction read between passes, so a cache that fits the L3 is "
                   "read from it");
  command
      .add_option("--decode-query-dtype", options.query_dtype,
                  "Decode cases: the queries' dtype (a model's own): cache (a bf16 or fp16 "
                  "cache's, float32 beside float32 and int8 caches), float32, bfloat16 or "
                  "float16 (half queries go in as a half model passes them, the output in "
                  "their dtype)")
      ->check(CLI::IsMember(query_dtypes()))
      ->default_str("cache");
  command
      .add_option("--stream-mib", options.stream_mib,
                  "Buffer of the stream-read ceiling in MiB (default: 1024, or 4x the L3 with "
                  "--quick, within a quarter of the available memory)")
      ->transform(number_check(options.stream_mib, from_to(1, 1048576)))
      // Absent means the size the help names, which the 0 it is held as is not a value to type.
      ->default_str("");
}

void check_decode_options(DecodeBenchOptions& options, bool quick) {
  if (quick) {
    const DecodeBenchOptions defaults;
    if (options.batches == defaults.batches) options.batches = {1};
    if (options.queries == defaults.queries) options.queries = {1};
    if (options.lengths == defaults.lengths) options.lengths = {4096};
    options.repeats = std::min(options.repeats, 3);
  }
  if (options.heads % options.kv_heads != 0) {
    throw ValueError("--decode-kv-heads: expected a divisor of --decode-heads (" +
                     std::to_string(options.heads) + "), got " + std::to_string(options.kv_heads));
  }
  const int64_t group = options.heads / options.kv_heads;
  for (const int64_t n : options.queries) {
    // More rows than the decode kernel takes go to the prefill kernel: not a decode step.
    if (n * group > kMaxDecodeRows) {
      throw ValueError("--decode-queries: expected at most " +
                       std::to_string(kMaxDecodeRows / group) +
                       " new queries with --decode-heads " + std::to_string(options.heads) +
                       " over --decode-kv-heads " + std::to_string(options.kv_heads) + " (n x " +
                       std::to_string(group) + " query heads per key/value head must be at most " +
                       std::to_string(kMaxDecodeRows) +
                       ", the decode kernel's rows; more are a prefill, not a decode step), got " +
                       std::to_string(n));
    }
  }
}

namespace {

// Why `entry`'s cache of `batch` x `length` tokens is not filled, or nothing when it runs: the
// cache is the case's memory, and sizes that would crowd the machine are skipped.
std::optional<std::string> decode_skip_reason(const DecodeBenchOptions& options,
                                              const bench::DecodeCase& entry, int64_t batch,
                                              int64_t length, int64_t available) {
  const double scales = entry.dtype == CacheDType::kInt8 ? 8.0 : 0.0;
  const double cache_bytes =
      static_cast<double>(batch * length * options.kv_heads) *
      (2.0 * static_cast<double>(options.head_dim * cache_dtype_size(entry.dtype)) + scales);
  if (available > 0 && cache_bytes > 0.5 * static_cast<double>(available)) {
    return "its cache (" + std::to_string(static_cast<int64_t>(cache_bytes / (1 << 20))) +
           " MiB) exceeds half the available memory";
  }
  return std::nullopt;
}

std::string decode_case_text(const bench::DecodeCase& entry, int64_t batch, int64_t length) {
  return entry.name + " B=" + std::to_string(batch) + " m=" + std::to_string(length);
}

}  // namespace

std::vector<std::string> decode_skip_reasons(const DecodeBenchOptions& options,
                                             const std::vector<const bench::DecodeCase*>& cases) {
  std::vector<std::string> reasons;
  const int64_t available = bench::available_memory();
  for (const int64_t batch : options.batches) {
    for (const int64_t length : options.lengths) {
      for (const bench::DecodeCase* entry : cases) {
        const std::optional<std::string> reason =
            decode_skip_reason(options, *entry, batch, length, available);
        if (!reason) return {};
        reasons.push_back(decode_case_text(*entry, batch, length) + ": " + *reason);
      }
    }
  }
  return reasons;
}

DecodeReport run_decode_benchmarks(const DecodeBenchOptions& options,
                                   const std::vector<const bench::DecodeCase*>& cases,
                                   const std::vector<int>& threads, bool quick, bool no_ceilings,
                                   uint64_t seed,
                                   const std::function<void(const std::string&)>& progress) {
  DecodeReport report;
  if (cases.empty()) return report;
  if (!no_ceilings) {
    const int64_t bytes = options.stream_mib > 0
                              ? static_cast<int64_t>(options.stream_mib * 1024 * 1024)
                              : bench::default_stream_read_bytes(quick);
    for (const int count : threads) {
      progress("stream read, " + std::to_string(count) + " thread(s)");
      try {
        report.stream_read[count] = bench::measure_stream_read(count, bytes, quick ? 2 : 5);
      } catch (const ValueError& error) {
        // A buffer the system refuses: say which option sized it.
        if (options.stream_mib <= 0) throw;
        throw ValueError(std::string("--stream-mib: ") + error.what() +
                         " (choose a smaller buffer, or leave the option out)");
      }
    }
  }
  const bench::DecodeQueryDType query_dtype = query_dtypes().at(options.query_dtype);
  std::optional<bench::CacheEvictor> evictor;
  if (!options.warm) {
    evictor.emplace();
    report.evicted_bytes = evictor->bytes();
  }
  const int64_t available = bench::available_memory();
  for (const int64_t batch : options.batches) {
    for (const int64_t length : options.lengths) {
      for (const bench::DecodeCase* entry : cases) {
        const bench::DecodeShape shape{batch, options.heads, options.kv_heads, options.head_dim,
                                       length};
        const std::string where = decode_case_text(*entry, batch, length);
        if (const std::optional<std::string> reason =
                decode_skip_reason(options, *entry, batch, length, available)) {
          progress("skipping " + where + ": " + *reason);
          continue;
        }
        progress("filling the cache of " + where);
        std::shared_ptr<const KVCache> cache = bench::make_decode_cache(shape, entry->dtype, seed);
        for (const int64_t n : options.queries) {
          const bench::PreparedDecode prepared =
              bench::prepare_decode(cache, options.heads, n, seed, query_dtype);
          for (const int count : threads) {
            progress(where + " n=" + std::to_string(n) + ", " + std::to_string(count) +
                     " thread(s)");
            omp_set_num_threads(count);
            std::vector<double> seconds;
            for (int pass = -1; pass < options.repeats; ++pass) {  // pass −1: the warm-up
              if (evictor) evictor->evict();
              const auto start = std::chrono::steady_clock::now();
              prepared.run();
              const double elapsed =
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
              if (pass >= 0) seconds.push_back(elapsed);
            }
            std::sort(seconds.begin(), seconds.end());
            const double time = seconds[seconds.size() / 2];
            DecodeRow row;
            row.name = entry->name;
            row.dtype = entry->dtype_name;
            row.batch = batch;
            row.queries = n;
            row.length = length;
            row.threads = count;
            row.milliseconds = time * 1e3;
            row.bytes_read = prepared.bytes_read;
            row.gbytes_per_second = prepared.bytes_read / time * 1e-9;
            report.rows.push_back(row);
          }
        }
      }
    }
  }
  // Ratios, once every row is in.
  for (DecodeRow& row : report.rows) {
    const auto stream = report.stream_read.find(row.threads);
    if (stream != report.stream_read.end() && stream->second.gbytes_per_second > 0) {
      row.read_fraction = row.gbytes_per_second / stream->second.gbytes_per_second;
    }
    for (const DecodeRow& base : report.rows) {
      if (base.dtype == "float32" && base.batch == row.batch && base.queries == row.queries &&
          base.length == row.length && base.threads == row.threads) {
        row.speedup_vs_float32 = base.milliseconds / row.milliseconds;
      }
    }
  }
  return report;
}

void print_decode_table(const DecodeReport& report, const DecodeBenchOptions& options,
                        std::ostream& out) {
  if (report.rows.empty() && report.stream_read.empty()) return;
  out << "\ndecode: attn::scaled_dot_product_attention(query, cache), causal, " << options.heads
      << " query heads over " << options.kv_heads << " key/value heads of " << options.head_dim
      << "; queries: "
      << (options.query_dtype == "cache" ? std::string("a bf16 or fp16 cache's dtype")
                                         : options.query_dtype)
      << "; median of " << options.repeats << " passes after one warm-up, each after ";
  if (report.evicted_bytes > 0) {
    out << "an eviction read of " << report.evicted_bytes / (1 << 20)
        << " MiB (2x the L3: the cache is read from memory, as in a model whose other layers "
           "pass through the L3 between two steps)\n";
  } else {
    out << "no eviction read (--decode-warm: a cache that fits the L3 is read from it)\n";
  }
  for (const auto& [threads, stream] : report.stream_read) {
    char line[200];
    std::snprintf(line, sizeof line,
                  "stream read, %d thread(s): %.1f GB/s (%lld MiB buffer, Highway %s, best of "
                  "the repeats)\n",
                  threads, stream.gbytes_per_second,
                  static_cast<long long>(stream.bytes / (1 << 20)), stream.simd_target.c_str());
    out << line;
  }
  if (report.rows.empty()) return;
  out << "GB/s: bytes of keys and values read (sum of lengths x bytes per token, int8 scales "
         "included) / time; % read: of the stream read at the same thread count; vs fp32: "
         "decode-float32's time / this time\n\n";
  char line[200];
  std::snprintf(line, sizeof line, "%-16s %5s %3s %8s %7s %10s %8s %7s %8s\n", "case", "B", "n",
                "m", "threads", "ms", "GB/s", "% read", "vs fp32");
  out << line;
  for (const DecodeRow& row : report.rows) {
    char read[16] = "-", speedup[16] = "-";
    if (row.read_fraction) std::snprintf(read, sizeof read, "%.1f", *row.read_fraction * 100);
    if (row.speedup_vs_float32)
      std::snprintf(speedup, sizeof speedup, "%.2fx", *row.speedup_vs_float32);
    std::snprintf(line, sizeof line, "%-16s %5lld %3lld %8lld %7d %10.3f %8.1f %7s %8s\n",
                  row.name.c_str(), static_cast<long long>(row.batch),
                  static_cast<long long>(row.queries), static_cast<long long>(row.length),
                  row.threads, row.milliseconds, row.gbytes_per_second, read, speedup);
    out << line;
  }
}

nlohmann::json decode_json(const DecodeReport& report, const DecodeBenchOptions& options) {
  using nlohmann::json;
  const auto optional_json = [](const auto& value) { return value ? json(*value) : json(nullptr); };
  json document;
  document["decode_shape"] = {{"heads", options.heads},
                              {"kv_heads", options.kv_heads},
                              {"head_dim", options.head_dim},
                              {"repeats", options.repeats},
                              {"query_dtype", options.query_dtype},
                              {"evicted_bytes", report.evicted_bytes}};
  document["stream_read"] = json::array();
  for (const auto& [threads, stream] : report.stream_read) {
    document["stream_read"].push_back({{"threads", threads},
                                       {"gbytes_per_second", stream.gbytes_per_second},
                                       {"bytes", stream.bytes},
                                       {"simd_target", stream.simd_target}});
  }
  document["decode"] = json::array();
  for (const DecodeRow& row : report.rows) {
    document["decode"].push_back({{"case", row.name},
                                  {"dtype", row.dtype},
                                  {"batch", row.batch},
                                  {"n", row.queries},
                                  {"m", row.length},
                                  {"threads", row.threads},
                                  {"ms", row.milliseconds},
                                  {"bytes_read", row.bytes_read},
                                  {"gbytes_per_second", row.gbytes_per_second},
                                  {"read_fraction", optional_json(row.read_fraction)},
                                  {"speedup_vs_float32", optional_json(row.speedup_vs_float32)}});
  }
  return document;
}

}  // namespace attn::cli
