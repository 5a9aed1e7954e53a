#!/usr/bin/env bash
# Bundles a Release build for a server that has none of attn's dependencies installed (the device
# tool's Xeon: Ubuntu's glibc, libstdc++, a compiler and Python, but no Highway, oneDNN, MPI or Cairo).
#
#   bash scripts/pack-server.sh      # → build/server and build/server.tar.xz (carry the archive)
#
# build/server/bin holds the CLI, the kernel tests, ggml_decode_bench (when scripts/build-ggml.sh
# made it), attn_tile_benchmarks, attn_amx_overlap_benchmarks and attn_bf16_dot_benchmarks (when
# the build has them);
# build/server/lib every shared library they load except the C and C++ runtimes, which the
# server's own (newer) ones serve; build/server/lib-fallback the OpenMP runtime, used only where the
# server has none (bench/server_side_by_side.sh decides). bench/server_side_by_side.sh finds the
# bundle when ATTN=build/server/bin/attn, and its module phase builds attn's Python module there
# against it (bench/server/CMakeLists.txt). Overrides: BUILD (default build/release), OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

build=${BUILD:-build/release}
bundle=${OUT_DIR:-build/server}
binaries=("$build/cli/attn" "$build/tests/kernels/kernels_test")
for binary in "${binaries[@]}"; do
  test -x "$binary" || { echo "no $binary: build $build with -DATTN_BUILD_TESTS=ON first" >&2; exit 1; }
done
[[ -x build/ggml/ggml_decode_bench ]] && binaries+=(build/ggml/ggml_decode_bench)
[[ -x $build/bench/attn_tile_benchmarks ]] && binaries+=("$build/bench/attn_tile_benchmarks")
[[ -x $build/bench/attn_amx_overlap_benchmarks ]] &&
  binaries+=("$build/bench/attn_amx_overlap_benchmarks")
[[ -x $build/bench/attn_bf16_dot_benchmarks ]] && binaries+=("$build/bench/attn_bf16_dot_benchmarks")

rm -rf "$bundle" && mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/lib-fallback"
cp "${binaries[@]}" "$bundle/bin/"

# Every library the binaries load, by the name the loader asks for (the soname), resolved as here.
ldd "${binaries[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r soname path; do
    case $soname in
      # The C runtime and the compiler's runtimes: the server's are at least as new, and an older
      # copy first on the library path would break the server's Python and PyTorch.
      libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | libresolv.so.* | \
        ld-linux*.so.* | libstdc++.so.* | libgcc_s.so.*) ;;
      libgomp.so.*) cp -L "$path" "$bundle/lib-fallback/$soname" ;;
      *) cp -L "$path" "$bundle/lib/$soname" ;;
    esac
  done
strip --strip-unneeded "$bundle"/lib/libattn_*.so.* "$bundle"/bin/* 2>/dev/null || true
# The archive travels (12 MB against 53 MB unpacked, oneDNN being most of it); the script unpacks it.
tar -cf - -C "$(dirname "$bundle")" "$(basename "$bundle")" | xz -T0 -6 >"$bundle.tar.xz.part"
mv "$bundle.tar.xz.part" "$bundle.tar.xz"
echo "$bundle: $(du -sh "$bundle" | cut -f1) ($(ls "$bundle/lib" | wc -l) libraries); $bundle.tar.xz: $(du -sh "$bundle.tar.xz" | cut -f1)"
