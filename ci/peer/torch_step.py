#!/usr/bin/env python3
"""PyTorch eager peer of headroom's controlled transformer training step.

The same architecture and sizes as harness/models/transformer.hpp with the
presets of harness/models/presets.hpp: token + position embedding, pre-LN
blocks (separate q, k, v linears, naive causal attention with scale 1/sqrt(D),
output projection, residual; LayerNorm, fc -> tanh GELU -> proj, dropout,
residual), final LayerNorm, untied LM head without bias, cross-entropy with
ignore index -100, AdamW. One step = zero_grad + forward + backward +
optimizer step. Prints one JSON object with the median step time.

Two forms of the step (--forms):
  eager      the model as written: the point's attention (naive, or SDPA on
             its default backend for a memory-efficient point), the default
             AdamW, the point's dtype (autocast for 16-bit);
  strongest  the fastest form this PyTorch has: scaled_dot_product_attention
             on its flash backend, fused AdamW (else foreach), bf16 autocast
             where the device has bf16, and torch.compile where it compiles
             within --compile-budget seconds. What it could not use, and why,
             is in its "fell_back" list.
Each form's figures are one object of "forms"; "headline" sets headroom's point
against the strongest form that ran.

Not part of CI (it needs torch); used to compare step times:
    python3 ci/peer/torch_step.py --device cpu --preset quick --dtype fp32
    python3 ci/peer/torch_step.py --device cuda --point results.json
With --point, the model, dtype, micro-batch and sequence length are those of a
BM-MB point of headroom's results (the largest micro-batch without accumulation
on that backend, its fastest attention form), so both sides time the same step.
"""
import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

NO_COMPARABLE_POINT = 3  # exit status: nothing to compare with (a skip, not a failure)

PRESETS = {
    # vocab, max_positions, d_model, heads, layers, batch, seq_len
    "quick": dict(vocab=512, max_positions=128, d_model=128, heads=4, layers=4, batch=8, seq_len=128),
    "full": dict(vocab=32768, max_positions=1024, d_model=1024, heads=16, layers=12, batch=16, seq_len=1024),
}


class Block(nn.Module):
    def __init__(self, c, h, dropout, mlp_ratio=4, sdpa=False):
        super().__init__()
        self.h = h
        self.sdpa = sdpa
        self.ln1 = nn.LayerNorm(c, eps=1e-5)
        self.q = nn.Linear(c, c)
        self.k = nn.Linear(c, c)
        self.v = nn.Linear(c, c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c, eps=1e-5)
        self.fc = nn.Linear(c, mlp_ratio * c)
        self.mlp_proj = nn.Linear(mlp_ratio * c, c)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask):
        b, t, c = x.shape
        d = c // self.h
        y = self.ln1(x)
        q = self.q(y).view(b, t, self.h, d).transpose(1, 2)
        k = self.k(y).view(b, t, self.h, d).transpose(1, 2)
        v = self.v(y).view(b, t, self.h, d).transpose(1, 2)
        if self.sdpa:  # PyTorch's fused attention kernels
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            s = s.masked_fill(mask, float("-inf"))
            a = torch.softmax(s, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        x = x + self.drop(self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))
        return x


class Model(nn.Module):
    def __init__(self, p, dropout):
        super().__init__()
        c = p["d_model"]
        self.wte = nn.Embedding(p["vocab"], c)
        self.wpe = nn.Embedding(p["max_positions"], c)
        self.blocks = nn.ModuleList([Block(c, p["heads"], dropout, p.get("mlp_ratio", 4), p.get("sdpa", False))
                                     for _ in range(p["layers"])])
        self.ln_f = nn.LayerNorm(c, eps=1e-5)
        self.lm_head = nn.Linear(c, p["vocab"], bias=False)

    def forward(self, ids, pos, targets):
        t = ids.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=ids.device), diagonal=1)
        x = self.wte(ids) + self.wpe(pos)
        for b in self.blocks:
            x = b(x, mask)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1), ignore_index=-100)


