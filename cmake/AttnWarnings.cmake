# attn_set_warnings(target): the project's warning policy (everything useful, as errors) for its
# own targets only, so consumers of the installed package are not affected.
function(attn_set_warnings target)
  # -Wrestrict is off: GCC 12 reports false overlaps inside std::string's operator+ at -O2
  # (GCC bug 105329).
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion
                                           -Wno-sign-conversion -Wno-restrict -Werror)
endfunction()
