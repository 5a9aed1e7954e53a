#!/usr/bin/env bash
# Issues 13 and 14's side-by-side on a server CPU (the device tool's 16-core Xeon), in phases that
# each fit one 10-minute device command; every figure goes to files under OUT with the CPU's name.
#
#   bench/server_side_by_side.sh kernels [OUT]   attn bench, every prefill case, AVX-512 and AVX2
#   bench/server_side_by_side.sh pytorch [OUT]   PyTorch's SDPA beside it (reuses OUT/bench.json)
#   bench/server_side_by_side.sh layers  [OUT]   MultiHeadAttention, decoding and a transformers
#                                                model from Python
#   bench/server_side_by_side.sh amx     [OUT]   the AMX tests, then bf16 on AMX tiles beside
#                                                vdpbf16ps (ATTN_AMX=1 against unset), one run
#   bench/server_side_by_side.sh ggml    [OUT]   decoding beside ggml's flash_attn_ext (llama.cpp),
#                                                F32 and F16 caches, interleaved rounds (issue 13)
#
# Carry a Release build (build/release: the CLI and its shared libraries), for the layers phase
# attn's Python module built for the machine's Python, and for the ggml phase build/ggml too: its
# ggml_decode_bench (scripts/build-ggml.sh, portable AVX-512 flags) is the one file needed, ggml
# being linked into it statically (ldd: glibc and libgomp only). Overrides: ATTN (the CLI), PYTHON,
# SIZES (default 1024,4096), THREADS (default 1,4 and the machine's cores), REPEATS, LENGTHS (the
# decode cases' cached tokens, default 4096,32768,65536), GGML (default
# build/ggml/ggml_decode_bench), ROUNDS (the ggml phase's interleaved rounds, default 2). On the
# device tool, keep OUT outside the call's $OUT (e.g. the default /tmp/attn-server, which lasts
# while the machine stays warm, so the pytorch phase finds bench.json) and copy each phase's files
# to $OUT: at most 8 files come back.
set -euo pipefail

phase=${1:?usage: bench/server_side_by_side.sh kernels|pytorch|layers|amx|ggml [OUT]}
out=${2:-${OUT:-/tmp/attn-server}}
attn=${ATTN:-build/release/cli/attn}
python=${PYTHON:-python3}
cores=$(nproc)
sizes=${SIZES:-1024,4096}
threads=${THREADS:-$(printf '%s\n' 1 4 "$cores" | awk '$1 <= '"$cores" | sort -un | paste -sd,)}
repeats=${REPEATS:-5}
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(dirname "$attn")/../src/kernels"
mkdir -p "$out"
lscpu >"$out/cpu.txt"

case $phase in
kernels)
  "$attn" bench --cases fused,fused-causal,fused-backward,fused-bf16,fused-fp16,fused-bf16-backward,fused-additive,fused-mha \
    --sizes "$sizes" --threads "$threads" --repeats "$repeats" --json-out "$out/bench.json" >"$out/bench.txt"
  # The AVX2 kernels on the same cores, for the AVX2 rows of issue 14's targets.
  "$attn" bench --simd-target avx2 --cases fused,fused-backward,fused-additive \
    --sizes "$sizes" --threads "1,$cores" --repeats "$repeats" >"$out/bench_avx2.txt"
  ;;
pytorch)
  test -f "$out/bench.json" || { echo "run the kernels phase first: $out/bench.json" >&2; exit 2; }
  "$python" bench/compare_pytorch.py --attn-json "$out/bench.json" --sizes "$sizes" \
    --threads "$threads" --repeats "$repeats" --additive-sizes 0 --json-out "$out/pytorch.json" \
    >"$out/pytorch.txt"
  ;;
layers)
  "$python" -c "import attn" || { echo "attn's Python module is not importable" >&2; exit 2; }
  "$python" bench/compare_mha.py --sizes "$sizes" --threads "$threads" --repeats "$repeats" \
    --json-out "$out/mha.json" >"$out/mha.txt"
  "$python" bench/compare_decode.py --lengths "${LENGTHS:-4096,32768,65536}" --threads "1,$cores" \
    --attn-cli "$attn" --json-out "$out/decode.json" --plot-out "$out/decode.png" >"$out/decode.txt"
  # A transformers model end to end (prefill, then decode steps), attn beside SDPA.
  "$python" bench/compare_transformers.py --contexts 4096,32768 --threads "1,$cores" \
    --json-out "$out/transformers.json" >"$out/transformers.txt"
  ;;
amx)
  # Needs the Release build's test binaries too. The tests say SKIPPED where there is no AMX.
  tests=$(dirname "$attn")/../tests/kernels/kernels_test
  "$tests" --gtest_filter='*Amx*:*FlashAttentionHalf*' >"$out/amx_tests.txt" 2>&1 || true
  for round in 1 2; do
    for use in 0 1; do
      ATTN_AMX=$use "$attn" bench --cases fused,fused-bf16 --sizes "$sizes" --threads "$threads" \
        --repeats "$repeats" --no-ceilings >"$out/bench_amx${use}_round$round.txt"
    done
  done
  ;;
ggml)
  # attn bench's decode cases and ggml's flash_attn_ext in turn, B = 1, n = 1, 32 heads over 8 of
  # 128: issue 13's target is attn >= 3x ggml at m = 65536. Python's standard library only.
  ggml=${GGML:-build/ggml/ggml_decode_bench}
  test -x "$ggml" ||
    { echo "no ggml benchmark at $ggml: run scripts/build-ggml.sh and carry it" >&2; exit 2; }
  "$python" bench/compare_ggml_decode.py --attn-cli "$attn" --ggml-bench "$ggml" \
    --lengths "${LENGTHS:-4096,32768,65536}" --threads "$threads" --rounds "${ROUNDS:-2}" \
    --json-out "$out/ggml.json" >"$out/ggml.txt"
  ;;
*)
  echo "unknown phase '$phase': expected kernels, pytorch, layers, amx or ggml" >&2
  exit 2
  ;;
esac
echo "wrote $out:" && ls "$out"
