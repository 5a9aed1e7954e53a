// `attn bench`: runs the cases of bench/attention_cases.hpp over the chosen sizes and thread
// counts, measures the two ceilings (FMA peak, sgemm) in the same run and prints one table, or
// JSON for scripts (bench/compare_pytorch.py); then the decode cases (bench_decode.hpp) against
// the stream-read ceiling.
#include "bench_command.hpp"

#include <omp.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/threads.hpp"
#include "attn/io/files.hpp"
#include "attn/kernels/amx.hpp"
#include "attn/kernels/bfloat16_dot.hpp"
#include "attn/kernels/bfloat16_probabilities.hpp"
#include "attn/kernels/simd_target.hpp"
#include "bench/attention_cases.hpp"
#include "bench/ceilings.hpp"
#include "bench/decode_cases.hpp"
#include "bench/memory_probe.hpp"
#include "bench_decode.hpp"
#include "command_support.hpp"
#include "file_name_check.hpp"
#include "number_options.hpp"

namespace attn::cli {

namespace {

using bench::AttentionCase;
using bench::AttentionShape;

const char* const kMemoryMethod =
    "peak extra memory = growth of the process's peak resident set (VmHWM, reset through "
    "/proc/self/clear_refs) during one pass, beyond its inputs and outputs";

// 1, 2, 4, … below the machine's logical CPUs, then their number: the thread-scaling table's
// columns (1, 2 on a 2-core machine; 1, 2, 4, 8, 16 on a 16-core one).
std::vector<int> default_thread_counts() {
  const int cpus = std::max(1, omp_get_num_procs());
  std::vector<int> counts;
  for (int count = 1; count < cpus; count *= 2) counts.push_back(count);
  counts.push_back(cpus);
  return counts;
}

struct BenchOptions {
  std::vector<int64_t> sizes{128, 512, 1024, 2048, 4096};
  std::vector<int> threads = default_thread_counts();
  std::vector<std::string> cases;  // empty: all
  int repeats = 5;
  bool quick = false;
  bool no_ceilings = false;  // skip the FMA peak and sgemm (profiling the cases alone)
  bool json = false;
  std::string json_out;  // also write the JSON here, with the table on stdout
  int64_t batch = 4;
  int64_t heads = 8;
  int64_t head_dim = 64;
  int64_t window = 256;  // fused-window's left size
  double max_working_set_mib = 600.0;
  uint64_t seed = 1;
  std::string simd_target = "best";  // cap on the kernels' Highway target (limit_simd_target)
  DecodeBenchOptions decode;
};

struct CaseRow {
  std::string name;
  std::string workload;
  std::string path;
  int64_t length = 0;
  int threads = 1;
  double milliseconds = 0.0;  // the median pass
  double gflops = 0.0;
  // The fastest pass, and its rate against the highest FMA rate of the run (best_fma_rate): on a
  // host whose other guests take the core's cycles at times, the two undisturbed figures side by
  // side, where the median pass against the peak (best of its repeats) mixes two estimators.
  double best_milliseconds = 0.0;
  double best_gflops = 0.0;
  std::optional<int64_t> extra_bytes;
  std::optional<double> peak_fraction;
  std::optional<double> best_peak_fraction;
  std::optional<double> sgemm_ratio;
  std::optional<double> speedup_vs_plain;  // plain time / this time, same workload
  // The functional cases but fused-sdpa: fused-sdpa's time / this time, same n and threads.
  std::optional<double> speedup_vs_sdpa;
  // The half-precision cases (fused-bf16, fused-fp16, fused-bf16-causal, the -backward ones): the
  // fp32 case's time (fused, fused-causal, fused-backward) / this time.
  std::optional<double> speedup_vs_fp32;
  // Time at the run's first thread count (1 by default) / this time, same case and n.
  std::optional<double> thread_scaling;
  std::vector<int64_t> padding_lengths;
};

struct SgemmRow {
  int64_t length = 0;
  int threads = 1;
  bench::SgemmCeiling ceiling;
};

struct BenchReport {
  std::string cpu;
  std::string simd_target;  // the kernels' Highway target in this run
  std::string amx;          // amx_status(): whether the bf16 forward runs on AMX tiles
  std::string bf16_dot;     // bf16_dot_status(): vdpbf16ps, or bf16 widened to fp32
  std::string bf16_p;       // bf16_probabilities_status() where bf16 has bf16 products, else ""
  std::string load_before;
  std::string load_after;
  std::string sgemm_library;
  std::map<int, bench::FmaPeak> peaks;  // by thread count
  // By thread count: the lowest rate of a short FMA probe run after each case. On a virtual
  // machine whose cores' other hardware threads belong to other guests, the cores' speed drifts
  // for seconds at a time (a third lower on a Zen 3 guest): the peak, best of its repeats, cannot
  // show it; this shows the FMA units' part of it.
  std::map<int, double> probe_lowest;
  // By thread count: the highest FMA rate of the run, the peak's best repeat or a probe's.
  std::map<int, double> best_fma_rate;
  std::vector<SgemmRow> sgemm;
  std::vector<CaseRow> rows;
  DecodeReport decode;
};

std::string load_average() {
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) != 3) return "unknown";
  char text[64];
  std::snprintf(text, sizeof text, "%.2f %.2f %.2f", load[0], load[1], load[2]);
  return text;
}

