#!/usr/bin/env bash
# Installs the Debian packages attn builds and tests with, skipping apt when all are present.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  ccache                               # compiler cache: the Python module's build reuses the Release build's objects
  libcairo2-dev fonts-dejavu-core      # heatmaps (PNG, SVG, PDF) and the font they use
  libcli11-dev                         # the command line
  nlohmann-json3-dev                   # safetensors headers
  libhwy-dev                           # SIMD kernels with run-time dispatch (Highway)
  libdnnl-dev ocl-icd-opencl-dev       # GEMMs of the projections (oneDNN; its CMake package needs OpenCL)
  libopenblas-dev                      # benchmarks only: OpenBLAS beside oneDNN (bench/gemm_libraries.cpp)
  libgtest-dev                         # tests
  libbenchmark-dev                     # benchmarks (bench/): Google Benchmark
  clang libclang-rt-dev libomp-dev llvm # fuzz targets (fuzz/): libFuzzer, ASan, OpenMP, symbolizer
  libopenmpi-dev openmpi-bin           # attn::dist: ring attention over MPI (mpirun, its tests)
)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
[[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
