// gemm: a thin, checked wrapper over oneDNN's dnnl_sgemm (row-major, 64-bit sizes, its OpenMP
// threads), a Linear layer's product on oneDNN's matmul primitive, and the library's name and ISA.
#include "attn/kernels/gemm.hpp"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "attn/core/error.hpp"
#include "core/fork_safety.hpp"
#include "kernels/parallel_tasks.hpp"

namespace attn {

namespace {
std::string isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41:
      return "SSE4.1";
    case dnnl_cpu_isa_avx:
      return "AVX";
    case dnnl_cpu_isa_avx2:
      return "AVX2";
    case dnnl_cpu_isa_avx2_vnni:
      return "AVX2-VNNI";
    case dnnl_cpu_isa_avx512_core:
      return "AVX-512";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "AVX-512 VNNI";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "AVX-512 BF16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "AVX-512 AMX";
    default:
      return "ISA code " + std::to_string(static_cast<int>(isa));
  }
}

// One CPU engine for the process (its creation is thread-safe).
const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A matmul primitive for y (rows × out) = x (rows × in) · Wᵀ (+ bias), W stored out × in and read
// through its strides, with its memory descriptors.
struct LinearPrimitive {
  int64_t rows, in, out;
  bool bias_added;
  int threads;  // oneDNN fixes a primitive's thread count when it is created
  dnnl::memory::desc x, weight, bias, y;
  dnnl::matmul product;
};

// The primitive for this shape, from a small per-thread cache: a layer calls the same shapes
// again and again, and building the primitive descriptor took 20-40 µs per call (Zen 4) — as
// long as a whole 1 × 512 × 512 product — even when oneDNN's own cache held the kernel.
const LinearPrimitive& linear_primitive(int64_t rows, int64_t in, int64_t out, bool bias_added) {
  constexpr size_t kCached = 8;
  thread_local std::vector<LinearPrimitive> cache;
  const int threads = omp_get_max_threads();
  core_detail::note_parallel_region(threads);  // oneDNN's OpenMP regions, on this thread
  for (const LinearPrimitive& cached : cache) {
    if (cached.rows == rows && cached.in == in && cached.out == out &&
        cached.bias_added == bias_added && cached.threads == threads)
      return cached;
  }
  using dims = dnnl::memory::dims;
  const auto f32 = dnnl::memory::data_type::f32;
  const dnnl::memory::desc x(dims{rows, in}, f32, dims{in, 1});
  const dnnl::memory::desc weight(dims{in, out}, f32, dims{1, in});
  const dnnl::memory::desc y(dims{rows, out}, f32, dims{out, 1});
  const dnnl::memory::desc bias =
      bias_added ? dnnl::memory::desc(dims{1, out}, f32, dims{out, 1}) : dnnl::memory::desc();
  const dnnl::matmul::primitive_desc description(dnnl::matmul::desc(x, weight, bias, y),
                                                 cpu_engine());
  if (cache.size() == kCached) cache.erase(cache.begin());  // the oldest goes
  cache.push_back(
      {rows, in, out, bias_added, threads, x, weight, bias, y, dnnl::matmul(description)});
  return cache.back();
}

}  // namespace

void gemm(Transpose transpose_a, Transpose transpose_b, int64_t rows, int64_t cols, int64_t depth,
          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc) {
  if (rows == 0 || cols == 0) return;
  if (depth == 0) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j)
        c[r * ldc + j] = beta == 0.0F ? 0.0F : beta * c[r * ldc + j];
    return;
  }
  const dnnl_status_t status = dnnl_sgemm(transpose_a == Transpose::kYes ? 'T' : 'N',
                                          transpose_b == Transpose::kYes ? 'T' : 'N', rows, cols,
                                          depth, alpha, a, lda, b, ldb, beta, c, ldc);
  if (status != dnnl_success) {
    throw ValueError("gemm: oneDNN's sgemm refused rows = " + std::to_string(rows) +
                     ", cols = " + std::to_string(cols) + ", depth = " + std::to_string(depth) +
                     ", lda = " + std::to_string(lda) + ", ldb = " + std::to_string(ldb) +
                     ", ldc = " + std::to_string(ldc) + " (dnnl status " +
                     std::to_string(static_cast<int>(status)) + ")");
  }
}

void linear_product(int64_t rows, int64_t in, int64_t out, const float* x, const float* weight,
                    const float* bias, float* y) {
  if (rows <= 0 || out <= 0) return;
  if (in <= 0) {  // an empty sum: the bias alone
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < out; ++o) y[r * out + o] = bias != nullptr ? bias[o] : 0.0F;
    }
    return;
  }
  // Few rows (a decode step's projections) or a small weight: sgemm onto the bias rows. oneDNN's
  // matmul costs a fixed 20-40 µs per call more there (1 × 512 × 512: 0.05 against 0.018 ms), and
  // gains from 16 rows of a 256 × 256 weight on (Zen 4, docs/gemm.md).
  if (rows < 16 || in * out < 256 * 256) {
    if (bias != nullptr) {  // the product accumulates onto the bias rows, copied in parallel
      for_each_index(rows, rows * out > (int64_t{1} << 16),
                     [&](int64_t r) { std::copy_n(bias, out, y + r * out); });
    }
    gemm(Transpose::kNo, Transpose::kYes, rows, out, in, 1.0F, x, in, weight, in,
         bias != nullptr ? 1.0F : 0.0F, y, out);
    return;
  }
  try {
    const LinearPrimitive& primitive = linear_primitive(rows, in, out, bias != nullptr);
    const dnnl::engine& engine = cpu_engine();
    // oneDNN's handles take non-const pointers; it only reads its inputs.
    std::unordered_map<int, dnnl::memory> arguments = {
        {DNNL_ARG_SRC, dnnl::memory(primitive.x, engine, const_cast<float*>(x))},
        {DNNL_ARG_WEIGHTS, dnnl::memory(primitive.weight, engine, const_cast<float*>(weight))},
        {DNNL_ARG_DST, dnnl::memory(primitive.y, engine, y)}};
    if (bias != nullptr) {
      arguments.emplace(DNNL_ARG_BIAS,
                        dnnl::memory(primitive.bias, engine, const_cast<float*>(bias)));
    }
    dnnl::stream stream(engine);
    primitive.product.execute(stream, arguments);
    stream.wait();
  } catch (const dnnl::error& error) {
    throw ValueError("linear_product: oneDNN's matmul refused rows = " + std::to_string(rows) +
                     ", in = " + std::to_string(in) + ", out = " + std::to_string(out) + " (" +
                     error.what() + ")");
  }
}

std::string gemm_library() {
  const dnnl_version_t* version = dnnl_version();
  return "oneDNN " + std::to_string(version->major) + "." + std::to_string(version->minor) + "." +
         std::to_string(version->patch) + " (" + isa_name(dnnl_get_effective_cpu_isa()) + ")";
}

}  // namespace attn
