#!/usr/bin/env python3
"""CTest's GPU allocation, on a stand-in spec: every GPU-labelled test gets a slot of
its own while it runs.

    check_ctest_slots.py BUILD_DIR [--slots N]

Writes a spec of N stand-in GPU slots (ci/ctest-resources --stand-in N), runs
`ctest -L gpu -j N --resource-spec-file SPEC` over the build with each test recording
its slot (HEADROOM_CTEST_SLOT_LOG), and checks that every GPU test recorded exactly
one slot, that its CUDA_VISIBLE_DEVICES is that slot, and that no two tests that ran
at the same time held the same slot. Then the control: the same run with
HEADROOM_INJECT_CTEST_SLOT=0 (every test bound to slot 0 whatever CTest gave, a
fault switch in the binding) must be caught. Without a GPU the tests skip; the
binding happens before they do.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def records(folder):
    out = []
    for path in glob.glob(os.path.join(folder, "*.slot")):
        rec = {}
        for line in open(path):
            key, _, value = line.rstrip("\n").partition(" ")
            rec[key] = value
        rec["file"] = os.path.basename(path)
        out.append(rec)
    return out


def test_name(command):
    m = re.search(r"--gtest_filter=(\S+)", command)
    return m.group(1) if m else command


def problems(recs, n_tests, slots):
    """What is wrong with one run's slot records ([] when nothing)."""
    bad = []
    gtest = [r for r in recs if "--gtest_filter=" in r.get("command", "")]
    if len(gtest) != n_tests:
        bad.append(f"{len(gtest)} GPU tests recorded a slot, {n_tests} ran")
    for r in gtest:
        ids = r.get("ids", "").split(",") if r.get("ids") else []
        name = test_name(r["command"])
        if len(ids) != 1 or ids[0] not in {str(i) for i in range(slots)}:
            bad.append(f"{name}: slots '{r.get('ids')}', expected one of 0..{slots - 1}")
        if r.get("visible") != r.get("ids"):
            bad.append(f"{name}: CUDA_VISIBLE_DEVICES '{r.get('visible')}' for slot '{r.get('ids')}'")
        if "end" not in r or float(r["end"]) < float(r["start"]):
            bad.append(f"{name}: no end recorded")
    spans = sorted((float(r["start"]), float(r.get("end", r["start"])), r.get("ids"), r["command"]) for r in gtest)
    shared, overlapping = [], 0
    for i, (s1, e1, id1, c1) in enumerate(spans):
        for s2, e2, id2, c2 in spans[i + 1:]:
            if s2 >= e1:
                break
            overlapping += 1
            if id1 == id2:
                shared.append(f"slot {id1} held at once by {test_name(c1)} and {test_name(c2)}")
    if overlapping == 0:
        bad.append("no two tests ran at the same time: the allocation was not exercised")
    if shared:
        bad.append(f"{len(shared)} pairs of tests shared a slot, e.g. {shared[0]}")
    return bad, overlapping, len({r.get('ids') for r in gtest})


def run(build, spec, slots, folder, env_extra):
    env = dict(os.environ, HEADROOM_CTEST_SLOT_LOG=folder, **env_extra)
    r = subprocess.run(["ctest", "--test-dir", build, "-L", "gpu", "-j", str(slots), "--resource-spec-file", spec],
                       env=env, capture_output=True, text=True, timeout=900)
    return r


def main():
    build = os.path.abspath(sys.argv[1])
    slots = int(sys.argv[sys.argv.index("--slots") + 1]) if "--slots" in sys.argv else 4
    listed = subprocess.run(["ctest", "--test-dir", build, "-N", "-L", "gpu"], capture_output=True, text=True)
    m = re.search(r"Total Tests: (\d+)", listed.stdout)
    if not m or int(m.group(1)) == 0:
        sys.exit(f"ctest lists no GPU-labelled test in {build}:\n{listed.stdout[-1000:]}")
    n_tests = int(m.group(1))
    with tempfile.TemporaryDirectory(prefix="headroom_slots_") as tmp:
        spec = os.path.join(tmp, "gpus.json")
        subprocess.run([os.path.join(ROOT, "ci", "ctest-resources"), "--stand-in", str(slots), spec], check=True,
                       stderr=subprocess.DEVNULL)
        good, control = os.path.join(tmp, "run"), os.path.join(tmp, "control")
        os.makedirs(good)
        os.makedirs(control)
        r = run(build, spec, slots, good, {})
        if r.returncode != 0:
            sys.exit(f"ctest -L gpu with {slots} stand-in slots failed:\n{r.stdout[-3000:]}{r.stderr[-2000:]}")
        bad, overlapping, used = problems(records(good), n_tests, slots)
        if bad:
            sys.exit("CTest's GPU allocation:\n  " + "\n  ".join(bad))
        print(f"ctest slots: {n_tests} GPU tests, each on its own slot of {slots} ({used} used, "
              f"{overlapping} pairs ran at the same time on different slots)")
        run(build, spec, slots, control, {"HEADROOM_INJECT_CTEST_SLOT": "0"})
        caught, _, _ = problems(records(control), n_tests, slots)
        if not any("shared a slot" in b for b in caught):
            sys.exit("the control (every test bound to slot 0) was not caught: " + "; ".join(caught))
        print(f"ctest slots: the control (every test bound to slot 0) caught: {caught[0]}")


if __name__ == "__main__":
    main()
