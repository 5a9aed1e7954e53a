// Google Benchmark targets for attn's attention kernels: every case of attention_cases() at
// B = 4, 8 heads, d = 64 over n = m ∈ {128 … 4096} with 1 and 2 threads, and the two ceilings (the
// FMA peak and oneDNN sgemm on the attention shapes), each with a GFLOP/s counter; and small calls
// of the functional API (small_call/...), where a call's fixed costs rather than its arithmetic
// decide: B = 1, 8 heads of 64, a decode step (1 query, 16 keys) and n = m ∈ {8, 16, 32}.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attn/core/random.hpp"
#include "attn/core/tensor.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"
#include "bench/attention_cases.hpp"
#include "bench/ceilings.hpp"

namespace {

using attn::bench::AttentionCase;
using attn::bench::AttentionShape;

const std::vector<int64_t> kLengths = {128, 512, 1024, 2048, 4096};
const std::vector<int> kThreads = {1, 2};
// The plain path holds B·H·n·m floats of scores and runs serial loops: 2048 is already 512 MiB
// and tens of seconds per pass.
constexpr double kPlainMaxBytes = 600.0 * 1024 * 1024;

AttentionShape shape_for(int64_t length) {
  AttentionShape shape;
  shape.queries = length;
  shape.keys = length;
  return shape;
}

void gflops_counter(benchmark::State& state, double flops) {
  // Iteration-invariant rate: flops per pass times passes per second, in units of 1e9; Google
  // Benchmark appends the "/s".
  state.counters["Gflop"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void run_case(benchmark::State& state, const AttentionCase& entry, int64_t length, int threads) {
  omp_set_num_threads(threads);
  const attn::bench::PreparedCase prepared = entry.prepare(shape_for(length), 1);
  for (auto _ : state) prepared.run();
  gflops_counter(state, prepared.useful_flops);
}

void run_fma_peak(benchmark::State& state, int threads) {
  double gflops = 0.0;
  for (auto _ : state) gflops = attn::bench::measure_fma_peak(threads, 0.2, 1).gflops;
  state.counters["GFLOP/s"] = gflops;
}

void run_sgemm(benchmark::State& state, int64_t length, int threads) {
  const AttentionShape shape = shape_for(length);
  double gflops = 0.0;
  for (auto _ : state) {
    gflops = attn::bench::measure_sgemm(shape.batch * shape.heads, length, length, shape.head_dim,
                                        threads, 1)
                 .gflops;
  }
  state.counters["GFLOP/s"] = gflops;
}

void register_benchmarks() {
  for (const int threads : kThreads) {
    benchmark::RegisterBenchmark(("fma_peak/threads:" + std::to_string(threads)).c_str(),
                                 run_fma_peak, threads)
        ->Iterations(3)
        ->Unit(benchmark::kMillisecond);
  }
  for (const int64_t length : kLengths) {
    for (const int threads : kThreads) {
      const std::string suffix =
          "/n:" + std::to_string(length) + "/threads:" + std::to_string(threads);
      benchmark::RegisterBenchmark(("sgemm" + suffix).c_str(), run_sgemm, length, threads)
          ->Iterations(3)
          ->Unit(benchmark::kMillisecond);
      for (const AttentionCase& entry : attn::bench::attention_cases()) {
        if (!entry.uses_threads && threads != 1) continue;
        if (entry.working_set_bytes(shape_for(length)) > kPlainMaxBytes) continue;
        if (entry.max_length > 0 && length > entry.max_length) continue;
        benchmark::RegisterBenchmark((entry.name + suffix).c_str(), run_case, entry, length,
                                     threads)
            ->UseRealTime()
            ->MeasureProcessCPUTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

// One call of attn::scaled_dot_product_attention on (1, 8, n, 64) queries against m keys: the
// forward into a preallocated output, or forward and backward (gradients into new storage).
void run_small_call(benchmark::State& state, int64_t n, int64_t m, bool backward, int threads) {
  omp_set_num_threads(threads);
  attn::Rng rng(1);
  const auto random = [&rng](const attn::Shape& shape) {
    attn::Tensor tensor(shape);
    for (int64_t i = 0; i < tensor.numel(); ++i) tensor.data()[i] = rng.uniform(-1.0F, 1.0F);
    return tensor;
  };
  const attn::Tensor q = random({1, 8, n, 64}), k = random({1, 8, m, 64}),
                     v = random({1, 8, m, 64}), grad = random({1, 8, n, 64});
  attn::Tensor out({1, 8, n, 64});
  std::vector<float> log_sum_exp(static_cast<size_t>(attn::log_sum_exp_size(q.shape())));
  const attn::AttentionOptions options;
  for (auto _ : state) {
    attn::scaled_dot_product_attention(q, k, v, options, out, log_sum_exp);
    if (backward) {
      benchmark::DoNotOptimize(
          attn::scaled_dot_product_attention_backward(q, k, v, out, grad, log_sum_exp, options));
    }
  }
}

void register_small_call_benchmarks() {
  const int64_t sizes[][2] = {{1, 16}, {8, 8}, {16, 16}, {32, 32}};
  for (const auto& [n, m] : sizes) {
    for (const bool backward : {false, true}) {
      for (const int threads : kThreads) {
        const std::string name = std::string("small_call/") +
                                 (backward ? "forward_backward" : "forward") +
                                 "/n:" + std::to_string(n) + "/m:" + std::to_string(m) +
                                 "/threads:" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(), run_small_call, n, m, backward, threads)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_benchmarks();
  register_small_call_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
