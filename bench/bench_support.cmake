# attn_bench_support: the benchmark case tables (attention, decoding), the FMA-peak, sgemm and
# stream-read ceilings and the memory probe, shared by bench/ (Google Benchmark) and the CLI's
# `attn bench`. Included from both folders; the first inclusion defines the target.
include_guard(GLOBAL)

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
set_target_properties(attn_bench_support PROPERTIES POSITION_INDEPENDENT_CODE ON)
attn_set_warnings(attn_bench_support)
