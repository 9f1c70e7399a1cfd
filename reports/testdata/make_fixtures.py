#!/usr/bin/env python3
# Writes the report fixtures in this folder: a small results file with data for
# every section of the report (synthetic but shaped like a GPU run, with hostile
# strings in the device name and a model name to test escaping), and baselines
# for the comparison tests. Deterministic; rerun after changing the schema.
import copy
import json
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
CONSUMERS = ["weights", "gradients", "optimizer_state", "activations", "workspace"]
MIB = 1 << 20


def mem(weights=0, gradients=0, optimizer_state=0, activations=0, workspace=0):
    # Byte counts are whole numbers (a results file with a fraction of a byte is refused).
    peak = {k: int(round(v)) for k, v in dict(weights=weights, gradients=gradients, optimizer_state=optimizer_state,
                                              activations=activations, workspace=workspace).items()}
    return {"current_bytes": {c: 0 for c in CONSUMERS}, "peak_bytes": peak,
            "total_current_bytes": 0,
            "total_peak_bytes": int(weights + gradients + optimizer_state + activations + 0.5 * workspace)}


def tstats(median, spread=0.03):
    return {"reps": 20, "median_s": median, "mean_s": median * 1.01, "min_s": median * 0.97,
            "max_s": median * 1.06, "stddev_s": median * spread / 2.6, "mad_s": median * spread / 4,
            "rel_spread": spread, "noisy": spread > 0.25}


def point(sweep, config, memory, time=None, metrics=None, dtype="fp32", model="transformer",
          backend="cuda", status="ok", reason=""):
    p = {"sweep": sweep, "backend": backend, "dtype": dtype, "model": model, "config": config,
         "status": status, "reason": reason, "memory": memory, "metrics": metrics or {}}
    if time is not None:
        p["time"] = time
    return p


def meas(id_, title, backend, dtype, model, error, tol, metric="rel_l2", neg=False, config=None,
         reason="PROPERTIES.md", details=None):
    passed = (error > tol) if neg else (error <= tol)
    return {"id": id_, "title": title, "backend": backend, "dtype": dtype, "model": model,
            "config": config or {}, "metric": metric, "error": error, "tolerance": tol,
            "negative_control": neg, "passed": passed, "tolerance_reason": reason,
            "details": details or {}}