std::string cpu_description() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model = "unknown CPU", family, model_number;
  const auto value = [](const std::string& text) {
    const auto colon = text.find(':');
    return colon == std::string::npos ? std::string() : text.substr(colon + 2);
  };
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) model = value(line);
    if (line.rfind("cpu family", 0) == 0) family = value(line);
    if (line.rfind("model\t", 0) == 0) model_number = value(line);
    if (line.empty() && !family.empty()) break;  // the first processor is enough
  }
  return model + " (family " + family + ", model " + model_number + "), " +
         std::to_string(omp_get_num_procs()) + " logical CPUs";
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

void check_options(BenchOptions& options) {
  if (options.quick) {
    // A smoke run: the tooling end to end in seconds, not figures to quote.
    if (options.sizes == BenchOptions{}.sizes) options.sizes = {128, 512};
    options.repeats = std::min(options.repeats, 2);
  }
  for (const int64_t size : options.sizes) {
    if (size < 1 || size > (int64_t{1} << 20)) {
      throw ValueError("--sizes: expected lengths in [1, 1048576], got " + std::to_string(size));
    }
  }
  for (const int threads : options.threads) {
    check_thread_count(threads, "--threads");
  }
  if (options.cases.empty()) {
    for (const AttentionCase& entry : bench::attention_cases()) options.cases.push_back(entry.name);
    for (const bench::DecodeCase& entry : bench::decode_cases())
      options.cases.push_back(entry.name);
  }
  for (const std::string& name : options.cases) {
    if (bench::find_decode_case(name) != nullptr) continue;
    const auto& known = bench::attention_cases();
    if (std::none_of(known.begin(), known.end(),
                     [&](const AttentionCase& entry) { return entry.name == name; })) {
      std::string names;
      for (const AttentionCase& entry : known) names += (names.empty() ? "" : ", ") + entry.name;
      for (const bench::DecodeCase& entry : bench::decode_cases()) names += ", " + entry.name;
      throw ValueError("--cases: expected one of " + names + ", got '" + name + "'");
    }
  }
  check_decode_options(options.decode, options.quick);
}

// The selected cases of each table, in --cases order.
std::vector<std::string> selected_attention_cases(const BenchOptions& options) {
  std::vector<std::string> names;
  for (const std::string& name : options.cases) {
    if (bench::find_decode_case(name) == nullptr) names.push_back(name);
  }
  return names;
}
std::vector<const bench::DecodeCase*> selected_decode_cases(const BenchOptions& options) {
  std::vector<const bench::DecodeCase*> cases;
  for (const std::string& name : options.cases) {
    if (const bench::DecodeCase* entry = bench::find_decode_case(name)) cases.push_back(entry);
  }
  return cases;
}

AttentionShape shape_for(const BenchOptions& options, int64_t length) {
  return {options.batch, options.heads, length, length, options.head_dim, options.window};
}