def bm_mb_point(path, backend):
    """The BM-MB point of `path` that a peer can repeat: status ok, this backend, no
    accumulation, a config that names the whole model; the largest micro-batch and,
    of its attention forms (naive, and on a GPU memory-efficient on named kernels),
    the fastest: headroom at its best against PyTorch at its best."""
    with open(path) as f:
        results = json.load(f)
    need = {"vocab", "max_positions", "d_model", "heads", "layers", "micro_batch", "seq_len", "mlp_ratio",
            "attention", "dropout", "accum_steps"}
    pts = [q for q in results.get("sweep_points", []) if q.get("sweep") == "BM-MB" and q.get("status") == "ok"
           and q.get("backend") == backend and q.get("model") == "transformer"
           and need <= set(q.get("config", {})) and q["config"]["accum_steps"] == 1]
    if not pts:
        print("no comparable point: %s has no BM-MB %s transformer point without accumulation "
              "that names its whole model" % (path, backend), file=sys.stderr)
        sys.exit(NO_COMPARABLE_POINT)
    largest = max(q["config"]["micro_batch"] for q in pts)
    return max((q for q in pts if q["config"]["micro_batch"] == largest),
               key=lambda q: q.get("metrics", {}).get("tokens_per_s", 0.0))


class BudgetExceeded(Exception):
    pass


@contextlib.contextmanager
def time_budget(seconds):
    """Raises BudgetExceeded in the main thread once `seconds` have passed."""
    def on_alarm(signum, frame):
        raise BudgetExceeded()
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(max(1, int(seconds)))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def first_line(e):
    text = str(e).strip().splitlines()
    return "%s: %s" % (type(e).__name__, text[0] if text else "")


def flash_context(device):
    """A context that restricts SDPA to its flash backend, or None and the reason."""
    if device != "cuda":
        return None, "the flash backend is CUDA-only"
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return (lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])), None
    except ImportError:
        pass
    if hasattr(torch.backends.cuda, "sdp_kernel"):
        return (lambda: torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False,
                                                       enable_mem_efficient=False)), None
    return None, "no SDPA backend selection in torch %s" % torch.__version__


def make_optimizer(model, fused_first):
    """AdamW: fused, else foreach, else the default loop; its kind, and why the
    faster kinds could not be used."""
    why = []
    if fused_first:
        for name, kw in (("fused", dict(fused=True)), ("foreach", dict(foreach=True))):
            try:
                return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, **kw), name, why
            except (TypeError, RuntimeError, ValueError) as e:
                why.append("%s: %s" % (name, first_line(e)))
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01), "default", why


