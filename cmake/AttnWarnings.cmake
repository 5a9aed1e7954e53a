# attn_set_warnings(target): the project's warning policy (everything useful, as errors) for its
# own targets only, so consumers of the installed package are not affected.
function(attn_set_warnings target)
  # -Wrestrict is off: GCC 12 reports false overlaps inside std::string's operator+ at -O2
  # (GCC bug 105329).
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion
                                           -Wno-sign-conversion -Wno-restrict -Werror)
  if(ATTN_SANITIZE)
    # GCC 12's flow-based warnings misfire on the sanitizers' instrumentation (inside std::regex and
    # std::vector, say); the Release build keeps them as errors.
    target_compile_options(${target} PRIVATE -Wno-maybe-uninitialized -Wno-stringop-overflow)
  endif()
endfunction()