CaseRow measure_case(const AttentionCase& entry, const AttentionShape& shape, int threads,
                     const BenchOptions& options) {
  omp_set_num_threads(threads);
  const bench::PreparedCase prepared = entry.prepare(shape, options.seed);
  CaseRow row;
  row.name = entry.name;
  row.workload = entry.workload;
  row.path = entry.path;
  row.length = shape.queries;
  row.threads = threads;
  row.padding_lengths = prepared.padding_lengths;
  // The first pass is the warm-up and the memory probe at once.
  row.extra_bytes = bench::peak_extra_bytes(prepared.run);
  std::vector<double> seconds;
  for (int repeat = 0; repeat < options.repeats; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    prepared.run();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const double time = median(seconds);
  row.milliseconds = time * 1e3;
  row.gflops = prepared.useful_flops / time * 1e-9;
  const double best = *std::min_element(seconds.begin(), seconds.end());
  row.best_milliseconds = best * 1e3;
  row.best_gflops = prepared.useful_flops / best * 1e-9;
  return row;
}

// Why `entry` does not run at n = `length`, or nothing when it runs.
std::optional<std::string> attention_skip_reason(const AttentionCase& entry,
                                                 const BenchOptions& options, int64_t length) {
  if (entry.max_length > 0 && length > entry.max_length) {
    return "it runs up to n=" + std::to_string(entry.max_length);
  }
  if (entry.working_set_bytes(shape_for(options, length)) >
      options.max_working_set_mib * 1024 * 1024) {
    return "its working set exceeds --max-working-set-mib";
  }
  return std::nullopt;
}

// Options under which every case chosen is skipped used to measure the ceilings, print a table's
// header without a row and exit 0: an error before anything is measured instead, with the reasons.
void require_a_case_that_runs(const BenchOptions& options) {
  std::vector<std::string> reasons;
  for (const std::string& name : selected_attention_cases(options)) {
    for (const int64_t length : options.sizes) {
      const std::optional<std::string> reason =
          attention_skip_reason(bench::find_attention_case(name), options, length);
      if (!reason) return;
      reasons.push_back(name + " n=" + std::to_string(length) + ": " + *reason);
    }
  }
  const auto decode_cases = selected_decode_cases(options);
  const std::vector<std::string> decode_reasons = decode_skip_reasons(options.decode, decode_cases);
  if (decode_reasons.empty() && !decode_cases.empty()) return;
  reasons.insert(reasons.end(), decode_reasons.begin(), decode_reasons.end());
  std::string listed;
  constexpr size_t kListed = 3;
  for (size_t index = 0; index < std::min(reasons.size(), kListed); ++index) {
    listed += (index == 0 ? "" : "; ") + reasons[index];
  }
  if (reasons.size() > kListed) {
    listed += "; and " + std::to_string(reasons.size() - kListed) + " more";
  }
  throw ValueError("--cases: expected at least one case that runs with these options, got none: " +
                   listed);
}

BenchReport run_benchmarks(const BenchOptions& options) {
  require_a_case_that_runs(options);
  BenchReport report;
  report.cpu = cpu_description();
  report.simd_target = simd_target();
  report.amx = amx_status();
  // Below AVX-512 (--simd-target) the kernels have no bf16 products, whatever the CPU offers.
  report.bf16_dot = report.simd_target.starts_with("AVX3")
                        ? bf16_dot_status()
                        : "bf16 widened to fp32 (no bf16 products below AVX-512)";
  // (Only where bf16 has bf16 products: widened, P is fp32's.)
  if (report.simd_target.starts_with("AVX3") && (amx_tiles_in_use() || bf16_dot_in_use()))
    report.bf16_p = bf16_probabilities_status();
  report.load_before = load_average();
  report.sgemm_library = bench::sgemm_library();
  const bool verbose = !options.json;
  const auto progress = [&](const std::string& what) {
    std::cerr << "attn bench: " << what << "\n";
  };
  const std::vector<std::string> attention_cases = selected_attention_cases(options);
  for (const int threads : options.threads) {
    // The FMA peak and sgemm are the attention cases' ceilings, the stream read the decode ones'.
    if (options.no_ceilings || attention_cases.empty()) break;
    progress("FMA peak, " + std::to_string(threads) + " thread(s)");
    report.peaks[threads] =
        bench::measure_fma_peak(threads, options.quick ? 0.05 : 0.3, options.quick ? 2 : 5);
    report.best_fma_rate[threads] = report.peaks[threads].gflops;
  }
  for (const int64_t length : options.sizes) {
    if (attention_cases.empty()) break;
    const AttentionShape shape = shape_for(options, length);
    if (!options.no_ceilings) {
      for (const int threads : options.threads) {
        progress("sgemm n=" + std::to_string(length) + ", " + std::to_string(threads) +
                 " thread(s)");
        report.sgemm.push_back({length, threads,
                                bench::measure_sgemm(shape.batch * shape.heads, length, length,
                                                     shape.head_dim, threads, options.repeats)});
      }
    }
    for (const std::string& name : attention_cases) {
      const AttentionCase& entry = bench::find_attention_case(name);
      if (const std::optional<std::string> reason = attention_skip_reason(entry, options, length)) {
        if (verbose) progress("skipping " + name + " n=" + std::to_string(length) + ": " + *reason);
        continue;
      }
      for (const int threads : options.threads) {
        // A serial path runs once, with 1 thread; other thread counts compare against that.
        if (!entry.uses_threads && threads != options.threads.front()) continue;
        const int used = entry.uses_threads ? threads : 1;
        progress(name + " n=" + std::to_string(length) + ", " + std::to_string(used) +
                 " thread(s)");
        report.rows.push_back(measure_case(entry, shape, used, options));
        if (report.peaks.contains(used)) {
          const double probe = bench::measure_fma_peak(used, options.quick ? 0.01 : 0.05, 1).gflops;
          const auto [lowest, first] = report.probe_lowest.try_emplace(used, probe);
          if (!first) lowest->second = std::min(lowest->second, probe);
          double& highest = report.best_fma_rate[used];
          highest = std::max(highest, probe);
        }
      }
    }
  }
  // Ratios, now that every figure of the run is in.
  for (CaseRow& row : report.rows) {
    const auto peak = report.peaks.find(row.threads);
    if (peak != report.peaks.end() && peak->second.gflops > 0) {
      row.peak_fraction = row.gflops / peak->second.gflops;
      row.best_peak_fraction = row.best_gflops / report.best_fma_rate.at(row.threads);
    }
    for (const SgemmRow& sgemm : report.sgemm) {
      if (sgemm.length == row.length && sgemm.threads == row.threads) {
        row.sgemm_ratio = row.gflops / sgemm.ceiling.gflops;
      }
    }
    for (const CaseRow& base : report.rows) {
      if (base.path == "plain" && base.workload == row.workload && base.length == row.length &&
          (base.threads == row.threads || base.threads == 1)) {
        row.speedup_vs_plain = base.milliseconds / row.milliseconds;
      }
      if (base.workload == "sdpa" && row.workload.rfind("sdpa-", 0) == 0 &&
          base.length == row.length && base.threads == row.threads) {
        row.speedup_vs_sdpa = base.milliseconds / row.milliseconds;
      }
      // The half-precision cases against their fp32 case: fused, fused-causal or fused-backward.
      const bool half_forward = row.workload == "dot-bf16" || row.workload == "dot-fp16";
      const bool half_causal = row.workload == "dot-causal-bf16";
      const bool half_backward =
          row.workload == "dot-backward-bf16" || row.workload == "dot-backward-fp16";
      const char* fp32_case = half_backward ? "fused-backward"
                              : half_causal ? "fused-causal"
                                            : "fused";
      if (base.name == fp32_case && (half_forward || half_causal || half_backward) &&
          base.length == row.length && base.threads == row.threads) {
        row.speedup_vs_fp32 = base.milliseconds / row.milliseconds;
      }
      if (base.name == row.name && base.length == row.length &&
          base.threads == options.threads.front() && row.threads != base.threads) {
        row.thread_scaling = base.milliseconds / row.milliseconds;
      }
    }
  }
  report.decode =
      run_decode_benchmarks(options.decode, selected_decode_cases(options), options.threads,
                            options.quick, options.no_ceilings, options.seed, progress);
  report.load_after = load_average();
  return report;
}

std::string fixed(double value, int decimals) {
  std::ostringstream text;
  text.setf(std::ios::fixed);
  text.precision(decimals);
  text << value;
  return text.str();
}

std::string mebibytes(const std::optional<int64_t>& bytes) {
  if (!bytes) return "n/a";
  return fixed(static_cast<double>(*bytes) / (1024.0 * 1024.0), 1) + " MiB";
}

// Each threaded case's time at the first thread count / its time at each of the others, one row
// per case and n: how far the kernels scale on this machine (ideal: the thread ratio).
void print_thread_scaling(const BenchReport& report, const BenchOptions& options) {
  if (options.threads.size() < 2) return;
  std::ostringstream header;
  header << "\nthread scaling: time at " << options.threads.front()
         << " thread(s) / time at T threads\n"
         << std::left << std::setw(20) << "case" << std::right << std::setw(7) << "n";
  for (size_t t = 1; t < options.threads.size(); ++t)
    header << std::setw(9) << ("T=" + std::to_string(options.threads[t]));
  // One line per (case, n) in the run's order, with the case's scaling per thread count.
  std::vector<std::pair<const CaseRow*, std::map<int, double>>> lines;
  for (const CaseRow& row : report.rows) {
    if (!row.thread_scaling) continue;
    auto line = std::find_if(lines.begin(), lines.end(), [&](const auto& entry) {
      return entry.first->name == row.name && entry.first->length == row.length;
    });
    if (line == lines.end()) line = lines.insert(lines.end(), {&row, {}});
    line->second[row.threads] = *row.thread_scaling;
  }
  if (lines.empty()) return;
  std::cout << header.str() << "\n";
  for (const auto& [first, scaling] : lines) {
    std::cout << std::left << std::setw(20) << first->name << std::right << std::setw(7)
              << first->length;
    for (size_t t = 1; t < options.threads.size(); ++t) {
      const auto cell = scaling.find(options.threads[t]);
      std::cout << std::setw(9) << (cell == scaling.end() ? "-" : fixed(cell->second, 2) + "x");
    }
    std::cout << "\n";
  }
}

void print_table(const BenchReport& report, const BenchOptions& options) {
  if (report.rows.empty() && report.peaks.empty()) {  // decode cases alone
    std::cout << "attn bench: decode cases\n"
              << "machine: " << report.cpu << "\n"
              << "load average (1, 5, 15 min): " << report.load_before << " before, "
              << report.load_after << " after\n";
    print_decode_table(report.decode, options.decode, std::cout);
    return;
  }
  std::cout << "attn bench: B=" << options.batch << ", heads=" << options.heads
            << ", d=" << options.head_dim << ", n=m (additive: B batch elements of size d, h=d, "
            << "no heads; fused-window: keys i-" << options.window << "..i; fused-gqa: "
            << "heads/4 key/value heads); median and best of " << options.repeats
            << " passes after one warm-up\n"
            << "machine: " << report.cpu << "; kernels on Highway target " << report.simd_target
            << "; " << report.amx << "; " << report.bf16_dot
            << (report.bf16_p.empty() ? "" : "; " + report.bf16_p) << "\n"
            << "load average (1, 5, 15 min): " << report.load_before << " before, "
            << report.load_after << " after\n";
  for (const auto& [threads, peak] : report.peaks) {
    std::cout << "FMA peak, " << threads << " thread(s): " << fixed(peak.gflops, 1)
              << " GFLOP/s (Highway " << peak.simd_target << ", " << peak.accumulators
              << " chains x " << peak.lanes << " lanes per thread, best of the repeats)\n";
    const auto probe = report.probe_lowest.find(threads);
    if (probe == report.probe_lowest.end() || peak.gflops <= 0) continue;
    const double fraction = probe->second / peak.gflops;
    std::cout << "  FMA probe after each case, " << threads << " thread(s): lowest "
              << fixed(probe->second, 1) << " GFLOP/s, " << fixed(100 * fraction, 0)
              << "% of the peak (the FMA units' share only: other work in the shared caches "
                 "does not show here)"
              << (fraction < 0.9 ? ": the cores ran slower at times during this run (other work "
                                   "on them, or on their sibling hardware threads): single figures "
                                   "may read low; compare rows of one run, or run again"
                                 : "")
              << "\n";
  }
  std::cout << "sgemm: " << report.sgemm_library << "\n";
  std::cout
      << kMemoryMethod << "\n"
      << "GFLOP/s count, per visible (query, key) pair of every batch element and head, "
         "4*d for dot-product forward, 8*d for its backward (dV, dP, dQ, dK), 3*h+2*d for "
         "additive forward (tanh not counted), 6*h+4*d for its backward; fused-mha adds its "
         "projections, 8*B*n*(H*d)^2: masked work is not counted (a window or mask counts "
         "only the pairs it lets through)\n"
      << "% peak: of the FMA peak at the same thread count; best ms, best %: the fastest "
         "pass, against the highest FMA rate of the run (the peak's best repeat or a "
         "probe's), where other work on the host slows some passes; x sgemm: rate / the sgemm rate "
         "on the attention shapes (n x d)(d x m) + (n x m)(m x d); vs plain: plain time / "
         "this time (the plain path is serial and is measured with 1 thread)\n\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-20s %6s %7s %10s %9s %7s %10s %7s %8s %9s %12s\n", "case",
                "n", "threads", "ms", "GFLOP/s", "% peak", "best ms", "best %", "x sgemm",
                "vs plain", "extra memory");
  std::cout << line;
  const auto optional_text = [](const std::optional<double>& value, double scale, int decimals,
                                const std::string& suffix) {
    return value ? fixed(*value * scale, decimals) + suffix : std::string("-");
  };
  for (const int64_t length : options.sizes) {
    for (const SgemmRow& sgemm : report.sgemm) {
      if (sgemm.length != length) continue;
      const auto peak = report.peaks.find(sgemm.threads);
      const std::optional<double> fraction =
          peak == report.peaks.end()
              ? std::nullopt
              : std::optional<double>(sgemm.ceiling.gflops / peak->second.gflops);
      std::snprintf(line, sizeof line, "%-20s %6lld %7d %10.2f %9.1f %7s %10s %7s %8s %9s %12s\n",
                    "sgemm", static_cast<long long>(length), sgemm.threads,
                    sgemm.ceiling.milliseconds, sgemm.ceiling.gflops,
                    optional_text(fraction, 100, 1, "").c_str(), "-", "-", "1.00", "-", "-");
      std::cout << line;
    }
    for (const CaseRow& row : report.rows) {
      if (row.length != length) continue;
      std::snprintf(line, sizeof line, "%-20s %6lld %7d %10.2f %9.1f %7s %10.2f %7s %8s %9s %12s\n",
                    row.name.c_str(), static_cast<long long>(row.length), row.threads,
                    row.milliseconds, row.gflops,
                    optional_text(row.peak_fraction, 100, 1, "").c_str(), row.best_milliseconds,
                    optional_text(row.best_peak_fraction, 100, 1, "").c_str(),
                    optional_text(row.sgemm_ratio, 1, 2, "").c_str(),
                    optional_text(row.speedup_vs_plain, 1, 1, "x").c_str(),
                    mebibytes(row.extra_bytes).c_str());
      std::cout << line;
    }
  }
  bool heading = false;
  for (const CaseRow& row : report.rows) {
    if (!row.speedup_vs_sdpa) continue;
    if (!heading) {
      std::cout << "\nfunctional API: fused-sdpa's time (no mask, same n and threads) / this "
                   "time\n";
      heading = true;
    }
    std::snprintf(line, sizeof line, "%-20s %6lld %7d %9.2fx\n", row.name.c_str(),
                  static_cast<long long>(row.length), row.threads, *row.speedup_vs_sdpa);
    std::cout << line;
  }
  heading = false;
  for (const CaseRow& row : report.rows) {
    if (!row.speedup_vs_fp32) continue;
    if (!heading) {
      std::cout << "\nhalf precision: the fp32 case's time (fused, fused-causal for the causal "
                   "case, fused-backward for the backward cases; same n and threads) / this time\n";
      heading = true;
    }
    std::snprintf(line, sizeof line, "%-20s %6lld %7d %9.2fx\n", row.name.c_str(),
                  static_cast<long long>(row.length), row.threads, *row.speedup_vs_fp32);
    std::cout << line;
  }
  print_thread_scaling(report, options);
  print_decode_table(report.decode, options.decode, std::cout);
}

