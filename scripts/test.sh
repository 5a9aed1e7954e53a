#!/usr/bin/env bash
# Fresh machine → every test: installs what is missing, then builds and runs the whole suite three
# ways: a Release build, an AddressSanitizer + UndefinedBehaviorSanitizer build, and a consumer
# project built against the installed package (find_package(attn)); between the first two, the
# Python module is installed with pip into build/venv beside PyTorch and transformers, and its
# pytest suite run there; before the last, the fuzz targets (fuzz/) run for 45 s each.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=2
started=$SECONDS

# The suite needs about 8 GB on this disk (four builds, PyTorch in build/venv) and some hundreds of
# MB under the temporary folder (test files up to 32 MiB each): say so first, not mid-suite.
for folder in . "${TMPDIR:-/tmp}"; do
  free_gb=$(df -Pk "$folder" | awk 'NR == 2 { printf "%d", $4 / 1048576 }')
  echo "test.sh: $free_gb GB free at $folder"
  if ((free_gb < 8)); then
    echo "test.sh: warning: less than 8 GB free at $folder; tests that write files may fail with" \
      "'No space left on device'" >&2
  fi
done

bash scripts/install-deps.sh
# Every build below goes through ccache (unless the caller chose a launcher): the Python module's
# `pip install .` compiles attn's library with the Release build's flags, and finds those objects
# there instead of compiling every kernel for every SIMD target again. ccache keys on the compiler's
# name as well: pip's build names g++, where CMake alone would pick c++ (the same GCC).
export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER-ccache}
export CXX=${CXX:-g++}

echo "== Release build and tests"
stage_started=$SECONDS
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DATTN_BUILD_TESTS=ON
cmake --build build/release -j"$jobs"
ctest --test-dir build/release -j"$jobs" --output-on-failure
echo "test.sh: Release stage took $((SECONDS - stage_started)) s"

echo "== Python module: pip install . and pytest, in a virtual environment with PyTorch and transformers"
python_started=$SECONDS
# The python3 on PATH needs pip, venv and its C headers; Debian's own python3 lacks them until
# installed.
has_headers='import os, sysconfig as s; os.stat(os.path.join(s.get_path("include"), "Python.h"))'
if ! python3 -m pip --version >/dev/null 2>&1 || ! python3 -c "$has_headers" 2>/dev/null ||
  ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-pip python3-dev python3-venv
fi
# The project's own environment under build/ (git-ignored), so that every comparison with PyTorch
# and transformers runs; pip's cache makes later runs fast. Without network (PyTorch cannot be
# installed), the module is tested with the system python3 instead, the PyTorch and transformers
# tests skipped.
venv=build/venv
python=("$venv/bin/python")
pip_flags=(--quiet --disable-pip-version-check)
if ! { [[ -x $venv/bin/python ]] || python3 -m venv "$venv"; } ||
  ! "${python[@]}" -m pip install "${pip_flags[@]}" "torch>=2.5" "transformers>=5" numpy pytest; then
  echo "test.sh: could not install PyTorch and transformers from PyPI into $venv (no network?):" \
    "testing the Python module with the system python3; the PyTorch and transformers tests are skipped"
  python=(python3)
  # A distribution's python3 marked externally managed (PEP 668) refuses pip installs without this.
  managed='import os, sysconfig as s; os.stat(os.path.join(s.get_path("stdlib"), "EXTERNALLY-MANAGED"))'
  if python3 -c "$managed" 2>/dev/null; then
    pip_flags+=(--break-system-packages)
  fi
fi
CMAKE_BUILD_PARALLEL_LEVEL=$jobs PIP_ROOT_USER_ACTION=ignore \
  "${python[@]}" -m pip install "${pip_flags[@]}" --config-settings=build-dir=build/python ./ numpy pytest
"${python[@]}" -m pytest -q -rs tests/python
echo "test.sh: Python stage took $((SECONDS - python_started)) s"

echo "== AddressSanitizer + UndefinedBehaviorSanitizer build and tests"
stage_started=$SECONDS
# The benchmarks are left out: they are timed in the Release build, never run here. Line tables
# only (-g1: the sanitizers' reports name files and lines; full debug information made a test
# file's compile 1.35x longer on Zen 1). The kernels are compiled for the SIMD targets this
# machine runs, once per vector width and code path: SSSE3 is left out (SSE4's width and paths),
# so is AVX3_DL (AVX3's), and AVX3 where the CPU has no AVX-512. The Release stage compiles and
# tests every target.
left_out="HWY_SSSE3|HWY_AVX3_DL"
for flag in avx512f avx512vl avx512dq avx512bw; do
  grep -qw "$flag" /proc/cpuinfo 2>/dev/null || { left_out+="|HWY_AVX3"; break; }
done
cmake -S . -B build/sanitize -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 -DCMAKE_CXX_FLAGS_DEBUG=-g1 \
  -DATTN_SANITIZE=ON -DATTN_BUILD_TESTS=ON -DATTN_BUILD_BENCH=OFF -DATTN_DISABLED_SIMD_TARGETS="$left_out"
cmake --build build/sanitize -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp ctest --test-dir build/sanitize -j"$jobs" --output-on-failure
echo "test.sh: sanitizer stage took $((SECONDS - stage_started)) s"

echo "== Fuzz targets: libFuzzer + ASan + UBSan on each reader of hostile bytes, 45 s each"
# scripts/fuzz.sh fails on any finding; `bash scripts/fuzz.sh --seconds 3600` is the long campaign.
stage_started=$SECONDS
bash scripts/fuzz.sh --seconds 45
echo "test.sh: fuzz stage took $((SECONDS - stage_started)) s"

echo "== Installed package: find_package(attn) from a consumer project"
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install build/release --prefix "$prefix/install" >/dev/null
cmake -S tests/install -B "$prefix/consumer" -DCMAKE_PREFIX_PATH="$prefix/install" -DCMAKE_BUILD_TYPE=Release
cmake --build "$prefix/consumer" -j"$jobs"
ctest --test-dir "$prefix/consumer" --output-on-failure
"$prefix/install/bin/attn" --version

echo "test.sh: all suites passed in $((SECONDS - started)) s"
