#!/usr/bin/env python3
"""A dump of every technique, each validated against conventions.schema.json.

    check_dumps.py HEADROOM SCHEMA WORK [--ranks]

Runs `headroom dump` for accumulation, checkpointing with dropout, fp16 with the
loss scaler over steps with a skipped one, bf16, packing (drawn and given lengths),
memory-efficient attention, 8-bit AdamW over steps, LoRA with a non-zero B (on both
models) and, with --ranks, data parallel with ZeRO-1 at two ranks. Every
conventions.json must match the schema (closed objects: a field the dump writes
that the schema lacks fails), every file conventions.json names must be there, and
each case checks what its technique must show (a skipped step backs the scale off,
the 8-bit state holds codes, absmax and maps, A's gradient is not zero, the ranks
agree with the single process). The schema itself must refuse a conventions.json
with an unknown field, a missing rule or a wrong format.
"""
import copy
import json
import os
import shutil
import subprocess
import sys

try:
    import jsonschema
    import numpy as np
except ImportError as e:  # a failure with the install line, never a pass
    sys.exit(f"check_dumps: {e}; install python3-numpy and python3-jsonschema (ci/deps.sh does)")

DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I32": "<i4", "U8": "u1", "BF16": "<u2"}


def load(path):
    """An independent safetensors reader: {name: (dtype, numpy array)}."""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        a = np.frombuffer(raw[8 + n + b:8 + n + e], DTYPES[t["dtype"]]).reshape(t["shape"])
        if t["dtype"] == "BF16":  # the high half of an fp32
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = (t["dtype"], a)
    return out


def values(path):
    return {k: v[1].astype(np.float64) for k, v in load(path).items()}


