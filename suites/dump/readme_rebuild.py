#!/usr/bin/env python3
"""The README's numpy rebuild of an MLP dump, run as the README shows it.

    readme_rebuild.py HEADROOM README.md WORK

Takes the python block between the README's `rebuild-mlp` markers, dumps the
quick MLP in micro-batches (`headroom dump --model mlp --micro-batch 16`), and
runs the block on it: it must exit 0. Then the control: the same block on a copy
of the dump whose largest gradient element is 1% off must fail, so the example's
own checks can see an error of that size.
"""
import json
import os
import shutil
import subprocess
import sys


def block(readme):
    text = open(readme).read()
    begin, end = "<!-- rebuild-mlp:begin -->", "<!-- rebuild-mlp:end -->"
    if begin not in text or end not in text:
        sys.exit(f"readme_rebuild: {readme} has no {begin} ... {end} block")
    inner = text[text.index(begin) + len(begin):text.index(end)]
    start = inner.index("```python\n") + len("```python\n")
    return inner[start:inner.index("```", start)]


def corrupt_largest_gradient(path):
    raw = bytearray(open(path, "rb").read())
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    import numpy as np
    best = None
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        a = np.frombuffer(bytes(raw[8 + n + b:8 + n + e]), "<f4")
        i = int(np.argmax(np.abs(a)))
        if best is None or abs(a[i]) > best[2]:
            best = (8 + n + b + 4 * i, name, abs(a[i]), a[i])
    at, name, _, v = best
    raw[at:at + 4] = np.float32(v * 1.01).tobytes()
    open(path, "wb").write(bytes(raw))
    return name


def main():
    headroom, readme, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    script = os.path.join(work, "rebuild_mlp.py")
    open(script, "w").write(block(readme))
    d = os.path.join(work, "dump")
    r = subprocess.run([headroom, "dump", "--model", "mlp", "--micro-batch", "16", "--backend", "cpu", "--out", d],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"readme_rebuild: headroom dump exited {r.returncode}:\n{r.stdout}{r.stderr}")
    ok = subprocess.run([sys.executable, script, d], capture_output=True, text=True)
    print(ok.stdout + ok.stderr, end="")
    if ok.returncode != 0:
        sys.exit("readme_rebuild: the README's rebuild does not agree with the dump")
    bad = os.path.join(work, "dump_corrupted")
    shutil.copytree(d, bad)
    name = corrupt_largest_gradient(os.path.join(bad, "gradients.safetensors"))
    control = subprocess.run([sys.executable, script, bad], capture_output=True, text=True)
    if control.returncode == 0:
        sys.exit(f"readme_rebuild: the rebuild passed a dump whose {name} gradient is 1% off:\n{control.stdout}")
    print(f"control: a 1% error in {name}'s gradient fails the rebuild, as it must")


if __name__ == "__main__":
    main()
