#!/usr/bin/env python3
"""The report's layout in headless Chromium: nothing wider than the page, no label cut.

    layout_check.py HEADROOM RESULTS.json WORK [--baseline BASELINE.json] [--widths 1280,1920]
    layout_check.py HEADROOM PAGE.html WORK [--widths 1280,1920]

Renders the report of RESULTS (with BASELINE's comparison when given), or takes a
page already written (the fleet report), loads a copy
with a measuring script in headless Chromium at each width, and fails when:
- the page scrolls sideways (the document is wider than the window);
- a section is wider than its box (a table or chart that neither fits nor scrolls
  inside a box of its own, class "scroll");
- a chart label is cut: an SVG text that ends in "..." or runs past its chart's
  edge, or a text cut by CSS (text-overflow) or clipped by its cell.
Prints what it found at each width. Chromium missing is a failure with the install
line, never a pass.
"""
import json
import os
import re
import shutil
import subprocess
import sys

MEASURE = r"""
<script>
(function () {
  function box(e) { var r = e.getBoundingClientRect(); return {l: r.left, r: r.right, w: r.width}; }
  var out = {width: window.innerWidth, page: document.documentElement.scrollWidth, sections: [], scrolls: [],
             cut: [], first_screen: []};
  document.querySelectorAll('section').forEach(function (s) {
    if (s.scrollWidth > s.clientWidth + 1)
      out.sections.push({id: s.id, scroll: s.scrollWidth, client: s.clientWidth});
  });
  document.querySelectorAll('.scroll').forEach(function (s) {
    if (s.closest('details:not([open])')) return;  // not shown until opened
    if (s.scrollWidth > s.clientWidth + 1) {
      var sec = s.closest('section');
      out.scrolls.push({section: sec ? sec.id : '', scroll: s.scrollWidth, client: s.clientWidth});
    }
  });
  document.querySelectorAll('svg').forEach(function (svg) {
    var frame = svg.getBoundingClientRect();  // on the screen, after every transform
    svg.querySelectorAll('text').forEach(function (t) {
      var txt = t.textContent || '';
      var bb = t.getBoundingClientRect();
      var sec = svg.closest('section');
      if (/(\.\.\.|\u2026)\s*$/.test(txt) || bb.left < frame.left - 1 || bb.right > frame.right + 1 ||
          bb.top < frame.top - 1 || bb.bottom > frame.bottom + 1)
        out.cut.push({section: sec ? sec.id : '', text: txt.slice(0, 80), left: bb.left - frame.left,
                      right: frame.right - bb.right});
    });
  });
  document.querySelectorAll('td, th, span, div, a').forEach(function (e) {
    var cs = getComputedStyle(e);
    if (cs.textOverflow === 'ellipsis' && e.scrollWidth > e.clientWidth + 1) {
      var sec = e.closest('section');
      out.cut.push({section: sec ? sec.id : '', text: (e.textContent || '').slice(0, 80), css: true});
    }
  });
  var pre = document.createElement('pre');
  pre.id = 'hr-layout';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>
"""


def chromium():
    for b in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(b):
            return b
    sys.exit("layout check: no chromium on PATH; install it (apt-get install chromium) - ci/deps.sh does in CI")


def measure(browser, html, work, width):
    profile = os.path.join(work, f"profile{width}")
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--window-size={width},1000", "--virtual-time-budget=4000",
                        "--dump-dom", "file://" + html], capture_output=True, text=True, timeout=180)
    m = re.search(r'<pre id="hr-layout">(.*?)</pre>', r.stdout, re.S)
    if not m:
        sys.exit(f"layout check: no measurement came back from {browser} at {width} px:\n{r.stderr[-2000:]}")
    text = m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    return json.loads(text)


SELF_TEST = r"""
<script>
(function () {
  var s = document.querySelector('section');
  var wide = document.createElement('div');
  wide.style.width = '3000px';
  wide.textContent = 'a planted block wider than the page';
  s.appendChild(wide);
  var svg = document.querySelector('svg');
  if (svg) {
    var t = document.createElementNS('http://www.w3.org/2000/svg', 'text');
    t.setAttribute('x', '4'); t.setAttribute('y', '14'); t.textContent = 'a planted label cut...';
    svg.appendChild(t);
  }
})();
</script>
"""


def main():
    headroom, results, work = sys.argv[1:4]
    args = sys.argv[4:]
    baseline = args[args.index("--baseline") + 1] if "--baseline" in args else None
    widths = [int(w) for w in (args[args.index("--widths") + 1] if "--widths" in args else "1280,1920").split(",")]
    os.makedirs(work, exist_ok=True)
    if results.endswith(".html"):
        page = open(results).read()
    else:
        report = os.path.join(work, "report.html")
        cmd = [headroom, "report", results, "--html", report] + (["--baseline", baseline] if baseline else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode not in (0, 1):
            sys.exit(f"layout check: {' '.join(cmd)} exited {r.returncode}:\n{r.stderr}")
        page = open(report).read()
    probe = os.path.join(work, "report_measured.html")
    open(probe, "w").write(page.replace("</body>", MEASURE + "</body>"))
    browser = chromium()
    # The check must be able to fail: the same page with a planted block wider than
    # the page and a planted cut label is refused.
    planted = os.path.join(work, "report_planted.html")
    open(planted, "w").write(page.replace("</body>", SELF_TEST + MEASURE + "</body>"))
    m = measure(browser, planted, work, widths[0])
    # (A page without a chart has no SVG to plant a cut label in.)
    label_planted = "<svg" not in page or any("planted" in c["text"] for c in m["cut"])
    if not (m["page"] > m["width"] + 1 and m["sections"] and label_planted):
        sys.exit(f"layout check: a planted overflow and cut label went unseen: {m}")
    bad = []
    for w in widths:
        m = measure(browser, probe, work, w)
        print(f"{w} px: page {m['page']} px wide; {len(m['sections'])} sections too wide, "
              f"{len(m['scrolls'])} boxes that scroll, {len(m['cut'])} labels cut")
        for s in m["sections"]:
            print(f"  section {s['id']}: {s['scroll']} px in a box of {s['client']}")
        for s in m["scrolls"]:
            print(f"  (scrolls inside its box) {s['section']}: {s['scroll']} px in {s['client']}")
        for c in m["cut"][:20]:
            print(f"  cut in {c['section']}: {c['text']!r}")
        if m["page"] > m["width"] + 1 or m["sections"] or m["cut"]:
            bad.append(w)
    if bad:
        sys.exit(f"layout check: the report does not fit at {', '.join(map(str, bad))} px")
    print("layout check: the report fits at " + ", ".join(f"{w} px" for w in widths))


if __name__ == "__main__":
    main()
