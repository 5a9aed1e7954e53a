#!/usr/bin/env bash
# Builds attn's fuzz targets (fuzz/: libFuzzer with AddressSanitizer and UndefinedBehaviorSanitizer,
# clang from Debian) and runs each from its committed seed corpus for a bounded time.
#   bash scripts/fuzz.sh                       # every target for 45 s (scripts/test.sh runs this)
#   bash scripts/fuzz.sh --seconds 3600        # the longer campaign: an hour per target
#   bash scripts/fuzz.sh --seconds 600 npy     # chosen targets only
# Fails on any finding: a crash, a sanitizer report, a leak, an input slower than 10 s, more than
# 2 GiB of memory, or an exception other than attn's own. The input is saved under
# build/fuzz/findings/<target>/ (replay: build/fuzz/<target>_fuzzer <file>). The corpus each run
# grows is kept in build/fuzz/corpus/<target>/ (git-ignored); the committed seeds stay as they are.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=45
targets=()
while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    -h | --help) sed -n '2,11p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
((${#targets[@]})) || targets=(npy safetensors state_dict seq2seq_model)

build=${ATTN_FUZZ_BUILD_DIR:-build/fuzz}
jobs=${ATTN_FUZZ_JOBS:-2}
CC=clang CXX=clang++ cmake -S fuzz -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$jobs" --target "${targets[@]/%/_fuzzer}"

status=0
for target in "${targets[@]}"; do
  corpus=$build/corpus/$target
  findings=$build/findings/$target
  log=$build/logs/$target.log
  mkdir -p "$corpus" "$findings" "$(dirname "$log")"
  dict=fuzz/json.dict
  [[ $target == npy ]] && dict=fuzz/npy.dict
  # One thread per execution: attn's kernels would otherwise start OpenMP teams inside the fuzzer.
  if OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build/${target}_fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -dict="$dict" -artifact_prefix="$findings/" -print_final_stats=1 \
    "$corpus" "fuzz/corpus/$target" >"$log" 2>&1; then
    result=passed
  else
    result="FAILED (finding in $findings, log $log)"
    status=1
    tail -n 40 "$log"
  fi
  runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  corp=$(grep -o 'corp: [0-9]*/[0-9]*[bKM]*' "$log" | tail -n 1 || echo "corp: ?")
  echo "fuzz: $target ${seconds}s: $result, $runs executions, final ${corp}, seeds $(ls "fuzz/corpus/$target" | wc -l)"
done
exit $status
