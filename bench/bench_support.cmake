# attn_bench_support: the benchmark case tables (attention, decoding), the FMA-peak, sgemm and
# stream-read ceilings and the memory probe, shared by bench/ (Google Benchmark) and the CLI's
# `attn bench`. Included from both folders; the first inclusion defines the target. OpenBLAS is
# linked here only, not into libattn.
include_guard(GLOBAL)

find_package(PkgConfig REQUIRED)
pkg_check_modules(OPENBLAS IMPORTED_TARGET openblas)

add_library(attn_bench_support STATIC
  ${CMAKE_CURRENT_LIST_DIR}/attention_cases.cpp
  ${CMAKE_CURRENT_LIST_DIR}/decode_cases.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fma_peak.cpp
  ${CMAKE_CURRENT_LIST_DIR}/memory_probe.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sgemm_ceiling.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stream_read.cpp
)
# Sources include "bench/...": the project root is on the path (also for Highway's re-inclusion
# of fma_peak.cpp and stream_read.cpp through HWY_TARGET_INCLUDE).
target_include_directories(attn_bench_support PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(attn_bench_support PUBLIC attn::attn OpenMP::OpenMP_CXX PRIVATE hwy::hwy)
if(OPENBLAS_FOUND)
  target_link_libraries(attn_bench_support PRIVATE PkgConfig::OPENBLAS)
  target_compile_definitions(attn_bench_support PRIVATE ATTN_BENCH_HAVE_CBLAS=1)
else()
  message(STATUS "attn: OpenBLAS not found (pkg-config openblas): benchmarks run without the sgemm ceiling")
  target_compile_definitions(attn_bench_support PRIVATE ATTN_BENCH_HAVE_CBLAS=0)
endif()
set_target_properties(attn_bench_support PROPERTIES POSITION_INDEPENDENT_CODE ON)
attn_set_warnings(attn_bench_support)
