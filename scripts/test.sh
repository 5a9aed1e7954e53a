#!/usr/bin/env bash
# Fresh machine → every test: installs what is missing, then builds and runs the whole suite three
# ways: a Release build, an AddressSanitizer + UndefinedBehaviorSanitizer build, and a consumer
# project built against the installed package (find_package(attn)); between the first two, the
# Python module is installed with pip and its pytest suite run.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=2
started=$SECONDS

bash scripts/install-deps.sh

echo "== Release build and tests"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DATTN_BUILD_TESTS=ON
cmake --build build/release -j"$jobs"
ctest --test-dir build/release -j"$jobs" --output-on-failure

echo "== Python module: pip install . and pytest"
# The python3 on PATH needs pip and its C headers; Debian's own python3 lacks both until installed.
has_headers='import os, sysconfig as s; os.stat(os.path.join(s.get_path("include"), "Python.h"))'
if ! python3 -m pip --version >/dev/null 2>&1 || ! python3 -c "$has_headers" 2>/dev/null; then
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-pip python3-dev
fi
pip_flags=(--quiet)
# A distribution's python3 marked externally managed (PEP 668) refuses pip installs without this.
managed='import os, sysconfig as s; os.stat(os.path.join(s.get_path("stdlib"), "EXTERNALLY-MANAGED"))'
if python3 -c "$managed" 2>/dev/null; then
  pip_flags+=(--break-system-packages)
fi
CMAKE_BUILD_PARALLEL_LEVEL=$jobs PIP_ROOT_USER_ACTION=ignore \
  python3 -m pip install "${pip_flags[@]}" --config-settings=build-dir=build/python ./ numpy pytest
python3 -m pytest -q -rs tests/python

echo "== AddressSanitizer + UndefinedBehaviorSanitizer build and tests"
cmake -S . -B build/sanitize -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 -DATTN_SANITIZE=ON -DATTN_BUILD_TESTS=ON
cmake --build build/sanitize -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp ctest --test-dir build/sanitize -j"$jobs" --output-on-failure

echo "== Installed package: find_package(attn) from a consumer project"
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install build/release --prefix "$prefix/install" >/dev/null
cmake -S tests/install -B "$prefix/consumer" -DCMAKE_PREFIX_PATH="$prefix/install" -DCMAKE_BUILD_TYPE=Release
cmake --build "$prefix/consumer" -j"$jobs"
ctest --test-dir "$prefix/consumer" --output-on-failure
"$prefix/install/bin/attn" --version

echo "test.sh: all suites passed in $((SECONDS - started)) s"
