#!/usr/bin/env bash
# Issues 13 and 14's side-by-side on a server CPU (the device tool's 16-core Xeon), in phases that
# each fit one 10-minute device command; every figure goes to files under OUT with the CPU's name.
#
#   bench/server_side_by_side.sh essentials [OUT]  issue 14's figures in one device call of at most
#                                                BUDGET seconds (default 480): every kernel test
#                                                (kernel-tests below), the module, attn bench's
#                                                target cases, attn.torch beside PyTorch
#                                                interleaved, attn run beside attn bench, the
#                                                MultiHeadAttention layer beside PyTorch's; nine
#                                                files in OUT, each step bounded by
#                                                what the budget has left (for a session with 15
#                                                minutes of device time: one call, start included)
#   bench/server_side_by_side.sh kernels [OUT]   attn bench, every prefill case (AVX-512)
#   bench/server_side_by_side.sh avx2    [OUT]   the AVX2 kernels on the same cores
#   bench/server_side_by_side.sh tiles   [OUT]   the forward's register tiles alone (Q·Kᵀ, P·V),
#                                                AVX-512's and AVX2's, as shares of the one-thread
#                                                FMA peak (attn_tile_benchmarks, in the bundle)
#   bench/server_side_by_side.sh pytorch [OUT]   PyTorch's SDPA beside it (reuses OUT/bench.json),
#                                                and ONNX Runtime's MultiHeadAttention beside the
#                                                layer rows where onnxruntime and onnx import
#   bench/server_side_by_side.sh layers  [OUT]   MultiHeadAttention, decoding, a transformers
#                                                model and torch.compile'd calls from Python
#   bench/server_side_by_side.sh kernel-tests [OUT]  every kernel test on every SIMD target the CPU
#                                                runs, in shards side by side (OUT/kernel_tests.txt)
#   bench/server_side_by_side.sh amx     [OUT]   the AMX tests, then bf16 on AMX tiles beside
#                                                bf16 widened to fp32 (ATTN_AMX=0) and beside
#                                                vdpbf16ps (ATTN_AMX=0 ATTN_BF16_DOT=1), one run;
#                                                whether tile products overlap vector arithmetic
#                                                (attn_amx_overlap_benchmarks) and vdpbf16ps's
#                                                rate (attn_bf16_dot_benchmarks), in the bundle
#   bench/server_side_by_side.sh ggml    [OUT]   decoding beside ggml's flash_attn_ext (llama.cpp),
#                                                F32 and F16 caches, interleaved rounds (issue 13)
#   bench/server_side_by_side.sh module  [OUT]   builds attn's Python module there (before layers)
#   bench/server_side_by_side.sh calls   [OUT]   attn bench's fused kernel and attn's Python call in
#                                                interleaved rounds (after module)
#   bench/server_side_by_side.sh interleaved [OUT]  issue 14's PyTorch targets through attn.torch:
#                                                attn and PyTorch's SDPA in turn, round after round
#                                                (after module; the ratios to report on this noisy
#                                                machine: rows of the other phases run minutes apart)
#   bench/server_side_by_side.sh short   [OUT]   short sequences through attn.torch beside PyTorch
#                                                (after module): training steps and inference at
#                                                n = 8 ... 200, fp32 and bf16, 1, 4 and all threads;
#                                                a decode-sized call's fixed cost; attention masks
#   bench/server_side_by_side.sh lengths [OUT]   n = 1024 ... LONG (default 16384) at B = 1, 8 heads,
#                                                1 thread and all cores, PyTorch beside it: where
#                                                K and V leave the L2 (the 1-thread forward read
#                                                66% at n = 1024, 60% at 4096), and the length plot
#   bench/server_side_by_side.sh run     [OUT]   issue 14's `attn run` target: the CLI on .npy files
#                                                of n = m = 4096, 32 heads of 64, its time minus
#                                                file I/O and peak RSS beside attn bench's fused
#                                                case at each thread count (bench/run_vs_bench.py;
#                                                NumPy, and strace where it may trace)
#
# The server needs none of attn's dependencies: carry build/server.tar.xz, the bundle that
# scripts/pack-server.sh makes here (the CLI, the kernel tests, ggml_decode_bench when
# scripts/build-ggml.sh made it, and every shared library they load but the C/C++ runtimes; 12 MB),
# which this script unpacks and uses when ATTN is unset. The module phase builds attn's Python module
# there against it for the server's own Python (bench/server/CMakeLists.txt: a compiler, Python's
# headers, CMake and nanobind are needed) and the layers phase imports it from OUT/python.
# Overrides: ATTN (the CLI; its libattn_*.so are looked for in ../src/kernels as in a build tree),
# PYTHON, SIZES (default 1024,4096), THREADS (default 1,4 and the machine's cores), REPEATS, LENGTHS
# (the decode cases' cached tokens, default 4096,32768,65536), GGML, ROUNDS (the ggml phase's
# interleaved rounds, default 2), CONTEXTS (the transformers model's cached tokens, default
# 4096,32768), RUN_N (the run phase's n = m, default 4096). On the device tool, keep OUT outside
# the call's $OUT (e.g. the default /tmp/attn-server, which lasts while the machine stays warm, so
# the pytorch phase finds bench.json) and pack OUT into the call's $OUT: at most 8 files come back.
#
# Durations on the Xeon (2026-11-24, REPEATS=3 unless said; docs/benchmarks.md "The Xeon side by
# side"): module 13 s; kernels 220 s at REPEATS=5; pytorch 212 s; amx more than 90 s (two rounds of
# four runs); layers: compare_mha 78 s, compare_decode 60 s (its --repeats 9), compare_transformers
# 83 s (--new-tokens 8); ggml 95 s; calls about 100 s, interleaved about 330 s (2026-11-25:
# REPEATS=3, 3 rounds, six workloads). A machine is given back 30 s after a call and a new
# one starts in about 30 s, bare: three calls of module + kernels + pytorch, module + amx + layers +
# calls, ggml + avx2 fitted the 30 minutes a session had then, each packing OUT into its $OUT as it
# goes. Since 2026-11 a session has 15 minutes of device time, the machine's start included: one
# call of the essentials phase (the device tool's `run` with carry build/server.tar.xz, command
# `BUDGET=480 bash bench/server_side_by_side.sh essentials /tmp/e; tar -czf $OUT/e.tar.gz -C /tmp
# e`, timeout_s 570: its nine files packed, a call returning eight).
# Not yet timed there: pytorch's ONNX Runtime rows (a few seconds per size and thread count); the
# essentials' run step took 22 s at 1 and 16 threads (2026-12-04).
set -euo pipefail