def rel(a, b):
    d = np.linalg.norm(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    n = np.linalg.norm(np.asarray(b, np.float64))
    return d / n if n > 0 else d


def f32(x):
    return np.float32(x)


def adamw_rebuild(p, g, m, v, t, hp, decay):
    """torch.optim.AdamW as conventions.json states it, in fp32 (numpy float32)."""
    lr, b1, b2, eps = f32(hp["lr"]), f32(hp["beta1"]), f32(hp["beta2"]), f32(hp["eps"])
    wd = f32(hp["weight_decay"]) if decay else f32(0)
    step_size = f32(float(lr) / (1.0 - float(b1) ** t))
    bc2_sqrt = f32(np.sqrt(1.0 - float(b2) ** t))
    p = p * (f32(1) - lr * wd)
    m = b1 * m + (f32(1) - b1) * g
    v = b2 * v + (f32(1) - b2) * g * g
    return p - step_size * (m / (np.sqrt(v) / bc2_sqrt + eps)), m, v


def encode(codebook, x):
    """Nearest code of x (the normalised values, sorted), a tie to the lower code."""
    lo = np.clip(np.searchsorted(codebook, x, side="right") - 1, 0, 254)
    hi = lo + 1
    code = np.where(x - codebook[lo] <= codebook[hi] - x, lo, hi)
    code = np.where(x <= codebook[0], 0, code)
    return np.where(x >= codebook[255], 255, code)


def quantise(codebook, x, block):
    """Block-wise: absmax per block of `block` row-major elements, then the nearest code."""
    flat = x.reshape(-1)
    absmax = np.array([np.abs(flat[i:i + block]).max() for i in range(0, flat.size, block)], np.float32)
    scale = np.repeat(absmax, block)[:flat.size]
    normalised = np.where(scale > 0, flat / np.where(scale > 0, scale, f32(1)), f32(0)).astype(np.float32)
    return encode(codebook, normalised), absmax


class Failed(Exception):
    pass


def need(cond, what):
    if not cond:
        raise Failed(what)


def dump(headroom, work, name, args, config=None):
    out = os.path.join(work, name)
    cmd = [headroom, "dump", "--backend", "cpu", "--out", out] + args
    if config is not None:
        cfg = os.path.join(work, name + ".config.json")
        with open(cfg, "w") as f:
            json.dump(config, f)
        cmd += ["--config", cfg]
    r = subprocess.run(cmd, capture_output=True, text=True)
    need(r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return out, json.load(open(os.path.join(out, "conventions.json")))


def files_present(d, conv):
    need(os.path.isfile(os.path.join(d, "weights.safetensors")), "no weights.safetensors")
    folders = [os.path.join(d, s["folder"]) for s in conv.get("steps", [])] or [d]
    p = conv["dropout"]["p"] + conv["dropout"].get("p_attn_probs", 0) + conv["dropout"].get("p_attn_out", 0)
    for f in folders:
        want = ["batch", "loss", "gradients"] + (["weights", "optimizer_state"] if "steps" in conv else [])
        want += ["dropout_masks"] if p > 0 else []
        for w in want:
            need(os.path.isfile(os.path.join(f, w + ".safetensors")), f"{f}: no {w}.safetensors")


def schema_refuses(validator, conv):
    """The schema must be able to fail: an unknown field at the top and deep inside,
    a rule left out and another format are each refused."""
    bad = []
    for mutate in (lambda c: c.__setitem__("unexpected", 1),
                   lambda c: c["loss"].__setitem__("count_per_micro_batch", [1.0]),
                   lambda c: c["dropout"].pop("p_zero_sites"),
                   lambda c: c.__setitem__("format", "headroom.dump/1"),
                   lambda c: c["optimizer"]["hyperparameters"].__setitem__("lr", "fast")):
        c = copy.deepcopy(conv)
        mutate(c)
        if validator.is_valid(c):
            bad.append(c)
    need(not bad, f"the schema accepted {len(bad)} broken conventions.json")


def main():
    headroom, schema_path, work = sys.argv[1:4]
    ranks = "--ranks" in sys.argv[4:]
    schema = json.load(open(schema_path))
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    failures = []

    def case(name, args, config=None, check=None):
        try:
            d, conv = dump(headroom, work, name, args, config)
            errors = sorted(validator.iter_errors(conv), key=lambda e: list(e.path))
            need(not errors, "schema: " + "; ".join(f"{list(e.path)}: {e.message[:200]}" for e in errors[:5]))
            files_present(d, conv)
            if check:
                check(d, conv)
            print(f"ok   {name}")
            return conv
        except Failed as e:
            failures.append(name)
            print(f"FAIL {name}: {e}")
            return None

    def accumulation(d, conv):
        need(conv["accumulation"]["accum_steps"] == 4, "not 4 micro-batches")
        need(len(conv["loss"]["divisor_per_micro_batch"]) == 4, "not 4 divisors")

    def checkpointing(d, conv):
        masks = load(os.path.join(d, "dropout_masks.safetensors"))
        need(len(masks) == 3 * conv["config"]["transformer"]["layers"] * conv["accumulation"]["accum_steps"],
             f"{len(masks)} masks")
        need(conv["config"]["checkpoint"]["every_k_blocks"] == 1, "not checkpointed")

    def scaler(d, conv):
        s = conv["steps"]
        need([x["skipped"] for x in s] == [False, True, False], f"skips {[x['skipped'] for x in s]}")
        need(s[1]["overflow_injected"] and s[1]["found_nonfinite"], "step 2: no injected overflow")
        need(s[1]["loss_scale_after"] == s[1]["loss_scale"] * conv["loss_scaler"]["backoff"], "no backoff")
        need(s[0]["loss_scale"] == conv["loss_scaler"]["init_scale"], "step 1 not at init_scale")
        need(s[2]["loss_scale"] == s[1]["loss_scale_after"], "step 3 not at the backed-off scale")
        need([x["optimizer_t"] for x in s] == [1, None, 2], f"t {[x['optimizer_t'] for x in s]}")
        before, after = values(os.path.join(d, "step_1", "weights.safetensors")), values(
            os.path.join(d, "step_2", "weights.safetensors"))
        need(all(np.array_equal(before[k], after[k]) for k in before), "the skipped step changed a weight")
        g = values(os.path.join(d, "step_2", "gradients.safetensors"))
        need(any(not np.isfinite(v).all() for v in g.values()), "the skipped step's gradients are finite")
        w = load(os.path.join(d, "step_3", "weights.safetensors"))
        need(any(k.endswith(".compute") and t == "F16" for k, (t, _) in w.items()), "no fp16 compute copies")

    def bf16(d, conv):
        w = load(os.path.join(d, "step_1", "weights.safetensors"))
        need(any(k.endswith(".compute") and t == "BF16" for k, (t, _) in w.items()), "no bf16 compute copies")
        st = load(os.path.join(d, "step_1", "optimizer_state.safetensors"))
        need(any(k.endswith(".exp_avg_sq") for k in st), "no AdamW moments")

    def packed(d, conv):
        b = values(os.path.join(d, "batch.safetensors"))
        need("segment_ids" in b and "key_valid_len" not in b, "not a packed batch")
        need(len(b["sequence_length"]) > conv["accumulation"]["batch"], "no row holds two sequences")
        pos, off, row = b["pos"], b["sequence_offset"], b["sequence_row"]
        for i, n in enumerate(b["sequence_length"].astype(int)):  # positions restart at each sequence
            r, o = int(row[i]), int(off[i])
            need(np.array_equal(pos[r, o:o + n], np.arange(n)), f"sequence {i}: positions not restarted")

    def given_lengths(d, conv):
        b = values(os.path.join(d, "batch.safetensors"))
        need(list(b["sequence_length"].astype(int)) == [100, 90, 60, 38, 28, 20, 5, 5, 3, 1], "not the lengths given")

    def adamw_steps(d, conv):
        """Each step rebuilt in numpy from the weights before it and its gradients:
        the update, the weight-decay exclusions and t as conventions.json states them."""
        o = conv["optimizer"]
        hp, no_decay = o["hyperparameters"], set(o["no_weight_decay"])
        before = {k: a for k, (_, a) in load(os.path.join(d, "weights.safetensors")).items()}
        state = {k: np.zeros_like(a) for k, a in before.items()}
        worst, control = 0.0, None
        prev_m = prev_v = {}
        for rec in conv["steps"]:
            at = os.path.join(d, rec["folder"])
            g = {k: a for k, (_, a) in load(os.path.join(at, "gradients.safetensors")).items()}
            after = {k: a for k, (_, a) in load(os.path.join(at, "weights.safetensors")).items()}
            moments = {k: a for k, (_, a) in load(os.path.join(at, "optimizer_state.safetensors")).items()}
            for k in g:
                p, m, v = adamw_rebuild(before[k], g[k], state.get(k + ".m", np.zeros_like(g[k])),
                                        state.get(k + ".v", np.zeros_like(g[k])), rec["optimizer_t"], hp,
                                        k not in no_decay)
                state[k + ".m"], state[k + ".v"] = m, v
                err = np.abs(p - after[k]).max() / np.abs(after[k] - before[k]).max()
                worst = max(worst, err)
                need(err <= 1e-3, f"{rec['folder']}: {k} off the numpy AdamW by {err:.3g} of its update")
                need(np.abs(m - moments[k + ".exp_avg"]).max() <= 1e-6 * np.abs(m).max(), f"{k}: exp_avg")
                need(np.abs(v - moments[k + ".exp_avg_sq"]).max() <= 1e-6 * np.abs(v).max(), f"{k}: exp_avg_sq")
            if rec["optimizer_t"] == 2:  # control: the same step told t = 1 (a lost step count) must fail
                k = max(g, key=lambda n: g[n].size)
                wrong, _, _ = adamw_rebuild(before[k], g[k], prev_m[k], prev_v[k], 1, hp, k not in no_decay)
                control = np.abs(wrong - after[k]).max() / np.abs(after[k] - before[k]).max()
                need(control > 1e-3, f"a step told t = 1 passes ({control:.3g} of the update)")
            prev_m = {k: state[k + ".m"] for k in g}
            prev_v = {k: state[k + ".v"] for k in g}
            before = after
        print(f"     numpy AdamW: worst error {worst:.3g} of the update over {len(conv['steps'])} steps; "
              f"a step told t = 1 errs {control:.3g}")

    def q8(d, conv):
        """Step 1's codes and absmax rebuilt in numpy from its gradients alone, by
        the map, block and quantiser rules conventions.json states."""
        o = conv["optimizer"]
        hp, block = o["hyperparameters"], o["block_size"]
        g = {k: a for k, (_, a) in load(os.path.join(d, "step_1", "gradients.safetensors")).items()}
        st = {k: a for k, (_, a) in load(os.path.join(d, "step_1", "optimizer_state.safetensors")).items()}
        b1, b2 = f32(hp["beta1"]), f32(hp["beta2"])
        checked = mismatched = 0
        for k, grad in g.items():
            if k + ".exp_avg.codes" not in st:
                need(grad.size < o["min_8bit_numel"], f"{k}: {grad.size} elements kept in fp32")
                continue
            for moment, value, book in (("exp_avg", (f32(1) - b1) * grad, "maps.exp_avg"),
                                        ("exp_avg_sq", (f32(1) - b2) * grad * grad, "maps.exp_avg_sq")):
                codes, absmax = quantise(st[book], value, block)
                need(np.array_equal(absmax, st[f"{k}.{moment}.absmax"]), f"{k}.{moment}: absmax")
                dumped = st[f"{k}.{moment}.codes"].reshape(-1).astype(int)
                off = codes != dumped
                checked += codes.size
                mismatched += int(off.sum())
                need(np.abs(codes - dumped).max() <= 1, f"{k}.{moment}: a code off by more than one")
        need(checked > 0 and mismatched <= 1e-3 * checked, f"{mismatched} of {checked} codes differ")
        # Control: the first moment quantised with the unsigned map (its sign lost) must differ.
        k = next(n for n in g if n + ".exp_avg.codes" in st)
        wrong, _ = quantise(st["maps.exp_avg_sq"], (f32(1) - b1) * g[k], block)
        control = float(np.mean(wrong != st[k + ".exp_avg.codes"].reshape(-1)))
        need(control > 0.1, f"the first moment in the unsigned map passes ({control:.3g} of codes differ)")
        print(f"     numpy 8-bit quantiser: {checked - mismatched} of {checked} codes equal; with the unsigned map "
              f"for the first moment {control:.0%} differ")
        for s in ("step_1", "step_2"):
            st = load(os.path.join(d, s, "optimizer_state.safetensors"))
            need(any(k.endswith(".exp_avg.codes") and t == "U8" for k, (t, _) in st.items()), f"{s}: no codes")
            need(any(k.endswith(".exp_avg_sq.absmax") for k in st), f"{s}: no absmax")
            need(st["maps.exp_avg"][1].shape == (256,) and st["maps.exp_avg_sq"][1][0] == 0, f"{s}: no maps")

    def lora(d, conv):
        g = values(os.path.join(d, "gradients.safetensors"))
        a = [k for k in g if k.endswith("lora_A")]
        need(a and all(np.abs(g[k]).max() > 0 for k in a), "an A gradient is zero")
        need("normal(0, 0.02" in conv["adapters"]["init"], "the B init is not stated")

    def mlp_lora(d, conv):
        g = values(os.path.join(d, "gradients.safetensors"))
        need(conv["adapters"]["adapted"].startswith("layers.") and "layers.0.lora_A" in g, "adapters misnamed")

    def data_parallel(d, conv):
        dp = conv["data_parallel"]
        shards = dp["zero1"]["shards"]
        for s in ("step_1", "step_2"):
            ref = values(os.path.join(d, s, "gradients.safetensors"))
            w_ref = values(os.path.join(d, s, "weights.safetensors"))
            for r in range(dp["ranks"]):
                at = os.path.join(d, f"rank_{r}", s)
                g = values(os.path.join(at, "gradients.safetensors"))
                for k in ref:
                    need(rel(g[k], ref[k]) < 1e-5, f"{at}: gradient {k} off the single process by {rel(g[k], ref[k]):.3g}")
                w = values(os.path.join(at, "weights.safetensors"))
                for k in w_ref:
                    need(rel(w[k], w_ref[k]) < 1e-5, f"{at}: weight {k} off the single process")
                st = values(os.path.join(at, "optimizer_state.safetensors"))
                need(len(st["exp_avg"]) == max(1, shards[r][1] - shards[r][0]), f"{at}: shard size")
                local = values(os.path.join(at, "gradients_local.safetensors"))
                need(local.keys() == g.keys(), f"{at}: gradients_local names")
            b0 = values(os.path.join(d, "rank_0", s, "batch.safetensors"))
            need(len(b0["x"]) == dp["rows_per_rank"], "rank 0's slice")

    if not ranks:
        c = case("accumulation", ["--model", "mlp", "--micro-batch", "16"], check=accumulation)
        if c:
            schema_refuses(validator, c)
        case("checkpointing_dropout", ["--micro-batch", "4"],
             {"checkpoint": {"every_k_blocks": 1}, "transformer": {"dropout": 0.1}}, checkpointing)
        case("fp16_scaler_steps", ["--dtype", "fp16", "--steps", "3", "--overflow-steps", "2"], check=scaler)
        case("bf16_step", ["--dtype", "bf16", "--steps", "1"], check=bf16)
        case("packed", ["--layout", "packed"], check=packed)
        case("packed_given_lengths", ["--layout", "packed", "--lengths", "100,90,60,38,28,20,5,5,3,1"],
             check=given_lengths)
        case("memory_efficient_attention", [], {"transformer": {"attention": "memory_efficient"}})
        case("adamw_steps", ["--model", "mlp", "--micro-batch", "16", "--steps", "3"], check=adamw_steps)
        case("adamw8bit_steps", ["--steps", "2"], {"optimizer": {"kind": "adamw8bit"}}, q8)
        case("lora_nonzero_b", ["--lora-b-std", "0.02"], {"adapters": {"kind": "lora", "rank": 4}}, lora)
        case("mlp_lora", ["--model", "mlp", "--lora-b-std", "0.02"], {"adapters": {"kind": "lora", "rank": 4}},
             mlp_lora)
    else:
        case("data_parallel_zero1", ["--model", "mlp", "--ranks", "2", "--steps", "2", "--micro-batch", "16"],
             check=data_parallel)
    if failures:
        sys.exit(f"check_dumps: {len(failures)} failed: {', '.join(failures)}")
    print("check_dumps: every dump matches the schema")


if __name__ == "__main__":
    main()
