#!/usr/bin/env python3
"""compare: zero against DeepSpeed, per cell of the parity suite (docs/deepspeed_parity.md).

Reads DIR_ZERO/<cell>.zero.json (zero_parity) and DIR_DS/<cell>.ds.json (ds_parity.py) for every
cell of the cells file and measures, per cell:
  - lr, loss scale (before and after each step), was_step_applied, skipped and global steps: exact;
  - global grad norm: the largest relative difference over the steps both applied;
  - fp32 master weights and model parameters: max|a - b| / max|b - init| (relative to the weight
    change over the run) and max|a - b| / max|b|; exp_avg, exp_avg_sq: max|a - b| / max|b|
    (moments start at 0, so that is relative to their change too). Model parameters in 16 bits are
    also counted in units in the last place of the model dtype;
  - both sides' initial masters against cells.py's init_values (bitwise: the generators agree).
Verdict: "bitwise" (every array and step quantity identical, grad norms within 1e-6), "fp32
rounding" (step quantities exact, grad norm and every relative-to-change difference <= TOL,
16-bit model parameters within 1 ulp), else "beyond", with the reasons that apply from KNOWN_REASONS
(DEEPSPEED_FACTS.md) or "UNEXPLAINED". A cell that failed on either side is "error".

Writes the table between the markers of the template (docs/deepspeed_parity.md) into --write, and
the per-cell figures as JSON into --json. Exit status 0 unless a cell is "error" or UNEXPLAINED
(--strict) or inputs are missing.

Usage: compare.py --cells CELLS.json --zero DIR --ds DIR [--template MD --write MD] [--json OUT]
"""

import argparse
import base64
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cells as cells_lib  # noqa: E402

TOL = 2e-5          # relative to the weight change: fp32 rounding (torch AdamW's operation order)
NORM_TOL = 1e-5     # grad norm, relative
BEGIN = "<!-- parity-table:begin (written by tests/deepspeed_parity/compare.py) -->"
END = "<!-- parity-table:end -->"

# Known reasons for a cell beyond fp32 rounding (../shared/DEEPSPEED_FACTS.md, "Measured against
# DeepSpeed 0.19.8"): (key, predicate(cell, figures), text). Every one that applies is listed.
KNOWN_REASONS = [
    ("ds-stage0-16bit",
     lambda c, f: c["stage"] == 0 and c["dtype"] != "fp32",
     "stage 0 in 16 bits: DeepSpeed runs FP16_UnfusedOptimizer (bf16 differs from its own stages "
     "1-3; its fp16 scaler halves at the first overflow despite hysteresis 2); not a target"),
    ("ds-16bit-accumulation",
     lambda c, f: c["dtype"] != "fp32" and max_backwards(c) > 1,
     "16-bit with several backward calls per step: DeepSpeed accumulates the micro-step gradients "
     "in the 16-bit dtype, zero in fp32 (the more precise; kept)"),
    ("ds-stage3-unmanaged-carry-over",
     lambda c, f: c["stage"] == 3 and not c["managed"] and has_inactive(c),
     "unmanaged stage 3: DeepSpeed carries a parameter's gradient from one window into the next "
     "window in which it is inactive (a DeepSpeed bug; not reproduced)"),
    ("ds-stage3-norm-after-scale-growth",
     lambda c, f: c["stage"] == 3 and f.get("norm_off_steps") and not f.get("norm_off_not_growth"),
     "stage 3 fp16, a step at which the loss scale grows: DeepSpeed updates the scale before it "
     "divides the norm by it (stage3.py step(): _loss_scale_update_and_overflow_cleanup, then "
     "_global_grad_norm = norm / loss_scale, and unscale_and_clip_grads with the new scale), so it "
     "reports half the norm and unscales by twice the scale (the same update when clipping is "
     "active; Adam all but ignores the factor otherwise); the grad norm differs only at those steps"),
    ("zero-unmanaged-freezes-inactive",
     lambda c, f: not c["managed"] and has_inactive(c) and f.get("active_ok", False),
     "unmanaged, inactive parameters: only the parameters inactive in some window differ; "
     "DeepSpeed steps an inactive parameter with a zero gradient, a zero build that freezes them "
     "differs there (issue 7 item 2)"),
]


