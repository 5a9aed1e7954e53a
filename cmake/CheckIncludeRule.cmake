# Checks docs/architecture.md's dependency rule: each part's headers and sources include only the
# parts listed for it below. Run as `cmake -DATTN_ROOT=<repository> -P cmake/CheckIncludeRule.cmake`
# (CTest's architecture_include_rule test does); prints every offending line and fails if any.
#
# Linking catches a call into a part a library does not link (the shared parts link with
# --no-undefined), but not an include of a header-only piece, since every part shares include/:
# hence this check of the #include lines themselves.
cmake_minimum_required(VERSION 3.25)
if(NOT ATTN_ROOT)
  message(FATAL_ERROR "CheckIncludeRule.cmake: pass -DATTN_ROOT=<repository root>")
endif()

# part -> the parts its files may include (itself included). core, kernels and functional are one
# library (attn::kernels) but keep their own order: core < kernels < functional.
set(allowed_core core)
set(allowed_kernels core kernels)
set(allowed_functional core kernels functional)
set(allowed_nn core kernels functional nn)
set(allowed_io core io)
set(allowed_viz core viz)
set(allowed_train core kernels functional nn io train)
set(allowed_seq2seq core kernels functional nn io train seq2seq)
set(allowed_dist core kernels functional dist)
set(parts core kernels functional nn io viz train seq2seq dist)

set(violations "")
foreach(part IN LISTS parts)
  file(GLOB_RECURSE files LIST_DIRECTORIES false
       ${ATTN_ROOT}/include/attn/${part}/* ${ATTN_ROOT}/src/${part}/*)
  list(FILTER files INCLUDE REGEX "\\.(hpp|h|cpp)$")
  foreach(file IN LISTS files)
    file(STRINGS ${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]")
    foreach(line IN LISTS lines)
      # "attn/<part>/x.hpp" (public), "<part>/x.hpp" or "../<part>/x.hpp" (src/ internal headers);
      # a bare "x.hpp" is the file's own folder.
      if(line MATCHES "#[ \t]*include[ \t]*[\"<](attn/|\\.\\./)?([a-z0-9_]+)/")
        set(target_part ${CMAKE_MATCH_2})
        if(target_part IN_LIST parts AND NOT target_part IN_LIST allowed_${part})
          file(RELATIVE_PATH relative ${ATTN_ROOT} ${file})
          string(STRIP "${line}" line)
          list(JOIN allowed_${part} ", " allowed_text)
          list(APPEND violations "${relative}: ${line} (${part} may include ${allowed_text})")
        endif()
      endif()
    endforeach()
  endforeach()
endforeach()

if(violations)
  list(JOIN violations "\n  " text)
  message(FATAL_ERROR "include rule broken (docs/architecture.md):\n  ${text}")
endif()
message(STATUS "include rule holds for: ${parts}")
