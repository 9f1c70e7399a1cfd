#!/usr/bin/env python3
"""PyTorch eager peer of headroom's controlled transformer training step.

The same architecture and sizes as harness/models/transformer.hpp with the
presets of harness/models/presets.hpp: token + position embedding, pre-LN
blocks (separate q, k, v linears, naive causal attention with scale 1/sqrt(D),
output projection, residual; LayerNorm, fc -> tanh GELU -> proj, dropout,
residual), final LayerNorm, untied LM head without bias, cross-entropy with
ignore index -100, AdamW. One step = zero_grad + forward + backward +
optimizer step. Prints one JSON object with the median step time.

Not part of CI (it needs torch); used to compare step times:
    python3 ci/peer/torch_step.py --device cpu --preset quick --dtype fp32
    python3 ci/peer/torch_step.py --device cuda --point results.json
With --point, the model, dtype, micro-batch and sequence length are those of a
BM-MB point of headroom's results (the largest micro-batch without accumulation
on that backend), so both sides time the same step.
"""
import argparse
import json
import math
import os
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
        if self.sdpa:  # headroom's memory-efficient attention: PyTorch's fused kernels
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
    accumulation, a config that names the whole model; the largest micro-batch."""
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
    return max(pts, key=lambda q: q["config"]["micro_batch"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--preset", choices=["quick", "full"], default="quick")
    ap.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--point", help="headroom results.json: take model, dtype and batch from a BM-MB point")
    args = ap.parse_args()
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
    torch.manual_seed(0)
    dev = torch.device(args.device)
    model = Model(p, args.dropout).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    amp_dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    scaler = torch.cuda.amp.GradScaler() if (args.dtype == "fp16" and args.device == "cuda") else None

    b, t = p["batch"], p["seq_len"]
    ids = torch.randint(0, p["vocab"], (b, t), device=dev)
    pos = torch.arange(t, device=dev).expand(b, t).contiguous()
    targets = torch.roll(ids, -1, dims=1)
    targets[:, -1] = -100

    def step():
        opt.zero_grad(set_to_none=True)
        if amp_dtype is None:
            loss = model(ids, pos, targets)
        else:
            with torch.autocast(device_type=args.device, dtype=amp_dtype):
                loss = model(ids, pos, targets)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    times = []
    for i in range(args.warmup + args.steps):
        if args.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if i >= args.warmup:
            times.append(dt)
    med = statistics.median(times)
    print(json.dumps({
        "peer": "pytorch-eager",
        "torch": torch.__version__,
        "device": args.device,
        "preset": args.preset,
        "dtype": args.dtype,
        "threads": args.threads,
        "batch": b,
        "seq_len": t,
        "median_step_s": med,
        "min_step_s": min(times),
        "tokens_per_s": b * t / med,
        "loss": float(loss),
        "steps": args.steps,
        "model": {k: p[k] for k in ("vocab", "max_positions", "d_model", "heads", "layers")},
        "headroom_point": None if point is None else {
            "config": point["config"], "dtype": point["dtype"],
            "tokens_per_s": point["metrics"].get("tokens_per_s"),
            "step_time_s": point["metrics"].get("step_time_s")},
    }))


if __name__ == "__main__":
    main()