def max_backwards(cell):
    return max(len(w["micros"]) for w in cell["windows"])


def has_inactive(cell):
    return any(len(m["params"]) < cells_lib.NUM_PARAMS for w in cell["windows"] for m in w["micros"])


def inactive_params(cell):
    used_everywhere = set(range(cells_lib.NUM_PARAMS))
    for w in cell["windows"]:
        active = set()
        for m in w["micros"]:
            active |= set(m["params"])
        used_everywhere &= active
    return sorted(set(range(cells_lib.NUM_PARAMS)) - used_everywhere)


def decode(b64):
    import numpy as np
    return np.frombuffer(base64.b64decode(b64), dtype="<f4").astype(np.float64)


def ulp(x, dtype):
    import numpy as np
    bits = {"bf16": 8, "fp16": 11, "fp32": 24}[dtype]
    e = np.floor(np.log2(np.maximum(np.abs(x), 2.0**-24 if dtype == "fp16" else 2.0**-126)))
    if dtype == "fp16":
        e = np.maximum(e, -14)
    return 2.0 ** (e - (bits - 1))


def num(v):
    if isinstance(v, str):
        return float(v)
    return float("nan") if v is None else float(v)


def rel(diff, base):
    if diff == 0:
        return 0.0
    return diff / base if base > 0 else float("inf")