def results():
    ms = []
    for be in ["cpu", "cuda"]:
        for dt, e in [("fp32", 3e-14), ("fp16", 7e-8), ("bf16", 4e-6)]:
            tol = {"fp32": 1e-9, "fp16": 1e-6, "bf16": 5e-5}[dt]
            ms.append(meas("OPS-1", "matmul forward against float64", be, dt, "op:matmul", e, tol,
                           metric="nmse", config={"m": 129, "n": 17, "k": 4097}))
            ms.append(meas("GA-1", "accumulated gradient equals the full-batch gradient", be, dt, "mlp",
                           e * 40, tol * 50, config={"micro_batch": 4, "accum_steps": 8}))
            ms.append(meas("GA-2", "without the loss division the check flags it", be, dt, "mlp",
                           7.0, tol * 50, neg=True, config={"micro_batch": 4, "accum_steps": 8}))
        ms.append(meas("CK-1", "checkpointed gradients bitwise equal", be, "fp32", "transformer", 0, 0,
                       metric="bitwise_mismatches", config={"every": 2, "depth": 8}))
        ms.append(meas("CK-2", "fresh RNG in recomputation is caught", be, "fp32", "transformer", 0.31,
                       1e-3, neg=True, config={"every": 2, "depth": 8}))
    ms.append(meas("OPS-3", "host Philox stream equals cuRAND's host generator", "cpu", "uint32",
                   "op:philox", 0, 0, metric="bitwise_mismatches",
                   config={"check": "curand_host_u32"}))
    ms.append(meas("MP-1", "loss scaling keeps small gradients", "cuda", "fp16", "mlp", 2e-4, 1e-3,
                   metric="zero_fraction", config={"loss_scale": 65536}))
    ms.append(meas("MEM-3", "tracker peak equals the pool's high-water mark", "cuda", "", "alloc_pattern",
                   0.0004, 0.01, metric="rel_diff", config={"pattern": "step_like"}))
    ms.append(meas("Q8-3", "8-bit Adam final loss within 5% of fp32 Adam", "cuda", "fp32", "mlp", 0.012,
                   0.05, metric="rel_final_loss", config={"steps": 500}))
    # A config value from outside with markup in it.
    ms.append(meas("PK-1", "packed row equals each sequence alone", "cuda", "fp32",
                   "transformer", 2e-7, 1e-5, config={"note": "<b>bold</b> & \"quoted\""}))

    sp = []
    # BM-MB: effective batch 32.
    for mb in [1, 2, 4, 8, 16, 32]:
        eff = 32
        step = 0.004 * (eff / mb) + 0.0021 * eff * (1 + 1.5 / mb)
        act = 6 * MIB * mb
        sp.append(point("BM-MB", {"micro_batch": mb, "accum_steps": eff // mb},
                        mem(weights=48 * MIB, gradients=48 * MIB, optimizer_state=96 * MIB, activations=act,
                            workspace=8 * MIB),
                        tstats(step), {"tokens_per_s": eff * 256 / step}))
    sp.append(point("BM-MB", {"micro_batch": 64, "accum_steps": 1}, mem(), status="out_of_memory",
                    reason="out of memory: 384.00 MiB for activations would exceed the budget of 512.00 MiB"))
    # CK-3: activation peak against depth.
    for depth in [4, 8, 16, 32, 64]:
        for ck in ["none", "sqrt"]:
            act = 3 * MIB * depth if ck == "none" else 3 * MIB * 2 * math.sqrt(depth) + 1 * MIB
            sp.append(point("CK-3", {"depth": depth, "checkpoint": ck},
                            mem(weights=depth * MIB, gradients=depth * MIB, activations=act)))
    # PK-4 and BM-SEQ: activation peak against sequence length.
    for t in [128, 256, 512, 1024, 2048]:
        for att in ["naive", "memory_efficient"]:
            act = (t * 4096 + (t * t * 32 if att == "naive" else t * 512)) * 2
            sp.append(point("BM-SEQ", {"seq_len": t, "attention": att},
                            mem(weights=24 * MIB, gradients=24 * MIB, optimizer_state=48 * MIB, activations=act),
                            tstats(1e-5 * t * (1 + (t / 1024 if att == "naive" else 0.15)))))
    # Q8-3: loss curves.
    for step in range(0, 501, 25):
        base = 2.3 * math.exp(-step / 140) + 0.12
        sp.append(point("Q8-3", {"step": step, "optimizer": "adam_fp32"}, mem(), metrics={"loss": base}, model="mlp"))
        sp.append(point("Q8-3", {"step": step, "optimizer": "adam_8bit"}, mem(),
                        metrics={"loss": base * (1 + 0.012 * step / 500)}, model="mlp"))
    # TRADE in the field guide's order.
    trade = [("baseline fp32", 1.0, 1.0), ("mixed precision (bf16)", 0.62, 0.55), ("sequence length + packing", 0.41, 0.43),
             ("accumulation (mb 4 x 8)", 0.29, 0.52), ("checkpointing sqrt(L)", 0.18, 0.69),
             ("8-bit optimizer", 0.13, 0.71), ("LoRA r=8", 0.06, 0.62)]
    for i, (name, m, t) in enumerate(trade):
        total = 2048 * MIB * m
        sp.append(point("TRADE", {"technique": name, "step": i},
                        mem(weights=total * 0.2, gradients=total * 0.15, optimizer_state=total * 0.25,
                            activations=total * 0.4), tstats(0.25 * t), {"tokens_per_s": 32 * 512 / (0.25 * t)},
                        dtype="mixed"))
    sp.append(point("BM-LR", {"rank": 8}, mem(weights=64 * MIB, activations=32 * MIB), tstats(0.01),
                    model="<img src=x onerror=alert(2)>"))

    device = {"backend": "cuda", "name": "<script>alert(1)</script>&\"'", "ordinal": 0,
              "compute_capability": "9.0", "sm_count": 132, "memory_bytes": 150 * 1024 ** 3,
              "sm_clock_khz": 1980000, "memory_clock_khz": 3201000, "memory_bus_bits": 6144,
              "driver_version": 13000, "runtime_version": 13000, "cublas_version": 130001, "ecc": True,
              "uuid": "GPU-00000000-0000-0000-0000-000000000000"}
    build = {"git_sha": "0123456789ab", "version": "0.1.0", "cxx_compiler": "GNU 12.2.0",
             "cuda_compiler": "nvcc 13.0.88", "cuda_archs": "90-real", "build_type": "Release", "cuda_backend": True}
    timings, seen = [], set()
    for m in ms:
        if m["id"] in seen:
            continue
        seen.add(m["id"])
        n = sum(1 for x in ms if x["id"] == m["id"])
        timings.append({"kind": "property", "id": m["id"], "title": m["title"], "seconds": 0.25 * n,
                        "expected_seconds_quick": 0.3 * n, "items": n})
    for sw in ["BM-MB", "CK-3", "BM-SEQ", "Q8-3", "TRADE", "BM-LR"]:
        n = sum(1 for p in sp if p["sweep"] == sw)
        timings.append({"kind": "sweep", "id": sw, "title": sw + " sweep", "seconds": 0.5 * n,
                        "expected_seconds_quick": 0.4 * n, "items": n})
    r = {"schema": "headroom.results/1", "run_time_utc": "2025-01-31T12:00:00Z", "duration_s": 42.5,
         "preset": "quick", "backend": "cuda", "seed": 1234, "only": "", "device": device, "build": build,
         "totals": {}, "measurements": ms, "sweep_points": sp, "timings": timings}
    return r


def scaled(r, time_factor=1.0, mem_factor=None, sweep="BM-MB"):
    b = copy.deepcopy(r)
    for p in b["sweep_points"]:
        if p["sweep"] != sweep or p["status"] != "ok":
            continue
        if "time" in p:
            for k in ["median_s", "mean_s", "min_s", "max_s", "stddev_s", "mad_s"]:
                p["time"][k] *= time_factor
        if mem_factor is not None and p["config"].get("micro_batch") == 8:
            p["memory"]["peak_bytes"]["activations"] = int(p["memory"]["peak_bytes"]["activations"] * mem_factor)
            p["memory"]["total_peak_bytes"] = int(p["memory"]["total_peak_bytes"] * mem_factor)
    return b


def peer(r):
    """ci/peer/torch_step.py's record of r's largest BM-MB point without accumulation."""
    pt = max((p for p in r["sweep_points"] if p["sweep"] == "BM-MB" and p["status"] == "ok"
              and p["config"]["accum_steps"] == 1), key=lambda p: p["config"]["micro_batch"])
    hp = {"config": pt["config"], "dtype": pt["dtype"], "tokens_per_s": pt["metrics"]["tokens_per_s"],
          "step_time_s": pt["time"]["median_s"]}
    tokens = 32 * 128

    def form(name, step_s, **kw):
        f = {"form": name, "dtype": "fp32", "attention": "naive", "optimizer": "default", "compiled": False,
             "median_step_s": step_s, "min_step_s": step_s * 0.97, "tokens_per_s": tokens / step_s, "loss": 6.2,
             "fell_back": []}
        f.update(kw)
        return f
    forms = [form("eager", 0.0743),
             form("strongest", 0.0410, dtype="bf16", attention="sdpa-flash", optimizer="fused", compiled=True,
                  compile_s=41.0, fell_back=["compile: <none> & \"quoted\""])]
    return {"peer": "pytorch", "torch": "2.11.0+cu130", "device": "cuda", "preset": "full", "threads": 16,
            "batch": 32, "seq_len": 128, "steps": 20, "model": {}, "dtype": "fp32",
            "median_step_s": forms[0]["median_step_s"], "min_step_s": forms[0]["min_step_s"],
            "tokens_per_s": forms[0]["tokens_per_s"], "loss": 6.2, "forms": forms, "headroom_point": hp,
            "headline": {"against": "strongest", "peer_tokens_per_s": forms[1]["tokens_per_s"],
                         "headroom_over_peer": hp["tokens_per_s"] / forms[1]["tokens_per_s"]}}


def write(name, obj):
    with open(os.path.join(HERE, name), "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    r = results()
    write("results.json", r)
    write("results-peer.json", peer(r))
    # Same device and build, timings 2% apart (within noise): fit.
    ok = scaled(r, 1.02)
    ok["run_time_utc"] = "2025-01-30T09:00:00Z"
    write("baseline_ok.json", ok)
    # A faster baseline with less memory at micro-batch 8: this run regressed.
    fast = scaled(r, 0.7, mem_factor=0.8)
    fast["device"]["name"] = "NVIDIA H100 80GB HBM3"
    fast["device"]["driver_version"] = 12040
    fast["run_time_utc"] = "2025-01-29T09:00:00Z"
    write("baseline_faster.json", fast)
    other = {"schema": "headroom.results/2", "run_time_utc": "2026-01-01T00:00:00Z", "preset": "quick",
             "backend": "cuda", "seed": 1, "device": {}, "measurements": [], "sweep_points": []}
    write("baseline_schema2.json", other)
