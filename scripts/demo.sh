#!/usr/bin/env bash
# Fresh machine → demo: installs what is missing, builds attn (Release) and runs `attn demo`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DATTN_BUILD_TESTS=OFF
cmake --build build/release -j2
build/release/cli/attn demo --out attn-demo
