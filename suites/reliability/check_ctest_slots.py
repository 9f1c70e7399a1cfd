#!/usr/bin/env python3
"""CTest's GPU allocation, on a stand-in spec: every GPU-labelled test gets a GPU of
its own while it runs.

    check_ctest_slots.py BUILD_DIR [--slots N]

Writes a spec of N stand-in GPU slots (ci/ctest-resources --stand-in N) and runs
`ctest -L gpu -j N --resource-spec-file SPEC` over the build with
CUDA_VISIBLE_DEVICES=s0,...,s<N-1> (N names that are no GPU: CUDA sees none, on a
machine with GPUs too, and each slot's binding is a name of its own) and each test
recording what it got (HEADROOM_CTEST_SLOT_LOG). Checks that every GPU test recorded
CTest's allocation of one slot, that its CUDA_VISIBLE_DEVICES became that slot's
name, and that no two tests that ran at the same time saw the same device. Then the
control: the same run with HEADROOM_INJECT_CTEST_SLOT=0 (the binding takes slot 0
whatever CTest gave, a fault switch in the binding) must be caught. Without a GPU
the tests skip; the binding happens before they do.
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
    wrong = []
    for r in gtest:
        name = test_name(r["command"])
        m = re.fullmatch(r"id:(\d+),slots:1", r.get("allocation", ""))
        if not m or int(m.group(1)) >= slots:
            bad.append(f"{name}: CTest's allocation '{r.get('allocation')}', expected one slot of 0..{slots - 1}")
            continue
        if r.get("visible") != f"s{m.group(1)}":
            wrong.append(f"{name}: given slot {m.group(1)}, CUDA_VISIBLE_DEVICES '{r.get('visible')}'")
        if "end" not in r or float(r["end"]) < float(r["start"]):
            bad.append(f"{name}: no end recorded")
    if wrong:
        bad.append(f"{len(wrong)} tests were bound to another slot than CTest gave, e.g. {wrong[0]}")
    spans = sorted((float(r["start"]), float(r.get("end", r["start"])), r.get("visible"), r["command"]) for r in gtest)
    shared, overlapping = [], 0
    for i, (s1, e1, v1, c1) in enumerate(spans):
        for s2, e2, v2, c2 in spans[i + 1:]:
            if s2 >= e1:
                break
            overlapping += 1
            if v1 == v2:
                shared.append(f"device {v1} seen at once by {test_name(c1)} and {test_name(c2)}")
    if overlapping == 0:
        bad.append("no two tests ran at the same time: the allocation was not exercised")
    if shared:
        bad.append(f"{len(shared)} pairs of tests shared a slot, e.g. {shared[0]}")
    return bad, overlapping, len({r.get("visible") for r in gtest})


def run(build, spec, slots, folder, env_extra):
    env = dict(os.environ, HEADROOM_CTEST_SLOT_LOG=folder,
               CUDA_VISIBLE_DEVICES=",".join(f"s{i}" for i in range(slots)), **env_extra)
    for k in ("HEADROOM_REQUIRE_GPU", "HEADROOM_CTEST_GPUS_BOUND", "HEADROOM_INJECT_CTEST_SLOT"):
        if k not in env_extra:
            env.pop(k, None)
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
        if not (any("another slot" in b for b in caught) and any("shared a slot" in b for b in caught)):
            sys.exit("the control (every test bound to slot 0) was not caught: " + "; ".join(caught))
        print("ctest slots: the control (every test bound to slot 0) caught: " + "; ".join(caught))


if __name__ == "__main__":
    main()