def time_form(form, p, args, dev):
    """Builds one form of the model and times its step; returns its record."""
    fell_back = []
    q = dict(p)
    dtype = args.dtype
    if form == "strongest":
        if not hasattr(F, "scaled_dot_product_attention"):
            fell_back.append("attention: naive (no scaled_dot_product_attention in torch %s)" % torch.__version__)
        else:
            q["sdpa"] = True
        if dev.type == "cuda" and torch.cuda.is_bf16_supported():
            dtype = "bf16"
        elif dtype == "fp32":
            fell_back.append("dtype: fp32 (bf16 autocast is taken on a CUDA device with bf16 only)")
    torch.manual_seed(0)
    model = Model(q, args.dropout).to(dev)
    opt, opt_kind, opt_why = make_optimizer(model, form == "strongest")
    if opt_why:
        fell_back.append("optimizer: %s AdamW (%s)" % (opt_kind, "; ".join(opt_why)))
    attention_ctx = contextlib.nullcontext
    if q.get("sdpa") and form == "strongest":
        ctx, why = flash_context(dev.type)
        if ctx is None:
            fell_back.append("attention: SDPA's default backend (%s)" % why)
        else:
            attention_ctx = ctx
    amp_dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    scaler = torch.cuda.amp.GradScaler() if (dtype == "fp16" and dev.type == "cuda") else None

    b, t = p["batch"], p["seq_len"]
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, p["vocab"], (b, t), generator=gen).to(dev)
    pos = torch.arange(t, device=dev).expand(b, t).contiguous()
    targets = torch.roll(ids, -1, dims=1)
    targets[:, -1] = -100

    forward = model
    compiled = False
    if form == "strongest":
        if not hasattr(torch, "compile"):
            fell_back.append("compile: none (no torch.compile in torch %s)" % torch.__version__)
        else:
            forward = torch.compile(model)
            compiled = True

    def step():
        opt.zero_grad(set_to_none=True)
        with attention_ctx():
            if amp_dtype is None:
                loss = forward(ids, pos, targets)
            else:
                with torch.autocast(device_type=dev.type, dtype=amp_dtype):
                    loss = forward(ids, pos, targets)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    if compiled:  # the first steps compile; past the budget, or on an error, time it eager
        t0 = time.perf_counter()
        try:
            with time_budget(args.compile_budget):
                for _ in range(2):
                    step()
                sync()
            compile_s = time.perf_counter() - t0
        except BudgetExceeded:
            fell_back.append("compile: none (over its %d s budget)" % args.compile_budget)
            compiled = False
        except Exception as e:  # noqa: BLE001 (any compiler failure means: time it uncompiled)
            fell_back.append("compile: none (%s)" % first_line(e))
            compiled = False
        if not compiled:
            forward = model
            compile_s = None
            sync()

    times = []
    for i in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        loss = step()
        sync()
        dt = time.perf_counter() - t0
        if i >= args.warmup:
            times.append(dt)
    med = statistics.median(times)
    rec = {
        "form": form,
        "dtype": dtype,
        "attention": ("sdpa-flash" if attention_ctx is not contextlib.nullcontext else "sdpa") if q.get("sdpa")
        else "naive",
        "optimizer": opt_kind,
        "compiled": compiled,
        "median_step_s": med,
        "min_step_s": min(times),
        "tokens_per_s": b * t / med,
        "loss": float(loss),
        "fell_back": fell_back,
    }
    if form == "strongest" and compiled:
        rec["compile_s"] = compile_s
    del model, opt, forward
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--preset", choices=["quick", "full"], default="quick")
    ap.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--forms", default=None,
                    help="comma-separated: eager, strongest (default: eager on a CPU, both on CUDA)")
    ap.add_argument("--compile-budget", type=int, default=150,
                    help="seconds torch.compile may take before the strongest form runs uncompiled")
    ap.add_argument("--point", help="headroom results.json: take model, dtype and batch from a BM-MB point")
    args = ap.parse_args()
    forms = (args.forms or ("eager,strongest" if args.device == "cuda" else "eager")).split(",")
    for f in forms:
        if f not in ("eager", "strongest"):
            ap.error("--forms: unknown form %r (eager, strongest)" % f)
    p = dict(PRESETS[args.preset])
    point = None
    if args.point:
        point = bm_mb_point(args.point, args.device)
        c = point["config"]
        p.update(vocab=c["vocab"], max_positions=c["max_positions"], d_model=c["d_model"], heads=c["heads"],
                 layers=c["layers"], batch=c["micro_batch"], seq_len=c["seq_len"], mlp_ratio=c["mlp_ratio"],
                 sdpa=c["attention"] == "memory_efficient")
        args.dtype = point["dtype"]
        args.dropout = c["dropout"]

    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    records = []
    for f in forms:
        print("timing PyTorch's %s step" % f, file=sys.stderr)
        records.append(time_form(f, p, args, dev))
    eager = next((r for r in records if r["form"] == "eager"), records[0])
    strongest = next((r for r in records if r["form"] == "strongest"), None)
    b, t = p["batch"], p["seq_len"]
    out = {
        "peer": "pytorch",
        "torch": torch.__version__,
        "device": args.device,
        "preset": args.preset,
        "threads": args.threads,
        "batch": b,
        "seq_len": t,
        "steps": args.steps,
        "model": {k: p[k] for k in ("vocab", "max_positions", "d_model", "heads", "layers")},
        # The first form's figures at the top level, as before there were forms.
        "dtype": eager["dtype"],
        "median_step_s": eager["median_step_s"],
        "min_step_s": eager["min_step_s"],
        "tokens_per_s": eager["tokens_per_s"],
        "loss": eager["loss"],
        "forms": records,
        "headroom_point": None if point is None else {
            "config": point["config"], "dtype": point["dtype"],
            "tokens_per_s": point["metrics"].get("tokens_per_s"),
            "step_time_s": point["metrics"].get("step_time_s")},
    }
    best = max(records, key=lambda r: r["tokens_per_s"])
    out["headline"] = {
        "against": (strongest or best)["form"],
        "peer_tokens_per_s": (strongest or best)["tokens_per_s"],
    }
    if point is not None and point["metrics"].get("tokens_per_s"):
        out["headline"]["headroom_over_peer"] = point["metrics"]["tokens_per_s"] / out["headline"]["peer_tokens_per_s"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
