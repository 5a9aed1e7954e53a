// The decode part of `attn bench` (issue 13): its options, the runs of bench/decode_cases.hpp
// over batch sizes, new queries, cached lengths, cache dtypes and thread counts against the
// stream-read ceiling measured in the same run, and their table and JSON.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "bench/ceilings.hpp"
#include "bench/decode_cases.hpp"

namespace attn::cli {

struct DecodeBenchOptions {
  std::vector<int64_t> batches{1, 8};
  std::vector<int64_t> queries{1, 4};
  std::vector<int64_t> lengths{4096, 32768};
  int64_t heads = 32;
  int64_t kv_heads = 8;
  int64_t head_dim = 128;
  int repeats = 15;
  double stream_mib = 0.0;            // 0: bench::default_stream_read_bytes
  bool warm = false;                  // true: no eviction read between passes
  std::string query_dtype = "cache";  // bench::DecodeQueryDType's names (--decode-query-dtype)
};

// --decode-batch, --decode-queries, --decode-lengths, --decode-heads, --decode-kv-heads,
// --decode-head-dim, --decode-repeats, --decode-warm, --decode-query-dtype, --stream-mib.
void add_decode_options(CLI::App& command, DecodeBenchOptions& options);
// --quick's smaller defaults (B = 1, n = 1, m = 4096, 3 passes) where the flags were not given, and
// the checks CLI11's validators cannot make (heads divisible by key/value heads).
void check_decode_options(DecodeBenchOptions& options, bool quick);

struct DecodeRow {
  std::string name;
  std::string dtype;
  int64_t batch = 0, queries = 0, length = 0;
  int threads = 1;
  double milliseconds = 0.0;
  double bytes_read = 0.0;
  double gbytes_per_second = 0.0;
  std::optional<double> read_fraction;       // of the stream read at the same thread count
  std::optional<double> speedup_vs_float32;  // decode-float32's time / this time
};

struct DecodeReport {
  std::map<int, bench::StreamRead> stream_read;  // by thread count
  int64_t evicted_bytes = 0;                     // read between passes (0: --decode-warm)
  std::vector<DecodeRow> rows;
};

// Why each chosen case is skipped at each batch size and length (its cache past half the
// available memory), or nothing when at least one of them runs.
std::vector<std::string> decode_skip_reasons(const DecodeBenchOptions& options,
                                             const std::vector<const bench::DecodeCase*>& cases);
DecodeReport run_decode_benchmarks(const DecodeBenchOptions& options,
                                   const std::vector<const bench::DecodeCase*>& cases,
                                   const std::vector<int>& threads, bool quick, bool no_ceilings,
                                   uint64_t seed,
                                   const std::function<void(const std::string&)>& progress);
void print_decode_table(const DecodeReport& report, const DecodeBenchOptions& options,
                        std::ostream& out);
// {"decode_shape": …, "stream_read": […], "decode": […]}, merged into attn bench's document.
nlohmann::json decode_json(const DecodeReport& report, const DecodeBenchOptions& options);

}  // namespace attn::cli
