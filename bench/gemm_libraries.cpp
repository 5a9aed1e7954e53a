// attn_gemm_libraries: sgemm of the GEMM libraries attn could use, side by side in one run on the
// shapes attn runs (projections, attention products, a decode step), against the FMA peak of the
// same run: the measurement behind docs/gemm.md's choice of oneDNN.
//
//   attn_gemm_libraries [--threads 1,2] [--scipy-openblas PATH/libscipy_openblas.so] [--avx2 1]
//
// --avx2 1 caps oneDNN and the FMA-peak loop at AVX2 (dnnl_set_max_cpu_isa, Highway's target
// mask): an AVX2-only CPU's view from an AVX-512 one (OpenBLAS runs its AVX2 kernels here anyway).
// Compared: attn::gemm (oneDNN's sgemm, what attn links), attn::linear_product (a Linear layer's
// product), the system OpenBLAS's cblas_sgemm (Debian's libopenblas-dev), and optionally the
// OpenBLAS that SciPy ships on PyPI (scipy-openblas32, loaded with dlopen: its symbols carry a
// scipy_ prefix). Each library runs alone on its own threads.
#include <cblas.h>
#include <dlfcn.h>
#include <hwy/targets.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attn/core/random.hpp"
#include "attn/kernels/gemm.hpp"
#include "bench/ceilings.hpp"

namespace {

struct GemmShape {
  int64_t rows, cols, depth;
  bool transpose_b;
  const char* what;
};

// B·n = 4 · 1024 rows through a 512 × 512 projection (nn.MultiheadAttention, D = 8 heads · 64), and
// 4 · 256 and 16 rows, 64 rows through a 4096 × 4096 weight, the two products of one head of the
// book's attention at n = 1024, d = 64, a larger projection, and a decode step's projection (8
// sequences through a 4096 × 4096 weight: memory-bound).
const GemmShape kShapes[] = {
    {4096, 512, 512, true, "projection 4096x512 . (512x512)^T"},
    {1024, 512, 512, true, "projection 1024x512 . (512x512)^T"},
    {16, 512, 512, true, "projection 16x512 . (512x512)^T"},
    {64, 4096, 4096, true, "projection 64x4096 . (4096x4096)^T"},
    {1024, 1024, 64, true, "scores 1024x64 . (1024x64)^T"},
    {1024, 64, 1024, false, "output 1024x1024 . 1024x64"},
    {16384, 512, 512, true, "projection 16384x512 . (512x512)^T"},
    {8, 4096, 4096, true, "decode 8x4096 . (4096x4096)^T"},
    // The book's Bahdanau decoder step (B = 64, 10 encoder steps, 256 hidden units): the keys'
    // projection, and the query's (one row per sequence).
    {640, 256, 256, true, "bahdanau keys 640x256 . (256x256)^T"},
    {64, 256, 256, true, "bahdanau query 64x256 . (256x256)^T"},
};

using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                       float, float*, int);
using SetThreads = void (*)(int);

struct Library {
  std::string name;
  std::function<void(int)> set_threads;
  std::function<void(const GemmShape&, const float*, const float*, float*)> run;
};

Library system_openblas() {
  return {"OpenBLAS (system) " + std::string(openblas_get_config()) + " core " +
              openblas_get_corename(),
          [](int threads) { openblas_set_num_threads(threads); },
          [](const GemmShape& s, const float* a, const float* b, float* c) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, s.transpose_b ? CblasTrans : CblasNoTrans,
                        static_cast<int>(s.rows), static_cast<int>(s.cols),
                        static_cast<int>(s.depth), 1.0F, a, static_cast<int>(s.depth), b,
                        static_cast<int>(s.transpose_b ? s.depth : s.cols), 0.0F, c,
                        static_cast<int>(s.cols));
          }};
}

Library onednn() {
  return {"attn::gemm: " + attn::gemm_library(), [](int threads) { omp_set_num_threads(threads); },
          [](const GemmShape& s, const float* a, const float* b, float* c) {
            attn::gemm(attn::Transpose::kNo,
                       s.transpose_b ? attn::Transpose::kYes : attn::Transpose::kNo, s.rows, s.cols,
                       s.depth, 1.0F, a, s.depth, b, s.transpose_b ? s.depth : s.cols, 0.0F, c,
                       s.cols);
          }};
}

// What Linear layers run: attn::linear_product on the x·Wᵀ shapes (oneDNN's matmul from 16 rows
// of a 256 × 256 weight up, sgemm below), attn::gemm on the others.
Library linear() {
  return {"attn::linear_product (x.W^T shapes; attn::gemm on the others)",
          [](int threads) { omp_set_num_threads(threads); },
          [](const GemmShape& s, const float* a, const float* b, float* c) {
            if (s.transpose_b) {
              attn::linear_product(s.rows, s.depth, s.cols, a, b, nullptr, c);
            } else {
              attn::gemm(attn::Transpose::kNo, attn::Transpose::kNo, s.rows, s.cols, s.depth, 1.0F,
                         a, s.depth, b, s.cols, 0.0F, c, s.cols);
            }
          }};
}