def compare_cell(cell, z, d):
    """Figures for one cell (both sides ran)."""
    import numpy as np
    f = {"notes": [], "norm_off_steps": [], "norm_off_not_growth": False}
    zs, ds = z["steps"], d["steps"]
    if len(zs) != len(ds):
        f["notes"].append("step count %d vs %d" % (len(zs), len(ds)))
    exact_keys = ("loss_scale", "loss_scale_after", "applied", "skipped_steps", "global_steps")
    f["steps_exact"] = True
    lr_rel = 0.0
    norm_rel = 0.0
    for s, (a, b) in enumerate(zip(zs, ds)):
        for k in exact_keys:
            if a[k] != b[k] and not (isinstance(a[k], float) and isinstance(b[k], (int, float)) and
                                     num(a[k]) == num(b[k])):
                f["steps_exact"] = False
                f["notes"].append("step %d: %s %s vs %s" % (s, k, a[k], b[k]))
        la, lb = num(a["lr"]), num(b["lr"])
        lr_rel = max(lr_rel, abs(la - lb) / max(abs(lb), 1e-30))
        if a["applied"] and b["applied"]:
            na, nb = num(a["grad_norm"]), num(b["grad_norm"])
            if math.isfinite(na) and math.isfinite(nb):
                r = abs(na - nb) / max(abs(nb), 1e-30)
                norm_rel = max(norm_rel, r)
                if r > NORM_TOL:
                    # DeepSpeed divided by the loss scale after this step's growth?
                    grown = num(b["loss_scale_after"]) / num(b["loss_scale"])
                    f["norm_off_steps"].append(s)
                    if not (grown > 1 and abs(nb * grown - na) <= NORM_TOL * abs(na)):
                        f["norm_off_not_growth"] = True
            elif not (math.isnan(nb) or b["grad_norm"] is None):
                norm_rel = float("inf")
                f["notes"].append("step %d: grad norm %s vs %s" % (s, a["grad_norm"], b["grad_norm"]))
    f["lr_rel"] = lr_rel
    f["norm_rel"] = norm_rel
    if lr_rel > 1e-12:
        f["steps_exact"] = False

    n = cells_lib.NUM_PARAMS
    init = [cells_lib.init_values(p).astype(np.float64) for p in range(n)]
    f["init_ok"] = all(np.array_equal(decode(z["final"]["init"][p]), init[p]) for p in range(n)) and \
        all(np.array_equal(decode(d["init_master"][p]), init[p]) for p in range(n))
    if not f["init_ok"]:
        f["notes"].append("initial masters differ from cells.py's init_values")
    zf, df = z["final"], d["final"]
    bitwise = f["init_ok"]
    per_param = []
    for p in range(n):
        r = {}
        for k in ("master", "model", "exp_avg", "exp_avg_sq"):
            a, b = decode(zf[k][p]), decode(df[k][p])
            if a.shape != b.shape:
                r[k] = float("inf")
                f["notes"].append("%s %s: %d vs %d elements" % (cells_lib.PARAMS[p][0], k, a.size, b.size))
                bitwise = False
                continue
            bitwise = bitwise and np.array_equal(a, b)
            diff = float(np.max(np.abs(a - b))) if a.size else 0.0
            if k in ("master", "model"):
                r[k] = rel(diff, float(np.max(np.abs(b - init[p]))))
                r[k + "_abs_rel"] = rel(diff, float(np.max(np.abs(b))))
            else:
                r[k] = rel(diff, float(np.max(np.abs(b))))
            if k == "model" and cell["dtype"] != "fp32":
                r["model_ulps"] = float(np.max(np.abs(a - b) / ulp(b, cell["dtype"])))
        per_param.append(r)
    f["per_param"] = per_param

    def worst(k, params=range(n)):
        return max((per_param[p].get(k, 0.0) for p in params), default=0.0)

    for k in ("master", "model", "exp_avg", "exp_avg_sq", "model_ulps"):
        f[k] = worst(k)

    def ok(params):
        if cell["dtype"] == "fp32":
            model_ok = worst("model", params) <= TOL
        else:
            model_ok = worst("model_ulps", params) <= 1.0
        return (worst("master", params) <= TOL and worst("exp_avg", params) <= TOL and
                worst("exp_avg_sq", params) <= TOL and model_ok)

    inactive = inactive_params(cell)
    f["active_ok"] = bool(inactive) and ok([p for p in range(n) if p not in inactive]) and \
        f["steps_exact"] and norm_rel <= NORM_TOL
    if bitwise and f["steps_exact"] and norm_rel <= 1e-6:
        f["verdict"] = "bitwise"
    elif f["steps_exact"] and norm_rel <= NORM_TOL and f["init_ok"] and ok(range(n)):
        f["verdict"] = "fp32 rounding"
    else:
        f["verdict"] = "beyond"
        f["reasons"] = [k for k, pred, _ in KNOWN_REASONS if pred(cell, f)] or ["UNEXPLAINED"]
    return f


def load(path):
    if not os.path.exists(path):
        return None, "missing " + os.path.basename(path)
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except ValueError as e:
        return None, "%s is not JSON: %s" % (os.path.basename(path), e)
    if "error" in doc:
        return None, doc["error"].splitlines()[0][:160]
    return doc, None


def fmt(x):
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return "inf"
    return "%.1e" % x


