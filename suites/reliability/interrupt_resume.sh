#!/usr/bin/env bash
# SIGTERM / SIGINT during `headroom run`: the property that is running finishes,
# what finished is written as a valid results file marked incomplete, the exit
# code is 143 / 130; a second run into the same --out is refused while the first
# holds it; an incomplete file is no baseline; `run --resume` runs only what is
# missing and ends with the same set of measurements as an uninterrupted run;
# after SIGKILL what had finished is on disk (written as each part finished); a
# device that becomes unusable mid-run (a sticky CUDA error, injected here) is
# left behind: the run goes on in a fresh process and ends with the same set; an
# entry skipped there (DP-1 without mpirun) is tried again by a resume.
#   interrupt_resume.sh <headroom binary> <scratch dir>
set -u
headroom=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
only='OPS-|GA-1'  # GA-1 first (seconds), then two quick ones
fail() { echo "FAIL: $*"; exit 1; }
# until <tries> <command...>: runs the command every 50 ms until it succeeds (or the
# tries are used up), e.g. until 600 grep -q '\[1/3\]' run.err.
until_() {
  local tries=$1
  shift
  for _ in $(seq 1 "$tries"); do
    "$@" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

"$headroom" run --backend cpu --only "$only" --out "$work/whole" >"$work/whole.log" 2>&1 ||
  fail "the uninterrupted run failed: $(tail -3 "$work/whole.log")"

# killed_at <dir> <pattern> <tries>: a run into dir, killed with SIGKILL once its
# progress (dir.err) shows the pattern.
killed_at() {
  local dir=$1 pattern=$2 tries=$3
  "$headroom" run --backend cpu --only "$only" --out "$dir" >"$dir.out" 2>"$dir.err" &
  local pid=$!
  until_ "$tries" grep -q "$pattern" "$dir.err"
  kill -KILL "$pid"
  wait "$pid"
}

# signal_run <signal> <dir>: starts a run into dir, sends the signal once the first
# property is under way, and echoes the exit code. While the run holds the
# folder, a second run into it must be refused.
signal_run() {
  local sig=$1 dir=$2
  "$headroom" run --backend cpu --only "$only" --out "$dir" >"$dir.out" 2>"$dir.err" &
  local pid=$!
  until_ 600 grep -q '\[1/3\]' "$dir.err"
  "$headroom" run --backend cpu --only 'OPS-3' --out "$dir" >"$dir.second" 2>&1
  local second=$?
  # A dump takes the same lock: it may not swap the folder out from under the run.
  "$headroom" dump --backend cpu --model mlp --out "$dir" >"$dir.dump" 2>&1
  local dump=$?
  [ "$dump" = 2 ] && grep -q 'another headroom command' "$dir.dump" || second="dump:$dump"
  kill "-$sig" "$pid"
  wait "$pid"
  local rc=$?
  echo "$rc $second"
}

read -r rc second < <(signal_run TERM "$work/term")
cat "$work/term.err" "$work/term.out"
[ "$second" = 2 ] && grep -q 'another headroom command' "$work/term.second" ||
  fail "a second run or a dump into a folder in use was not refused (exit $second): $(cat "$work/term.second" \
    "$work/term.dump")"
[ "$rc" = 143 ] || fail "SIGTERM: expected exit 143, got $rc"
grep -q '"incomplete": true' "$work/term/results.json" || fail "the interrupted results are not marked incomplete"
"$headroom" report "$work/term/results.json" --html "$work/term.html" >/dev/null ||
  fail "the interrupted results file does not read back"
"$headroom" validate --baseline "$work/term/results.json" --results "$work/whole/results.json" >"$work/base.log" 2>&1
base_rc=$?
[ "$base_rc" = 2 ] && grep -q 'interrupted run' "$work/base.log" ||
  fail "an incomplete baseline was not refused (exit $base_rc): $(cat "$work/base.log")"

# Killed in its first property, a rerun into a used folder leaves no older complete
# result behind: the folder said "incomplete" before the first property began.
"$headroom" run --backend cpu --only "$only" --out "$work/rerun" >/dev/null 2>&1 || fail "the first run into rerun failed"
killed_at "$work/rerun" '\[1/3\]' 600
grep -q '"incomplete": true' "$work/rerun/results.json" ||
  fail "a rerun killed in its first property left the previous run's complete results"
[ -e "$work/rerun/index.html" ] && fail "a rerun killed in its first property left the previous run's report"

read -r rc second < <(signal_run INT "$work/int")
[ "$rc" = 130 ] || fail "SIGINT: expected exit 130, got $rc"

# A second signal, of either kind, ends the run at once with its own status.
"$headroom" run --backend cpu --only "$only" --out "$work/twice" >/dev/null 2>"$work/twice.err" &
pid=$!
until_ 600 grep -q '\[1/3\]' "$work/twice.err"
kill -TERM "$pid"
sleep 0.2
t0=$(date +%s%N)
kill -INT "$pid"
wait "$pid"
rc=$?
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[ "$rc" = 130 ] || fail "SIGTERM then SIGINT: expected exit 130 (the second signal's), got $rc"
[ "$ms" -lt 1000 ] || fail "SIGTERM then SIGINT: the run took $ms ms to stop after the second signal"

# SIGKILL during a data-parallel property: mpirun dies with the run (the kernel
# sends it SIGTERM, which it passes to its ranks), and the next launch removes the
# scratch folder the killed run left. A stand-in mpirun that would wait 30 s makes
# the outcome independent of how fast the real ranks finish.
if command -v pgrep >/dev/null; then
  printf '#!/bin/sh\nsleep 30 &\nwait\n' >"$work/slow_mpirun"
  chmod +x "$work/slow_mpirun"
  HEADROOM_MPIRUN="$work/slow_mpirun" "$headroom" run --backend cpu --only '^DP-1$' --ranks 2 --out "$work/dp" \
    >/dev/null 2>"$work/dp.err" &
  pid=$!
  until_ 600 pgrep -f "headroom-dp-$pid-" >/dev/null
  pgrep -f "headroom-dp-$pid-" >/dev/null || fail "no data-parallel launcher of run $pid was seen: $(cat "$work/dp.err")"
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null
  none_of() { ! pgrep -f "headroom-dp-$1-" >/dev/null; }
  until_ 20 none_of "$pid"
  pgrep -f "headroom-dp-$pid-" >/dev/null &&
    fail "mpirun outlived the killed run by a second: $(pgrep -af "headroom-dp-$pid-")"
  ls -d "${TMPDIR:-/tmp}/headroom-dp-$pid-"* >/dev/null 2>&1 || fail "no scratch folder of the killed run to clean up"
  if command -v mpirun >/dev/null; then
    "$headroom" run --backend cpu --only '^DP-1$' --ranks 2 --out "$work/dp2" >/dev/null 2>&1 || fail "the next DP run failed"
    ls -d "${TMPDIR:-/tmp}/headroom-dp-$pid-"* >/dev/null 2>&1 && fail "the killed run's scratch folder was left behind"
  fi
fi

# SIGKILL: nothing can be written at the end, so what finished was written as it
# finished; the run resumes from there.
killed_at "$work/kill" '\[2/3\]' 1200
grep -q '"incomplete": true' "$work/kill/results.json" ||
  fail "after SIGKILL no results file marked incomplete holds what had finished"
"$headroom" run --resume "$work/kill" >"$work/kill_resume.log" 2>&1 || fail "resume after SIGKILL failed"
grep -q 'property GA-1' "$work/kill_resume.log" && fail "the run resumed after SIGKILL ran GA-1 again"
ls -a "$work/kill" | grep -q '\.tmp\.' && fail "a temporary file was left in the output folder"

"$headroom" run --resume "$work/term" >"$work/resume.log" 2>&1 || fail "resume failed: $(tail -3 "$work/resume.log")"
grep -q 'property GA-1' "$work/resume.log" && fail "the resumed run ran GA-1 again, which had finished"
grep -q '"incomplete"' "$work/term/results.json" && fail "the resumed results are still marked incomplete"
# The same measurements and sweep points, in the same order, as the uninterrupted run.
keys() { grep -E '^      "(id|dtype|model|metric|negative_control|control|sweep)":' "$1"; }
diff <(keys "$work/whole/results.json") <(keys "$work/term/results.json") >"$work/keys.diff" ||
  fail "the resumed run's set differs from the uninterrupted run's: $(head -20 "$work/keys.diff")"
diff <(keys "$work/whole/results.json") <(keys "$work/kill/results.json") >"$work/kill_keys.diff" ||
  fail "the run resumed after SIGKILL differs from the uninterrupted run: $(head -20 "$work/kill_keys.diff")"
# A device lost after GA-1 (HEADROOM_INJECT_DEVICE_LOST): the same command goes on
# in a fresh process (exec of run --resume) and ends complete, exit 0, GA-1 run once.
HEADROOM_INJECT_DEVICE_LOST=GA-1 "$headroom" run --backend cpu --only "$only" --out "$work/lost" \
  >"$work/lost.out" 2>"$work/lost.err" || fail "the run whose device was lost failed: $(tail -3 "$work/lost.err")"
grep -q 'continuing in a fresh process (1 of at most' "$work/lost.err" ||
  fail "no fresh process after the device was lost: $(tail -5 "$work/lost.err")"
grep -q 'resuming the' "$work/lost.err" || fail "the fresh process did not resume"
[ "$(grep -c 'property GA-1' "$work/lost.err")" = 1 ] || fail "GA-1 ran again in the fresh process"
grep -q '"incomplete"' "$work/lost/results.json" && fail "the results after a lost device are still incomplete"
diff <(keys "$work/whole/results.json") <(keys "$work/lost/results.json") >"$work/lost_keys.diff" ||
  fail "the run continued after a lost device differs from the uninterrupted run: $(head -20 "$work/lost_keys.diff")"
n=$(keys "$work/whole/results.json" | grep -c '"id"')
[ "$n" -gt 0 ] || fail "no measurements to compare"
"$headroom" run --resume "$work/term" >"$work/again.log" 2>&1
[ $? = 2 ] && grep -q 'nothing to resume' "$work/again.log" || fail "resuming a complete run was not refused"

# --only / --skip with --resume: the selection becomes them. A complete run that
# skipped entries takes them on (ending with the uninterrupted run's set); a new
# selection that would drop something finished, or adds nothing, is refused; so is
# a file of another build.
"$headroom" run --backend cpu --only "$only" --skip 'OPS-' --out "$work/widen" >/dev/null 2>&1 ||
  fail "the run without OPS- failed"
"$headroom" run --resume "$work/widen" --only 'OPS-' --skip '' >"$work/narrow.log" 2>&1
[ $? = 2 ] && grep -q 'leaves out what the run finished: GA-1' "$work/narrow.log" ||
  fail "a new selection without GA-1, which had finished, was not refused: $(cat "$work/narrow.log")"
"$headroom" run --resume "$work/widen" --skip 'OPS-' >"$work/same.log" 2>&1
[ $? = 2 ] && grep -q 'adds nothing' "$work/same.log" ||
  fail "a new selection that adds nothing was not refused: $(cat "$work/same.log")"
sed 's/"git_sha": "/&x/' "$work/widen/results.json" >"$work/widen.json"
mkdir -p "$work/other" && cp "$work/widen.json" "$work/other/results.json"
"$headroom" run --resume "$work/other" --skip '' >"$work/other.log" 2>&1
[ $? = 2 ] && grep -q 'another build' "$work/other.log" ||
  fail "a file of another build was resumed: $(cat "$work/other.log")"
"$headroom" run --resume "$work/widen" --skip '' >"$work/widen.log" 2>&1 ||
  fail "the run could not take on what its --skip left out: $(tail -3 "$work/widen.log")"
grep -q 'property GA-1' "$work/widen.log" && fail "taking on OPS- ran GA-1 again"
grep -q '"skip": ""' "$work/widen/results.json" || fail "the widened results do not record the new selection"
diff <(keys "$work/whole/results.json") <(keys "$work/widen/results.json") >"$work/widen_keys.diff" ||
  fail "the widened run differs from the uninterrupted run: $(head -20 "$work/widen_keys.diff")"
# A new selection that puts a new entry (GA-1) before finished ones (GA-2..GA-4):
# the file written after GA-1 still holds them, so SIGKILL during the next new
# entry (TRADE) loses none of them.
"$headroom" run --backend cpu --only '^(GA-2|GA-3|GA-4)$' --out "$work/before" >/dev/null 2>&1 ||
  fail "the GA-2..4 run failed"
ga_before=$(grep -cE '^      "id": "GA-[234]"' "$work/before/results.json")
[ "$ga_before" -gt 0 ] || fail "no GA-2..4 measurements to keep"
"$headroom" run --resume "$work/before" --only '^(GA-1|GA-2|GA-3|GA-4|TRADE)$' >"$work/before.out" \
  2>"$work/before.err" &
pid=$!
until_ 1200 grep -q 'property TRADE' "$work/before.err"
kill -KILL "$pid"
wait "$pid" 2>/dev/null
grep -q 'property TRADE' "$work/before.err" || fail "the widened run never reached TRADE: $(tail -3 "$work/before.err")"
[ "$(grep -cE '^      "id": "GA-[234]"' "$work/before/results.json")" = "$ga_before" ] ||
  fail "a run killed after a new entry lost what it had finished earlier"
grep -q '"id": "GA-1"' "$work/before/results.json" || fail "GA-1, which finished, is not in the file"
grep -A2 '"not_run"' "$work/before/results.json" | grep -q '"TRADE"' || fail "TRADE, killed, is not listed as not run"
# What was skipped is not finished: a run without mpirun skips DP-1 and is complete,
# and resuming it where an mpirun is found tries DP-1 again (a stand-in that fails
# at once: DP-1 becomes an error, not the old skip). Needs the MPI worker built.
# A complete run that skipped nothing has nothing to resume.
if [ -x "$(dirname "$headroom")/headroom-dp" ]; then
HEADROOM_MPIRUN="$work/no_mpirun" "$headroom" run --backend cpu --only '^(OPS-3|DP-1)$' --ranks 2 \
  --out "$work/skipped" >"$work/skipped.log" 2>&1 || fail "the run without mpirun failed: $(tail -3 "$work/skipped.log")"
grep -q '"skipped": "mpirun not found' "$work/skipped/results.json" ||
  fail "the run without mpirun did not record DP-1 as skipped"
printf '#!/bin/sh\nexit 3\n' >"$work/failing_mpirun"
chmod +x "$work/failing_mpirun"
HEADROOM_MPIRUN="$work/failing_mpirun" "$headroom" run --resume "$work/skipped" >"$work/skipped_resume.log" 2>&1
grep -q 'what was skipped there is tried again: DP-1' "$work/skipped_resume.log" &&
  grep -q 'property DP-1' "$work/skipped_resume.log" ||
  fail "resuming a run that skipped DP-1 did not try it again: $(tail -3 "$work/skipped_resume.log")"
grep -q 'property OPS-3' "$work/skipped_resume.log" && fail "resuming a run that skipped DP-1 ran OPS-3 again"
grep -q '"skipped": "mpirun not found' "$work/skipped/results.json" && fail "the resumed file kept DP-1's old skip"
python3 - "$work/skipped/results.json" <<'PY' || fail "DP-1 is not the error of its failing launch: the resume did not run it again"
import json, sys
r = json.load(open(sys.argv[1]))
dp = [m for m in r["measurements"] if m["id"] == "DP-1"]
sys.exit(0 if dp and all(m.get("metric") == "exception" and not m.get("passed") for m in dp) else 1)
PY
grep -q '"id": "OPS-3"' "$work/skipped/results.json" || fail "the resumed file lost OPS-3"
fi
"$headroom" run --resume "$work/whole" >"$work/whole_resume.log" 2>&1
[ $? = 2 ] && grep -q 'complete and skipped nothing' "$work/whole_resume.log" ||
  fail "a complete run that skipped nothing was resumed: $(cat "$work/whole_resume.log")"

echo "interrupted, refused, resumed, continued after a lost device, widened: the same $n measurements"
