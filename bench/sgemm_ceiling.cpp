// sgemm (attn::gemm, oneDNN) on the shapes of the book's dot-product attention, the ceiling a
// materialising implementation built on a tuned GEMM could reach.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/random.hpp"
#include "attn/kernels/gemm.hpp"
#include "bench/ceilings.hpp"

namespace attn::bench {

std::string sgemm_library() {
  return gemm_library();
}

SgemmCeiling measure_sgemm(int64_t batch_heads, int64_t queries, int64_t keys, int64_t head_dim,
                           int threads, int repeats) {
  if (batch_heads <= 0 || queries <= 0 || keys <= 0 || head_dim <= 0) {
    throw ValueError("sgemm ceiling: expected positive sizes, got batch·heads " +
                     std::to_string(batch_heads) + ", n " + std::to_string(queries) + ", m " +
                     std::to_string(keys) + ", d " + std::to_string(head_dim));
  }
  omp_set_num_threads(threads);  // attn::gemm runs on the OpenMP runtime's threads
  const auto n = static_cast<size_t>(queries), m = static_cast<size_t>(keys),
             d = static_cast<size_t>(head_dim);
  // One head's operands, reused for every head: the ceiling is the arithmetic, and the book's
  // code streams the score matrix through memory once per head in the same way.
  Rng rng(7);
  std::vector<float> q(n * d), k(m * d), v(m * d), out(n * d), scores(n * m);
  for (float& x : q) x = rng.uniform(-1.0F, 1.0F);
  for (float& x : k) x = rng.uniform(-1.0F, 1.0F);
  for (float& x : v) x = rng.uniform(-1.0F, 1.0F);
  const auto run_once = [&] {
    for (int64_t head = 0; head < batch_heads; ++head) {
      // S = Q Kᵀ: (n×d)·(d×m).
      gemm(Transpose::kNo, Transpose::kYes, queries, keys, head_dim, 1.0F, q.data(), head_dim,
           k.data(), head_dim, 0.0F, scores.data(), keys);
      // O = S V: (n×m)·(m×d).
      gemm(Transpose::kNo, Transpose::kNo, queries, head_dim, keys, 1.0F, scores.data(), keys,
           v.data(), head_dim, 0.0F, out.data(), head_dim);
    }
  };
  run_once();  // warm-up: first touch of the buffers, OpenMP's threads, oneDNN's kernels
  std::vector<double> times;
  for (int repeat = 0; repeat < std::max(repeats, 1); ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    run_once();
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  const double flops = 4.0 * static_cast<double>(batch_heads) * static_cast<double>(n) *
                       static_cast<double>(m) * static_cast<double>(d);
  return {median * 1e3, flops / median * 1e-9};
}

}  // namespace attn::bench