def table(cells, results):
    counts = {}
    for c in cells:
        v = results[c["name"]]["verdict"]
        counts[v] = counts.get(v, 0) + 1
    unexplained = [c["name"] for c in cells if "UNEXPLAINED" in results[c["name"]].get("reasons", [])]
    lines = [BEGIN, ""]
    lines.append("%d cells: %s; UNEXPLAINED: %d." % (
        len(cells), ", ".join("%s %d" % (k, counts[k]) for k in
                              ("bitwise", "fp32 rounding", "beyond", "error") if k in counts),
        len(unexplained)))
    lines.append("")
    classes = {}
    for c in cells:
        k = results[c["name"]].get("ds_optimizer")
        if k:
            classes.setdefault(k, set()).add("s%d %s" % (c["stage"], c["dtype"]))
    if classes:
        lines.append("DeepSpeed's optimizer: " + "; ".join(
            "%s (%s)" % (k, ", ".join(sorted(v))) for k, v in sorted(classes.items())) + ".")
        lines.append("")
    lines.append("| cell | verdict | lr, scale, skips | grad norm | master | model | exp_avg | exp_avg_sq | reason |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for c in cells:
        r = results[c["name"]]
        if r["verdict"] == "error":
            lines.append("| %s | error | | | | | | | %s |" % (c["name"], r["error"].replace("|", "/")))
            continue
        model = fmt(r["model"])
        if c["dtype"] != "fp32":
            model = "%g ulp" % r["model_ulps"]
        reason = "; ".join(r.get("reasons", []))
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            c["name"], r["verdict"], "exact" if r["steps_exact"] else "**differ**", fmt(r["norm_rel"]),
            fmt(r["master"]), model, fmt(r["exp_avg"]), fmt(r["exp_avg_sq"]), reason))
    lines.append("")
    lines.append("Reasons:")
    lines.append("")
    for k, _, text in KNOWN_REASONS:
        lines.append("- `%s`: %s." % (k, text))
    lines.append("- `UNEXPLAINED`: none of the above applies: a new difference, to be investigated.")
    lines.append("")
    lines.append(END)
    return "\n".join(lines), unexplained


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", required=True)
    ap.add_argument("--zero", required=True)
    ap.add_argument("--ds", required=True)
    ap.add_argument("--template", help="markdown with the table markers (docs/deepspeed_parity.md)")
    ap.add_argument("--write", help="where the filled-in markdown goes")
    ap.add_argument("--json", help="per-cell figures as JSON")
    ap.add_argument("--header", default="", help="a line put above the table (run date, versions)")
    ap.add_argument("--strict", action="store_true", help="exit 1 on UNEXPLAINED cells too")
    args = ap.parse_args()
    with open(args.cells) as fh:
        cells = json.load(fh)["cells"]
    results = {}
    for c in cells:
        z, ze = load(os.path.join(args.zero, c["name"] + ".zero.json"))
        d, de = load(os.path.join(args.ds, c["name"] + ".ds.json"))
        if ze or de:
            parts = (["zero: " + ze] if ze else []) + (["deepspeed: " + de] if de else [])
            results[c["name"]] = {"verdict": "error", "error": "; ".join(parts)}
            continue
        try:
            results[c["name"]] = compare_cell(c, z, d)
        except Exception as e:  # a malformed result: this cell is an error, the others go on
            results[c["name"]] = {"verdict": "error", "error": "compare: %s: %s" % (type(e).__name__, e)}
        if "optimizer_class" in d:
            results[c["name"]]["ds_optimizer"] = d["optimizer_class"]
    text, unexplained = table(cells, results)
    if args.header:
        text = text.replace(BEGIN + "\n", BEGIN + "\n\n" + args.header + "\n", 1)
    if args.write:
        if args.template:
            with open(args.template) as fh:
                tpl = fh.read()
            if BEGIN not in tpl or END not in tpl:
                sys.exit("compare: %s lacks the table markers %r ... %r" % (args.template, BEGIN, END))
            out = tpl[:tpl.index(BEGIN)] + text + tpl[tpl.index(END) + len(END):]
        else:
            out = text + "\n"
        with open(args.write, "w") as fh:
            fh.write(out)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1, default=float)
    counts = {}
    for r in results.values():
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    print("compare: %d cells: %s; UNEXPLAINED %d%s" % (
        len(cells), ", ".join("%s %d" % kv for kv in sorted(counts.items())), len(unexplained),
        (" (" + ", ".join(unexplained) + ")") if unexplained else ""))
    errors = counts.get("error", 0)
    return 1 if errors or (args.strict and unexplained) else 0


if __name__ == "__main__":
    sys.exit(main())