void write_json(const BenchReport& report, const BenchOptions& options, std::ostream& out) {
  using nlohmann::json;
  const auto optional_json = [](const auto& value) { return value ? json(*value) : json(nullptr); };
  json document;
  document["shape"] = {{"batch", options.batch},
                       {"heads", options.heads},
                       {"head_dim", options.head_dim},
                       {"window", options.window}};
  document["repeats"] = options.repeats;
  document["machine"] = report.cpu;
  document["simd_target"] = report.simd_target;
  document["amx"] = report.amx;
  document["bf16_dot"] = report.bf16_dot;
  document["bf16_probabilities"] = report.bf16_p;
  document["load_average_before"] = report.load_before;
  document["load_average_after"] = report.load_after;
  document["sgemm_library"] = report.sgemm_library;
  document["memory_method"] = kMemoryMethod;
  document["fma_peak"] = json::array();
  for (const auto& [threads, peak] : report.peaks) {
    document["fma_peak"].push_back({{"threads", threads},
                                    {"gflops", peak.gflops},
                                    {"simd_target", peak.simd_target},
                                    {"chains", peak.accumulators},
                                    {"lanes", peak.lanes},
                                    {"lowest_repeat", peak.lowest},
                                    {"best_rate", report.best_fma_rate.at(threads)}});
    const auto probe = report.probe_lowest.find(threads);
    document["fma_peak"].back()["probe_lowest"] =
        probe == report.probe_lowest.end() ? json(nullptr) : json(probe->second);
  }
  document["sgemm"] = json::array();
  for (const SgemmRow& sgemm : report.sgemm) {
    document["sgemm"].push_back({{"n", sgemm.length},
                                 {"threads", sgemm.threads},
                                 {"ms", sgemm.ceiling.milliseconds},
                                 {"gflops", sgemm.ceiling.gflops}});
  }
  document["cases"] = json::array();
  for (const CaseRow& row : report.rows) {
    document["cases"].push_back({{"case", row.name},
                                 {"workload", row.workload},
                                 {"path", row.path},
                                 {"n", row.length},
                                 {"threads", row.threads},
                                 {"ms", row.milliseconds},
                                 {"gflops", row.gflops},
                                 {"peak_fraction", optional_json(row.peak_fraction)},
                                 {"best_ms", row.best_milliseconds},
                                 {"best_gflops", row.best_gflops},
                                 {"best_peak_fraction", optional_json(row.best_peak_fraction)},
                                 {"sgemm_ratio", optional_json(row.sgemm_ratio)},
                                 {"speedup_vs_plain", optional_json(row.speedup_vs_plain)},
                                 {"speedup_vs_sdpa", optional_json(row.speedup_vs_sdpa)},
                                 {"speedup_vs_fp32", optional_json(row.speedup_vs_fp32)},
                                 {"thread_scaling", optional_json(row.thread_scaling)},
                                 {"extra_bytes", optional_json(row.extra_bytes)},
                                 {"padding_lengths", row.padding_lengths}});
  }
  document.update(decode_json(report.decode, options.decode));
  out << document.dump(2) << "\n";
}

