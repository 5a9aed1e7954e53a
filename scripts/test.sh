#!/usr/bin/env bash
# Fresh machine → every test: installs what is missing, then builds and runs the whole suite three
# ways: a Release build, an AddressSanitizer + UndefinedBehaviorSanitizer build, and a consumer
# project built against the installed package (find_package(attn)).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=2
started=$SECONDS

bash scripts/install-deps.sh

echo "== Release build and tests"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DATTN_BUILD_TESTS=ON
cmake --build build/release -j"$jobs"
ctest --test-dir build/release -j"$jobs" --output-on-failure

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
