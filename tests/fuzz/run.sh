#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz/ (built in an FXDP_SANITIZE=ON clang
# build: `make fuzz` / `make fuzz-smoke`; docs/robustness.md).
#   tests/fuzz/run.sh BUILD_DIR SECONDS
# SECONDS is split 3:1 between fxdp_graph_fuzzer (decode, verify, analyze,
# expand) and fxdp_text_fuzzer (the text parser). Seeds: every graph of
# tests/testdata, the model zoo's traced steps (golden/zoo_*.traced.txt)
# included; text graphs are parsed into GraphDefs with `fxdp graph parse`. New
# inputs accumulate in BUILD_DIR/fuzz/corpus/<target>; a crash
# leaves its input in BUILD_DIR/fuzz/artifacts/ and fails the run.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS}
SECONDS_TOTAL=${2:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS}
FUZZ=$BUILD/fuzz
SEEDS=$FUZZ/seeds
mkdir -p "$SEEDS/graph" "$SEEDS/text" "$FUZZ/corpus/graph" "$FUZZ/corpus/text" "$FUZZ/artifacts"

# Seeds from tests/testdata: text graphs (for both targets) and binary ones.
while IFS= read -r -d '' f; do
  name=$(echo "${f#tests/testdata/}" | tr '/' '_')
  case "$f" in
    *.txt)
      if [ "$(head -c 5 "$f")" = graph ]; then
        cp "$f" "$SEEDS/text/$name"
        "$BUILD/bin/fxdp" graph parse "$f" "$SEEDS/graph/${name%.txt}.pb" >/dev/null
      fi ;;
    *.pb) cp "$f" "$SEEDS/graph/$name" ;;
  esac
done < <(find tests/testdata -type f \( -name '*.txt' -o -name '*.pb' \) -print0)

graph_s=$(( SECONDS_TOTAL * 3 / 4 ))
text_s=$(( SECONDS_TOTAL - graph_s ))
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
run() {  # target seconds
  local log=$FUZZ/$1.log rc=0
  echo "fuzz: fxdp_$1_fuzzer for $2 s ($(find "$SEEDS/$1" -type f | wc -l) seeds)"
  "$BUILD/fuzz/fxdp_$1_fuzzer" "$FUZZ/corpus/$1" "$SEEDS/$1" -max_total_time="$2" \
    -rss_limit_mb=4096 -timeout=30 -print_final_stats=1 -artifact_prefix="$FUZZ/artifacts/" \
    >"$log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    tail -n 60 "$log"
    echo "fuzz: fxdp_$1_fuzzer failed (exit $rc; full log $log, input in $FUZZ/artifacts/)"
    return "$rc"
  fi
  grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb)' "$log" | tr '\n' ' '
  echo "corpus $(find "$FUZZ/corpus/$1" -type f | wc -l) inputs"
}
run graph "$graph_s"
run text "$text_s"
