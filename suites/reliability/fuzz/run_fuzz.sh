#!/usr/bin/env bash
# run_fuzz.sh FUZZER CORPUS WORK SECONDS [PATTERN]: replay the committed corpus, then
# mutate a copy of it for SECONDS. A finding (crash, sanitizer report, a reader that
# throws something other than hr::Error, a round trip that changes the text) fails
# the test and leaves the input that caused it in WORK/ (crash-*, leak-*, timeout-*).
# With PATTERN (the negative control) the test passes only when a finding whose
# report matches PATTERN was made.
set -euo pipefail
fuzzer=$1 corpus=$2 work=$3 seconds=$4 expect=${5:-}
rm -rf "$work"
mkdir -p "$work/corpus"
cp "$corpus"/* "$work/corpus/"
cd "$work"
rc=0
"$fuzzer" -max_total_time="$seconds" -max_len=16384 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
  -artifact_prefix="$work/" "$work/corpus" >fuzz.log 2>&1 || rc=$?
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' fuzz.log)
found=$(ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* 2>/dev/null | head -n1 || true)
if [ -n "$expect" ]; then
  if [ $rc -ne 0 ] && grep -qE "$expect" fuzz.log; then
    echo "fuzz: the planted fault was found after ${runs:-?} inputs: $(grep -m1 -E "$expect" fuzz.log)"
    exit 0
  fi
  echo "fuzz: the planted fault ('$expect') was not found in ${seconds} s (exit $rc)"
  tail -n 5 fuzz.log
  exit 1
fi
if [ $rc -ne 0 ] || [ -n "$found" ]; then
  grep -m1 -A12 -E 'ERROR|fuzz_json_readers:|deadly signal' fuzz.log || tail -n 20 fuzz.log
  echo "fuzz: a finding after ${runs:-?} inputs (exit $rc); the input: ${found:-see $work/fuzz.log}"
  exit 1
fi
echo "fuzz: ${runs:-?} inputs in ${seconds} s from $(ls "$corpus" | wc -l) corpus files, no finding"