void run(BenchOptions options) {
  check_options(options);
  // Checked first, so that a bad path fails before minutes of measuring; written through a
  // temporary file renamed over it, so that a failed write keeps an earlier report whole.
  if (!options.json_out.empty()) check_outputs({{"--json-out", options.json_out}}, {});
  with_context("--simd-target", [&] { limit_simd_target(options.simd_target); });
  const BenchReport report = run_benchmarks(options);
  if (!options.json_out.empty()) {
    std::ostringstream text;
    write_json(report, options, text);
    with_context("--json-out", [&] { write_file(options.json_out, text.str()); });
  }
  if (options.json) {
    write_json(report, options, std::cout);
  } else {
    print_table(report, options);
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command = app.add_subcommand(
      "bench", "Time attn's attention kernels against the FMA peak and oneDNN sgemm");
  std::string case_names;
  for (const AttentionCase& entry : bench::attention_cases()) {
    case_names += (case_names.empty() ? "" : ", ") + entry.name;
  }
  for (const bench::DecodeCase& entry : bench::decode_cases()) case_names += ", " + entry.name;
  command->footer(
      "Dot-product attention at B x heads x n x d (n = m): the fused kernel and the plain path "
      "that materialises the scores, forward without mask, with padded batches (valid lengths "
      "uniform in [1, m], seeded) and causal, and backward without mask; the MultiHeadAttention "
      "layer with its projections (fused-mha); "
      "the functional API attn::scaled_dot_product_attention on (B, H, n, d) views of the same "
      "storage, without mask (fused-sdpa, the base of the others), with a causal sliding window "
      "of --window keys back (fused-window), a bool key-padding mask (B, 1, 1, S) of "
      "fused-padded's lengths (fused-mask-bool), a bool (L, S) causal mask (fused-mask-causal), "
      "a float (L, S) ALiBi-like bias (fused-mask-float) and grouped-query heads, H/4 key/value "
      "heads (fused-gqa); "
      "additive attention "
      "(the AdditiveAttention layer, h = d) forward and backward, fused and on its reference "
      "path (up to n = 1024). Decoding (decode-float32, -float16, -bfloat16, -int8): "
      "attn::scaled_dot_product_attention(query, cache) for n new queries against a KV cache of m "
      "tokens in that dtype, --decode-heads query heads over --decode-kv-heads, at every "
      "--decode-batch x --decode-queries x --decode-lengths, in GB/s of keys and values read. "
      "The FMA peak and the sgemm ceiling (attention cases) and the stream-read bandwidth "
      "(decode cases) are measured in the same run. Timings are only meaningful on an "
      "otherwise idle machine (see the load average in the output). Cases: " +
      case_names + ".");
  command->add_option("--sizes", options->sizes, "Sequence lengths n = m, comma-separated")
      ->delimiter(',')
      ->transform(number_check(options->sizes));
  command
      ->add_option("--threads", options->threads,
                   "Thread counts, comma-separated (default: 1, 2, 4, ... up to the machine's "
                   "logical CPUs); with several, a thread-scaling table follows")
      ->delimiter(',')
      ->transform(number_check(options->threads))
      ->capture_default_str();
  command->add_option("--cases", options->cases, "Cases to run, comma-separated")
      ->delimiter(',')
      ->default_str("all");
  command
      ->add_option("--repeats", options->repeats,
                   "Timed passes per case (the median and the fastest are reported)")
      ->transform(number_check(options->repeats, from_to(1, 1000)));
  command->add_flag("--quick", options->quick,
                    "Smoke run: sizes 128,512 unless --sizes is given, at most 2 repeats; decode "
                    "cases at B=1, n=1, m=4096 unless given, at most 3 passes");
  command->add_flag("--no-ceilings", options->no_ceilings,
                    "Skip the FMA peak and sgemm measurements (% peak and x sgemm stay empty): "
                    "the cases alone, e.g. under perf record");
  command->add_flag("--json", options->json, "Print JSON instead of the table");
  command->add_option("--json-out", options->json_out, "Also write the JSON to this file")
      ->type_name("FILE")
      ->check(file_name_check());
  command->add_option("--batch", options->batch, "Batch size B")
      ->transform(number_check(options->batch, from_to(1, 4096)));
  command->add_option("--heads", options->heads, "Heads H")
      ->transform(number_check(options->heads, from_to(1, 4096)));
  command->add_option("--head-dim", options->head_dim, "Head size d")
      ->transform(number_check(options->head_dim, from_to(1, 4096)));
  command
      ->add_option("--window", options->window,
                   "fused-window: query i sees keys i - N ... i (causal sliding window)")
      ->type_name("N")
      ->transform(number_check(options->window, from_to(0, 1 << 20)));
  command
      ->add_option("--max-working-set-mib", options->max_working_set_mib,
                   "Skip a case at sizes where it would materialise more than this (the plain "
                   "path's B*H*n*m scores)")
      ->transform(number_check(options->max_working_set_mib, positive()));
  command->add_option("--seed", options->seed, "Seed of the inputs and valid lengths")
      ->transform(number_check(options->seed));
  command
      ->add_option("--simd-target", options->simd_target,
                   "Run the kernels, the FMA peak and oneDNN no better than this instruction set "
                   "(Highway's names: AVX3, AVX2, SSE4, ...; best = this CPU's), to measure here "
                   "what an older CPU runs")
      ->capture_default_str();
  add_decode_options(*command, options->decode);
  command->callback([options] { run(*options); });
}

}  // namespace attn::cli