phase=${1:?usage: bench/server_side_by_side.sh essentials|kernel-tests|kernels|avx2|tiles|pytorch|layers|calls|interleaved|short|lengths|run|amx|ggml|module [OUT]}
out=${2:-${OUT:-/tmp/attn-server}}
python=${PYTHON:-python3}
# An absolute path: the module phase hands it to CMake, which runs it from its build folder.
[[ $python == */* && $python != /* ]] && python=$PWD/$python
cores=$(nproc)
sizes=${SIZES:-1024,4096}
threads=${THREADS:-$(printf '%s\n' 1 4 "$cores" | awk '$1 <= '"$cores" | sort -un | paste -sd,)}
repeats=${REPEATS:-3}
bundle=build/server
if [[ -z ${ATTN:-} && ! -d $bundle && -f $bundle.tar.xz ]]; then
  tar -xJf "$bundle.tar.xz" -C "$(dirname "$bundle")"
fi
if [[ -z ${ATTN:-} && -x $bundle/bin/attn ]]; then
  attn=$bundle/bin/attn
  kernels_test=$bundle/bin/kernels_test
  tile_bench=$bundle/bin/attn_tile_benchmarks
  overlap_bench=$bundle/bin/attn_amx_overlap_benchmarks
  dot_bench=$bundle/bin/attn_bf16_dot_benchmarks
  ggml=${GGML:-$bundle/bin/ggml_decode_bench}
  libraries=$PWD/$bundle/lib
  # The bundle's OpenMP runtime only where the server has none of its own.
  ldconfig -p 2>/dev/null | grep -q 'libgomp\.so\.1 ' || libraries+=:$PWD/$bundle/lib-fallback
else
  attn=${ATTN:-build/release/cli/attn}
  kernels_test=$(dirname "$attn")/../tests/kernels/kernels_test
  tile_bench=$(dirname "$attn")/../bench/attn_tile_benchmarks
  overlap_bench=$(dirname "$attn")/../bench/attn_amx_overlap_benchmarks
  dot_bench=$(dirname "$attn")/../bench/attn_bf16_dot_benchmarks
  ggml=${GGML:-build/ggml/ggml_decode_bench}
  libraries=$(cd "$(dirname "$attn")/../src/kernels" 2>/dev/null && pwd || true)
fi
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$libraries"
# Where the module phase builds attn's Python module: OUT, or WORK (essentials: /tmp/attn-work by
# default, keeping OUT to the phase's own nine files).
work=${WORK:-$out}
[[ $phase == essentials ]] && work=${WORK:-/tmp/attn-work}
# attn's module built by the module phase, ahead of any installed one.
[[ -d $work/python/attn ]] && export PYTHONPATH="$work/python${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$out" "$work"
lscpu >"$out/cpu.txt"

# essentials' steps: `step NAME SECONDS COMMAND...` runs COMMAND for at most SECONDS and at most
# what the budget has left (less `reserve` seconds kept for the steps after it), and logs its
# start, duration and exit status to OUT/log.txt.
budget_end=$((SECONDS + ${BUDGET:-480}))
step() {
  local name=$1 cap=$2 reserve=$3
  shift 3
  local left=$((budget_end - SECONDS - reserve))
  ((left < cap)) && cap=$left
  if ((cap < 10)); then
    echo "$(date -u +%T) $name: skipped (${cap}s of the budget left)" >>"$out/log.txt"
    return 0
  fi
  local start=$SECONDS status=0
  timeout --kill-after=10 "$cap" "$@" || status=$?
  echo "$(date -u +%T) $name: exit $status after $((SECONDS - start))s (limit ${cap}s)" >>"$out/log.txt"
}

case $phase in
essentials)
  # Issue 14's target figures in priority order, each step bounded (`step` above); BUDGET 480 s
  # leaves a 10-minute call room for the bundle's unpacking and the files' return. On the 16-core
  # Xeon (12-04): tests 12 s, module 10 s, bench 41 s, interleaved about 110 s, run 22 s; mha
  # about 80 s (11-24's compare_mha at 3 repeats).
  {
    echo "essentials: budget ${BUDGET:-480}s, sizes $sizes, threads $threads, $(nproc) CPUs"
    "$python" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)" 2>&1 || true
  } >"$out/log.txt"
  step tests 60 420 env WORK="$work" "$0" kernel-tests "$out" >>"$out/log.txt" 2>&1
  step module 90 380 env WORK="$work" "$0" module "$work" >>"$out/log.txt" 2>&1
  export PYTHONPATH="$work/python${PYTHONPATH:+:$PYTHONPATH}"
  # Which import order works, and which of the bundle's libraries `import attn` loads: on 12-04
  # attn before torch aborted torch's import there (below); the list names the candidates.
  imports_torch_first=1
  {
    for order in "attn, torch" "torch, attn"; do
      status=0
      "$python" -c "import $order" >/dev/null 2>&1 || status=$?
      echo "import $order: exit $status"
      if [[ $order == "torch, attn" ]]; then imports_torch_first=$status; fi
    done
    echo "the bundle's libraries that import attn loads:"
    "$python" -c "import attn; print(open('/proc/self/maps').read())" 2>/dev/null |
      awk -v lib="${libraries%%:*}" 'index($6, lib) == 1 {print "  " $6}' | sort -u
  } >>"$out/log.txt" 2>&1
  # The 1-thread targets (fp32 forward's share of the peak, backward / forward, additive, bf16 /
  # fp32) and the 16-thread scaling, in one attn bench run.
  step bench 120 300 "$attn" bench --cases fused,fused-causal,fused-backward,fused-additive,fused-bf16 \
    --sizes "$sizes" --threads "1,$cores" --repeats "$repeats" --json-out "$out/bench.json" \
    >"$out/bench.txt" 2>&1
  # The PyTorch targets (prints each row as it ends: a step cut short keeps the rows before);
  # without attn's module, PyTorch's SDPA beside the bench's rows instead (compare_pytorch.py).
  # torch before attn, as the bench scripts import them: on the Xeon (2026-12-04, PyTorch 2.11) attn
  # first, with the bundle's Debian libraries on LD_LIBRARY_PATH, aborted torch's import ("free():
  # invalid pointer", docs/xeon/2026-12-04/import_order.txt); torch first imports both.
  if ((imports_torch_first == 0)); then
    step interleaved 260 150 "$python" -u bench/interleaved_pytorch.py --sizes "$sizes" \
      --threads "$threads" --rounds 2 --repeats 2 --json-out "$out/interleaved.json" \
      >"$out/interleaved.txt" 2>&1
  elif [[ -f $out/bench.json ]]; then
    step pytorch 200 150 "$python" -u bench/compare_pytorch.py --attn-json "$out/bench.json" \
      --sizes "$sizes" --threads "1,$cores" --repeats 2 --additive-sizes 0 \
      --json-out "$out/pytorch.json" >"$out/pytorch.txt" 2>&1
  fi
  step run 120 90 "$python" -u bench/run_vs_bench.py --attn "$attn" --threads "1,$cores" \
    --n "${RUN_N:-4096}" --rounds 2 --repeats 2 >"$out/run.txt" 2>&1
  # The fused-mha target: attn's layer beside nn.MultiheadAttention (and ONNX Runtime's), one run
  # at 1, 4 and all threads (12-04's essentials had no such row: PyTorch's layer at 4 threads
  # went unmeasured).
  step mha 90 0 "$python" -u bench/compare_mha.py --sizes "$sizes" --threads "$threads" \
    --repeats 3 >"$out/mha.txt" 2>&1
  ;;
kernels)
  # The FMA peak at every thread count first (a small case; the table after it gives the peak per
  # count): if 8 threads reach what 16 do, the 16 vCPUs are 8 cores' hyperthreads, and issue 14's
  # "16 threads >= 13x one thread" cannot hold there (the peak scaled 7.9x on 2026-11-24).
  "$attn" bench --cases fused --sizes 256 --repeats 1 \
    --threads "$(printf '%s\n' 1 2 4 8 12 "$cores" | awk '$1 <= '"$cores" | sort -un | paste -sd,)" \
    >"$out/peak_by_threads.txt"
  "$attn" bench --cases fused,fused-causal,fused-backward,fused-bf16,fused-fp16,fused-bf16-backward,fused-additive,fused-mha \
    --sizes "$sizes" --threads "$threads" --repeats "$repeats" --json-out "$out/bench.json" >"$out/bench.txt"
  ;;
avx2)
  # The AVX2 kernels on the same cores, for the AVX2 rows of issue 14's targets.
  "$attn" bench --simd-target avx2 --cases fused,fused-backward,fused-additive \
    --sizes "$sizes" --threads "1,$cores" --repeats "$repeats" >"$out/bench_avx2.txt"
  ;;
tiles)
  # Whether the 1-thread forward's distance to 80% of the peak on this core is the register tiles'
  # own rate or the rest of the pass (docs/benchmarks.md's "What limits each unmet target": the
  # Xeon dev's 6 x 4 tile ran at 91% alone, 11-28); AVX2's 3 x 4 tile beside it. Not yet timed
  # there: 2 min 41 s on Zen 4 at 6 repetitions (2026-12-01), so about 1 min 50 s at these 4.
  test -x "$tile_bench" || { echo "no $tile_bench: build with bench targets, then pack" >&2; exit 2; }
  for target in best avx2; do
    "$tile_bench" --simd-target="$target" --benchmark_repetitions=4 \
      --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
  done >"$out/tiles.txt" 2>&1
  ;;
pytorch)
  test -f "$out/bench.json" || { echo "run the kernels phase first: $out/bench.json" >&2; exit 2; }
  # ONNX Runtime's MultiHeadAttention in the same run as the rest (issue 14's one side by side).
  onnx=()
  "$python" -c "import onnx, onnxruntime" 2>/dev/null && onnx=(--onnx-mha)
  "$python" bench/compare_pytorch.py --attn-json "$out/bench.json" --sizes "$sizes" \
    --threads "$threads" --repeats "$repeats" --additive-sizes 0 ${onnx[@]+"${onnx[@]}"} \
    --json-out "$out/pytorch.json" >"$out/pytorch.txt"
  ;;
layers)
  "$python" -c "import attn" || { echo "attn's Python module is not importable" >&2; exit 2; }
  "$python" bench/compare_mha.py --sizes "$sizes" --threads "$threads" --repeats "$repeats" \
    --json-out "$out/mha.json" >"$out/mha.txt"
  "$python" bench/compare_decode.py --lengths "${LENGTHS:-4096,32768,65536}" --threads "1,$cores" \
    --repeats 9 --attn-cli "$attn" --json-out "$out/decode.json" --plot-out "$out/decode.png" \
    >"$out/decode.txt"
  # A transformers model end to end (prefill, then decode steps), attn beside SDPA.
  "$python" bench/compare_transformers.py --contexts "${CONTEXTS:-4096,32768}" --threads "1,$cores" \
    --new-tokens 8 --json-out "$out/transformers.json" >"$out/transformers.txt"
  # Both under torch.compile (decode and training steps; not yet timed there: ~1.5 min on Zen 4
  # for two thread counts, most of it compiling).
  "$python" bench/compare_compiled.py --threads "1,$cores" --rounds 3 >"$out/compiled.txt"
  ;;
calls)
  # Whether the Python call's 1.09-1.45x over attn bench (two phases apart, 2026-11-24) holds when
  # the two take turns; contiguous and transposed torch tensors, and the functional call in C++.
  "$python" -c "import attn" || { echo "attn's Python module is not importable" >&2; exit 2; }
  "$python" bench/python_call_overhead.py --attn "$attn" --sizes "$sizes" --threads "$threads" \
    --rounds 3 --repeats "$repeats" >"$out/calls.txt"
  ;;
interleaved)
  "$python" -c "import attn" || { echo "attn's Python module is not importable" >&2; exit 2; }
  "$python" bench/interleaved_pytorch.py --sizes "$sizes" --threads "$threads" --rounds 3 \
    --repeats "$repeats" --json-out "$out/interleaved.json" >"$out/interleaved.txt"
  ;;
short)
  # Where a call's fixed costs decide (issue 14's small calls, measured on Zen 4 and Zen 5 only):
  # each thread count's OpenMP wake-up and the Python call beside PyTorch's, on this machine.
  "$python" -c "import attn" || { echo "attn's Python module is not importable" >&2; exit 2; }
  "$python" bench/compare_short_sequences.py --threads "$threads" >"$out/short.txt"
  "$python" bench/compare_short_sequences.py --threads "$threads" --sizes 8,16,32,77 \
    --heads 32 --kv-heads 8 --head-dim 128 --dtype bfloat16 >>"$out/short.txt"
  # A decode-sized call's fixed cost through attn.torch, attn and PyTorch (Zen 5 2026-11-27: 4.4,
  # 3.7 and 5.0 µs), and the masks transformers passes (bool, float) beside is_causal.
  "$python" bench/python_call_overhead.py --per-call >>"$out/short.txt"
  "$python" bench/compare_masks.py --threads "$threads" >"$out/masks.txt"
  ;;
lengths)
  # The query and key blocks sized by the L2 (2026-11-25) were measured on Zen 4 only; this phase
  # shows whether the Xeon's forward still loses efficiency as n grows.
  lengths=$(printf '%s\n' 1024 2048 4096 8192 16384 | awk '$1 <= '"${LONG:-16384}" | paste -sd,)
  "$attn" bench --cases fused,fused-backward --batch 1 --heads 8 --sizes "$lengths" \
    --threads "1,$cores" --repeats 2 --json-out "$out/lengths.json" >"$out/lengths.txt"
  "$python" bench/compare_pytorch.py --attn-json "$out/lengths.json" --batch 1 --heads 8 \
    --sizes "$lengths" --threads "1,$cores" --repeats 2 --additive-sizes 0 \
    --json-out "$out/lengths_pytorch.json" >"$out/lengths_pytorch.txt"
  ;;
run)
  # `attn run` against `attn bench` at the same shape and threads (measured on Zen 5 and Zen 4
  # only): the CLI's time minus its reads and its write, and its peak RSS against the 134 MB of
  # inputs and output. The .npy files go to a temporary folder, removed afterwards.
  "$python" -c "import numpy" || { echo "run_vs_bench.py needs NumPy" >&2; exit 2; }
  "$python" bench/run_vs_bench.py --attn "$attn" --threads "$threads" --n "${RUN_N:-4096}" \
    --rounds 3 --repeats "$repeats" --json-out "$out/run.json" >"$out/run.txt"
  ;;
kernel-tests)
  # Every kernel test on every SIMD target this CPU runs (AVX-512, AVX512-BF16/FP16 and AMX tiles
  # where it has them: the paths no development machine without them has run), in gtest shards
  # side by side (2 OpenMP threads each, as on the development machines): 42 s in one process on
  # Zen 1's four targets, about 10 s so on 16 cores. One file, OUT/kernel_tests.txt, the shards'
  # outputs one after another; the counts and any failing test to stdout.
  shards=$((cores < 8 ? cores : 8))
  rm -f "$work"/kernel_tests.*.txt
  pids=()
  for ((shard = 0; shard < shards; ++shard)); do
    OMP_NUM_THREADS=2 GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$shard "$kernels_test" \
      >"$work/kernel_tests.$shard.txt" 2>&1 &
    pids+=($!)
  done
  status=0
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  cat "$work"/kernel_tests.*.txt >"$out/kernel_tests.txt"
  awk '$2 == "OK" {ok++; if ($4 ~ /Amx/) amx++}
       $2 == "FAILED" && $4 ~ /^[A-Za-z]/ && !failed_seen[$4]++ {failed++; print "failed:", $4}
       $2 == "SKIPPED" && $4 ~ /^[A-Za-z]/ && !skipped_seen[$4]++ {skipped++; if ($4 ~ /Amx/) amx_skipped++}
       END {printf "kernel tests in %d shards: %d passed (%d AMX), %d failed, %d skipped (%d AMX)\n",
            '"$shards"', ok, amx, failed, skipped, amx_skipped}' "$out/kernel_tests.txt"
  exit $status
  ;;
amx)
  # Needs the Release build's test binaries too. The tests say SKIPPED where there is no AMX.
  "$kernels_test" --gtest_filter='*Amx*:*FlashAttentionHalf*' >"$out/amx_tests.txt" 2>&1 || true
  # Tiles (amx1), widened (amx0), vdpbf16ps (amx0_dot1), rounds alternating.
  for round in 1 2; do
    for setting in "1 " "0 " "0 1"; do
      read -r use dot <<<"$setting"
      ATTN_AMX=$use ATTN_BF16_DOT=${dot:-} "$attn" bench --cases fused,fused-bf16 \
        --sizes "$sizes" --threads "$threads" --repeats "$repeats" --no-ceilings \
        >"$out/bench_amx${use}${dot:+_dot$dot}_round$round.txt"
    done
  done
  if [[ -x $dot_bench ]]; then
    "$dot_bench" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
      >"$out/bf16_dot.txt" 2>&1 || true
  fi
  # Overlap would read "16 dots + N FMAs" near the longer of the two alone; serialisation near
  # their sum (docs/benchmarks.md, "Emerald Rapids again").
  if [[ -x $overlap_bench ]]; then
    "$overlap_bench" --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true \
      --benchmark_report_aggregates_only=true >"$out/amx_overlap.txt" 2>&1 || true
  fi
  ;;
ggml)
  # attn bench's decode cases and ggml's flash_attn_ext in turn, B = 1, n = 1, 32 heads over 8 of
  # 128: issue 13's target is attn >= 3x ggml at m = 65536. Python's standard library only.
  test -x "$ggml" ||
    { echo "no ggml benchmark at $ggml: run scripts/build-ggml.sh and carry it" >&2; exit 2; }
  "$python" bench/compare_ggml_decode.py --attn-cli "$attn" --ggml-bench "$ggml" \
    --lengths "${LENGTHS:-4096,32768,65536}" --threads "$threads" --rounds "${ROUNDS:-2}" \
    --json-out "$out/ggml.json" >"$out/ggml.txt"
  ;;
module)
  # attn's Python module for this machine's Python, linked to the bundle's libraries.
  [[ -d ${libraries%%:*} ]] || { echo "no bundle: carry build/server.tar.xz (scripts/pack-server.sh)" >&2; exit 2; }
  cmake -S bench/server -B "$work/module-build" -DCMAKE_BUILD_TYPE=Release \
    -DPython_EXECUTABLE="$(command -v "$python")" -DATTN_LIB_DIR="${libraries%%:*}" >"$work/module.txt"
  cmake --build "$work/module-build" -j "$cores" >>"$work/module.txt"
  mkdir -p "$work/python/attn"
  cp bindings/python/attn/*.py bindings/python/attn/*.pyi bindings/python/attn/py.typed "$work/python/attn/"
  cp "$work"/module-build/_attn*.so "$work/python/attn/"
  PYTHONPATH="$work/python" "$python" -c "import attn; print('attn module:', attn.__file__)"
  ;;
*)
  echo "unknown phase '$phase': expected essentials, kernels, avx2, pytorch, layers, calls, interleaved, short, lengths, run, amx, ggml or module" >&2
  exit 2
  ;;
esac
echo "wrote $out:" && ls "$out"
