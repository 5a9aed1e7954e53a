#!/usr/bin/env bash
# Builds ggml's CPU backend (llama.cpp's, vendored in llama-cpp-python 0.3.36's sdist from PyPI) as
# static libraries with portable x86-64-v4 flags, and bench/ggml/ggml_decode_bench.cpp against them.
#
#   bash scripts/build-ggml.sh        # → build/ggml/ggml_decode_bench (prints the path)
#
# Everything lands under build/ (git-ignored): build/ggml-download (the sdist), build/ggml-src (its
# ggml directory only), build/ggml (the CMake build of bench/ggml/CMakeLists.txt: ggml and the
# benchmark), out of the main project's CMake so that CI and scripts/test.sh never need ggml.
# Re-running skips the finished steps. The flags are the AVX-512 level that AMD Zen 4/5 and Intel
# Xeons since Skylake-SP share (F, CD, VL, DQ, BW, with AVX2/FMA/F16C/BMI2), nothing from
# -march=native, so the binary built here runs on the device tool's Xeon as is. Overrides: PYTHON
# (the Python whose pip downloads), SDIST (a local copy of llama_cpp_python-0.3.36.tar.gz;
# /tmp/llamapy/ is tried too), CXX (first run only).
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.3.36
sdist_name=llama_cpp_python-$version.tar.gz
# PyPI's file for 0.3.36 (checked by pip download on 2026-11-24): a pinned hash keeps the build
# reproducible, and a different file fails here instead of producing other figures silently.
sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
python=${PYTHON:-python3}
cxx=${CXX:-g++}
download=build/ggml-download
src=build/ggml-src
out=build/ggml
bench=$out/ggml_decode_bench

# 1. The sdist: a given or already downloaded copy if its hash matches, else pip download.
sdist=
for candidate in ${SDIST:-} "$download/$sdist_name" "/tmp/llamapy/$sdist_name"; do
  if [[ -f $candidate ]] && echo "$sdist_sha256  $candidate" | sha256sum --check --status; then
    sdist=$candidate
    break
  fi
done
if [[ -z $sdist ]]; then
  "$python" -m pip --version >/dev/null 2>&1 ||
    { echo "$python has no pip: apt-get install python3-pip, or set PYTHON or SDIST" >&2; exit 1; }
  echo "downloading llama-cpp-python==$version's sdist from PyPI into $download"
  mkdir -p "$download"
  "$python" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$download"
  sdist=$download/$sdist_name
  echo "$sdist_sha256  $sdist" | sha256sum --check --quiet ||
    { echo "$sdist: sha256 differs from the pinned $sdist_sha256" >&2; exit 1; }
fi

# 2. ggml's sources only (the sdist is 76 MB, mostly the rest of llama.cpp), with
# llama.cpp's commit from the submodule's HEAD that the sdist carries: ggml's CMake would otherwise
# ask git, which here answers with attn's own commit (build/ is inside attn's work tree).
if [[ ! -f $src/.extracted ]] || [[ $(cat "$src/.extracted") != "$sdist_sha256" ]]; then
  echo "extracting ggml from $sdist into $src"
  rm -rf "$src" && mkdir -p "$src"
  top=llama_cpp_python-$version
  tar -xzf "$sdist" -C "$src" --strip-components=4 "$top/vendor/llama.cpp/ggml"
  tar -xzf "$sdist" -C "$src" --strip-components=3 "$top/vendor/llama.cpp/LICENSE"
  tar -xzOf "$sdist" "$top/.git/modules/vendor/llama.cpp/HEAD" | tr -d '[:space:]' \
    >"$src/LLAMA_CPP_COMMIT"
  echo "$sdist_sha256" >"$src/.extracted"
fi
commit=$(cat "$src/LLAMA_CPP_COMMIT")

# 3. ggml's CPU backend, static, and the benchmark, through bench/ggml/CMakeLists.txt (which adds
# ggml as a subdirectory: the sdist lacks ggml.pc.in and tests/, which a standalone configure of
# ggml wants). GGML_NATIVE=OFF with each extension named: AVX-512 VNNI/BF16/VBMI, AVX-VNNI and AMX
# stay off (x86-64-v4 only; F32/F16 flash attention uses none of them). OpenMP on, as in
# llama.cpp's release builds. The benchmark links ggml, libstdc++ and libgcc statically, so that
# only glibc and libgomp (which attn needs too) come from the machine it runs on.
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)  # else CMake's default, Unix Makefiles
if [[ ! -f $out/CMakeCache.txt ]]; then
  cmake -S bench/ggml -B "$out" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DGGML_SOURCE_DIR="$PWD/$src" -DCMAKE_CXX_COMPILER="$cxx" \
    -DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF \
    -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_AVX512=ON -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
    -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    -DGGML_OPENMP=ON -DGGML_BLAS=OFF -DGGML_LLAMAFILE=OFF -DGGML_CPU_KLEIDIAI=OFF \
    -DGGML_CUDA=OFF -DGGML_HIP=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_SYCL=OFF \
    -DGGML_OPENCL=OFF -DGGML_RPC=OFF -DGGML_WEBGPU=OFF \
    -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DGGML_CCACHE=OFF \
    -DGIT_EXE=OFF -DGGML_BUILD_COMMIT="${commit:0:8}" \
    -DATTN_GGML_SOURCE="llama-cpp-python $version sdist, llama.cpp $commit"
fi
cmake --build "$out" -j2 --target ggml_decode_bench
echo "ggml (llama.cpp $commit, from llama-cpp-python $version) built in $out"
echo "benchmark: $bench"