std::vector<Library> scipy_openblas(const std::string& path) {
  if (path.empty()) return {};
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::fprintf(stderr, "--scipy-openblas: cannot load %s: %s\n", path.c_str(), dlerror());
    return {};
  }
  const auto sgemm = reinterpret_cast<Sgemm>(dlsym(handle, "scipy_cblas_sgemm"));
  const auto set_threads =
      reinterpret_cast<SetThreads>(dlsym(handle, "scipy_openblas_set_num_threads"));
  const auto config =
      reinterpret_cast<const char* (*)()>(dlsym(handle, "scipy_openblas_get_config"));
  const auto core =
      reinterpret_cast<const char* (*)()>(dlsym(handle, "scipy_openblas_get_corename"));
  if (sgemm == nullptr || set_threads == nullptr || config == nullptr || core == nullptr) {
    std::fprintf(stderr, "--scipy-openblas: %s lacks the scipy_-prefixed OpenBLAS symbols\n",
                 path.c_str());
    return {};
  }
  return {{"OpenBLAS (scipy-openblas32) " + std::string(config()) + " core " + core(), set_threads,
           [sgemm](const GemmShape& s, const float* a, const float* b, float* c) {
             sgemm(CblasRowMajor, CblasNoTrans, s.transpose_b ? CblasTrans : CblasNoTrans,
                   static_cast<int>(s.rows), static_cast<int>(s.cols), static_cast<int>(s.depth),
                   1.0F, a, static_cast<int>(s.depth), b,
                   static_cast<int>(s.transpose_b ? s.depth : s.cols), 0.0F, c,
                   static_cast<int>(s.cols));
           }}};
}

// Median GFLOP/s of 7 timed calls after one warm-up.
double time_gemm(const Library& library, const GemmShape& shape) {
  attn::Rng rng(3);
  std::vector<float> a(static_cast<size_t>(shape.rows * shape.depth)),
      b(static_cast<size_t>(shape.depth * shape.cols)),
      c(static_cast<size_t>(shape.rows * shape.cols));
  for (float& x : a) x = rng.uniform(-1.0F, 1.0F);
  for (float& x : b) x = rng.uniform(-1.0F, 1.0F);
  library.run(shape, a.data(), b.data(), c.data());
  std::vector<double> seconds;
  for (int repeat = 0; repeat < 7; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    library.run(shape, a.data(), b.data(), c.data());
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * static_cast<double>(shape.rows * shape.cols * shape.depth) / seconds[3] * 1e-9;
}

std::vector<int> parse_threads(const std::string& text) {
  std::vector<int> threads;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) threads.push_back(std::stoi(item));
  return threads;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> thread_counts = {1, 2};
  std::string scipy_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string option = argv[i];
    if (option == "--threads") {
      thread_counts = parse_threads(argv[i + 1]);
    } else if (option == "--scipy-openblas") {
      scipy_path = argv[i + 1];
    } else if (option == "--avx2" && std::string(argv[i + 1]) == "1") {
      hwy::SetSupportedTargetsForTest(HWY_AVX2);
      if (dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2) != dnnl_success) {
        std::fprintf(stderr, "--avx2: oneDNN refused the cap (called after its first use?)\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--threads 1,2] [--scipy-openblas PATH] [--avx2 1]\n",
                   argv[0]);
      return 2;
    }
  }
  std::vector<Library> libraries = {onednn(), linear(), system_openblas()};
  for (Library& library : scipy_openblas(scipy_path)) libraries.push_back(std::move(library));
  for (size_t l = 0; l < libraries.size(); ++l)
    std::printf("library %zu: %s\n", l, libraries[l].name.c_str());
  for (const int threads : thread_counts) {
    const attn::bench::FmaPeak peak = attn::bench::measure_fma_peak(threads, 0.3, 5);
    std::printf(
        "\n%d thread(s), FMA peak %.1f GFLOP/s (Highway %s); GFLOP/s (%% of peak) per library\n",
        threads, peak.gflops, peak.simd_target.c_str());
    for (const GemmShape& shape : kShapes) {
      std::printf("%-38s", shape.what);
      for (const Library& library : libraries) {
        // Every library's pool is set to this count; only the one timed runs, after the others'
        // threads have stopped spinning (OpenBLAS's spin for about 2^28 cycles after a call).
        for (const Library& other : libraries) other.set_threads(threads);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        const double gflops = time_gemm(library, shape);
        std::printf("  %7.1f (%3.0f%%)", gflops, 100.0 * gflops / peak.gflops);
      }
      std::printf("\n");
    }
  }
  return 0;
}
