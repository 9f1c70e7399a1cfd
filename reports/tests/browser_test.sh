#!/usr/bin/env bash
# Renders the fixture report (with its baseline verdict) in headless Chromium and
# checks the screenshot shows a real page. Chromium missing is a failure with the
# install line, never a pass: CI installs it (ci/deps.sh, HEADROOM_DEBS_TEST).
#   browser_test.sh HEADROOM_BINARY TESTDATA_DIR WORK_DIR
set -euo pipefail
headroom=$1 data=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
browser=""
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then browser=$b; break; fi
done
if [ -z "$browser" ]; then
  echo "browser test: no chromium on PATH; install it (apt-get install chromium) - ci/deps.sh does in CI" >&2
  exit 1
fi
if ! command -v python3 >/dev/null 2>&1; then
  echo "browser test: python3 is needed to check the screenshot (apt-get install python3)" >&2
  exit 1
fi
mkdir -p "$work"
rm -f "$work/report.html" "$work/report.png"
"$headroom" report "$data/results.json" --baseline "$data/baseline_faster.json" --html "$work/report.html"
# A private profile so parallel runs and a user's own profile do not interfere.
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --user-data-dir="$work/profile" --screenshot="$work/report.png" --window-size=1280,4000 \
  "file://$work/report.html" >"$work/chromium.log" 2>&1 || {
  echo "browser test: $browser failed; its output:" >&2
  cat "$work/chromium.log" >&2
  exit 1
}
if [ ! -s "$work/report.png" ]; then
  echo "browser test: $browser wrote no screenshot; its output:" >&2
  cat "$work/chromium.log" >&2
  exit 1
fi
python3 "$here/check_png.py" "$work/report.png" --min-kb 40 --min-colours 64 --min-ink 0.05
